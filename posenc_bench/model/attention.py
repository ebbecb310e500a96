"""How one forward pass runs attention: ``attend`` runs each layer's query chunks along the path its
``AttentionPlan`` (``plan.py``) chose, through one table, ``PATHS``. The fused, mask, folded and distance-bias
paths are here (the folded bias: ``fold_bias``); the explicit-logits paths live in ``explicit.py``, the
attention-sinks path in ``sinks.py``, a learned bias's training kernel in ``distance_bias.py``, the
FlexAttention path (CUDA) in ``flex.py``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.model import distance_bias, explicit, flex, sinks
from posenc_bench.model.plan import AttentionPlan, Chunk

__all__ = ["PATHS", "AttentionPlan", "Chunk", "attend", "bias_kernel_attention", "fold_bias", "fold_channels",
           "folded_attention", "sdpa_attention"]


def _fold_parts(dtype: torch.dtype) -> int:
    return 2 if dtype.itemsize >= 4 else 3  # float32: 2 parts; bf16/fp16: 3


def _bias_factors(plan: AttentionPlan, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    if i not in plan.factors:  # float64 factors, shared by all layers of this forward
        plan.factors[i] = plan.encoding.bias_factors(*plan.chunk_positions(i))
    return plan.factors[i]  # (H, q, E), (H or B, H, k, E)


def fold_channels(plan: AttentionPlan, head_dim: int, dtype: torch.dtype) -> int:
    """How many channels ``fold_bias`` appends to q, k and v for this head dimension."""
    E2 = _bias_factors(plan, 0)[0].shape[-1] * _fold_parts(dtype)
    return E2 + (-(head_dim + E2) % 8)


def fold_bias(plan: AttentionPlan, i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Append the encoding's bias factors to chunk i's q (B, H, q, D) and k (B, H, k, D), so that
    scale * q' . k' = scale * q . k + bias + a per-query constant, and as many zero channels to v (SDPA's fused
    kernels need one head dimension). Each key factor is split into a high part in q's dtype and rounding rests
    (2 parts in float32, 3 in bf16), so the bias keeps at least float32 precision; channels are padded to a
    multiple of 8 for the GPU kernels."""
    qf, kf = _bias_factors(plan, i)  # (H, q, E), (H, k, E) or (B, H, k, E) for per-sequence positions
    parts, rest = [], kf / scale
    for _ in range(_fold_parts(k.dtype)):
        parts.append(rest.to(k.dtype))
        rest = rest - parts[-1].double()
    qx = torch.cat([qf] * len(parts), -1).to(q.dtype)  # (H, q, parts * E)
    kx = torch.cat(parts, -1)  # (H, k, parts * E)
    channels = fold_channels(plan, q.shape[-1], q.dtype)
    pad = channels - qx.shape[-1]
    B = q.shape[0]
    q = torch.cat((q, F.pad(qx, (0, pad)).expand(B, -1, -1, -1)), -1)  # (B, H, q, D + channels)
    k = torch.cat((k, F.pad(kx, (0, pad)).expand(B, -1, -1, -1)), -1)  # (B, H, k, D + channels)
    return q, k, F.pad(v, (0, channels))


def sdpa_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """The fused and mask paths: SDPA on the chunk, with its own causal mask where the chunk needs no other."""
    return F.scaled_dot_product_attention(c.q, c.k, c.v, attn_mask=c.mask, is_causal=c.mask is None, scale=c.scale)


def folded_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """The folded path: SDPA on the chunk with the bias folded into q and k -> (B, H, q, D + extra channels)."""
    q, k, v = fold_bias(plan, c.i, c.q, c.k, c.v, c.scale)
    return sdpa_attention(plan, c._replace(q=q, k=k, v=v))


def bias_kernel_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """The distance_bias and bias_grad paths: the flash kernel, and the bias gradient from dS, into the distance
    table r where the plan has one, else into the chunk's mask."""
    qs, _, ks = plan.chunks[c.i]
    positions = plan.chunk_positions(c.i) if plan.pos.dim() == 2 else None  # (B, q), (B, k): +rand
    return distance_bias.bias_attention(c.q, c.k, c.v, c.mask, c.scale, qs, ks, r=plan.distance_bias, positions=positions)


# What each path runs for one chunk: the one place attend looks at the plan's path.
PATHS = {"fused": sdpa_attention, "mask": sdpa_attention, "folded": folded_attention,
         "distance_bias": bias_kernel_attention, "bias_grad": bias_kernel_attention,
         "logits": explicit.explicit_attention, "parts": explicit.parts_attention, "sinks": sinks.sink_attention,
         "flex": flex.flex_attention_path}


# The paths whose own matmuls read each chunk's q, k, v as (B H, n, D) batches: (B, H, T, D) contiguous, a
# chunk's keys (a slice along T) merge their batch and head dimensions without a copy
CONTIGUOUS_PATHS = ("logits", "distance_bias", "bias_grad")


def attend(encoding: encodings.Encoding, plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Attention of one layer along ``plan``: q, k, v (B, H, T, D) before the encoding's rotation -> (B, H, T, D).

    Our model calls it, and so does a Hugging Face model's attention rerouted through an encoding of ours
    (``hf/attention.py``), so both run the same chunks, masks and per-pair positions."""
    D = q.shape[-1]
    raw = q, k  # the sink path rotates queries again, at their cache positions
    q, k = encoding.rotate(q, k, plan.pos)
    if plan.path in CONTIGUOUS_PATHS:  # one copy per layer, not one per chunk and matmul of strided views
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    path = PATHS[plan.path]
    outs = []
    for i, (qs, qe, _) in enumerate(plan.chunks):
        mask = plan.mask(i, q.dtype)  # None (a causal chunk) or (1 or B, H or 1, qe - qs, p + qe - ks)
        chunk = Chunk(i, q[:, :, qs:qe], plan.chunk_keys(i, k, 2), plan.chunk_keys(i, v, 2), mask, scale, raw,
                      encoding)
        outs.append(path(plan, chunk)[..., :D])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, T, D)
