"""The textbook attention the model's paths are checked against: one full (1, H, T, T) mask, softmax by hand."""

import torch

from posenc_bench.model.transformer import DecoderLM


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
