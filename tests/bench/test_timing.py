"""The timing harness: files, schema, references and the CUDA path. No timed asserts (speed lives in benchmarks/)."""

import csv
import json

import pytest
from pathlib import Path
import torch

from posenc_bench.commands.cli import main
from posenc_bench.bench.timing import (TimingConfig, llama_like, markdown, measure, run_timing, textbook_sinusoidal, versus_llama,
                                 write_outputs)


def quiet(_):
    pass


def test_time_writes_json_csv_and_markdown(tmp_path, capsys):
    code = main(["time", "--lengths", "64,96", "--d-model", "32", "--head-dim", "16", "--min-run-time", "0.001",
                 "--no-train", "--out", str(tmp_path)])
    assert code == 0
    data = json.loads((tmp_path / "timing.json").read_text())
    assert data["machine"]["torch"] == torch.__version__ and data["machine"]["threads"] >= 1 and data["machine"]["cpu"]
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
    assert {r["encoding"] for r in attn} >= {"nope", "rope", "alibi", "alibi (explicit bias)", "t5"}
    assert next(r for r in attn if r["encoding"] == "nope")["x_fused"] == 1.0
    for r in attn:  # alternating rounds, each against its own round's fused time; the median reported
        assert len(r["x_fused_rounds"]) == 3 and r["x_fused"] == pytest.approx(sorted(r["x_fused_rounds"])[1], abs=5e-4)
        assert r["runs"] >= 3
    with open(tmp_path / "timing.csv") as f:
        table = list(csv.DictReader(f))
    assert {"device", "dtype", "length", "dims", "median_ms", "iqr_ms", "floor_ms", "x_floor", "x_textbook"} <= set(table[0])
    assert len(table) == len(rows)
    md = (tmp_path / "timing.md").read_text()
    assert "### generation" in md and "sinusoidal" in md and "x_floor" in md and "setup_ms" in md
    assert "wrote" in capsys.readouterr().out


def test_textbook_reference_is_the_tutorial_formula():
    from posenc_bench.encodings.absolute import sinusoidal_table

    assert torch.allclose(textbook_sinusoidal(100, 32), sinusoidal_table(100, 32), atol=1e-5)


def test_llama_reference_matches_our_model_size():
    from posenc_bench.model.transformer import DecoderLM, ModelConfig

    cfg = ModelConfig()
    ours = sum(p.numel() for p in DecoderLM(cfg, "rope", 128).parameters())
    llama = llama_like(cfg, 128)
    theirs = sum(p.numel() for p in llama.parameters())
    assert abs(ours - theirs) / ours < 0.005
    c = llama.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (128, 4, 4, 257)
    assert c.tie_word_embeddings and c._attn_implementation == "sdpa"
    assert c.use_cache is False  # a training step builds no KV cache


def test_versus_llama_reports_paired_rounds_and_tokens_per_second():
    v = versus_llama(torch.device("cpu"), quiet, train_len=16, batch=2, rounds=3, min_run_time=0.001)
    assert v["shape"] == "batch 2 x 16 tokens" and v["params_ours"] == 821_632
    assert len(v["ratios"]) == len(v["ours_tokens_per_s"]) == len(v["llama_tokens_per_s"]) == 3
    for r, ours, llama in zip(v["ratios"], v["ours_tokens_per_s"], v["llama_tokens_per_s"]):
        assert r == pytest.approx(ours / llama)  # tokens/s ratio = Llama time / our time, per round
    assert v["ratio"] == sorted(v["ratios"])[1]
    result = {"machine": {"cpu": "cpu", "device": "cpu", "threads": 2, "torch": torch.__version__},
              "config": {"dtype": "fp32"}, "commit": "abc", "rows": [], "versus_llama":
              {**v, "ratio": 1.25, "ratios": [1.2, 1.25, 1.3], "ours_tokens_per_s": [10_000.0, 12_500.0, 13_000.0],
               "llama_tokens_per_s": [9_000.0, 10_000.0, 11_000.0]}}
    assert ("tokens/s = **1.25x**, the median of the paired rounds 1.20, 1.25, 1.30 (tokens/s, each side's own "
            "median: ours 12,500, Llama 10,000; 821,632 vs") in markdown(result)


@pytest.mark.parametrize("threads", [1, 2])
def test_measure_runs_at_the_configured_thread_count(threads):
    # torch.utils.benchmark.Timer runs single-threaded unless told otherwise; the timing table records
    # torch.get_num_threads(), so the measured code must run with exactly that many threads.
    seen = []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        result = measure(lambda: seen.append(torch.get_num_threads()), 0.01)
    finally:
        torch.set_num_threads(before)
    assert result["runs"] >= 1 and result["median_s"] > 0
    assert seen and set(seen) == {threads}


@pytest.mark.parametrize("args,message", [
    (["--lengths", "12,abc"], "--lengths '12,abc'"),
    (["--precision", "fp8"], "precision 'fp8' is not supported here; valid: fp32, bf16"),
    (["--lengths", "0"], "lengths must be positive"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    assert main(["time", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "timing.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_cuda_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["time", "--device", "cuda", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert "CUDA is not available" in err and len(err.splitlines()) == 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
def test_cuda_run_records_the_gpu(tmp_path):
    tc = TimingConfig(device="cuda", lengths=[256], d_model=64, head_dim=16, min_run_time=0.01, training=False)
    result = run_timing(tc, log=quiet)
    write_outputs(result, tmp_path)
    assert result["machine"]["gpu"] and result["machine"]["device"].startswith("cuda")
    assert all(r["median_s"] > 0 for r in result["rows"])


def test_eval_peak_memory_is_measured_per_encoding():
    from posenc_bench.bench.timing import eval_peak_memory

    if not Path("/proc/self/clear_refs").exists():  # no way to reset the peak RSS here
        assert eval_peak_memory("nope", torch.device("cpu"), 16, 64, 2) is None
        return
    fused = eval_peak_memory("nope", torch.device("cpu"), 64, 256, 2)
    explicit = eval_peak_memory("rope-rerope", torch.device("cpu"), 64, 256, 2)  # whole (B, H, q, k) logits
    assert isinstance(fused, int) and fused > 0 and explicit > fused
    with pytest.raises(RuntimeError, match="peak-memory forward of 'no-such-row' failed"):
        eval_peak_memory("no-such-row", torch.device("cpu"), 16, 64, 2)

