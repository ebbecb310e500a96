"""CoPE: contextual position encoding.

Golovneva, Wang, Weston & Sukhbaatar, "Contextual Position Encoding: Learning to Count What's Important",
2024 (arXiv:2405.18719), sec. 3: positions are counted by the content. For query i and key j <= i,

    g_ij = sigmoid(q_i . k_j / sqrt(D)),   p_ij = sum_{t = j .. i} g_it,

and the logit gains q_i . e[p_ij], where e holds ``npos_max`` learned vectors of the head dimension and a
fractional p_ij interpolates e[floor p] and e[ceil p] (by the logits q . e, as the paper does). As the
authors' code (facebookresearch/RAM, projects/cope/src/cope/context_position.py, ``ContextPosSelfAttn``),
positions are clamped to npos_max - 1, the table starts at zero, the position logit is added before the
1/sqrt(D) scale, and npos_max defaults to the train length + 1 (a count can reach the number of keys; lines
69-73 there).

Each attention layer has its own table, as in the authors' default: ``ContextPosSelfAttn`` is built once per
layer (models/transformer.py line 72) with its own ``pos_emb`` of shape (1, head_dim, npos), shared by the
heads of that layer (context_position.py lines 75-78), and ``--cope-shared`` (default False, lines 46-51)
ties every layer's table to the first one (models/transformer.py lines 262-267). Here ``shared`` (default
False) is that flag: per layer, ``pos_emb`` is (n_layers, D, npos_max) and ``for_layer(i)`` is the view
that attention layer i attends with; shared, it is one (D, npos_max) table, the layout this module had
before, so a checkpoint of that layout loads into ``shared=True``. ``n_layers`` is the model's number of
layers (the model passes it; a standalone encoding has one). Whether the tables are shared determines the
weights, so it is part of the cell key (``key_options``): a per-layer checkpoint is never mistaken for a
shared one, nor for one trained before per-layer tables existed.

CoPE reads q . k, so it computes each query chunk's whole logits (``has_attention_logits``): attention runs
explicitly, chunk by chunk, with memory bounded by the chunk size. The model runs each chunk's
softmax(logits) @ v through ``attention_output`` (``has_attention_output``): ``CoPEAttention``, the same
values with a backward written out, faster than autograd through ``cope_logits``, which stays the definition
it is tested against (tests/encodings/test_cope.py). On the CPU in float32 its element-wise work (gates and
counts, the position logits and softmax, the gates' backward) runs in the C kernels of ``cope_kernel``, one
pass a row; elsewhere, or where no C compiler is found, in torch ops; both paths are tested against the
definition.
"""

from __future__ import annotations


import torch
from torch import nn

from posenc_bench.encodings import cope_kernel
from posenc_bench.encodings.base import Encoding, LayerOf
from posenc_bench.encodings.registry import register


def positions_of(logits: torch.Tensor, visible: torch.Tensor, npos_max: int) -> torch.Tensor:
    """p_ij = sum_{t >= j} g_it over visible keys, clamped to npos_max - 1: (B, H, q, k) from scaled q . k."""
    gates = torch.sigmoid(logits) * visible
    return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=npos_max - 1)


def cope_logits(table: torch.Tensor, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float
                ) -> torch.Tensor:
    """One chunk's pre-softmax logits (B, H, q, k) with position table ``table`` (D, npos_max): content plus
    the interpolated position logit, scaled, plus the mask (context_position.py lines 96-139)."""
    qf = q.float()
    content = qf @ k.float().transpose(-1, -2)  # (B, H, q, k)
    p = positions_of(content * scale, torch.isfinite(mask).float(), table.shape[-1])
    fixed = qf @ table.float()  # (B, H, q, npos_max): q . e[n] for every integer position n
    floor = p.floor()
    w = p - floor  # differentiable in the gates
    lo = fixed.gather(-1, floor.long())
    hi = fixed.gather(-1, p.ceil().long())
    return (content + hi * w + lo * (1 - w)) * scale + mask


