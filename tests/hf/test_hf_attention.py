"""Zero-shot fixes on a Hugging Face model: its attention rerouted through our encodings (hf/attention.py).

The reference for each fix is written out here from its paper's rule with transformers' own rotary module and
``apply_rotary_pos_emb``, independently of our encodings' code."""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

from posenc_bench import data
from posenc_bench.bench.evaluate import documents_per_window
from posenc_bench.commands.cli import main
from posenc_bench.env import peak_memory
from posenc_bench.hf import attention as hf_attention
from posenc_bench.hf import model as hf
from posenc_bench.hf import rope as hf_rope

sys.path.insert(0, str(Path(__file__).parent))
from hf_tiny import save_llama, train_tokenizer  # noqa: E402

TRAIN = 32  # the tiny model's max_position_embeddings


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer, tmp_path_factory):
    path = save_llama(tmp_path_factory.mktemp("llama") / "tiny-llama", tokenizer, max_positions=TRAIN)
    return hf.HFModel(hf.resolve_model(f"hf:{path}"), device=torch.device("cpu"))


def _logits(m: hf.HFModel, x: torch.Tensor, encoding=None) -> torch.Tensor:
    with torch.inference_mode():
        if encoding is None:
            return m.model(input_ids=x, use_cache=False).logits
        with hf_attention.rerouted(m.model, m.rotary):
            return m.model(input_ids=x, use_cache=False, posenc=hf_attention.Rerouted(encoding)).logits


