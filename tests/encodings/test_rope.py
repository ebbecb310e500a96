import math

import pytest
import torch

from posenc_bench import encodings
from posenc_bench.encodings.rope import RoPE, default_inv_freq, rope_cos_sin
from posenc_bench.encodings.rope_scaling import linear_inv_freq


def test_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    enc = RoPE(d_model=64, n_heads=2, train_len=64)
    q = torch.randn(1, 2, 1, 32).expand(1, 2, 200, 32).contiguous()
    k = torch.randn(1, 2, 1, 32).expand(1, 2, 200, 32).contiguous()
    qr, kr = enc.rotate(q, k, torch.arange(200))
    scores = qr @ kr.transpose(-1, -2)  # (1, 2, 200, 200)
    for delta in (0, 3, 17, 150):
        diag = torch.diagonal(scores, offset=-delta, dim1=-2, dim2=-1)  # all (m, m - delta)
        assert torch.allclose(diag, diag[..., :1].expand_as(diag), atol=1e-3), delta
    assert not torch.allclose(scores[0, 0, 10, 0], scores[0, 0, 10, 5])


def test_rotation_preserves_norm():
    enc = RoPE(d_model=32, n_heads=2, train_len=8)
    q, k = torch.randn(2, 2, 50, 16), torch.randn(2, 2, 50, 16)
    qr, kr = enc.rotate(q, k, torch.arange(50))
    assert torch.allclose(qr.norm(dim=-1), q.norm(dim=-1), atol=1e-5)


def test_matches_transformers_llama_rotary():
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=16, max_position_embeddings=128)
    hf = LlamaRotaryEmbedding(cfg)
    ours = RoPE(d_model=64, n_heads=4, train_len=128)
    assert torch.allclose(ours.inv_freq, hf.inv_freq, rtol=0, atol=0)
    q, k = torch.randn(2, 4, 40, 16), torch.randn(2, 4, 40, 16)
    pos = torch.arange(40)
    cos, sin = hf(q, pos[None])
    hq, hk = apply_rotary_pos_emb(q, k, cos, sin)
    oq, ok = ours.rotate(q, k, pos)
    assert torch.allclose(oq, hq, atol=1e-6) and torch.allclose(ok, hk, atol=1e-6)


@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0])
def test_linear_scaling_is_default_over_factor_and_matches_transformers(factor):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    base, _ = default_inv_freq(32, 10000.0)
    scaled, scale = linear_inv_freq(32, 10000.0, factor, original_len=64)
    assert scale == 1.0
    assert torch.allclose(scaled, base / factor, rtol=1e-6)
    cfg = LlamaConfig(hidden_size=128, num_attention_heads=4, max_position_embeddings=64,
                      rope_parameters={"rope_type": "linear", "factor": factor, "rope_theta": 10000.0})
    hf_freq, _ = ROPE_INIT_FUNCTIONS["linear"](cfg, "cpu")
    assert torch.allclose(scaled, hf_freq, rtol=0, atol=0)


def test_rope_linear_positions_are_interpolated():
    """At factor f, position f*m of rope-linear is rotated exactly like position m of rope."""
    plain = RoPE(d_model=32, n_heads=2, train_len=16)
    pi = encodings.build("rope-linear", d_model=32, n_heads=2, train_len=16)
    pi.set_eval_length(64)  # factor 4
    q, k = torch.randn(1, 2, 64, 16), torch.randn(1, 2, 64, 16)
    pq, _ = pi.rotate(q, k, torch.arange(64))
    rq, _ = plain.rotate(q[:, :, ::4], k[:, :, ::4], torch.arange(16))
    assert torch.allclose(pq[:, :, ::4], rq, atol=1e-5)
    pi.set_eval_length(16)  # factor back to 1: identical to rope
    assert torch.equal(pi.rotate(q, k, torch.arange(64))[0], plain.rotate(q, k, torch.arange(64))[0])
    pi.set_eval_length(8)  # shorter than train: never compress below factor 1
    assert torch.equal(pi.inv_freq, plain.inv_freq)