class CoPEAttention(torch.autograd.Function):
    """softmax(cope_logits(table, q, k, mask, scale)) @ v for one query chunk, with a hand-written backward.
    Autograd through ``cope_logits`` saves about ten (B, H, q, k) tensors per chunk (int64 floor and ceil
    among them) and runs a gather, scatter, flip or mask for every step of the definition; here the forward
    takes fewer passes over the (B, H, q, k) values (scale and mask inside the q . k product, the position
    logit as lo + w d in one gather fewer, in-place updates, only the table's columns the counts reach: at
    most k + 1 over k keys, on the CPU up to the chunk's largest count) and saves three of them (P, the gates
    g, the counts p; backward takes floor p, its fraction w and d from p and the (q, n) differences again,
    cheaper than holding them: every held byte is a fresh page on the next step). With
    L the logits, dL = P (dP - dout . out) the softmax backward, s the scale:

    - the position logit lo + w d, lo = fixed[floor p], d = fixed[floor p + 1] - fixed[floor p], fixed =
      q . table s: a scatter-add of dL at floor p into d(fixed), and of dL w moved from floor p to floor p + 1;
    - dL/dp = dL d; p is a reverse cumsum of the gates, so dg = cumsum(dL d) (its transpose), and the gates'
      input s q . k + mask gets dL + dg g (1 - g) (the sigmoid's derivative; g = 0 off the visible keys);
    - then the matmuls for dq, dk, dv and d(table), the table's unread columns getting 0.

    Where p is an integer, autograd's floor/ceil gathers give dL/dp = 0 and d here does not: p is an exact
    integer only where every gate it counts is exactly 0 or 1 (or p is clamped at npos - 1, where d = 0), and
    there g (1 - g) = 0 for every gate that dp reaches, so the gradients agree. Computed in float32 (float64
    if given). The mask must be 0 or -inf (CoPE has no bias, so the plan's masks are): it enters the gates'
    input, and gets no gradient. ``native`` (default): float32 CPU chunks take ``cope_kernel``'s C kernels for
    the element-wise steps, the same formulas one row at a time (P written over x; dx over dout . v)."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, table: torch.Tensor, mask: torch.Tensor,
                scale: float, npos: int, native: bool = True) -> torch.Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        qf, kf, tf = q.to(dtype), k.to(dtype), table.to(dtype)
        B, H, Q, D = q.shape
        K = k.shape[-2]
        n = min(npos, K + 1)  # reachable positions 0 .. n - 1
        # x = s q . k + mask: the gates' input (sigmoid(-inf) = 0 off the visible keys), and the logits but for
        # the position logit: (B H, q, k)
        hidden = mask.to(dtype)  # (1 or B, 1 or H, q, k)
        hidden = hidden.view(1, Q, K) if hidden.numel() == Q * K else hidden.expand(B, H, Q, K).reshape(-1, Q, K)
        x = torch.baddbmm(hidden, qf.reshape(B * H, Q, D), kf.reshape(B * H, K, D).transpose(-1, -2), alpha=scale)
        x = x.view(B, H, Q, K)
        kernel = native and K > 0 and cope_kernel.usable(x)  # the C kernels: float32 on the CPU
        if kernel:
            g, p = cope_kernel.gates(x, npos)  # g 0 off the visible keys; p_ij = sum_{t >= j} g_it, clamped
        else:
            g = torch.sigmoid(x)  # 0 off the visible keys
            p = g.flip(-1).cumsum_(-1).flip(-1)  # p_ij = sum_{t >= j} g_it
            if n == npos:  # a count can pass the last position only when there are that many keys
                p.clamp_(max=npos - 1)
        if p.device.type == "cpu" and K:  # only the positions the counts reach (a host read: free on the CPU)
            # p falls along a row (gates >= 0), so a row's largest count is at its first key; floor p + 1 is the
            # last column read (the last one, npos - 1, only where p is clamped to it, with d = 0 there)
            n = min(n, int(p[..., 0].max()) + 2)
        fixed = qf @ (tf[:, :n] * scale)  # (B, H, q, n): s q . e[m] for every reachable integer position m
        diff = torch.nn.functional.pad(fixed.diff(dim=-1), (0, 1))  # (B, H, q, n): e[m + 1] - e[m], 0 at the end
        if kernel:
            P = cope_kernel.probs_(x, p, fixed, diff)  # written over x
        else:
            floor = p.long()  # p >= 0: truncation is the floor
            w = p - floor
            d = diff.gather(-1, floor)
            x.add_(fixed.gather(-1, floor).addcmul_(w, d))
            P = torch.softmax(x, dim=-1)
            del floor, w, d
        del x, fixed
        out = P.to(v.dtype) @ v
        # saved: P, the gates and the counts p, and the (q, n) differences; floor p, its fraction and the
        # gathered difference are recomputed in backward (three passes there, half the memory held for it)
        ctx.save_for_backward(q, k, v, table, out, P, g, p, diff)
        ctx.scale, ctx.n, ctx.kernel = scale, n, kernel
        return out

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        q, k, v, table, out, P, g, p, diff = ctx.saved_tensors
        s, n = ctx.scale, ctx.n
        dtype = P.dtype
        qf, kf, vf, tf, dout = q.to(dtype), k.to(dtype), v.to(dtype), table.to(dtype), dout.to(dtype)
        dv = P.transpose(-1, -2) @ dout
        delta = (dout * out.to(dtype)).sum(-1, keepdim=True)  # sum_k dP P = dout . out
        if ctx.kernel:  # dx from dout . v in one pass a row; d(fixed) with it
            dx = dout @ vf.transpose(-1, -2)
            dfixed = cope_kernel.backward_(dx, delta, P, g, p, diff)
        else:
            floor = p.long()
            d = diff.gather(-1, floor)
            w = p.sub_(floor)  # the fraction, in place: p is not read again
            dL = (dout @ vf.transpose(-1, -2)).sub_(delta).mul_(P)  # softmax backward: (B, H, q, k)
            dfixed = torch.zeros(*dL.shape[:-1], n, dtype=dtype, device=dL.device).scatter_add_(-1, floor, dL)
            dnext = torch.zeros_like(dfixed).scatter_add_(-1, floor, w.mul_(dL))  # w's share moves to m + 1
            dfixed[..., 1:] += dnext[..., :-1]
            dfixed[..., :-1] -= dnext[..., :-1]
            dg = d.mul_(dL).cumsum_(-1)  # dL/dp, then the transpose of the reverse cumsum
            dx = dL.add_(dg.mul_(g.addcmul_(g, g, value=-1)))  # content and gate paths: d(s q . k)
        ts = tf[:, :n] * s
        dq = (dx @ kf).mul_(s).add_(dfixed @ ts.transpose(0, 1))
        dk = (dx.transpose(-1, -2) @ qf).mul_(s)
        dtable = torch.zeros_like(tf)
        dtable[:, :n] = (qf.reshape(-1, qf.shape[-1]).transpose(0, 1) @ dfixed.reshape(-1, n)).mul_(s)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dtable.to(table.dtype), None, None, None, None


def cope_attention(table: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                   scale: float, native: bool = True) -> torch.Tensor:
    """softmax(cope_logits(table, q, k, mask, scale)) @ v (B, H, q, D) of one query chunk, through
    ``CoPEAttention`` (a hand-written backward; in evaluation the same forward, nothing saved). ``native``: its
    element-wise work in the C kernels of ``cope_kernel`` where they apply (float32 on the CPU), else in torch
    ops; the same values either way."""
    return CoPEAttention.apply(q, k, v, table, mask, scale, table.shape[-1], native)


@register("cope")
class CoPE(Encoding):
    summary = "positions counted by sigmoid(q.k) gates, interpolated position logits (CoPE); Golovneva et al. 2024"
    family = "contextual"
    newer = True
    paper = "Golovneva et al. 2024 (arXiv:2405.18719)"
    has_attention_logits = True
    has_attention_output = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, npos_max: int = 0, shared: bool = False,
                 n_layers: int = 1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if npos_max < 0:
            raise ValueError(f"npos_max must be >= 0 (0: train length + 1), got {npos_max}")
        if not isinstance(shared, bool):
            raise ValueError(f"CoPE option shared must be true or false, got {shared!r}")
        if n_layers < 1:
            raise ValueError(f"CoPE needs n_layers >= 1 (one position table per attention layer), got {n_layers}")
        self.npos_max = npos_max or train_len + 1
        self.shared = shared
        self.n_layers = n_layers
        shape = (self.head_dim, self.npos_max) if shared else (n_layers, self.head_dim, self.npos_max)
        self.pos_emb = nn.Parameter(torch.zeros(shape))  # e[p] = table[:, p]

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        """Shared or per-layer tables: different weights (and a key unlike the one CoPE had before)."""
        return {"shared": bool(options.get("shared", False))}

    def table(self, layer: int) -> torch.Tensor:
        """Layer ``layer``'s position table (D, npos_max): column p is e[p]."""
        if self.shared:
            return self.pos_emb
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"CoPE has {self.n_layers} per-layer position table(s) (n_layers={self.n_layers}); "
                             f"layer {layer} has none: build it with the model's n_layers, or shared=True")
        return self.pos_emb[layer]

    def for_layer(self, layer: int) -> "CoPELayer":
        self.table(layer)  # refuse a layer without a table here, not mid-forward
        return CoPELayer(self, layer)

    def positions_of(self, logits: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """p_ij = sum_{t >= j} g_it over visible keys, clamped to npos_max - 1: (B, H, q, k) from scaled q . k."""
        return positions_of(logits, visible, self.npos_max)

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        """With layer 0's table (the model asks each layer's view, ``for_layer``, for its own)."""
        return cope_logits(self.table(0), q, k, mask, scale)

    def attention_output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                         k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        """softmax(attention_logits) @ v with layer 0's table, by ``cope_attention``."""
        return cope_attention(self.table(0), q, k, v, mask, scale)


class CoPELayer(LayerOf):
    """CoPE as attention layer ``layer`` sees it (``CoPE.for_layer``): its own position table."""

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        return cope_logits(self.encoding.table(self.layer), q, k, mask, scale)

    def attention_output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                         k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        return cope_attention(self.encoding.table(self.layer), q, k, v, mask, scale)
