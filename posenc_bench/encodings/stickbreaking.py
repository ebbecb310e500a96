"""Stick-breaking attention: attention weights from a stick-breaking process over the keys, nearest first.

Tan, Yang, Courville, Panda & Shen, "Scaling Stick-Breaking Attention: An Efficient Implementation and In-depth
Study", ICLR 2025 (arXiv:2410.17980). No softmax and no position signal: query i walks back from its nearest
earlier key and breaks off a share beta_ij = sigmoid(z_ij), z_ij = q_i . k_j * scale, of what is left of a stick
of length 1, so that for j < i

    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik),
    log A_ij = logsigmoid(z_ij) + sum_{j < k < i} logsigmoid(-z_ik)     (log(1 - sigmoid(z)) = logsigmoid(-z)).

A nearer key with a high logit takes the stick before a farther one can: the recency bias comes from the order
of the breaks, not from positions. What is left, 1 - sum_j A_ij = prod_{k < i} (1 - beta_ik), goes to the query's
own value, so the output is sum_{j < i} A_ij v_j + (1 - sum_{j < i} A_ij) v_i. As the authors' code has it
(shawntan/stickbreaking-attention at commit 3147a38, whose naive PyTorch reference sits beside its Triton kernel):

- ``stickbreaking_attention/sb_ref.py``, ``stickbreaking`` (lines 8-25): logits q k^T / sqrt(D) (line 12, the
  scale; ``sb_attn/__init__.py``, ``sb_attn`` lines 57-59: ``inv_temp`` defaults to 1 / sqrt(D), the model's
  scale here); log beta = logsigmoid(z), log(1 - beta) = logsigmoid(-z) (lines 17-19); the product as a sum of
  log(1 - beta) over the keys strictly between j and i (lines 21-22, with ``cm = tril(-1)``); returns
  ``att @ v`` and the remainder ``1 - att.sum(-1)`` (line 25).
- ``tests/test_attn.py``, ``ref_fwd`` (lines 10-18): the query's own key is no break (``mask = triu(0)``, the
  diagonal masked, unless ``attend_current``, whose default is False in ``sb_attn``, line 57) and the output
  is ``o + rem[..., None] * v`` (line 17): the remainder on the query's own value. The authors' first model
  code does the same (shawntan/dolomite-engine, ``hf_models/models/stickbreaking/attention.py``,
  ``SBAttention.forward``, at commit 0296e23, lines 96-97 and 154-155, ``sb_remainder`` True by default in its
  ``config.py``, line 10).
- ``stickbreaking_attention/sb_varlen/sb_varlen_fwd.py``, ``compute_block`` and ``_forward_one_row`` (lines
  26-78, 81-215): the kernel works in log space, log p = z - sum softplus over the keys from j to the query,
  accumulated block by block from the query's own block backwards, and stores the remainder as the exponential
  of that sum (line 204), never as 1 - sum A.

Here in the same log space, the sums accumulated nearest key first, so the weights that matter, the near ones,
carry the least rounding, and a window of any length underflows to weights of 0, never to NaN:

    log A_ij = logsigmoid(z_ij) + sum_{j < k < i} logsigmoid(-z_ik),   log remainder_i = sum_{k < i} logsigmoid(-z_ik).

``stickbreaking_logits``, the definition the tests hold everything to, takes logsigmoid(z) and logsigmoid(-z)
as the reference does; ``StickBreakingAttention``, what the model runs, takes one softplus per pair as the
kernel does (log(1 - beta) = -softplus(z), log beta = z - softplus(z)), with a threshold exact to rounding in
float32 and float64, and a weight below the smallest normal float (e^-87 in float32) is 0.

The weights with the remainder on the query's own key sum to 1, so they are a softmax of themselves:
``attention_logits`` returns them in log space (the own key holding the log remainder), and softmax of that
is the attention; ``attention_output`` (``StickBreakingAttention``) computes the same output with a
hand-written backward, without the softmax pass and with two (B, H, q, k) tensors saved per chunk.

The model runs it per query chunk with keys [ks, qe) (``model/plan.py``) and a mask that is -inf outside the
visible set: a hidden key breaks no stick (logsigmoid(+inf) = 0) and gets no weight. A key's weight depends only
on the keys nearer than it, so a sliding window keeps the weights of the keys it shows and hands the farther
keys' shares to the remainder; attention sinks are stick-breaking over the cache (the sinks break what the
window left). No positions are read, so there is no ``+rand`` row (``batched_positions`` stays False) and no
FlexAttention score_mod; the same torch code runs on every device.

Deviations: none in the weights or the remainder. The authors' later model code (dolomite-engine commit 32da568,
"add stickbreaking reminder bias") moves the remainder from v_i to a learned vector per head, and commit
46c0084 adds a GroupNorm over each head's output; both change the model beyond its attention weights, which
this benchmark keeps equal across rows, so neither is taken. ``attend_current`` (the own key breaking the stick
too) is not offered: the authors' default leaves it off.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import register


# log of the smallest normal float32 / float64 (1.2e-38, 2.2e-308), rounded up: the log weights below it are
# weights of 0 (the attention changes by less than that), which keeps exp off its slow subnormal path
_LOG_TINY = {torch.float32: -87.0, torch.float64: -708.0}


def softplus(z: torch.Tensor) -> torch.Tensor:
    """softplus(z) = log(1 + e^z) = -log(1 - sigmoid(z)), exact to rounding in float32 and float64: torch returns z
    itself above its threshold, which at 20 is exact in float32 (the rest, < 2e-9, is below its rounding) but
    not in float64, which gets 40 (the rest < 5e-18)."""
    return F.softplus(z, threshold=20.0 if z.dtype.itemsize <= 4 else 40.0)


def _own_key(Q: int, K: int) -> int:
    """Column of query 0's own key among a chunk's K keys: the chunk's keys end at its last query
    (``AttentionPlan.key_span``), so query a's own key is column K - Q + a."""
    if K < Q:
        raise ValueError(f"a chunk of {Q} queries needs at least {Q} keys ending at its last query, got {K} keys")
    return K - Q


