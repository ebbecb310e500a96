"""Training attention with a learned bias that depends only on the distance i - j and is constant past a
band (T5's relative buckets), on SDPA's flash kernel instead of its materialising math path.

CPU SDPA has no flash kernel for a mask that requires grad, so a learned bias sends training to the math
path (the full (B, H, T, T) probabilities are built and saved). Here the forward and the q/k/v backward run
on the flash kernel with the bias as a constant mask, and the bias gradient is computed separately:

    d bias(i, j) = dS_ij = P_ij (dO_i . v_j - dO_i . O_i)          (softmax backward)

For a bias r[h, min(i - j, W)] the gradient of r[h, d] for d < W is the sum of dS over the diagonal i - j = d,
which needs P only on a band of W diagonals (from the saved log-sum-exp), and the tail r[h, W] gets minus the
sum of all of those, because every row of dS sums to zero. Cost: O(T * W * D) on top of flash attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def supported(x: torch.Tensor) -> bool:
    """The path needs the CPU flash kernel's log-sum-exp (other devices keep SDPA, whose GPU kernels take a
    bias gradient themselves)."""
    return x.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


class _DistanceBiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, r, mask, scale: float, q_start: int, k_start: int, rows: int):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        ctx.save_for_backward(q, k, v, r, mask, out, lse)
        ctx.scale, ctx.q_start, ctx.k_start, ctx.rows = scale, q_start, k_start, rows
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, r, mask, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=ctx.scale)
        dr = None
        if ctx.needs_input_grad[3]:
            dr = band_bias_grad(q, k, v, r, mask, out, lse, grad_out, ctx.scale, ctx.q_start, ctx.k_start, ctx.rows)
        return dq, dk, dv, dr, None, None, None, None, None


def band_bias_grad(q, k, v, r, mask, out, lse, grad_out, scale: float, q_start: int, k_start: int, rows: int) -> torch.Tensor:
    """d loss / d r for r (H, W + 1): diagonals 0..W-1 from the band of dS, the tail from the row-sum identity.

    Queries go in blocks of ``rows``; a block's keys are its own positions and the W - 1 before them, so
    dS of the block is two small matmuls, and its diagonals d = i - j < W are summed with a strided view."""
    B, H, Tq, D = q.shape
    W = r.shape[1] - 1
    delta = (grad_out.float() * out.float()).sum(-1, keepdim=True)  # (B, H, Tq, 1): dO_i . O_i
    dr = torch.zeros(H, W + 1, dtype=torch.float32, device=q.device)
    offset = q_start - k_start  # local key index of query 0
    for a0 in range(0, Tq, rows):
        a1 = min(Tq, a0 + rows)
        c0, c1 = a0 + offset - (W - 1), a1 + offset  # local keys [c0, c1): distances 0 .. W - 1 of the block
        pad = max(0, -c0)

        kw = F.pad(k[:, :, max(0, c0):c1].float(), (0, 0, pad, 0))  # (B, H, n + W - 1, D)
        vw = F.pad(v[:, :, max(0, c0):c1].float(), (0, 0, pad, 0))
        mw = F.pad(mask[:, :, a0:a1, max(0, c0):c1].float(), (pad, 0), value=float("-inf"))  # (1, H, n, n + W - 1)
        s = q[:, :, a0:a1].float() @ kw.transpose(-1, -2) * scale + mw  # (B, H, n, n + W - 1)
        p = torch.exp(s - lse[:, :, a0:a1, None].float())
        dp = grad_out[:, :, a0:a1].float() @ vw.transpose(-1, -2)
        ds = (p * (dp - delta[:, :, a0:a1])).sum(0).contiguous()  # (H, n, n + W - 1), summed over the batch
        n, cols = ds.shape[1], ds.shape[2]
        # band[h, a, u] = ds[h, a, a + u]: key a + u of row a is at distance W - 1 - u
        band = ds.as_strided((H, n, W), (n * cols, cols + 1, 1))
        dr[:, :W] += band.sum(1).flip(-1)
    dr[:, W] = -dr[:, :W].sum(-1)
    return dr.to(r.dtype)


def distance_bias_attention(q, k, v, r, mask, scale: float, q_start: int, k_start: int, rows: int = 256):
    """softmax(q k^T * scale + mask) v, where mask (1, H, Tq, Tk) is r[h, min(i - j, W)] on visible keys and
    -inf elsewhere (built by the caller from r, detached); gradients reach q, k, v and r."""
    return _DistanceBiasAttention.apply(q, k, v, r, mask.detach(), scale, q_start, k_start, rows)