def test_cos_sin_angles():
    inv, scale = default_inv_freq(8)
    cos, sin = rope_cos_sin(torch.tensor([0, 7]), inv, scale)
    assert torch.equal(cos[0], torch.ones(8)) and torch.equal(sin[0], torch.zeros(8))
    assert math.isclose(float(sin[1, 0]), math.sin(7.0), rel_tol=1e-6)
    assert math.isclose(float(cos[1, 5]), math.cos(7.0 * 10000 ** (-2 / 8)), rel_tol=1e-6)


def test_odd_head_dim_is_refused():
    with pytest.raises(ValueError, match="even head dimension"):
        RoPE(d_model=36, n_heads=4, train_len=8)


def float64_cos_sin(pos, inv_freq, scale=1.0):
    angles = pos.double()[:, None] * inv_freq.double()[None, :]
    angles = torch.cat((angles, angles), -1)
    return angles.cos() * scale, angles.sin() * scale


@pytest.mark.parametrize("start", [0, 5])
def test_cos_sin_cache_is_exact_to_float32_rounding_at_long_lengths(start):
    inv, _ = default_inv_freq(128)
    pos = torch.arange(start, start + 8192)
    cos, sin = rope_cos_sin(pos, inv, 1.0)
    ref_cos, ref_sin = float64_cos_sin(pos, inv)
    assert cos.shape == sin.shape == (8192, 128) and cos.dtype == torch.float32
    assert (cos.double() - ref_cos).abs().max() < 3e-7 and (sin.double() - ref_sin).abs().max() < 3e-7
    # transformers' float32 angles are off by ~2e-4 at these positions; ours are not
    angles32 = pos.float()[:, None] * inv[None, :]
    assert (angles32.cos().double() - ref_cos[:, :64]).abs().max() > 1e-4


def test_cos_sin_of_any_positions_and_attention_scale():
    inv, _ = default_inv_freq(16)
    pos = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])  # not consecutive: the direct path
    cos, sin = rope_cos_sin(pos, inv, 0.75)
    ref_cos, ref_sin = float64_cos_sin(pos, inv, 0.75)
    assert (cos.double() - ref_cos).abs().max() < 1e-7 and (sin.double() - ref_sin).abs().max() < 1e-7
    cos, sin = rope_cos_sin(torch.arange(100), inv, 0.75)  # the angle-addition path scales the same way
    ref_cos, ref_sin = float64_cos_sin(torch.arange(100), inv, 0.75)
    assert (cos.double() - ref_cos).abs().max() < 3e-7 and (sin.double() - ref_sin).abs().max() < 3e-7


def test_fused_rotation_equals_the_textbook_formula_forward_and_backward():
    from posenc_bench.encodings.rope import apply_rotary, rope_cos_sin_halves, rotate_half

    inv, _ = default_inv_freq(16)
    cos, sin = rope_cos_sin_halves(torch.arange(30), inv, 1.0)
    full_cos, full_sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    x = torch.randn(2, 3, 30, 16, requires_grad=True)
    g = torch.randn(2, 3, 30, 16)
    ours = apply_rotary(x, cos, sin)
    (gx,) = torch.autograd.grad(ours, x, g)
    ref = x * full_cos + rotate_half(x) * full_sin
    (gref,) = torch.autograd.grad(ref, x, g)
    assert torch.allclose(ours, ref, atol=1e-6) and torch.allclose(gx, gref, atol=1e-6)
    xd = torch.randn(1, 2, 5, 16, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(apply_rotary, (xd, cos[:5].double(), sin[:5].double()))
    # a strided view (what the model passes: q from the fused qkv projection) rotates the same
    qkv = torch.randn(2, 30, 3, 3, 16)
    q = qkv[:, :, 0].transpose(1, 2)  # (2, 3, 30, 16), not contiguous
    assert torch.allclose(apply_rotary(q, cos, sin), apply_rotary(q.contiguous(), cos, sin))
