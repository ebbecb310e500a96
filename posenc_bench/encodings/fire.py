"""FIRE: functional interpolation for relative positions.

Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar & Bhojanapalli, "Functional Interpolation
for Relative Positions Improves Long Context Transformers", ICLR 2024 (arXiv:2310.04418), sec. 3: a per-head
bias

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

for a query at position i and a key at j <= i. f_theta: R -> R^H is a small MLP, c > 0 sharpens the log
(the code's comment: "amplifying differences among local positions"), and L is a threshold: up to L the
normaliser is the constant psi(L), so the bias is a function of the distance; past it the normalised distance
stays in [0, 1] whatever the length (the paper's "progressive interpolation"), which lets the bias
interpolate instead of extrapolate.

Every default and every step of the computation is the public implementation ``class FIRE`` of
mcleish7/arithmetic, ``cramming/architectures/embeddings.py`` (lines 419-480 at commit 86022a5, cited as
``embeddings.py``; its docstrings cite the paper), which this module equals entry by entry
(tests/encodings/test_fire.py re-implements it in float64):

- ``mlp_width`` 32: ``__init__(..., mlp_width=32, ...)`` (line 420); the MLP is ``Linear(1, width) -> ReLU ->
  Linear(width, H)`` (line 435) with PyTorch's default initialisation (the model's std-0.02 init runs before
  the encoding is built and does not touch it).
- c starts at 0.1 (``init_c=0.1``, line 420) and is learned as a plain parameter (line 438); the code takes
  ``log(|c * d| + 1)`` for the distance and for the normaliser alike (lines 472-473), so c's sign never
  matters.
- L starts at 512 tokens (``init_L=512.0``, line 420): a fixed ``init_L`` (``requires_grad=False``, line 441)
  times a learned multiplier that starts at 1 (line 442), L = |multiplier * init_L| (line 468). It is a number
  of tokens, not a fraction of the train length (the caller, ``cramming/architectures/attention.py`` line
  182, builds FIRE with that default whatever the sequence length). ``threshold=0`` gives this repository's
  earlier default, a quarter of the train length.
- the normaliser is max(i, L) over the query position i, positions counted from 0 (lines 464, 469); eps =
  1e-6 is added to psi of it (``eps=1e-6``, lines 420, 476).
- future keys (j > i) get psi(|i - j|) (the ``abs`` of line 472), as there; the causal mask hides them.
- the paper's sec. 3 defines the same b(i, j); the values above are the code's, and its own runs use them
  (attention.py line 182 passes only the head count and ``max_length``, the randomised-positions range).

One difference stays: the reference builds one FIRE per attention layer (attention.py line 182), while this
model computes one bias shared by all layers (model/transformer.py), like T5's bias here.

The bias depends on (i - j, i), not on the distance alone, so it goes through the chunked mask path (in
training on the CPU, the bias kernel gives the mask its gradient: model/distance_bias.py). The MLP is never run
pair by pair: f(u) = W2 relu(W1 u + b1) + b2 of a scalar u is piecewise linear, with a kink where a hidden unit
switches (u = -b1_k / W1_k, at most ``mlp_width`` of them), so ``mlp_pieces`` turns the weights into one line
per piece s (differentiable in the weights) and the bias is that line at each pair's u: the MLP's values up to
float rounding, and its gradients, without a (pairs, width) hidden activation.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc_bench.encodings import fire_kernel
from posenc_bench.encodings.base import Encoding, pair_score_mod
from posenc_bench.encodings.registry import register

EPS = 1e-6  # eps=1e-6: mcleish7/arithmetic cramming/architectures/embeddings.py, FIRE.__init__ (line 420)


def mlp_pieces(mlp: nn.Sequential) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``Linear(1, width) -> ReLU -> Linear(width, H)`` as lines: kinks (K,) sorted, and per piece s (u in
    (kinks[s - 1], kinks[s]]: ``torch.bucketize``) a point p_s inside it (K + 1,), the slope A_s (K + 1, H) and
    the MLP's value there C_s = mlp(p_s), so that mlp(u) = C_s + A_s (u - p_s). A unit with W1_k = 0 has no
    kink (it is constant); which units are on in a piece is read at p_s. A and C carry the weights' gradients;
    expanding around p_s keeps the sums of their gradients small (no cancellation of W1 u against b1)."""
    w1, b1 = mlp[0].weight[:, 0], mlp[0].bias  # (width,)
    with torch.no_grad():
        kinks = (-b1 / w1)[w1 != 0].sort().values  # (K,)
        inside = torch.cat([kinks[:1] - 1, (kinks[:-1] + kinks[1:]) / 2, kinks[-1:] + 1]) if len(kinks) else b1.new_zeros(1)
        on = (inside[:, None] * w1 + b1 > 0).to(w1.dtype)  # (K + 1, width): the units active in each piece
    slope = (on * w1) @ mlp[2].weight.t()  # (K + 1, H)
    return kinks, inside, slope, mlp(inside[:, None])


