"""The timing harness: files, schema, references and the CUDA path. No timed asserts (speed lives in benchmarks/)."""

import csv
import json

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.bench.timing.suite import (TimingConfig, clock_note, fused_first, markdown, rope_fixes, row_label,
                                       run_timing, seconds, versus_llama, write_outputs)
from posenc_bench.commands.cli import main
from posenc_bench.env import cpu_name


def quiet(_):
    pass


def test_time_writes_json_csv_and_markdown(tmp_path, capsys):
    code = main(["time", "--lengths", "64,96", "--d-model", "32", "--head-dim", "16", "--min-run-time", "0.001",
                 "--no-train", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "timing.json").read_text())
    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["threads"] >= 1
    assert data["machine"]["cpu"] == cpu_name() and "(" in cpu_name()  # the model and its instruction set
    assert 0 < data["machine"]["timer_resolution_s"] < 1e-3
    rows = data["rows"]
    gen = {(r["encoding"], r["length"]) for r in rows if r["part"] == "generation"}
    assert {("sinusoidal", 64), ("rope", 96), ("alibi", 64), ("t5", 96), ("learned", 64)} <= gen
    scaled = [r for r in rows if r["part"] == "generation" and r["length"] == 64 and r.get("setup_s") is not None]
    assert sorted(r["encoding"] for r in scaled) == ["rope-dynamic", "rope-linear", "rope-llama3", "rope-ntk", "rope-yarn"]
    assert all(r["setup_s"] > 0 and r["x_floor"] > 0 for r in scaled)
    sinus = next(r for r in rows if r["encoding"] == "sinusoidal" and r["length"] == 64)
    assert sinus["median_s"] > 0 and sinus["floor_s"] > 0 and sinus["x_floor"] == pytest.approx(sinus["median_s"] / sinus["floor_s"])
    assert sinus["x_textbook"] == pytest.approx(sinus["reference_s"] / sinus["median_s"])
    attn = [r for r in rows if r["part"] == "attention forward" and r["length"] == 64]
    # every trained encoding (the fused path first), the rope model's per-pair fixes and sinks at 4x, explicit alibi
    assert [r["encoding"] for r in attn] == fused_first(encodings.trained()) + rope_fixes(16) + ["alibi (explicit bias)"]
    assert attn[0]["encoding"] == "nope" and attn[0]["x_fused"] == 1.0
    for r in attn:  # alternating rounds, each against its own round's fused time; the median reported
        assert len(r["x_fused_rounds"]) == 3 and r["x_fused"] == pytest.approx(sorted(r["x_fused_rounds"])[1], abs=5e-4)
        assert r["runs"] >= 3
    with open(tmp_path / "timing.csv") as f:
        table = list(csv.DictReader(f))
    assert {"device", "dtype", "length", "dims", "median_ms", "iqr_ms", "floor_ms", "x_floor", "x_textbook"} <= set(table[0])
    assert len(table) == len(rows)
    md = (tmp_path / "timing.md").read_text()
    assert "### generation" in md and "sinusoidal" in md and "x_floor" in md and "setup_ms" in md
    out = capsys.readouterr().out
    assert "wrote" in out and "timer resolution" in out and "0.0x faster" not in out


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_run_records_the_gpu(tmp_path):
    tc = TimingConfig(device="cuda", lengths=[256], d_model=64, head_dim=16, min_run_time=0.01, training=False)
    result = run_timing(tc, log=quiet)
    write_outputs(result, tmp_path)
    assert result["machine"]["gpu"] and result["machine"]["device"].startswith("cuda")
    assert all(r["median_s"] > 0 for r in result["rows"])


def test_what_is_timed_is_the_registrys():
    # the rows of the former own lists: trained encodings with nope first, the zero-shot scalings, the fixes
    assert fused_first(encodings.trained())[:2] == ["nope", "sinusoidal"] and "rope-linear" not in encodings.trained()
    assert encodings.variants("rope", family="rotary scaling (zero-shot)") == [
        "rope-linear", "rope-ntk", "rope-dynamic", "rope-yarn", "rope-llama3"]
    assert rope_fixes(512) == ["rope-rerope", "rope-leaky", "rope-selfextend", "rope+sink4+sw508"]


def timed_result(resolution_s, rows):
    return {"machine": {"cpu": "AMD EPYC (AVX512)", "device": "cpu", "threads": 2, "torch": torch.__version__,
                        "timer_resolution_s": resolution_s}, "config": {"precision": "fp32"}, "commit": "abc",
            "rows": [{"part": "attention forward", "length": 2048, "dims": "4x128", "what": "one layer", **r}
                     for r in rows]}


def test_clock_bound_rows_are_named_in_the_log_note_and_timing_md():
    rows = [{"encoding": name, "median_s": ms / 1e3, "iqr_s": 0.0, "runs": 3, "clock_bound": True}
            for name, ms in (("nope", 8.0), ("rope", 16.0), ("t5", 24.0))]
    rows.append({"encoding": "alibi", "median_s": 0.0313, "iqr_s": 0.0021, "runs": 3, "clock_bound": False})
    result = timed_result(0.008, rows)
    note = clock_note(result)
    assert note.startswith("3 row(s) timed within 10 steps of the clock's resolution (8 ms)")
    assert note.endswith(": attention forward nope, L=2048; attention forward rope, L=2048; attention forward t5, L=2048")
    md = markdown(result)
    assert f"**Clock-bound:** {note}." in md and "timer resolution 8 ms" in md
    fine = timed_result(1e-6, rows[3:])
    assert clock_note(fine) is None and "Clock-bound" not in markdown(fine)


def test_row_label_names_what_a_generation_or_floor_row_builds():
    assert row_label({"part": "floor", "encoding": "-", "what": "write 64 fp32 / 0 fp32 sin", "length": 64}) == (
        "floor, write 64 fp32 / 0 fp32 sin, L=64")
    folded = {"part": "generation", "encoding": "alibi", "what": "folded bias factors (H, L) x 2", "length": 64}
    assert row_label(folded) == "generation alibi, folded bias factors (H, L) x 2, L=64"


def test_seconds_reads_at_any_scale():
    assert [seconds(v) for v in (4.1e-8, 1.5e-6, 0.008, 2.5)] == ["41 ns", "1.5 us", "8 ms", "2.5 s"]
