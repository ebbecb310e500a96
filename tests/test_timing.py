"""The timing harness: files, schema, references and the CUDA path. No timed asserts (speed lives in benchmarks/)."""

import csv
import json

import pytest
import torch

from posenc_bench.cli import main
from posenc_bench.timing import TimingConfig, llama_like, run_timing, textbook_sinusoidal, write_outputs


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
    assert {("sinusoidal", 64), ("rope", 96), ("rope-linear", 64), ("alibi", 64), ("t5", 96), ("learned", 64)} <= gen
    sinus = next(r for r in rows if r["encoding"] == "sinusoidal" and r["length"] == 64)
    assert sinus["median_s"] > 0 and sinus["floor_s"] > 0 and sinus["x_floor"] == pytest.approx(sinus["median_s"] / sinus["floor_s"])
    assert sinus["x_textbook"] == pytest.approx(sinus["reference_s"] / sinus["median_s"])
    attn = [r for r in rows if r["part"] == "attention forward" and r["length"] == 64]
    assert {r["encoding"] for r in attn} >= {"nope", "rope", "alibi", "alibi (explicit bias)", "t5"}
    assert next(r for r in attn if r["encoding"] == "nope")["x_fused"] == 1.0
    with open(tmp_path / "timing.csv") as f:
        table = list(csv.DictReader(f))
    assert {"device", "dtype", "length", "dims", "median_ms", "iqr_ms", "floor_ms", "x_floor", "x_textbook"} <= set(table[0])
    assert len(table) == len(rows)
    md = (tmp_path / "timing.md").read_text()
    assert "### generation" in md and "sinusoidal" in md and "x_floor" in md
    assert "wrote" in capsys.readouterr().out


def test_textbook_reference_is_the_tutorial_formula():
    from posenc_bench.encodings.absolute import sinusoidal_table

    assert torch.allclose(textbook_sinusoidal(100, 32), sinusoidal_table(100, 32), atol=1e-5)


def test_llama_reference_matches_our_model_size():
    from posenc_bench.model import DecoderLM, ModelConfig

    cfg = ModelConfig()
    ours = sum(p.numel() for p in DecoderLM(cfg, "rope", 128).parameters())
    llama = llama_like(cfg, 128)
    theirs = sum(p.numel() for p in llama.parameters())
    assert abs(ours - theirs) / ours < 0.005
    c = llama.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.vocab_size) == (128, 4, 4, 257)
    assert c.tie_word_embeddings and c._attn_implementation == "sdpa"


@pytest.mark.parametrize("args,message", [
    (["--lengths", "12,abc"], "--lengths '12,abc'"),
    (["--dtype", "fp8"], "dtype 'fp8' is not supported; valid: fp32, bf16"),
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
    from posenc_bench.timing import eval_peak_memory

    peak = eval_peak_memory("nope", torch.device("cpu"), 16, 64, 2)
    assert peak is None or (isinstance(peak, int) and peak >= 0)
