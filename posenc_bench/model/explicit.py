"""The explicit-logits paths: attention whose pre-softmax logits the encoding computes itself.

An encoding with ``has_attention_logits`` does not fit "q . k plus a bias that reads positions only": CoPE
(Golovneva et al. 2024, arXiv:2405.18719) counts positions from q . k itself; ReRoPE (Su 2023), Leaky ReRoPE
and Self-Extend (Jin et al., ICML 2024, arXiv:2401.01325) rotate each query-key pair by its own clipped or grouped
distance. Both paths run per query chunk, so memory stays bounded by the chunk size at any length:

- logits (``explicit_attention``): softmax of the chunk's whole (B, H, q, k) logits from
  ``encoding.attention_logits``, @ v; or, for an encoding with ``has_attention_output``, its own
  ``attention_output`` of the same values (CoPE's, with a hand-written backward).
- parts (``parts_attention``, for an encoding with ``has_attention_parts``): the same attention as a few plain
  attentions over disjoint sets of pairs (within and beyond a distance, for ReRoPE and Self-Extend), each on
  SDPA's kernel where it has one (``attention_lse``), merged exactly by their log-sum-exp: no (q, k) logits.
"""

from __future__ import annotations

import torch

from posenc_bench.model import flex, plan as attention_plan
from posenc_bench.model.plan import AttentionPlan, Chunk


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T scale + mask) @ v (B, H, q, D), its log-sum-exp (B, H, q) in float32): SDPA's CPU flash
    kernel in float32 inference, FlexAttention where the plan runs it (``flex.attention_lse``: no (q, k)
    logits, gradients included), else explicitly. A row with no visible key has lse -inf (the flash kernel
    says 0 there, with an output of zeros)."""
    if q.device.type in attention_plan.FLEX_DEVICES:
        return flex.attention_lse(q, k, v, mask, scale)
    if (q.device.type == "cpu" and q.dtype == torch.float32 and not torch.is_grad_enabled()
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse.masked_fill(~torch.isfinite(mask).any(-1), float("-inf"))
    logits = (q @ k.transpose(-1, -2)).float() * scale + mask  # (B, H, q, n)
    lse = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits - lse[..., None]).nan_to_num(0.0).to(v.dtype) @ v, lse


def parts_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """What ``explicit_attention`` computes, from ``encoding.attention_parts``: each part one attention over
    its pairs (the chunk's mask, -inf elsewhere), merged exactly: softmax over the union of disjoint sets is
    sum_p exp(lse_p - m) out_p / sum_p exp(lse_p - m), m the largest lse."""
    q_pos, k_pos = plan.chunk_positions(c.i)
    outs, lses = [], []
    encoding = plan.encoding if c.encoding is None else c.encoding  # the layer's view (Encoding.for_layer)
    for qp, kp, first, pairs in encoding.attention_parts(c.q, c.k, q_pos, k_pos):
        n = kp.shape[-2]
        part_mask = c.mask[..., first:first + n].masked_fill(~pairs, float("-inf"))  # (1, H or 1, q, n)
        out, lse = attention_lse(qp, kp, c.v[..., first:first + n, :], part_mask, c.scale)
        outs.append(out)
        lses.append(lse.float())
    top = torch.stack(lses).amax(0)  # (B, H, q): every query sees at least itself in some part
    num = torch.zeros(outs[0].shape, dtype=torch.float32, device=c.q.device)
    den = torch.zeros(top.shape, dtype=torch.float32, device=c.q.device)
    for out, lse in zip(outs, lses):
        w = torch.exp(lse - top)  # 0 for a query with no pair in this part (its out may be NaN there)
        num += torch.where(w[..., None] > 0, out.float(), 0.0) * w[..., None]
        den += w
    return (num / den[..., None]).to(c.v.dtype)


def explicit_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """softmax(encoding.attention_logits(...)) @ v for chunk ``c``: q (B, H, q, D), k, v (B, H, k, D), the mask
    holding the causal/window/sink set and any bias."""
    q_pos, k_pos = plan.chunk_positions(c.i)
    encoding = plan.encoding if c.encoding is None else c.encoding  # the layer's view (Encoding.for_layer)
    if encoding.has_attention_output:  # the same values by the encoding's own route (CoPE's backward)
        return encoding.attention_output(c.q, c.k, c.v, q_pos, k_pos, c.mask, c.scale)
    logits = encoding.attention_logits(c.q, c.k, q_pos, k_pos, c.mask, c.scale)  # (B, H, q, k), -inf: unseen
    return torch.softmax(logits.float(), dim=-1).to(c.v.dtype) @ c.v