class _PsiRatio(torch.autograd.Function):
    """``FIRE.psi_ratio(i, j, c, L)`` for positions i (..., Tq, 1), j (..., 1, Tk): the same operations in
    place, with a backward that holds only u and reduces each row to two sums. Autograd would keep four
    (..., Tq, Tk) intermediates for c's and L's two scalar gradients. With num = log(|c| |i - j| + 1), den =
    log(|c| N + 1) + eps, N = max(i, L):

        du/dc = sgn(c) (|i - j| / (|c| |i - j| + 1) - u N / (|c| N + 1)) / den,
        du/dL = -u |c| / (|c| N + 1) / den   where L > i (half where L = i, as ``torch.maximum``), else 0."""

    @staticmethod
    def forward(ctx, i, j, c, threshold):
        normaliser = torch.maximum(i, threshold)  # (..., Tq, 1)
        den = torch.log(torch.abs(c * normaliser) + 1) + EPS
        u = (i - j).mul_(c).abs_().add_(1).log_().div_(den)  # FIRE.psi_ratio's operations, in place
        ctx.save_for_backward(i, j, c, threshold, u, den)
        return u

    @staticmethod
    def backward(ctx, du):
        i, j, c, threshold, u, den = ctx.saved_tensors
        ac = c.abs()
        distance = (i - j).abs_()  # (..., Tq, Tk)
        per_c = distance.div_(distance * ac + 1)  # |i - j| / (|c| |i - j| + 1)
        r1 = (du * per_c).sum(-1, keepdim=True)  # (..., Tq, 1)
        r2 = (du * u).sum(-1, keepdim=True)
        normaliser = torch.maximum(i, threshold)
        d_c = torch.sgn(c) * ((r1 - r2 * normaliser / (ac * normaliser + 1)) / den).sum()
        route = (threshold > i).to(u.dtype) + 0.5 * (threshold == i).to(u.dtype)  # torch.maximum's gradient
        d_threshold = -(r2 * ac / (ac * normaliser + 1) / den * route).sum()
        return None, None, d_c.reshape(c.shape), d_threshold.reshape(threshold.shape)


def pieces(u: torch.Tensor, kinks: torch.Tensor) -> torch.Tensor:
    """``torch.bucketize(u, kinks)``: the number of kinks below each u, u's shape. On the CPU counted one kink
    at a time over the kinks inside u's range (the others add a constant) into a uint8 (a few passes of
    compares instead of a binary search per value, several times faster there; one byte a pair held for
    backward instead of eight); elsewhere, or past 255 kinks, bucketize's int64."""
    if u.device.type != "cpu" or len(kinks) > 255:
        return torch.bucketize(u, kinks)
    lo, hi = torch.aminmax(u)
    count = torch.full(u.shape, int((kinks < lo).sum()), dtype=torch.uint8)
    for kink in kinks[(kinks >= lo) & (kinks < hi)].tolist():  # u > kink for some u, not for all
        count += u > kink
    return count


