import pytest
import torch

from posenc_bench.model.attention import AttentionPlan, fold_bias, fold_channels
from posenc_bench.model.transformer import DecoderLM, ModelConfig


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


def assert_matches_reference_attention(model: DecoderLM, x: torch.Tensor, window, grad_atol: float) -> dict:
    """The model's logits (atol 2e-5) and every parameter's gradient of mean(logits^2) equal those of the
    textbook attention; returns the model's own gradients."""
    ours = model(x)
    ours.square().mean().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    ref = reference_attention(model, x, window)
    ref.square().mean().backward()
    assert torch.allclose(ours, ref, atol=2e-5), (ours - ref).abs().max()
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=grad_atol, rtol=1e-4), (n, (grads[n] - p.grad).abs().max())
    return grads


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
    plan = AttentionPlan(DecoderLM(cfg, "t5", 16).encoding, pos, None, 4 * 4 * 64 * 10)
    assert not plan.fused and not plan.folded
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


def test_alibi_is_folded_into_qk_channels_and_builds_no_bias():
    cfg = ModelConfig(d_model=32, n_layers=1, n_heads=4)
    plan = AttentionPlan(DecoderLM(cfg, "alibi", 16).encoding, torch.arange(1200), None, 64 << 20)
    assert plan.folded and not plan.fused
    assert [c[:2] for c in plan.chunks][:2] == [(0, 256), (256, 512)]  # FOLD_ROWS queries each
    assert plan.mask(0, torch.float32) is None  # square causal chunk: SDPA's own causal mask
    assert plan.mask(1, torch.float32).shape == (1, 1, 256, 512)  # causal only: no per-head bias


@pytest.mark.parametrize("budget,shared", [(64 << 20, True), (256 * 1024 * 4, False)])
def test_chunk_masks_are_shared_by_the_layers_only_within_the_memory_budget(budget, shared):
    # 1200 positions in 256-row chunks: the 4 masked chunks need 256 x (512 + 768 + 1024 + 1200) x 4 bytes = 3.5 MiB
    plan = AttentionPlan(DecoderLM(ModelConfig(d_model=32, n_layers=1, n_heads=4), "alibi", 16).encoding,
                         torch.arange(1200), None, budget)
    first = [plan.mask(i, torch.float32) for i in range(1, len(plan.chunks))]
    again = [plan.mask(i, torch.float32) for i in range(1, len(plan.chunks))]
    assert all((a is b) == shared for a, b in zip(first, again))  # the next layer gets the same tensors, or new ones
    assert all(torch.equal(a, b) for a, b in zip(first, again))
    assert len(plan._masks) == (4 if shared else 0)


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("fold_rows", [512, 8])  # one chunk / many
def test_folded_alibi_matches_the_explicit_bias_forward_and_gradients(monkeypatch, window, fold_rows):
    monkeypatch.setattr(AttentionPlan, "FOLD_ROWS", fold_rows)
    cfg = ModelConfig(d_model=48, n_layers=2, n_heads=6)  # 6 heads: slopes that are not powers of two
    model = DecoderLM(cfg, "alibi", 16, window=window, seed=3)
    x = torch.randint(0, 256, (2, 40))
    assert_matches_reference_attention(model, x, window, grad_atol=1e-6)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.bfloat16, 1e-5)])
def test_folded_alibi_keeps_precision_at_long_lengths(dtype, tol):
    """At 8192 tokens with 16 heads (slopes up to 0.71) the folded logits give the attention weights of
    the exact float64 bias within 1e-5 (measured 2.6e-6; 4.7e-5 with 512-row chunks), also when q and k are
    bf16 (the bias channel is split into high and low parts)."""
    H, D, T = 16, 8, 8192
    plan = AttentionPlan(DecoderLM(ModelConfig(d_model=H * D, n_layers=1, n_heads=H), "alibi", 16).encoding,
                         torch.arange(T), None, 64 << 20)
    i = len(plan.chunks) - 2
    qs, qe, ks = plan.chunks[i]
    torch.manual_seed(0)
    q, k = torch.randn(1, H, qe - qs, D).to(dtype), torch.randn(1, H, qe - ks, D).to(dtype)
    scale = D**-0.5
    qa, ka = fold_bias(plan, i, q, k, scale)
    assert qa.shape[-1] == ka.shape[-1] == D + fold_channels(plan, D, dtype)  # v gets as many zero channels
    rows = [0, 127, qe - qs - 1]  # first, middle, last query of the chunk
    folded = (qa[0, :, rows].float() @ ka[0].float().transpose(-1, -2)) * scale  # (H, 3, k), float32
    qpos = torch.arange(qs, qe)[rows]
    rel = (torch.arange(ks, qe)[None, :] - qpos[:, None]).double()
    exact = (q[0, :, rows].double() @ k[0].double().transpose(-1, -2)) * scale + plan.encoding.slopes.double()[:, None, None] * rel
    causal = torch.where(rel <= 0, 0.0, float("-inf"))
    p_folded = (folded.double() + causal).softmax(-1)
    p_exact = (exact + causal).softmax(-1)
    assert (p_folded - p_exact).abs().max() < tol


@pytest.mark.parametrize("window,max_mask_bytes,bias_rows", [(None, 64 << 20, 512), (None, 64 << 20, 40), (None, 4096, 512),
                                                             (9, 64 << 20, 512), (200, 64 << 20, 64)])
def test_t5_training_path_matches_sdpa_forward_and_gradients(monkeypatch, window, max_mask_bytes, bias_rows):
    """The flash + band-gradient path for a learned distance bias (training on CPU) equals the textbook
    attention: logits and the gradients of every parameter, the T5 table included (300 tokens: far past
    max_distance=128, so the shared last bucket gets its gradient from the row-sum identity)."""
    monkeypatch.setattr(AttentionPlan, "BIAS_ROWS", bias_rows)
    monkeypatch.setattr(AttentionPlan, "BAND_MIN", 2)  # 300 tokens >= 2 x 128: the band path
    cfg = ModelConfig(d_model=32, n_layers=2, n_heads=4)
    model = DecoderLM(cfg, "t5", 16, window=window, seed=1, max_mask_bytes=max_mask_bytes)
    x = torch.randint(0, 256, (2, 300))
    plan = AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes)
    assert plan.distance_bias is not None  # grad enabled on CPU: the band path
    assert AttentionPlan(model.encoding, torch.arange(200), window, max_mask_bytes).distance_bias is None  # short
    with torch.no_grad():
        assert AttentionPlan(model.encoding, torch.arange(300), window, max_mask_bytes).distance_bias is None
    grads = assert_matches_reference_attention(model, x, window, grad_atol=1e-7)
    assert grads["encoding.relative_attention_bias.weight"].abs().sum() > 0
