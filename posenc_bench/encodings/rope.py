"""Rotary position embeddings.

- ``rope``: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (arXiv:2104.09864).
  q and k are rotated by position-dependent angles pos * inv_freq, so q_m . k_n depends only on m - n.
  We use the half-split layout of GPT-NeoX / Llama (``rotate_half``), a fixed permutation of the paper's
  interleaved pairs, so our rotation can be checked against transformers' ``apply_rotary_pos_emb``.

The scalings of the trained ``rope`` model (position interpolation ``rope-linear``, NTK, dynamic NTK, YaRN,
Llama 3 and their fine-tuned rows) are one table of frequency functions in ``rope_scaling.py``; they only
change ``inv_freq`` and ``attention_scale`` of this class.
"""

from __future__ import annotations

from typing import Optional

import torch

from posenc_bench.encodings.base import Encoding, consecutive_start
from posenc_bench.encodings.registry import register
from posenc_bench.encodings.phasors import unit_phasors


def default_inv_freq(head_dim: int, theta: float = 10000.0) -> tuple[torch.Tensor, float]:
    """RoFormer's frequencies theta^(-2i/d), i = 0 .. d/2 - 1, and attention scale 1."""
    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got head_dim={head_dim}")
    exponent = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    return 1.0 / (theta**exponent), 1.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin_halves(pos: torch.Tensor, inv_freq: torch.Tensor, attention_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, D/2) for positions pos (T,), times attention_scale: the distinct values of the
    rotation (the half-split layout repeats them in both halves).

    The angles pos * inv_freq are exact (float64) for the float32 frequencies: transformers rounds them to
    float32 first (off by up to 2.4e-4 at position 8192); here every value is within 3e-7 of the exact one.
    Consecutive positions (what the model passes) take the angle-addition path of ``phasors.unit_phasors``,
    several times faster than evaluating cos and sin per element; other positions are evaluated directly.
    """
    T = pos.shape[0]
    start = consecutive_start(pos)
    if start is not None:
        pairs = unit_phasors(T, inv_freq, start=start, scale=attention_scale, device=pos.device)  # (T, D/2, 2)
    else:
        angles = pos.to(torch.float64)[:, None] * inv_freq.to(pos.device, torch.float64)[None, :]  # (T, D/2)
        pairs = (torch.stack((angles.cos(), angles.sin()), -1) * attention_scale).to(torch.float32)
    planar = pairs.permute(2, 0, 1).contiguous()  # (2, T, D/2): cos, sin
    return planar[0], planar[1]


def rope_cos_sin(pos: torch.Tensor, inv_freq: torch.Tensor, attention_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape (T, D) in transformers' layout (both halves equal); see rope_cos_sin_halves."""
    cos, sin = rope_cos_sin_halves(pos, inv_freq, attention_scale)
    return torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)


def _rotate_into(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, sign: float) -> torch.Tensor:
    """(x1 cos - sign x2 sin, x2 cos + sign x1 sin) for the halves x1, x2 of x (..., T, D); cos, sin (T, D/2).
    Four fused kernels writing straight into the output, no temporaries. Under ``torch.compile`` (which cannot
    trace ``out=`` into a strided half) the same products as one expression, which the compiler fuses itself."""
    x1, x2 = x.chunk(2, dim=-1)
    if torch.compiler.is_compiling():
        return torch.cat((x1 * cos - sign * (x2 * sin), x2 * cos + sign * (x1 * sin)), dim=-1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    o1, o2 = out.chunk(2, dim=-1)
    torch.mul(x1, cos, out=o1)
    o1.addcmul_(x2, sin, value=-sign)
    torch.mul(x2, cos, out=o2)
    o2.addcmul_(x1, sin, value=sign)
    return out


class _Rotary(torch.autograd.Function):
    """x * cos + rotate_half(x) * sin (transformers' apply_rotary_pos_emb) as one linear map whose backward
    is the same rotation by the opposite angle: 4 kernels each way instead of ~10 with their temporaries."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(cos, sin)
        return _rotate_into(x, cos, sin, 1.0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        cos, sin = ctx.saved_tensors
        return _rotate_into(grad, cos, sin, -1.0), None, None


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (..., T, D) by the angles whose cos, sin (T, D/2) are given (half-split layout)."""
    return _Rotary.apply(x, cos, sin)


@register("rope")
class RoPE(Encoding):
    summary = "rotary embeddings on q and k; Su et al. 2021"
    family = "rotary"
    paper = "Su et al. 2021, RoFormer (arXiv:2104.09864)"
    batched_positions = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.theta = theta
        inv_freq, scale = default_inv_freq(self.head_dim, theta)
        self._set_frequencies(inv_freq, scale)

    def _set_frequencies(self, inv_freq: torch.Tensor, attention_scale: float) -> None:
        self.inv_freq = inv_freq
        self.attention_scale = attention_scale
        self._cache: Optional[tuple[tuple, torch.Tensor, torch.Tensor]] = None
        self._batched_cache: Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = None

    def cos_sin(self, pos: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin (T, D/2) for (T,) positions, (B, 1, T, D/2) for (B, T) ones; cached for consecutive
        positions and per-sequence ones (by identity): every layer rotates with the same ones."""
        if pos.dim() == 2:  # per-sequence positions (+rand in training): new each forward, cached by identity
            cached = self._batched_cache
            if cached is None or cached[0] is not pos or cached[1].dtype != dtype:
                B, T = pos.shape
                cos, sin = rope_cos_sin_halves(pos.reshape(-1), self.inv_freq, self.attention_scale)  # (B T, D/2)
                cos, sin = (t.view(B, 1, T, -1).to(dtype) for t in (cos, sin))  # -> (B, 1, T, D/2)
                self._batched_cache = cached = (pos, cos, sin)
            return cached[1], cached[2]
        start = consecutive_start(pos)
        if start is None:  # other positions (a query's cache position towards attention sinks): not cached
            cos, sin = rope_cos_sin_halves(pos, self.inv_freq, self.attention_scale)
            return cos.to(dtype), sin.to(dtype)
        key = (pos.shape[0], start, pos.device, dtype)
        if self._cache is None or self._cache[0] != key:
            cos, sin = rope_cos_sin_halves(pos, self.inv_freq, self.attention_scale)
            self._cache = (key, cos.to(dtype), sin.to(dtype))
        return self._cache[1], self._cache[2]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = self.cos_sin(pos, q.dtype)  # (T, D/2) or (B, 1, T, D/2), broadcast over (B, H)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