def stickbreaking_logits(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The definition, by autograd: log weights (B, H, q, k) of one chunk, q (B, H, q, D), k (B, H, k, D),
    ``mask`` (1 or B, 1 or H, q, k) 0 where visible and -inf elsewhere. Entry (i, j) is log A_ij for an earlier
    key; the query's own key holds the log remainder; hidden keys -inf. Float32 (float64 if given)."""
    dtype = torch.promote_types(q.dtype, torch.float32)
    Q, K = q.shape[-2], k.shape[-2]
    own = torch.arange(Q, device=q.device)[:, None] + _own_key(Q, K) == torch.arange(K, device=q.device)  # (q, k)
    with torch.autocast(q.device.type, enabled=False):  # q . k in full precision under bf16 autocast too
        z = (q.to(dtype) @ k.to(dtype).transpose(-1, -2)) * scale + mask.to(dtype)  # (B, H, q, k)
    z = z.masked_fill(own, float("-inf"))  # the own key is no break
    # log(1 - beta) summed from the query back (flipped: the nearest key first), then shifted by one key so
    # that key j's sum holds the keys nearer than j only: (B, H, q, k) in the keys' order again
    from_query = F.logsigmoid(-z).flip(-1).cumsum(-1)  # (B, H, q, k), nearest key first
    nearer = F.pad(from_query[..., :-1], (1, 0)).flip(-1)  # sum over keys j < k < i
    log_a = F.logsigmoid(z) + nearer  # log beta_ij + sum of log(1 - beta_ik) over the nearer keys
    return torch.where(own, from_query[..., -1:], log_a)  # the log remainder, sum of log(1 - beta), on the own key


class StickBreakingAttention(torch.autograd.Function):
    """exp(stickbreaking_logits(q, k, mask, scale)) @ v for one query chunk, with a hand-written backward.

    The forward runs with the keys in reverse order, nearest first (k and v flipped, (B, H, k, D) each, and
    the (q, k) mask): the sum of softplus(z) = -log(1 - beta) over the keys nearer than key r is then a plain
    cumsum, shifted by one, and query a's own key is column q - 1 - a. Two (B, H, q, k) tensors are saved: z
    (with the mask and the own key at -inf) and the weights P. With g = dL = P * (dout . v) the gradient of the
    log weights (0 at hidden keys, where P = 0), and g_own that of the log remainder, the chain through
    log A_r = z_r - sum_{s <= r} softplus(z_s) and log rem = -sum_s softplus(z_s) (softplus' = sigmoid) gives

        dz_s = g_s - sigmoid(z_s) * (sum_{r >= s} g_r + g_own),

    the sum over key s and every farther one (a reverse cumsum, flipped back here). z, the own key and the
    hidden keys get 0 (sigmoid(-inf) = 0); the mask gets no gradient. Computed in float32 (float64 if given), with
    autocast off: under bf16 autocast q, k and v come in bf16 and the output goes back in v's dtype."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                scale: float) -> torch.Tensor:
        with torch.autocast(q.device.type, enabled=False):  # bf16 autocast would run the products in bf16
            return StickBreakingAttention._forward(ctx, q, k, v, mask, scale)

    @staticmethod
    def _forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                 scale: float) -> torch.Tensor:
        dtype = torch.promote_types(q.dtype, torch.float32)
        B, H, Q, _ = q.shape
        _own_key(Q, k.shape[-2])
        qf, k_rev, v_rev = q.to(dtype), k.to(dtype).flip(-2), v.flip(-2)  # keys nearest first: (B, H, k, D)
        own = torch.arange(Q - 1, -1, -1, device=q.device).view(1, 1, Q, 1).expand(B, H, Q, 1)  # own key's column
        z = (qf @ k_rev.transpose(-1, -2)).mul_(scale).add_(mask.to(dtype).flip(-1))  # (B, H, q, k)
        z.scatter_(-1, own, float("-inf"))  # the own key is no break
        broken = softplus(z)  # -log(1 - beta): 0 at hidden keys
        log_p = z - broken  # log beta = z - softplus(z), -inf at hidden keys
        broken.cumsum_(-1)  # (B, H, q, k): sum of -log(1 - beta) over key r and the nearer ones
        log_p[..., 1:].sub_(broken[..., :-1])  # minus the nearer keys' sum: log A
        log_p.scatter_(-1, own, broken[..., -1:].neg())  # the log remainder on the own key
        del broken
        # weights below the smallest normal float are 0 (the CPU's exp is ~10x slower where its result is subnormal)
        P = F.threshold_(log_p, _LOG_TINY[log_p.dtype], float("-inf")).exp_()  # the weights, over their logs
        ctx.save_for_backward(qf, k_rev, v_rev, z, P)
        ctx.scale, ctx.dtypes = scale, (q.dtype, k.dtype, v.dtype)
        return P.to(v.dtype) @ v_rev  # (B, H, q, D)

    @staticmethod
    def backward(ctx, dout: torch.Tensor):
        with torch.autocast(dout.device.type, enabled=False):
            return StickBreakingAttention._backward(ctx, dout)

    @staticmethod
    def _backward(ctx, dout: torch.Tensor):
        qf, k_rev, v_rev, z, P = ctx.saved_tensors
        Q = qf.shape[-2]
        dout = dout.to(P.dtype)
        own = torch.arange(Q - 1, -1, -1, device=P.device).view(1, 1, Q, 1).expand(*P.shape[:2], Q, 1)
        dv = (P.transpose(-1, -2) @ dout).flip(-2)  # (B, H, k, D), back in the keys' order
        g = (dout @ v_rev.to(P.dtype).transpose(-1, -2)).mul_(P)  # dL: (B, H, q, k)
        g_own = g.gather(-1, own)  # the log remainder's gradient: (B, H, q, 1)
        g.scatter_(-1, own, 0.0)
        farther = g.flip(-1).cumsum_(-1).flip(-1)  # sum over key s and every farther key
        dz = farther.add_(g_own).mul_(torch.sigmoid(z)).neg_().add_(g)  # (B, H, q, k)
        dq = (dz @ k_rev).mul_(ctx.scale)
        dk = (dz.transpose(-1, -2) @ qf).mul_(ctx.scale).flip(-2)  # (B, H, k, D), back in the keys' order
        q_dtype, k_dtype, v_dtype = ctx.dtypes
        return dq.to(q_dtype), dk.to(k_dtype), dv.to(v_dtype), None, None


def stickbreaking_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                            scale: float) -> torch.Tensor:
    """The attention output (B, H, q, D) of one query chunk: sum_j A_ij v_j + remainder_i v_i, through
    ``StickBreakingAttention`` (in evaluation the same forward, nothing saved)."""
    return StickBreakingAttention.apply(q, k, v, mask, scale)


@register("stickbreaking")
class StickBreaking(Encoding):
    """Stick-breaking attention, Tan et al., ICLR 2025 (arXiv:2410.17980), as the authors' naive reference has it:
    shawntan/stickbreaking-attention at commit 3147a3841b025a31d271fc8f873120ff6fa0461b,
    ``stickbreaking_attention/sb_ref.py`` function ``stickbreaking`` (lines 8-25: the weights and the remainder),
    completed as ``tests/test_attn.py`` function ``ref_fwd`` does (lines 10-18: the own key no break, the
    remainder on the own value v_i), with ``sb_attn``'s default scale 1/sqrt(D) (``sb_attn/__init__.py`` lines
    57-59), in log space as ``sb_varlen/sb_varlen_fwd.py`` ``compute_block`` (lines 26-78). No parameters and no
    positions: the attention weights are the position signal. Deviations: none; the authors' later model code
    (learned remainder vector, GroupNorm per head; the module docstring) is not taken, as it changes the model
    beyond its attention weights. The mask the model passes must be 0 or -inf (it enters the logits)."""

    summary = ("attention weights from a stick-breaking process over the keys, nearest first: sigmoid(q.k) "
               "breaks, the remainder on the own value, no softmax, no positions; Tan et al. 2025")
    family = "contextual"
    paper = "Tan et al., ICLR 2025 (arXiv:2410.17980)"
    newer = True
    has_attention_logits = True  # the weights read q . k pair by pair: the explicit path, chunk by chunk
    has_attention_output = True  # the same output without the softmax pass, with a hand-written backward

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        """The log weights (``stickbreaking_logits``): normalised, so softmax returns the weights themselves."""
        return stickbreaking_logits(q, k, mask, scale)

    def attention_output(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_pos: torch.Tensor,
                         k_pos: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
        """softmax(attention_logits) @ v, by ``stickbreaking_attention``."""
        return stickbreaking_attention(q, k, v, mask, scale)