def _reference_logits(m: hf.HFModel, x: torch.Tensor, pair_positions) -> torch.Tensor:
    """The model's logits with each layer's attention written out: logits of query i and key j are
    (q R_a) . (k R_b) for (a, b) = pair_positions(i, j), or none where j > i (causal) or the rule says None."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    lm, cfg = m.model, m.config
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    D = cfg.hidden_size // H
    T = x.shape[1]
    rotary = m.rotary[0][2]  # transformers' own rotary module
    with torch.inference_mode():
        h = lm.model.embed_tokens(x)
        for layer in lm.model.layers:
            a = layer.input_layernorm(h)
            att = layer.self_attn
            q = att.q_proj(a).view(1, T, H, D).transpose(1, 2)  # (1, H, T, D)
            k = att.k_proj(a).view(1, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            v = att.v_proj(a).view(1, T, Hkv, D).transpose(1, 2).repeat_interleave(H // Hkv, 1)
            logits = torch.full((1, H, T, T), float("-inf"))
            for i in range(T):
                for j in range(i + 1):
                    if pair_positions(i, j) is None:
                        continue
                    pa, pb = pair_positions(i, j)
                    cos, sin = rotary(q, torch.tensor([[pa, pb]], dtype=torch.float64))  # (1, 2, D)
                    qa, _ = apply_rotary_pos_emb(q[:, :, i : i + 1], q[:, :, i : i + 1], cos[:, :1], sin[:, :1])
                    _, kb = apply_rotary_pos_emb(k[:, :, j : j + 1], k[:, :, j : j + 1], cos[:, 1:], sin[:, 1:])
                    logits[..., i, j] = (qa * kb).sum(-1)[..., 0] * att.scaling
            y = torch.softmax(logits, -1) @ v  # (1, H, T, D)
            h = h + att.o_proj(y.transpose(1, 2).reshape(1, T, H * D))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return lm.lm_head(lm.model.norm(h))


def _ids(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(2, 300, (1, n), generator=torch.Generator().manual_seed(seed))


def test_plain_rope_rerouted_is_the_models_own_attention(model):
    x = _ids(3 * TRAIN)
    enc = hf_attention.build_encoding("rope", model.config, model.rotary, TRAIN)
    # ours: angles pos * inv_freq in float64; transformers rounds them to float32 first (1e-5 off at 96)
    torch.testing.assert_close(_logits(model, x, enc), _logits(model, x), rtol=1e-4, atol=1e-4)
    assert model.config._attn_implementation == "sdpa" and not isinstance(model.rotary[0][0].rotary_emb,
                                                                            hf_attention._NoRotation)  # put back


def test_reference_with_true_positions_is_the_model(model):
    x = _ids(12)
    torch.testing.assert_close(_reference_logits(model, x, lambda i, j: (i, j)), _logits(model, x), rtol=1e-4, atol=1e-4)


def test_selfextend_with_group_1_is_the_identity_on_its_explicit_path(model):
    x = _ids(2 * TRAIN)
    enc = hf_attention.build_encoding("rope-selfextend", model.config, model.rotary, TRAIN, neighbor_window=4, group=1)
    enc.set_eval_length(2 * TRAIN)
    assert enc.has_attention_logits  # the per-pair path runs, and with G = 1 it changes no position
    torch.testing.assert_close(_logits(model, x, enc), _logits(model, x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name, options, rule", [
    # Self-Extend (Jin et al. 2024): exact within W, else q at i // G + W - W // G, k at j // G
    ("rope-selfextend", {"neighbor_window": 3, "group": 2},
     lambda i, j: (i, j) if i - j < 3 else (i // 2 + 3 - 3 // 2, j // 2)),
    # ReRoPE (Su 2023): distances from w on are w: q at w, k at 0
    ("rope-rerope", {"window": 4}, lambda i, j: (i, j) if i - j < 4 else (4, 0)),
    # Leaky ReRoPE: w + (i - j - w) / k beyond w
    ("rope-leaky", {"window": 4, "slope": 4.0}, lambda i, j: (i, j) if i - j < 4 else (i / 4 + 4 * (1 - 1 / 4), j / 4)),
])
def test_fix_on_a_hugging_face_model_follows_its_papers_rule(model, name, options, rule):
    T = 14  # past the fixes' thresholds: train length 8 below
    x = _ids(T, seed=1)
    enc = hf_attention.build_encoding(name, model.config, model.rotary, 8, **options)
    enc.set_eval_length(T)
    mine = _logits(model, x, enc)
    torch.testing.assert_close(mine, _reference_logits(model, x, rule), rtol=1e-4, atol=1e-4)
    assert (mine - _logits(model, x)).abs().max() > 1e-3  # and it is not the unchanged model


def test_sinks_on_a_hugging_face_model_keep_the_first_tokens_and_a_window(model):
    """StreamingLLM (Xiao et al. 2024): query i sees keys 0 .. S-1 and its last W; in a cache of S + W, a query
    past it sits at position S + W - 1 towards sink j (at j), and recent keys keep their true distance."""
    S, W, T = 2, 6, 14
    x = _ids(T, seed=2)
    enc = hf_attention.build_encoding(f"rope+sink{S}+sw{W}", model.config, model.rotary, S + W)
    enc.set_eval_length(T)

    def rule(i, j):
        if j < S:
            return (min(i, S + W - 1), j)
        return (i, j) if i - j < W else None

    mine = _logits(model, x, enc)
    torch.testing.assert_close(mine, _reference_logits(model, x, rule), rtol=1e-4, atol=1e-4)
    assert (mine - _logits(model, x)).abs().max() > 1e-3
    assert hf_attention.is_plain_rope(enc, S + W) and not hf_attention.is_plain_rope(enc, S + W + 1)


def test_plain_rope_rule_decides_when_a_row_reuses_the_models_numbers(model):
    build = lambda name, L: hf_attention.build_encoding(name, model.config, model.rotary, L)  # noqa: E731
    se = build("rope-selfextend", TRAIN)
    for L, plain in ((TRAIN, True), (TRAIN + 1, False)):
        se.set_eval_length(L)
        assert hf_attention.is_plain_rope(se, L) is plain
    rr = build("rope-rerope", TRAIN)
    rr.set_eval_length(TRAIN)
    assert not hf_attention.is_plain_rope(rr, TRAIN)  # ReRoPE clips distances from w = L/2 on, at 1x too
    ntk = build("rope-ntk", TRAIN)
    ntk.set_eval_length(TRAIN)
    assert hf_attention.is_plain_rope(ntk, TRAIN)
    ntk.set_eval_length(2 * TRAIN)
    assert not hf_attention.is_plain_rope(ntk, 2 * TRAIN)


def test_scaled_frequencies_are_refused_for_rerouting(tokenizer, tmp_path):
    path = save_llama(tmp_path / "scaled", tokenizer, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                       "rope_theta": 10000.0})
    m = hf.HFModel(hf.resolve_model(f"hf:{path}"), device=torch.device("cpu"))
    with pytest.raises(Exception, match="not the default"):
        hf_attention.build_encoding("rope-selfextend", m.config, m.rotary, 32)


def test_every_fix_row_is_accepted_for_hugging_face_models_but_a_bare_sink():
    rows = hf_rope.parse_scalings("all,ntk,rerope,leaky,selfextend,sink4+sw60")
    hf_rope.require_hf(rows)
    with pytest.raises(Exception, match="trained without a sliding window"):
        hf_rope.require_hf(["sink4"])


def test_eval_rows_of_fixes_reuse_the_model_where_they_are_the_identity(model, tmp_path):
    out = tmp_path / "o"
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--eval-lens", "1,2x", "--eval-tokens", "128",
                 "--rope-scaling", "selfextend,rerope,sink4+sw28", "--out", str(out), "--progress", "off"]) == 0
    recs = {(r["encoding"].split("+", 1)[-1], r["eval_len"]): r for r in json.loads((out / "results.json").read_text())["records"]}
    base = {L: recs[(r, L)] for (r, L) in recs if r.startswith("hf:")}
    assert recs[("selfextend", 32)]["same_as"] and recs[("selfextend", 32)]["ppl"] == base[32]["ppl"]
    assert recs[("sink4+sw28", 32)]["same_as"]
    assert not recs[("rerope", 32)].get("same_as")  # active from w = 16 on
    for key in (("selfextend", 64), ("rerope", 64), ("sink4+sw28", 64)):
        rec = recs[key]
        assert not rec.get("same_as") and rec["ppl"] != base[64]["ppl"] and math.isfinite(rec["ppl"])
        assert rec["rerouted"]["encoding"] in ("rope-selfextend", "rope-rerope", "rope+sink4+sw28")
    assert recs[("selfextend", 64)]["rerouted"]["group"] == 3  # the smallest G with G (32 - 8) + 8 >= 64
    assert base[64]["peak_memory_bytes"] > 0 and base[64]["peak_memory_kind"] == "process peak RSS"
    assert base[64]["documents_per_window"] >= 1.0


# ---- long documents, documents per window, peak memory --------------------------------------------------

def test_document_segments_never_cross_a_document():
    docs = [torch.arange(100, 100 + n) for n in (5, 25, 9, 31)]  # with S = 10: 25 -> 2 segments, 31 -> 3
    seg = data.document_segments(docs, 10, 50)
    assert seg.shape == (5, 11)
    assert seg[0].tolist() == list(range(100, 111)) and seg[1].tolist() == list(range(110, 121))
    assert seg[2].tolist() == list(range(100, 111))  # the next long document, from its start
    with pytest.raises(data.DataError, match="hold 5 segment"):
        data.document_segments(docs, 10, 70)


def test_documents_per_window_counts_what_each_window_spans():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2]])  # (1, S + 1) with S = 8
    assert documents_per_window(doc, 8) == 3.0  # inputs are tokens 0..7: documents 0, 1, 2
    assert documents_per_window(doc, 4) == pytest.approx((2 + 2) / 2)  # [0,0,0,1], [1,2,2,2]
    assert documents_per_window(doc, 2) == pytest.approx((1 + 2 + 2 + 1) / 4)


def test_long_docs_keep_only_documents_longer_than_a_segment(model, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    for i, words in enumerate((20, 150, 30, 200)):  # 51, 431, 81, 575 tokens with the separator
        (folder / f"d{i}.txt").write_text(" ".join(f"w{k % 97}" for k in range(words)))
    out = tmp_path / "o"
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--data", str(folder / "*.txt"), "--split", "all",
                 "--long-docs", "--eval-lens", "1,8x", "--eval-tokens", "768", "--out", str(out), "--progress", "off"]) == 0
    res = json.loads((out / "results.json").read_text())
    # segments of 256 tokens: one from the 431-token document, two from the 575-token one, none from the others
    assert res["run"]["config"]["eval"]["long_docs"] and res["run"]["eval_documents"] == 2
    assert {r["documents_per_window"] for r in res["records"]} == {1.0}


def test_long_docs_without_a_long_enough_document_is_one_line_and_exit_2(model, tmp_path, capsys):
    (tmp_path / "short.txt").write_text("a few words only")
    assert main(["eval", "--model", f"hf:{model.spec.ref}", "--data", str(tmp_path / "*.txt"), "--split", "all",
                 "--long-docs", "--eval-tokens", "64", "--out", str(tmp_path / "o"), "--progress", "off"]) == 2
    err = capsys.readouterr().err.strip()
    assert "has 385 tokens (--long-docs" in err and "--split all" not in err and "\n" not in err


def test_corpus_documents_of_all_splits_and_a_bad_split():
    corpus = data.load_corpus("stdlib")
    everything = corpus.documents("all")
    assert len(everything) == sum(len(v) for v in corpus.splits.values())
    assert everything[: len(corpus.splits["test"])] == corpus.splits["test"]
    with pytest.raises(data.ConfigError, match="valid: train, valid, test, all"):
        corpus.documents("heldout")


def test_peak_memory_sees_a_large_allocation():
    with peak_memory(torch.device("cpu")) as mem:
        big = torch.ones(64 << 20, dtype=torch.float32)  # 256 MiB, touched
        big += 1
    del big
    if mem["peak_memory_bytes"] is None:
        pytest.skip("no /proc/self/clear_refs here")
    assert mem["peak_memory_kind"] == "process peak RSS" and mem["peak_memory_bytes"] >= 256 << 20
