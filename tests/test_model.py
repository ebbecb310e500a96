import pytest
import torch

from posenc_bench.model import AttentionPlan, DecoderLM, ModelConfig


def reference_attention(model: DecoderLM, x: torch.Tensor, window=None) -> torch.Tensor:
    """The straightforward version: one full (1, H, T, T) mask, per-layer softmax by hand."""
    B, T = x.shape
    enc = model.encoding
    pos = torch.arange(T)
    h = enc.embed(model.tok_emb(x), pos)
    rel = pos[None, :] - pos[:, None]
    allowed = rel <= 0 if window is None else (rel <= 0) & (rel > -window)
    bias = enc.bias(pos, pos)
    mask = torch.zeros(1, 1, T, T) if bias is None else bias
    mask = mask.masked_fill(~allowed, float("-inf"))
    for block in model.blocks:
        a = block.attn
        y = block.ln1(h)
        q, k, v = a.qkv(y).split(h.shape[-1], dim=2)
        q, k, v = (t.view(B, T, a.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        q, k = enc.rotate(q, k, pos)
        att = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5 + mask
        y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, -1)
        h = h + a.proj(y)
        h = h + block.mlp(block.ln2(h))
    return model.lm_head(model.ln_f(h))


@pytest.mark.parametrize("name", ["nope", "rope", "alibi", "t5", "sinusoidal"])
@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("max_mask_bytes", [64 << 20, 1024])  # one chunk / many query chunks
def test_sdpa_paths_match_the_textbook_attention(name, window, max_mask_bytes):
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, name, 16, window=window, seed=1, max_mask_bytes=max_mask_bytes).eval()
    x = torch.randint(0, 256, (2, 48))
    with torch.no_grad():
        ours = model(x)
        ref = reference_attention(model, x, window)
    assert torch.allclose(ours, ref, atol=2e-5), (ours - ref).abs().max()


def test_plan_uses_fused_causal_path_only_without_bias_and_window():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    pos = torch.arange(64)
    assert AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, None, 1 << 20).fused
    assert not AttentionPlan(DecoderLM(cfg, "rope", 16).encoding, pos, 8, 1 << 20).fused
    plan = AttentionPlan(DecoderLM(cfg, "alibi", 16).encoding, pos, None, 4 * 4 * 64 * 10)
    assert not plan.fused
    assert [c[0] for c in plan.chunks] == list(range(0, 64, 10))  # 10 query rows per chunk fit the budget
    mask = plan.mask(1, torch.float32)
    assert mask.shape == (1, 4, 10, 20) and mask.dim() == 4  # 4-D: SDPA's fused CPU kernel, not math


def test_chunked_mask_memory_is_bounded():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    enc = DecoderLM(cfg, "t5", 16).encoding
    plan = AttentionPlan(enc, torch.arange(2048), None, 1 << 20)
    biggest = max(plan.mask(i, torch.float32).numel() * 4 for i in range(len(plan.chunks)))
    assert biggest <= 1 << 20  # vs 4 * 2048 * 2048 * 4 = 64 MiB for the full matrix


def test_sliding_window_sees_only_the_last_w_tokens():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    model = DecoderLM(cfg, "nope", 16, window=4).eval()
    x = torch.randint(0, 256, (1, 20))
    y = x.clone()
    y[0, :12] = torch.randint(0, 256, (12,))  # change everything before position 12
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.equal(a[0, 15:], b[0, 15:])  # one layer: position 15 sees 12..15 only
    assert not torch.equal(a[0, 14], b[0, 14])


def test_heads_must_divide_width():
    from posenc_bench.errors import ConfigError

    with pytest.raises(ConfigError, match="n_heads=3 does not divide model.d_model=32"):
        DecoderLM(ModelConfig(d_model=32, n_heads=3), "nope", 16)
    with pytest.raises(ConfigError, match="even head dimension"):
        DecoderLM(ModelConfig(d_model=36, n_heads=4), "rope", 16)
