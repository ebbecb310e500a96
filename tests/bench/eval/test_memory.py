"""Eval peak memory per encoding (`posenc-bench time`'s "eval peak memory" rows)."""

from pathlib import Path

import pytest
import torch

from posenc_bench.bench.eval import memory as eval_memory
from posenc_bench.bench.eval.memory import eval_peak_memory, memory_rows


def test_eval_peak_memory_is_measured_per_encoding():
    if not Path("/proc/self/clear_refs").exists():  # no way to reset the peak RSS here
        assert eval_peak_memory("nope", torch.device("cpu"), 16, 64, 2) is None
        return
    fused = eval_peak_memory("nope", torch.device("cpu"), 64, 256, 2)
    explicit = eval_peak_memory("rope-rerope", torch.device("cpu"), 64, 256, 2)  # whole (B, H, q, k) logits
    assert isinstance(fused, int) and fused > 0 and explicit > fused
    with pytest.raises(RuntimeError, match="peak-memory forward of 'no-such-row' failed"):
        eval_peak_memory("no-such-row", torch.device("cpu"), 16, 64, 2)


def test_memory_rows_are_ratios_to_the_reference_measured_first(monkeypatch):
    peaks = {"nope": 2 << 20, "rope": 3 << 20, "t5": 4 << 20}
    seen = []

    def fake(name, device, train_len, length, batch):
        seen.append((name, train_len, length, batch))
        return peaks[name]

    monkeypatch.setattr(eval_memory, "eval_peak_memory", fake)
    rows = memory_rows(torch.device("cpu"), ["rope", "nope", "t5"], "nope", lambda _: None)
    assert [r["encoding"] for r in rows] == ["nope", "rope", "t5"]
    assert [r["x_fused"] for r in rows] == [1.0, 1.5, 2.0] and [r["peak_mib"] for r in rows] == [2.0, 3.0, 4.0]
    assert seen[0] == ("nope", 128, 512, 32)  # 4x the default run's 128, a batch of 16384 tokens
    monkeypatch.setattr(eval_memory, "eval_peak_memory", lambda *a: None)  # no way to measure: no rows
    assert memory_rows(torch.device("cpu"), ["nope"], "nope", lambda _: None) == []
