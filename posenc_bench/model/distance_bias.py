"""Training attention with a learned bias on SDPA's CPU flash kernel instead of its materialising math path.

CPU SDPA has no flash kernel for a mask that requires grad, so a learned bias sends training to the math path
(the full (B, H, T, T) logits and probabilities are built and kept for backward). Here the forward runs on the
flash kernel with the bias as a constant mask, and backward gets the bias gradient from

    d bias(i, j) = dS_ij = P_ij (dO_i . v_j - dO_i . O_i)          (softmax backward)

with P recomputed from the saved log-sum-exp. Two kinds of bias:

- a distance bias r[h, min(i - j, W)] (``Encoding.distance_bias``: T5's buckets, KERPLE's kernel with W past
  the longest distance): d r[h, d] is the sum of dS over the diagonal i - j = d (every distance >= W summed
  into r[h, W]); on per-sequence positions (``+rand``), over the pairs whose positions are d apart;
- any other bias, per pair (FIRE, a ``+rand`` row's per-sequence bias): the mask itself requires grad and gets
  dS (summed over the batch where the mask has one row for all sequences); the encoding's own autograd takes it
  from there, once per forward when the plan shares the mask between layers.

Two backward strategies give the same numbers:

- band (a distance bias with W << T, T5): SDPA's flash backward for q, k, v, and dS only on the band of the
  W diagonals next to the main one (O(T W D)); the tail r[h, W] gets minus their sum, because every row of dS
  sums to zero;
- tiled (everything else): one pass over blocks of query rows and the keys up to each block's last row, which
  recomputes P, forms dS and takes dq, dk, dv from it by matmuls (the flash backward's own work), then reduces
  dS to what the bias needs: its diagonal sums (a strided view) or the dS block itself.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

ROWS = 128  # query rows per block of the tiled backward: its (B, H, rows, keys) blocks stay in the CPU's caches
LOG2E = 1.4426950408889634  # P = 2^((s - lse) log2 e): torch.exp falls off its vectorised path for the large
# negative arguments of far keys (several times slower there, measured on AVX-512), exp2 does not
BAND_ROWS = 256  # query rows per block of the band gradient


def supported(x: torch.Tensor) -> bool:
    """The path needs the CPU flash kernel's log-sum-exp (other devices keep SDPA, whose GPU kernels take a
    bias gradient themselves)."""
    return x.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def banded(r: torch.Tensor, n_keys: int) -> bool:
    """Whether the band strategy is the cheaper one for a distance table r (H, W + 1) over ``n_keys`` keys: its
    band of W diagonals is a small part of the keys (then SDPA's flash backward plus the band beats one tiled
    pass that forms dS over every key)."""
    return 4 * (r.shape[1] - 1) <= n_keys


class _BiasAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, mask, r, scale: float, q_start: int, k_start: int, positions):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=mask.detach(), scale=scale)
        ctx.save_for_backward(q, k, v, mask.detach(), r, out, lse)
        ctx.scale, ctx.q_start, ctx.k_start, ctx.positions = scale, q_start, k_start, positions
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, mask, r, out, lse = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        want_mask, want_r = ctx.needs_input_grad[3], r is not None and ctx.needs_input_grad[4]
        if want_r and not want_mask and ctx.positions is None and banded(r, k.shape[2]):
            dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad_out, q, k, v, out, lse, 0.0, False, attn_mask=mask, scale=ctx.scale)
            dr = band_bias_grad(q, k, v, r, mask, out, lse, grad_out, ctx.scale, ctx.q_start, ctx.k_start)
            return dq, dk, dv, None, dr, None, None, None, None
        table = r.shape[1] if want_r and ctx.positions is not None else None
        dq, dk, dv, dmask, diagonals = tiled_backward(q, k, v, mask, out, lse, grad_out, ctx.scale,
                                                      ctx.q_start - ctx.k_start, want_mask, want_r, ctx.positions, table)
        dr = None
        if want_r:
            W = r.shape[1] - 1
            dr = torch.zeros_like(r, dtype=torch.float32)
            n = min(W, diagonals.shape[1])  # distances beyond this chunk's longest stay 0
            dr[:, :n] = diagonals[:, :n]
            dr[:, W] = diagonals[:, W:].sum(-1)  # every distance >= W reads r[h, W]
            dr = dr.to(r.dtype)
        return dq, dk, dv, dmask, dr, None, None, None, None


def tiled_backward(q, k, v, mask, out, lse, grad_out, scale: float, offset: int, want_mask: bool, want_diagonals: bool,
                   positions: Optional[tuple[torch.Tensor, torch.Tensor]] = None, table: Optional[int] = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Optional[torch.Tensor], Optional[torch.Tensor]]:
    """Attention backward in blocks of ``ROWS`` query rows: dq, dk, dv, and from dS the mask's gradient
    (``want_mask``; (1 or B, H, Tq, Tk) like the mask) and the sums of dS over each distance d
    (``want_diagonals``; (H, Tk + offset)): the diagonal i - j = d, or with ``positions`` (B, Tq), (B, Tk) the
    pairs whose positions are d apart, for d < ``table`` (larger ones summed into the last). Query a of the
    chunk sees local keys [0, a + offset] at most, so a block's keys stop at its last row's."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    # (B H, T, D) contiguous once, so that each block's matmuls read their operands in place and accumulate
    # into dk, dv in place (baddbmm): no per-block copies of strided 4-D operands, no separate += pass
    q3, k3, v3, g3 = q.reshape(-1, Tq, D), k.reshape(-1, Tk, D), v.reshape(-1, Tk, D), grad_out.reshape(-1, Tq, D)
    delta = (grad_out * out).sum(-1, keepdim=True).reshape(-1, Tq, 1)  # (B H, Tq, 1): dO_i . O_i
    dq = torch.empty(B * H, Tq, D, dtype=q.dtype)
    dk, dv = torch.zeros(B * H, Tk, D, dtype=k.dtype), torch.zeros(B * H, Tk, D, dtype=v.dtype)
    dmask = torch.empty(mask.shape, dtype=mask.dtype) if want_mask else None
    n_distances = table if positions is not None else Tk + offset if Tq else 0
    diagonals = torch.zeros(H, n_distances, dtype=torch.float32) if want_diagonals else None
    q2 = q3 * (scale * LOG2E)  # logits in log2 units straight from the product
    lse2 = (lse * LOG2E).reshape(-1, Tq, 1)
    for a0 in range(0, Tq, ROWS):
        a1 = min(Tq, a0 + ROWS)
        n, cols = a1 - a0, min(Tk, a1 + offset)  # keys [0, cols): the last row's and every earlier one
        kb, vb, qb, gb = k3[:, :cols], v3[:, :cols], q3[:, a0:a1], g3[:, a0:a1]
        p = torch.bmm(q2[:, a0:a1], kb.transpose(1, 2))  # (B H, n, cols), then P = 2^(s log2 e - lse log2 e)
        p.view(B, H, n, cols).add_(mask[:, :, a0:a1, :cols], alpha=LOG2E)
        p.sub_(lse2[:, a0:a1]).exp2_()
        dv[:, :cols].baddbmm_(p.transpose(1, 2), gb)
        ds = torch.bmm(gb, vb.transpose(1, 2))  # dP (B H, n, cols), then dS in place
        ds.sub_(delta[:, a0:a1]).mul_(p)
        dq[:, a0:a1].baddbmm_(ds, kb, beta=0, alpha=scale)
        dk[:, :cols].baddbmm_(ds.transpose(1, 2), qb, alpha=scale)
        ds = ds.view(B, H, n, cols)
        if want_mask:  # one mask for the batch gets the batch's sum; keys past the block's last row: dS = 0
            if mask.shape[0] == 1:
                torch.sum(ds, 0, keepdim=True, out=dmask[:, :, a0:a1, :cols])
            else:
                dmask[:, :, a0:a1, :cols] = ds
            dmask[:, :, a0:a1, cols:] = 0
        if want_diagonals and positions is not None:  # distance index of every pair, per sequence
            q_pos, k_pos = positions
            d = (q_pos[:, a0:a1, None] - k_pos[:, None, :cols]).clamp_(0, n_distances - 1)  # (B, n, cols)
            for b in range(B):
                diagonals.index_add_(1, d[b].flatten(), ds[b].reshape(H, -1))
        elif want_diagonals:
            # E[h, a, u] = dS summed over the batch at key u - (n - 1) (zeros before key 0): then E[h, a, a + u]
            # is the key at distance (a0 + offset + n - 1) - u from row a, for u in [0, cols)
            width = cols + n - 1
            E = torch.empty(H, n, width, dtype=torch.float32)
            E[:, :, :n - 1] = 0
            torch.sum(ds, 0, out=E[:, :, n - 1:])
            band = E.as_strided((H, n, cols), (n * width, width + 1, 1))
            diagonals[:, a0 + offset + n - cols:a0 + offset + n] += band.sum(1).flip(-1)
    dq, dk, dv = dq.view(B, H, Tq, D), dk.view(B, H, Tk, D), dv.view(B, H, Tk, D)
    return dq, dk, dv, dmask, diagonals


