"""`posenc-bench time`'s training part: forward+backward rows with peak memory, tokens/s and MFU; the Llama
comparison. No timed asserts (speed lives in benchmarks/)."""

from pathlib import Path

import pytest
import torch

from posenc_bench.bench.timing.mfu import step_flops
from posenc_bench.bench.timing.suite import TimingConfig, markdown
from posenc_bench.bench.timing.training import training_jobs, training_rows, versus_llama
from posenc_bench.model.transformer import ModelConfig


def quiet(_):
    pass


def test_training_jobs_add_the_explicit_bias_rows_of_alibi_and_t5():
    assert training_jobs(["nope", "rope"]) == [("nope", False), ("rope", False)]
    assert training_jobs(["nope", "t5", "alibi"]) == [("nope", False), ("t5", False), ("alibi", False),
                                                      ("alibi", True), ("t5", True)]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_rows_carry_peak_memory_tokens_per_second_and_mfu(precision):
    tc = TimingConfig(train_len=32, train_tokens=64, min_run_time=0.001, train_min_run_time=0.001, precision=precision)
    rows = training_rows(tc, torch.device("cpu"), quiet, ["nope", "t5"], peak_flops=1e9)
    assert [r["encoding"] for r in rows] == ["nope", "t5", "t5 (explicit bias)"]
    flops = step_flops(ModelConfig(), 2, 32)
    for r in rows:
        assert r["what"] == "batch 2, 5 rounds" and r["step_flops"] == flops
        assert r["tokens_per_s"] == pytest.approx(64 / r["median_s"])
        assert r["tflops"] == pytest.approx(flops / r["median_s"] / 1e12)
        assert r["mfu"] == pytest.approx(flops / r["median_s"] / 1e9)  # against the given peak
    if Path("/proc/self/clear_refs").exists():  # the peak RSS of a fresh process can be reset here
        assert rows[0]["peak_x_fused"] == 1.0 and all(r["peak_mib"] > 0 for r in rows)
        assert rows[2]["peak_x_fused"] == pytest.approx(rows[2]["peak_mib"] / rows[0]["peak_mib"], rel=0.05)
    no_peak = training_rows(tc, torch.device("cpu"), quiet, ["nope"])
    assert no_peak[0]["mfu"] is None and no_peak[0]["tokens_per_s"] > 0


def test_versus_llama_reports_paired_rounds_and_tokens_per_second():
    v = versus_llama(torch.device("cpu"), quiet, train_len=16, batch=2, rounds=3, min_run_time=0.001)
    assert v["shape"] == "batch 2 x 16 tokens" and v["params_ours"] == 821_632
    assert len(v["ratios"]) == len(v["ours_tokens_per_s"]) == len(v["llama_tokens_per_s"]) == 3
    for r, ours, llama in zip(v["ratios"], v["ours_tokens_per_s"], v["llama_tokens_per_s"]):
        assert r == pytest.approx(ours / llama)  # tokens/s ratio = Llama time / our time, per round
    assert v["ratio"] == sorted(v["ratios"])[1]
    result = {"machine": {"cpu": "AMD EPYC (AVX512)", "device": "cpu", "threads": 2, "torch": torch.__version__},
              "config": {"dtype": "fp32"}, "commit": "abc", "rows": [], "versus_llama":
              {**v, "ratio": 1.25, "ratios": [1.2, 1.25, 1.3], "ours_tokens_per_s": [10_000.0, 12_500.0, 13_000.0],
               "llama_tokens_per_s": [9_000.0, 10_000.0, 11_000.0]}}
    assert ("tokens/s = **1.25x**, the median of the paired rounds 1.20, 1.25, 1.30 (tokens/s, each side's own "
            "median: ours 12,500, Llama 10,000; 821,632 vs") in markdown(result)
