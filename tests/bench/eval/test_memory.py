"""Eval peak memory per encoding (`posenc-bench time`'s "eval peak memory" rows)."""

from pathlib import Path

import pytest
import torch

from posenc_bench.bench.eval import memory as eval_memory
from posenc_bench.bench.eval.memory import eval_peak_memory, measure_peaks, memory_rows, train_peak_memory


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

    def fake(name, device, train_len, length, batch, precision):
        seen.append((name, train_len, length, batch, precision))
        return peaks[name]

    monkeypatch.setattr(eval_memory, "eval_peak_memory", fake)
    rows = memory_rows(torch.device("cpu"), ["rope", "nope", "t5"], "nope", lambda _: None)
    assert [r["encoding"] for r in rows] == ["nope", "rope", "t5"]
    assert [r["x_fused"] for r in rows] == [1.0, 1.5, 2.0] and [r["peak_mib"] for r in rows] == [2.0, 3.0, 4.0]
    assert seen[0] == ("nope", 128, 512, 32, "fp32")  # 4x the default run's 128, a batch of 16384 tokens
    seen.clear()
    long = memory_rows(torch.device("cpu"), ["t5", "nope"], "nope", lambda _: None, train_len=2048, length=8192,
                       batch=1, precision="bf16")
    assert seen == [("nope", 2048, 8192, 1, "bf16"), ("t5", 2048, 8192, 1, "bf16")]
    assert [r["what"] for r in long] == ["forward at 4x, batch 1"] * 2 and long[1]["length"] == 8192
    monkeypatch.setattr(eval_memory, "eval_peak_memory", lambda *a: None)  # no way to measure: no rows
    assert memory_rows(torch.device("cpu"), ["nope"], "nope", lambda _: None) == []


def test_a_row_that_cannot_run_at_the_length_is_na_not_a_failure(monkeypatch):
    """A learned table has no rows past the train length (``learned``, ``learned+ssmax``): the memory rows
    leave it out, as a sweep marks it n/a, instead of the fresh process failing the whole timing run."""
    seen, lines = [], []
    monkeypatch.setattr(eval_memory, "eval_peak_memory", lambda name, *a: seen.append(name) or 1 << 20)
    rows = memory_rows(torch.device("cpu"), ["learned+ssmax", "nope", "learned", "rope"], "nope", lines.append)
    assert seen == ["nope", "rope"] and [r["encoding"] for r in rows] == ["nope", "rope"]
    assert any("learned+ssmax" in line and "n/a" in line for line in lines)


def test_train_peak_memory_is_measured_per_step_in_one_fresh_process():
    if not Path("/proc/self/clear_refs").exists():
        assert train_peak_memory([("nope", False)], torch.device("cpu"), 16, 2) == [None]
        return
    # the explicit bias path keeps a (1, H, T, T) bias and its gradient on top of the fused path's activations
    fused, explicit = train_peak_memory([("nope", False), ("t5", True)], torch.device("cpu"), 256, 2)
    assert isinstance(fused, int) and fused > 0 and explicit > fused
    assert explicit - fused >= 4 * 256 * 256 * 4  # at least one fp32 (H=4, 256, 256) tensor more
    with pytest.raises(RuntimeError, match="peak-memory step of 'nope', 'no-such-row' failed"):
        train_peak_memory([("nope", False), ("no-such-row", False)], torch.device("cpu"), 16, 2)


def test_measure_peaks_in_process_runs_every_job_under_the_precision():
    spec = {"jobs": [["nope", False], ["alibi", True]], "train_len": 16, "length": 64, "batch": 1, "train": False,
            "precision": "bf16"}
    peaks = measure_peaks(spec, torch.device("cpu"))
    assert len(peaks) == 2 and all(p is None or p >= 0 for p in peaks)
