"""benchmarks/gpu_check.py, the GPU check: its plan, its long-2048 summary (MFU from a run's records), and a
whole --tiny run on the CPU, resumed."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from posenc_bench.bench.timing.mfu import step_flops
from posenc_bench.model.transformer import ModelConfig

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "gpu_check.py"


def load():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_names_each_part_and_the_file_that_says_it_is_done(tmp_path):
    gc = load()
    args = lambda *a: gc.argparse.Namespace(**{"out": str(tmp_path), "device": "cuda", "tiny": False, "steps": 1000,  # noqa: E731
                                               "long_steps": 200, "eval_tokens": 262144, "rows": None,
                                               "peak_tflops_fp32": None, "peak_tflops_bf16": None,
                                               "mode": a[0]})
    measure = gc.parts(args("measure"))
    assert [(n, d.relative_to(tmp_path).as_posix()) for n, d, _ in measure] == [
        ("time-fp32", "time-fp32/timing.json"), ("time-bf16", "time-bf16/timing.json"), ("long-2048", "long-2048.json")]
    calls = []  # the bf16 table's part, given its own peak
    gc.time_part = lambda out, name, a: calls.append((name, a))
    gc.parts(gc.argparse.Namespace(**{**vars(args("measure")), "peak_tflops_bf16": 790.0}))[1][2]()
    assert calls[0][0] == "time-bf16" and calls[0][1][-2:] == ["--peak-tflops", "790.0"]
    train = gc.parts(args("train"))
    assert [(n, d.relative_to(tmp_path).as_posix()) for n, d, _ in train] == [("train-2048", "train-2048.json")]
    assert gc.TRAIN_ROWS.split(",") == ["nope", "rope", "alibi", "t5", "sinusoidal", "kerple-power", "xpos", "xpos+bca"]


def test_run_summary_prices_each_trained_row_by_its_flops_against_the_gpu_peak(tmp_path):
    model = {"d_model": 512, "n_layers": 6, "n_heads": 8, "mlp_ratio": 4, "vocab_size": 257, "encoding_options": {}}
    config = {"model": model, "train": {"train_len": 2048, "batch_size": 16, "steps": 200}, "precision": "bf16"}
    records = [{"encoding": "rope", "ratio": 1.0, "ppl": 3.5, "train_tokens_per_s": 1_000_000.0, "train_time_s": 6.5,
                "device": "cuda:NVIDIA H200", "config": config},
               {"encoding": "xpos+bca", "ratio": 2.0, "ppl": 4.0, "train_tokens_per_s": 900_000.0,
                "device": "cuda:NVIDIA H200", "config": config}]
    (tmp_path / "results.json").write_text(json.dumps({"records": records}))
    rows = load().run_summary(tmp_path, {})
    per_token = step_flops(ModelConfig(**model), 16, 2048) / (16 * 2048)
    assert rows["rope"]["tflops"] == pytest.approx(1e6 * per_token / 1e12)
    assert rows["rope"]["mfu"] == pytest.approx(1e6 * per_token / 989e12)
    assert rows["rope"]["peak"].startswith("NVIDIA H200 SXM dense bf16: 989 TFLOP/s")
    assert rows["xpos+bca"] == {"ppl": {"2x": 4.0}, "device": "cuda:NVIDIA H200", "precision": "bf16", "steps": 200,
                                "peak": rows["rope"]["peak"], "model": "xpos"}  # evaluated only: no speed of its own
    assert load().run_summary(tmp_path, {"bf16": 790.0, "fp32": 1.0})["rope"]["mfu"] == pytest.approx(1e6 * per_token / 790e12)


@pytest.mark.slow
def test_tiny_check_writes_every_file_and_a_second_call_resumes(tmp_path, capsys):
    gc = load()
    out = tmp_path / "gpu"
    assert gc.main(["measure", "--tiny", "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("gpu_check measure --tiny on cpu: ran time-fp32 ") and "skipped (done) nothing" in line
    for p in ("fp32", "bf16"):
        assert {f.name for f in (out / f"time-{p}").iterdir()} == {"timing.json", "timing.csv", "timing.md"}
    assert not list(out.glob(".partial-*")) and (out / "summary-measure.txt").read_text() == line + "\n"
    for p in ("fp32", "bf16"):
        data = json.loads((out / f"time-{p}" / "timing.json").read_text())
        assert data["config"]["precision"] == p and data["config"]["lengths"] == [64, 128]
        rows = data["rows"]
        attn = {(r["encoding"], r["length"]) for r in rows if r["part"] == "attention forward"}
        assert {(n, L) for n in ("alibi", "t5", "rope-rerope", "rope-leaky", "rope-selfextend") for L in (64, 128)} <= attn
        memory = [(r["encoding"], r["length"]) for r in rows if r["part"] == "eval peak memory"]
        assert memory == [("nope", 128), ("alibi", 128), ("t5", 128)]
        train = [r for r in rows if r["part"] == "model forward+backward"]
        assert len(train) == 6 and all(r["tokens_per_s"] > 0 and r["mfu"] is None for r in train)
    long = json.loads((out / "long-2048.json").read_text())
    assert list(long) == ["nope", "rope", "alibi", "t5"]
    assert all(r["tokens_per_s"] > 0 and math.isfinite(r["ppl"]["1x"]) and r["mfu"] is None for r in long.values())
    stamp = (out / "time-fp32" / "timing.json").stat().st_mtime_ns
    assert gc.main(["measure", "--tiny", "--out", str(out)]) == 0
    again = capsys.readouterr().out.strip().splitlines()[-1]
    assert "ran nothing; skipped (done) time-fp32, time-bf16, long-2048" in again
    assert (out / "time-fp32" / "timing.json").stat().st_mtime_ns == stamp
    (out / "long-2048.json").unlink()  # cut before its summary: the run resumes from its own records
    records = json.loads((out / "long-2048" / "results.json").read_text())["records"]
    assert gc.main(["measure", "--tiny", "--out", str(out)]) == 0
    assert "ran long-2048 4 rows" in capsys.readouterr().out
    assert json.loads((out / "long-2048" / "results.json").read_text())["records"] == records
    assert json.loads((out / "long-2048.json").read_text()) == long

    assert gc.main(["train", "--tiny", "--out", str(out)]) == 0
    assert "gpu_check train --tiny on cpu: ran train-2048 8 rows" in capsys.readouterr().out
    train = json.loads((out / "train-2048.json").read_text())
    assert list(train) == gc.TRAIN_ROWS.split(",") and train["xpos+bca"]["model"] == "xpos"
    assert all(set(r["ppl"]) == {"1x", "2x"} for r in train.values())
    assert gc.main(["train", "--tiny", "--out", str(out)]) == 0
    assert "ran nothing; skipped (done) train-2048" in capsys.readouterr().out
