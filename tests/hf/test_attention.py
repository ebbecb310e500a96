"""Zero-shot fixes on a Hugging Face model: its attention rerouted through our encodings (hf/attention.py).

The reference for each fix is written out here from its paper's rule with transformers' own rotary module and
``apply_rotary_pos_emb``, independently of our encodings' code."""

import copy

import pytest
import torch

from posenc_bench.hf import attention as hf_attention
from posenc_bench.hf import model as hf

from tests.hf.hf_tiny import save_llama

TRAIN = 32  # the tiny model's max_position_embeddings


@pytest.fixture
def model(hf_model):
    """The session's tiny Llama (tests/conftest.py), under the name these tests use."""
    return hf_model


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
    # STRING (An et al. 2024): distances from S on are d - S + W: q at i - S + W, k at j (factor 1: the rule alone)
    ("rope-string", {"shift": 5, "local_window": 2, "attention_factor": 1.0},
     lambda i, j: (i, j) if i - j < 5 else (i - 5 + 2, j)),
])
def test_fix_on_a_hugging_face_model_follows_its_papers_rule(model, name, options, rule):
    T = 14  # past the fixes' thresholds: train length 8 below
    x = _ids(T, seed=1)
    enc = hf_attention.build_encoding(name, model.config, model.rotary, 8, **options)
    enc.set_eval_length(T)
    mine = _logits(model, x, enc)
    torch.testing.assert_close(mine, _reference_logits(model, x, rule), rtol=1e-4, atol=1e-4)
    assert (mine - _logits(model, x)).abs().max() > 1e-3  # and it is not the unchanged model


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
@pytest.mark.parametrize("name, options", [("rope-rerope", {}), ("rope-leaky", {}), ("rope-selfextend", {})])
@pytest.mark.parametrize("T, max_bytes", [(14, 1 << 30), (512, 1 << 30), (2048, 1 << 20)])  # 1 MiB: many chunks
def test_a_fix_rerouted_on_cuda_is_the_cpus(model, monkeypatch, name, options, T, max_bytes):
    """The rerouted fixes on CUDA (the explicit log-sum-exp there, SDPA's flash kernel on the CPU) give the CPU's
    logits, in one chunk and in many: an H200 scored SmolLM2's ReRoPE row 1.6-4.2% worse than the CPU did
    (results/timing-gpu), with a cause not yet found."""
    monkeypatch.setattr(hf_attention, "MAX_LOGIT_BYTES", max_bytes)
    gpu = copy.deepcopy(model)
    gpu.model.to("cuda")
    x = _ids(T, seed=3)
    out = []
    for m, xs in ((model, x), (gpu, x.cuda())):
        enc = hf_attention.build_encoding(name, m.config, m.rotary, TRAIN, **options)
        enc.set_eval_length(T)
        out.append(_logits(m, xs, enc).float().cpu())
    torch.testing.assert_close(out[1], out[0], rtol=1e-4, atol=1e-4)


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
    assert not hf_attention.is_plain_rope(rr, TRAIN)  # ReRoPE clips distances from w = L/8 on, at 1x too
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
