"""The FlexAttention paths: a bias encoding's attention without a (q, k) bias, and plain attention with its
log-sum-exp without (q, k) logits.

FlexAttention (Dong, Feng, Guessous, Liang & He, "Flex Attention: A Programming Model for Generating Optimized
Attention Kernels", arXiv:2412.05496; ``torch.nn.attention.flex_attention``) calls a score_mod
(score, b, h, q_idx, kv_idx) -> score on every pair inside a fused attention kernel, and skips the key blocks
a ``BlockMask`` marks empty (a mask_mod decides the pairs of the blocks it marks partial).

- flex (``flex_attention_path``, chosen by ``plan.choose_path`` for an encoding with ``has_score_mod`` on a
  device in ``plan.FLEX_DEVICES``): one call per layer for the whole sequence; the bias comes from
  ``encoding.score_mod`` (T5's and KERPLE's per-distance line, ALiBi's slopes, FIRE's MLP pair by pair, the
  base's with ``+rand``'s per-sequence positions), causality, window and blocks from a BlockMask worked out
  block by block (``visible_blocks``), so neither a (q, k) bias nor a (q, k) mask exists.
- ``attention_lse``: one part of the parts path (``explicit.attention_lse``) on CUDA: the part's mask as the
  BlockMask and mask_mod, its finite values as a score_mod, the log-sum-exp from the kernel.

Only compiled is FlexAttention fused (eagerly it builds the whole score matrix): on ``COMPILE_DEVICES`` it runs
through ``compiled()``, one torch.compile of ``flex_attention`` per process, which compiles again for a new
shape or score_mod (its guards; after a change of length it treats lengths as dynamic). On the CPU this
torch's FlexAttention has no backward, so the CPU keeps its own paths; its eager forward is what the tests
compare with them there.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch
from torch.nn.attention.flex_attention import AuxRequest, BlockMask, flex_attention

from posenc_bench.model.plan import AttentionPlan, Chunk

BLOCK = 128  # the BlockMask's block, FlexAttention's default tile (its kernels need a multiple of theirs)
COMPILE_DEVICES = ("cuda",)  # where flex_attention runs compiled; elsewhere eagerly (the CPU tests' forward)
# Compiled kernels flex_attention may keep: one per score_mod's code (encoding), grad mode and shape (a fixed
# length, then dynamic ones), parts path included. Past torch's default of 8 a sweep over several encodings
# would fall back to the eager forward, which builds every (q, k) score; raised around our calls only.
RECOMPILES = 64


@functools.cache
def compiled() -> Callable:
    """``flex_attention`` compiled, once per process (torch.compile keeps one kernel per shape and score_mod)."""
    return torch.compile(flex_attention)


def attend_flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, score_mod, block_mask: BlockMask, scale: float,
                lse: bool = False):
    """FlexAttention of q (B, H, q, D), k, v (B, H, k, D) -> (B, H, q, D), and its log-sum-exp (B, H, q) float32
    with ``lse``; compiled on ``COMPILE_DEVICES``."""
    run = compiled() if q.device.type in COMPILE_DEVICES else flex_attention
    aux = AuxRequest(lse=True) if lse else None
    with torch._dynamo.config.patch(recompile_limit=RECOMPILES):
        out = run(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, return_aux=aux)
    return (out[0], out[1].lse) if lse else out


def listed_blocks(some: torch.Tensor, every: torch.Tensor, mask_mod, q_len: int, kv_len: int) -> BlockMask:
    """The BlockMask of (Bm, Hm, nq, nk) bool grids of BLOCK x BLOCK blocks: ``some``, the blocks with a visible
    pair, ``every``, those with every pair visible (mask_mod skipped there); both broadcast over batch and heads
    where Bm, Hm are 1."""
    partial = some & ~every

    def listed(grid):  # (Bm, Hm, nq) counts and (Bm, Hm, nq, nk) block indices, the listed ones first
        order = torch.argsort(grid.to(torch.int8), dim=-1, descending=True, stable=True)
        return grid.sum(-1, dtype=torch.int32), order.to(torch.int32)

    return BlockMask.from_kv_blocks(*listed(partial), *listed(every), BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))


def lowest_key(plan: AttentionPlan) -> Callable[[torch.Tensor], torch.Tensor]:
    """i -> the lowest key index token i sees (causal, window, blocks: it sees [lowest(i), i]); nondecreasing."""
    window, block = plan.window, plan.block

    def lowest(i: torch.Tensor) -> torch.Tensor:
        lo = torch.zeros_like(i)
        if window is not None:
            lo = torch.maximum(lo, i - window + 1)
        if block is not None:  # from the query's previous block on
            lo = torch.maximum(lo, (i // block - 1) * block)
        return lo

    return lowest


def visible_blocks(plan: AttentionPlan, i: int, device: torch.device) -> BlockMask:
    """Chunk i's causal/window/block set as a BlockMask, worked out per block pair from its corners, never per
    token pair. Queries i in [a, a1] see keys [lowest(i), i]; lowest is nondecreasing, so key block [c, c1] has
    a visible pair iff the first query that can see it, max(a, c), is in the block and lowest(max(a, c)) <= c1,
    and all pairs visible iff lowest(a1) <= c and c1 <= a."""
    qs, qe, ks = plan.chunks[i]
    lowest = lowest_key(plan)
    a = torch.arange(qs, qe, BLOCK, device=device)  # first token index of each query block
    a1 = (a + BLOCK).clamp(max=qe) - 1  # and its last
    c = torch.arange(ks, qe, BLOCK, device=device)  # the same for the key blocks
    c1 = (c + BLOCK).clamp(max=qe) - 1
    first = torch.maximum(a[:, None], c[None, :])  # (nq, nk)
    some = (first <= a1[:, None]) & (lowest(first) <= c1[None, :])
    every = (lowest(a1)[:, None] <= c[None, :]) & (c1[None, :] <= a[:, None])

    def mask_mod(b, h, q_idx, kv_idx):
        query, key = q_idx + qs, kv_idx + ks  # token indices
        return (key <= query) & (key >= lowest(query))

    return listed_blocks(some[None, None], every[None, None], mask_mod, qe - qs, qe - ks)


def flex_attention_path(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """The flex path: FlexAttention on the chunk with the encoding's score_mod and the chunk's BlockMask, both
    built once per forward and shared by the layers (``plan.flex``)."""
    if c.i not in plan.flex:
        plan.flex[c.i] = plan.encoding.score_mod(*plan.chunk_positions(c.i)), visible_blocks(plan, c.i, c.q.device)
    score_mod, block_mask = plan.flex[c.i]
    return attend_flex(c.q, c.k, c.v, score_mod, block_mask, c.scale)


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T scale + mask) @ v (B, H, q, D), its log-sum-exp (B, H, q) float32) for mask (1 or B,
    1 or H, q, n) through FlexAttention: its finite entries are the visible pairs (BlockMask and mask_mod),
    their values a score_mod, so no (q, n) logits exist. A row with no visible key: output 0, lse -inf."""
    visible = torch.isfinite(mask)  # (Bm, Hm, q, n)
    bias = mask.masked_fill(~visible, 0.0)
    Bm, Hm, Tq, Tn = visible.shape

    def at(t, b, h, q_idx, kv_idx):  # entry of a (Bm, Hm, q, n) tensor, broadcast over batch and heads
        return t[b if Bm > 1 else 0, h if Hm > 1 else 0, q_idx, kv_idx]

    pad = (0, -Tn % BLOCK, 0, -Tq % BLOCK)
    blocks = torch.nn.functional.pad(visible, pad).unflatten(-1, (-1, BLOCK)).unflatten(-3, (-1, BLOCK))
    some, every = blocks.any(-1).any(-2), blocks.all(-1).all(-2)  # (Bm, Hm, nq, BLOCK, nk) -> (Bm, Hm, nq, nk)
    block_mask = listed_blocks(some, every, lambda b, h, q_idx, kv_idx: at(visible, b, h, q_idx, kv_idx), Tq, Tn)
    score_mod = lambda score, b, h, q_idx, kv_idx: score + at(bias, b, h, q_idx, kv_idx)  # noqa: E731
    out, lse = attend_flex(q, k, v, score_mod, block_mask, scale, lse=True)
    return out, lse.float()
