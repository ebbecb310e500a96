"""The timing harness: files, schema, references and the CUDA path. No timed asserts (speed lives in benchmarks/)."""

import csv
import json

import pytest
import torch

from posenc_bench import encodings, native
from posenc_bench.bench.timing.suite import (PARTS, TimingConfig, bias_encodings, clock_note, fused_first, markdown, parts,
                                             rope_fixes, row_label, run_timing, seconds, timed_encodings, write_outputs)
from posenc_bench.errors import ConfigError
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
    assert data["machine"]["cc"] == native.compiler_version()  # what built the CPU kernels, or None
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
    assert rope_fixes(512) == ["rope-rerope", "rope-leaky", "rope-selfextend", "rope-string", "rope+sink4+sw508"]


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


def test_parts_and_encodings_choose_what_runs():
    assert parts(TimingConfig()) == list(PARTS)
    assert parts(TimingConfig(skip=["generation", "llama"])) == ["attention", "memory", "bias-memory", "training"]
    assert parts(TimingConfig(training=False)) == ["generation", "attention"]  # --no-train
    assert parts(TimingConfig(application=False, training=False)) == ["generation"]  # --generation-only
    with pytest.raises(ConfigError, match="skip 'gen': the parts are generation, attention, memory"):
        parts(TimingConfig(skip=["gen"]))
    assert timed_encodings(TimingConfig()) == fused_first(encodings.trained())
    assert timed_encodings(TimingConfig(encodings=["t5", "rope"])) == ["nope", "t5", "rope"]
    with pytest.raises(ConfigError, match="'rope-yarn' are not trained encodings"):
        timed_encodings(TimingConfig(encodings=["rope-yarn"]))
    assert bias_encodings(encodings.trained()) == ["t5", "alibi", "kerple", "kerple-power", "fire", "dape-kerple",
                                                   "dape-alibi"]


def test_time_reports_training_peak_memory_throughput_and_the_bias_rows_eval_peak(tmp_path, capsys):
    code = main(["time", "--lengths", "64", "--d-model", "32", "--head-dim", "16", "--min-run-time", "0.001",
                 "--train-min-run-time", "0.001", "--train-len", "32", "--train-tokens", "64", "--eval-len", "128",
                 "--skip", "generation,llama,memory", "--encodings", "rope,t5", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "timing.json").read_text())
    rows = data["rows"]
    assert list(dict.fromkeys(r["part"] for r in rows)) == ["attention forward", "eval peak memory", "model forward+backward"]
    attn = [r["encoding"] for r in rows if r["part"] == "attention forward"]
    assert attn == ["nope", "rope", "t5", *rope_fixes(16)]  # no alibi: no explicit alibi row either
    memory = [r for r in rows if r["part"] == "eval peak memory"]
    assert [(r["encoding"], r["length"], r["what"]) for r in memory] == [
        ("nope", 128, "forward at 4x, batch 1"), ("t5", 128, "forward at 4x, batch 1")]
    train = [r for r in rows if r["part"] == "model forward+backward"]
    assert [r["encoding"] for r in train] == ["nope", "rope", "t5", "t5 (explicit bias)"]
    assert all(r["tokens_per_s"] > 0 and r["tflops"] > 0 and r["mfu"] is None for r in train)  # no MFU on the CPU
    assert data["mfu"]["peak_flops"] is None and data["mfu"]["peak"] == "no MFU on the CPU"
    if memory[0]["peak_mib"] is not None:
        assert all(r["peak_mib"] > 0 for r in train)
    with open(tmp_path / "timing.csv") as f:
        table = list(csv.DictReader(f))
    assert {"peak_mib", "peak_x_fused", "tokens_per_s", "tflops", "mfu_pct"} <= set(table[0])
    assert all(t["mfu_pct"] == "" for t in table)
    md = (tmp_path / "timing.md").read_text()
    assert "### model forward+backward" in md and "MFU peak: no MFU on the CPU. FLOPs a step: 3 x forward" in md
    assert "mfu_pct" not in md.split("### model forward+backward")[1]  # an empty column is left out
    assert "MFU: no MFU on the CPU" in capsys.readouterr().out


def test_a_failure_in_a_later_part_keeps_the_parts_measured_before_it(tmp_path, monkeypatch, capsys):
    """An hour of attention rows is not lost to a failure in the memory part: each finished part is written to
    timing.partial.json as it ends; a finished run writes timing.json and removes the partial file."""
    from posenc_bench.bench.eval import memory as eval_memory

    def fail(*args, **kwargs):
        raise RuntimeError("the peak-memory forward of 'x' failed")

    monkeypatch.setattr(eval_memory, "memory_rows", fail)
    argv = ["time", "--lengths", "64", "--d-model", "32", "--head-dim", "16", "--min-run-time", "0.001",
            "--skip", "generation,bias-memory,training,llama", "--encodings", "rope", "--out", str(tmp_path)]
    with pytest.raises(RuntimeError, match="peak-memory forward of 'x'"):
        main(argv)
    assert "the parts measured before the stop are in" in capsys.readouterr().err
    partial = json.loads((tmp_path / "timing.partial.json").read_text())
    assert [r["encoding"] for r in partial["rows"]] == ["nope", "rope", *rope_fixes(16)]
    assert all(r["part"] == "attention forward" and r["median_s"] > 0 for r in partial["rows"])
    assert not (tmp_path / "timing.json").exists()
    monkeypatch.undo()
    assert main([*argv, "--skip", "generation,memory,bias-memory,training,llama"]) == 0  # the last --skip holds
    assert (tmp_path / "timing.json").exists() and not (tmp_path / "timing.partial.json").exists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_training_rows_have_mfu_against_the_given_peak():
    tc = TimingConfig(device="cuda", lengths=[128], d_model=64, head_dim=16, min_run_time=0.01, train_min_run_time=0.01,
                      train_len=128, train_tokens=256, encodings=["t5"], skip=["generation", "attention", "memory", "llama"],
                      peak_tflops=100.0, eval_len=512)
    result = run_timing(tc, log=quiet)
    train = [r for r in result["rows"] if r["part"] == "model forward+backward"]
    assert all(0 < r["mfu"] < 1 and r["peak_mib"] > 0 for r in train)
    assert all(r["mfu"] == pytest.approx(r["tflops"] / 100.0) for r in train)