class _Lines(torch.autograd.Function):
    """C[piece] + A[piece] (u - p[piece]) per head, written (L, H, Tq, Tk) from u (L, Tq, Tk): one table
    lookup per pair and head; in backward the pieces' sums of the gradient (for C) and of the gradient times
    u - p (for A) by one ``index_add_`` over all heads and both sums at once (several times faster than a
    scatter per head and sum, and than autograd's gather backward, which sorts the pairs). Both directions go
    in blocks of query rows per sequence, ``BLOCK`` pairs at most, so that every pass after the first over a
    block's values finds them in the cache (the (L, H, Tq, Tk) tensors of a chunk are tens of MiB) and the
    block's temporaries stay small beside the bias itself (the eval peak at long lengths). Float32 on the CPU
    with uint8 pieces goes through ``fire_kernel``'s C kernels instead: the same values, one pass a row of
    pairs, the pieces' sums in double."""

    BLOCK = 1 << 17  # pairs: 64 query rows of 2048 keys

    @staticmethod
    def blocks(piece: torch.Tensor):
        """(sequence b, rows r0:r1, the block's pieces (rows Tk,) as int64 indices) over piece (L, Tq, Tk)."""
        L, Tq, Tk = piece.shape
        rows = max(1, _Lines.BLOCK // max(1, Tk))
        for b in range(L):
            for r0 in range(0, Tq, rows):
                r1 = min(Tq, r0 + rows)
                yield b, r0, r1, piece[b, r0:r1].reshape(-1).long()

    @staticmethod
    def forward(ctx, u, piece, inside, slope, value):
        L, Tq, Tk = u.shape
        H = slope.shape[1]
        keep = any(ctx.needs_input_grad)  # backward reads u - p_s: whole, else one block at a time (evaluation)
        values, slopes = value.t().contiguous(), slope.t().contiguous()  # (H, S)
        ctx.kernel = fire_kernel.usable(u, piece)  # the C kernels: float32 on the CPU
        if ctx.kernel:  # the line tables in float32 (under autocast the MLP gave them in bf16)
            out, offset = fire_kernel.lines(u.contiguous(), piece.contiguous(), inside.float().contiguous(),
                                            values.float(), slopes.float(), keep)
            ctx.save_for_backward(offset, piece, slope)
            return out
        offset = torch.empty_like(u) if keep else None
        out = torch.empty(L, H, Tq, Tk, dtype=u.dtype, device=u.device)
        for b, r0, r1, flat in _Lines.blocks(piece):
            off = torch.sub(u[b, r0:r1], inside.index_select(0, flat).view(r1 - r0, Tk),
                            out=offset[b, r0:r1] if keep else None)  # u - p_s
            for h in range(H):
                torch.addcmul(values[h].index_select(0, flat).view_as(off),
                              slopes[h].index_select(0, flat).view_as(off), off, out=out[b, h, r0:r1])
        ctx.save_for_backward(offset, piece, slope)
        return out

    @staticmethod
    def backward(ctx, g):
        offset, piece, slope = ctx.saved_tensors
        S, H = slope.shape
        slopes = slope.t().contiguous()  # (H, S)
        if ctx.kernel:
            du, sums = fire_kernel.lines_backward(g.float().contiguous(), offset, piece.contiguous(), slopes.float())
            return du, None, None, sums[H:].t().to(slope.dtype), sums[:H].t().to(slope.dtype)
        du = torch.empty_like(offset)
        sums = torch.zeros(2 * H, S, dtype=g.dtype, device=g.device)  # per piece: sum of g, of g (u - p)
        for b, r0, r1, flat in _Lines.blocks(piece):
            gb, dub = g[b, :, r0:r1], du[b, r0:r1]  # (H, rows, Tk), (rows, Tk)
            torch.mul(gb[0], slopes[0].index_select(0, flat).view_as(dub), out=dub)
            for h in range(1, H):
                dub.addcmul_(gb[h], slopes[h].index_select(0, flat).view_as(dub))
            block = torch.cat((gb, gb * offset[b, r0:r1]))  # (2 H, rows, Tk)
            sums.index_add_(1, flat, block.reshape(2 * H, -1))
        d_value, d_slope = sums[:H], sums[H:]
        return du, None, None, d_slope.t().to(slope.dtype), d_value.t().to(slope.dtype)


@register("fire")
class FIRE(Encoding):
    summary = "learned MLP of log distance normalised by log query position (FIRE); Li et al. 2024"
    family = "relative bias"
    newer = True
    paper = "Li et al., ICLR 2024 (arXiv:2310.04418)"
    has_bias = True
    batched_positions = True
    # fire+rand as mcleish7/arithmetic runs it: random positions in training only; evaluated at 0 .. L-1
    # (embeddings.py lines 455-464: max_length = seq_length when not training, so the draw is every position)
    randomized_eval = "ordered"
    # and its M: the README's example, ``arch.attention.max_length=128`` ("setting this longer than the max
    # sequence length gives some randomness"), over their additions' training sequences of 64 tokens (20 + 20
    # digits, '+', '=', a 21-digit sum and EOS, padded to the longest: create_data_split.py bucket_method_gen
    # and tokenize_and_save_dataset, shells/generate_and_tokenize_data.sh): 2 x the train length.
    randomized_range = 2.0

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, mlp_width: int = 32, threshold: float = 512.0,
                 c_init: float = 0.1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if mlp_width < 1 or threshold < 0 or c_init <= 0:
            raise ValueError(f"FIRE needs mlp_width >= 1, threshold >= 0 (0: train length / 4) and c_init > 0, "
                             f"got {mlp_width}, {threshold}, {c_init}")
        self.mlp = nn.Sequential(nn.Linear(1, mlp_width), nn.ReLU(), nn.Linear(mlp_width, n_heads))
        self.c = nn.Parameter(torch.tensor(float(c_init)))
        self.register_buffer("threshold_init", torch.tensor(float(threshold or max(1.0, train_len / 4))))
        self.threshold_multiplier = nn.Parameter(torch.tensor(1.0))

    def threshold(self) -> torch.Tensor:
        """L = |multiplier * L_init|, learned through the multiplier."""
        return (self.threshold_multiplier * self.threshold_init).abs()

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """psi(|i - j|) / (psi(max(L, i)) + eps), psi(x) = log(|c x| + 1): (Tq, Tk) or (B, Tq, Tk)."""
        dtype = torch.promote_types(self.c.dtype, torch.float32)  # float32, or float64 for a float64 module
        i = q_pos.to(dtype)[..., :, None]  # (..., Tq, 1)
        j = k_pos.to(dtype)[..., None, :]  # (..., 1, Tk)
        return _PsiRatio.apply(i, j, self.c, self.threshold())

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        u = self.normalized_distance(q_pos, k_pos)  # (Tq, Tk) or (B, Tq, Tk)
        kinks, inside, slope, value = mlp_pieces(self.mlp)
        u = u.reshape(-1, *u.shape[-2:])  # (1 or B, Tq, Tk)
        return _Lines.apply(u, pieces(u.detach(), kinks), inside, slope, value)  # (1 or B, H, Tq, Tk)

    @staticmethod
    def psi_ratio(i: torch.Tensor, j: torch.Tensor, c: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        """psi(|i - j|) / (psi(max(L, i)) + eps), psi(x) = log(|c x| + 1), for float positions i, j of any
        broadcastable shapes and L = ``threshold``."""
        numerator = torch.log(torch.abs(c * (i - j)) + 1)
        denominator = torch.log(torch.abs(c * torch.maximum(i, threshold)) + 1) + EPS
        return numerator / denominator

    has_score_mod = True

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """The bias as a FlexAttention score_mod: the MLP evaluated pair by pair on the normalised distance,
        its hidden width unrolled into scalar operations (a score_mod is pointwise: no matmul inside the
        kernel); only the MLP's weights, c and L are captured."""
        dtype = torch.promote_types(self.c.dtype, torch.float32)
        first, second = self.mlp[0], self.mlp[2]
        w1, b1, w2, b2 = first.weight[:, 0], first.bias, second.weight, second.bias  # (W,), (W,), (H, W), (H,)
        c, threshold, psi_ratio = self.c, self.threshold(), self.psi_ratio  # a staticmethod: no module captured

        def bias_at(h, i, j):
            u = psi_ratio(i.to(dtype), j.to(dtype), c, threshold)
            out = b2[h]
            for m in range(w1.shape[0]):
                out = out + w2[h, m] * torch.relu(w1[m] * u + b1[m])
            return out

        return pair_score_mod(bias_at, q_pos, k_pos)