def band_bias_grad(q, k, v, r, mask, out, lse, grad_out, scale: float, q_start: int, k_start: int,
                   rows: int = BAND_ROWS) -> torch.Tensor:
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
        p = torch.exp2((s - lse[:, :, a0:a1, None].float()) * LOG2E)
        dp = grad_out[:, :, a0:a1].float() @ vw.transpose(-1, -2)
        ds = (p * (dp - delta[:, :, a0:a1])).sum(0).contiguous()  # (H, n, n + W - 1), summed over the batch
        n, cols = ds.shape[1], ds.shape[2]
        # band[h, a, u] = ds[h, a, a + u]: key a + u of row a is at distance W - 1 - u
        band = ds.as_strided((H, n, W), (n * cols, cols + 1, 1))
        dr[:, :W] += band.sum(1).flip(-1)
    dr[:, W] = -dr[:, :W].sum(-1)
    return dr.to(r.dtype)


def bias_attention(q, k, v, mask, scale: float, q_start: int = 0, k_start: int = 0, r: Optional[torch.Tensor] = None,
                   positions: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
    """softmax(q k^T * scale + mask) v for q (B, H, Tq, D) at queries [q_start, q_start + Tq) and k, v
    (B, H, Tk, D) at keys [k_start, k_start + Tk), mask (1 or B, H, Tq, Tk) -inf outside the visible set.
    Gradients reach q, k, v, the mask where it requires grad (a per-pair bias), and r (H, W + 1) where given:
    then the mask's bias must be r[h, min(i - j, W)] (built by the caller from r, detached), i - j the
    distance of the token indices, or of ``positions`` (B, Tq), (B, Tk) where given."""
    return _BiasAttention.apply(q, k, v, mask, r, scale, q_start, k_start, positions)
