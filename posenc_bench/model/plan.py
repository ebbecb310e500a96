"""The plan of one forward's attention: its path, its query chunks and their masks, shared by all layers.

``choose_path`` picks the path once per forward, a pure function of the encoding's declared capabilities
(``has_bias``, ``has_low_rank_bias``, ``has_distance_bias``, ``has_attention_logits``, ``has_attention_parts``,
``has_score_mod``) and the forward's facts (window, blocks, sinks, gradients, positions, the device), never of
its name; ``AttentionPlan`` holds that path with the chunks and masks it needs, and ``Chunk`` is what a path
gets for one query chunk. The attention-sinks geometry is here too (``sink_window``, ``cache_positions``,
``sink_bias``): the plan puts the first S keys before each chunk's window and their bias in its masks.
``attention.attend`` runs the plan's path
(``attention.PATHS``); the paths that need code of their own live in ``explicit.py``, ``sinks.py``, ``flex.py``
and ``distance_bias.py``, and import this module, never ``attention.py``.
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

import torch

from posenc_bench import encodings
from posenc_bench.errors import ConfigError
from posenc_bench.model import distance_bias

# The paths whose chunks SDPA attends itself: there a square chunk from position 0 needs no mask (is_causal).
SDPA_PATHS = ("fused", "folded", "mask")
# The devices on which a low-rank bias is folded into q/k channels. On CPU that keeps SDPA on its fused kernels
# and beats a (q, k) bias mask; on CUDA the mask path is the faster one (both measured by `posenc-bench time`,
# its "(explicit bias)" rows: docs/timing.md), so there the bias goes into the mask.
FOLD_DEVICES = ("cpu",)
# The default memory budget of the attention masks (``AttentionPlan``'s ``max_mask_bytes``): a few MiB of masks
# per query chunk keep a bias encoding's extra memory at long eval lengths near the fused path's (the eval peak
# rows of ``posenc-bench time``), at a few hundred SDPA calls per layer at 8192 tokens.
MAX_MASK_BYTES = 8 << 20
# The devices on which a bias with a score_mod (``has_score_mod``) runs in FlexAttention's fused kernel
# (``flex.py``), no (q, k) bias built. Not the CPU: this torch's FlexAttention has no backward there, and its
# eager forward builds the whole score matrix.
FLEX_DEVICES = ("cuda",)


def query_chunks(T: int, size: int, window: Optional[int], block: Optional[int], start: int = 0
                 ) -> list[tuple[int, int, int]]:
    """(qs, qe, ks) per chunk of at most ``size`` queries of [start, T); with blocks, no chunk crosses a block
    boundary and its keys start at the previous block (or the window, whichever is later). With S sinks the
    plan puts the first S keys before [ks, qe) (``AttentionPlan.key_span``)."""
    chunks = []
    step = size if block is None else min(size, block)
    starts = range(start, T, step) if block is None else [
        s for b in range(start // block * block, T, block) for s in range(max(b, start), min(T, b + block), step)]
    for qs in starts:
        qe = min(T, qs + step, T if block is None else (qs // block + 1) * block)
        ks = 0 if window is None else max(0, qs - window + 1)
        if block is not None:
            ks = max(ks, (qs // block - 1) * block)
        chunks.append((qs, qe, ks))
    return chunks


class Facts(NamedTuple):
    """A forward's facts that choose its path: the window and S ``sinks`` (``sink_window``), the ``block`` of
    blockwise attention, whether gradients are on, whether this device has the flash kernel that trains a learned bias (``bias_kernel``: ``distance_bias.supported``),
    whether it folds a low-rank bias (``fold``, ``FOLD_DEVICES``), and whether it runs FlexAttention (``flex``,
    ``FLEX_DEVICES``)."""

    window: Optional[int] = None
    block: Optional[int] = None
    sinks: int = 0
    grad: bool = False
    bias_kernel: bool = False
    fold: bool = True
    flex: bool = False


def choose_path(encoding: encodings.Encoding, facts: Facts) -> str:
    """The path of one forward, one of ``PATHS``, from what ``encoding`` declares (its ``has_*`` flags) and the
    forward's ``facts``.

    - logits: the encoding computes each chunk's logits (``has_attention_logits``); parts where it also splits
      them into plain attentions (``has_attention_parts``) and there are no sinks, whose keys are not one range.
    - sinks: the first S keys stay visible beside the window, at their cache positions (``sinks.py``).
    - folded: a low-rank bias (``has_low_rank_bias``), folded into extra q/k channels, where the device folds.
    - distance_bias: a distance bias (``has_distance_bias``) in training without blocks, where the device has
      the bias kernel: its table r gets the gradient.
    - bias_grad: any other bias in training there (per pair): the mask gets it.
    - flex: a bias with a score_mod (``has_score_mod``) where the device runs FlexAttention: one fused call.
    - fused: no bias, no window, no blocks: one causal SDPA call.
    - mask: anything else: SDPA with a float mask per chunk, the bias in it."""
    f = facts
    if encoding.has_attention_logits:
        return "parts" if encoding.has_attention_parts and not f.sinks else "logits"
    if f.sinks:
        return "sinks"
    if encoding.has_bias and encoding.has_low_rank_bias and f.fold:
        return "folded"
    if encoding.has_bias and f.grad and f.bias_kernel and f.block is None:
        return "distance_bias" if encoding.has_distance_bias else "bias_grad"
    if f.flex and encoding.has_bias and encoding.has_score_mod:
        return "flex"
    if not encoding.has_bias and f.window is None and f.block is None:
        return "fused"
    return "mask"


class AttentionPlan:
    """How one forward pass at length T runs attention: its path (``choose_path``), the query chunks and their
    masks, shared by all layers. What each path needs:

    - fused: one chunk, no mask: SDPA's fused causal path (``is_causal=True``).
    - folded (e.g. ALiBi): the bias is folded into extra q/k channels (``fold_bias``), so no (Tq, Tk) bias
      exists and SDPA stays on its fused kernels; queries come in chunks of at most ``FOLD_ROWS`` so the folded
      values stay small (float precision). The first chunk is square and causal; later ones get a causal (and
      window) mask without any bias.
    - mask: a 4-D (1 or B, H or 1, q, k) float mask per chunk holding the bias and the causal/window/block -inf
      entries (a 3-D mask would send SDPA to its slow math path).
    - distance_bias (e.g. T5, KERPLE in training on CPU): the mask as above, built as a constant, and the bias
      table r (H, W + 1) for this length, whose gradient ``distance_bias.bias_attention`` sums from dS over the
      diagonals (flash forward, its own backward), in chunks of ``BIAS_ROWS`` queries.
    - bias_grad (e.g. FIRE, ``kerple+rand`` in training on CPU): the mask as above, requiring grad, through
      the same kernel, which gives the mask dS; shared by the layers when the masks are kept, so the encoding's
      bias is built and differentiated once per forward.
    - flex (a bias with a score_mod, on CUDA): one chunk; the bias from ``encoding.score_mod`` and causality,
      window and blocks from a BlockMask, inside FlexAttention's kernel (``flex.py``): no mask, no (q, k) bias.
    - logits (e.g. CoPE) and parts (e.g. ReRoPE): the mask as above goes to the encoding's logits
      (``explicit.py``); chunks are sized for ``LOGIT_TENSORS`` tensors of (B, H, q, k) floats, or
      ``PART_TENSORS`` (q, k) masks on the parts path.
    - sinks (``encoding.attention_sinks`` = (S, W), StreamingLLM): keys j < S stay visible beside the window of
      W keys (the encoding's W, else the model's); towards them a query is biased and rotated from its cache
      position, min(i, S + W - 1) (``sinks.py``), its recent keys keep their true distances. Chunks are sized
      as on the logits path, for the S + W - 1 + q keys a chunk of q queries has at most.

    Positions are (T,) or, from an encoding's ``positions`` hook, (B, T); causality, windows and blocks always
    count tokens (indices), never positions. ``encoding.attention_block(T)`` (blockwise causal attention)
    cuts the chunks at block boundaries, each chunk's keys starting one block back.

    Chunk i covers queries [qs, qe) and keys [ks, qe), after keys [0, min(S, ks)) with S sinks (``key_span``):
    a sink chunk costs its window, not its whole prefix; from ``queries_from`` P on, the chunks of queries P .. T - 1
    alone (a KV cache of P tokens continued: ``hf/attention.py``). When all chunks' masks together fit in
    ``max_mask_bytes`` they are built once per forward and shared by the layers; otherwise each layer rebuilds
    them, so at most one chunk's mask is alive at a time, except on the bias kernel's paths (training), whose
    backward keeps every layer's masks: there they are always shared."""

    FOLD_ROWS = 256
    BIAS_ROWS = 256  # query chunk of a learned bias in training (distance_bias.py)
    LOGIT_TENSORS = 8  # (B, H, q, k) float tensors a logits or sinks chunk may hold at once (CoPE: ~6)
    PART_TENSORS = 8  # (q, k) 4-byte tensors of a parts chunk: masks, pairs, distances (int64: 2)
    TRAIN_LOGIT_ROWS = 128  # query chunk of the logits path in training (CoPE at 2048: the fastest of 16-512)

    def __init__(self, encoding: encodings.Encoding, pos: torch.Tensor, window: Optional[int], max_mask_bytes: int,
                 batch: int = 1, queries_from: int = 0):
        self.encoding = encoding
        self.pos = pos  # (T,) or (B, T)
        T = pos.shape[-1]
        self.sinks, self.window = sink_window(encoding, window, T)
        # token indices for causality and windows: the positions themselves when they are the plain (T,) ones
        self.index = pos if pos.dim() == 1 else torch.arange(T, device=pos.device)
        self.block = encoding.attention_block(T)
        grad = torch.is_grad_enabled()
        self.path = choose_path(encoding, Facts(window=self.window, block=self.block, sinks=self.sinks, grad=grad,
                                                bias_kernel=encoding.bias_kernel and distance_bias.supported(pos),
                                                fold=pos.device.type in FOLD_DEVICES,
                                                flex=pos.device.type in FLEX_DEVICES))
        # r (H, W + 1) carrying the gradient on the distance_bias path; not built at all elsewhere
        self.distance_bias = encoding.distance_bias(T) if self.path == "distance_bias" else None
        self.mask_bias = encoding.has_bias and self.path not in ("folded", "flex")  # the bias goes into the masks
        mask_batch = pos.shape[0] if pos.dim() == 2 and self.mask_bias else 1  # a bias of per-sequence positions
        mask_heads = encoding.n_heads if self.mask_bias else 1
        if self.path in ("fused", "flex") and not queries_from:  # flex: its BlockMask holds the window and blocks
            self.chunks = [(0, T, 0)]
        else:
            self.chunks = query_chunks(T, self._rows(T, max_mask_bytes, batch, mask_heads * mask_batch), self.window,
                                       self.block, queries_from)
        # chunks that need no mask: SDPA's own causal mask is exact for a square chunk from position 0
        self.causal = [self.path in SDPA_PATHS and not self.mask_bias and self.window is None and qs == 0 and ks == 0
                       for qs, _, ks in self.chunks]
        mask_bytes = sum(4 * mask_heads * mask_batch * (qe - qs) * (self.key_span(i)[0] + qe - ks)
                         for i, ((qs, qe, ks), c) in enumerate(zip(self.chunks, self.causal)) if not c)
        # on the bias kernel (training) every layer's backward keeps its masks anyway: sharing them is the least memory
        self._keep_masks = mask_bytes <= max_mask_bytes or self.path in ("distance_bias", "bias_grad")
        self._masks: dict[int, torch.Tensor] = {}
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # fold_bias's, per chunk
        self.flex: dict[int, tuple] = {}  # flex.py's score_mod and BlockMask, per chunk, shared by the layers

    def _rows(self, T: int, max_mask_bytes: int, batch: int, mask_cells: int) -> int:
        """Queries per chunk: as many as keep a chunk's masks (``mask_cells`` 4-byte values per query-key pair),
        logits or parts within ``max_mask_bytes``, capped by the path's own chunk size."""
        # training (the bias kernel's paths are only taken there): backward keeps every chunk's tensors whatever
        # their size, so the budget bounds nothing; the chunk size is the fastest one (a learned bias's chunk's
        # keys are [0, qe): BIAS_ROWS skips most of the masked upper half)
        if self.path == "logits" and torch.is_grad_enabled():
            return min(T, self.TRAIN_LOGIT_ROWS)
        if self.path in ("distance_bias", "bias_grad"):
            return min(T, self.BIAS_ROWS)
        logits = self.encoding.n_heads * batch * self.LOGIT_TENSORS  # whole (B, H, q, k) logits
        cell = 4 * {"parts": self.PART_TENSORS, "logits": logits, "sinks": logits}.get(self.path, mask_cells)
        if self.sinks:  # a chunk of q queries has at most S + W - 1 + q keys: the largest q that fits
            n = self.sinks + self.window
            size = int((math.sqrt(n * n + 4 * max_mask_bytes / cell) - n) / 2)
        else:  # at most T keys
            size = max_mask_bytes // (cell * T)
        size = max(1, min(T, size))
        return min(size, self.FOLD_ROWS) if self.path == "folded" else size

    def key_span(self, i: int) -> tuple[int, int, int]:
        """Chunk i's keys as (p, ks, qe): keys [0, p) then [ks, qe); p = min(S, ks) with S sinks, else 0."""
        _, qe, ks = self.chunks[i]
        return min(self.sinks, ks), ks, qe

    def chunk_keys(self, i: int, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Chunk i's keys of ``x`` along ``dim``: x[ks:qe], after x[:p] (the sinks) where the window left them."""
        p, ks, qe = self.key_span(i)
        if p == 0:
            return x.narrow(dim, ks, qe - ks)
        return torch.cat((x.narrow(dim, 0, p), x.narrow(dim, ks, qe - ks)), dim)

    def chunk_positions(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions of chunk i's queries and keys: (q,), (k,) or (B, q), (B, k)."""
        qs, qe, _ = self.chunks[i]
        return self.pos[..., qs:qe], self.chunk_keys(i, self.pos, -1)

    def mask(self, i: int, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """Chunk i's additive mask (1 or B, H or 1, q, k): the bias where it goes into the masks, -inf outside
        the visible set; None for a causal chunk and on the flex path (its BlockMask is ``flex.py``'s)."""
        if self.path == "flex" or self.causal[i]:
            return None
        if i in self._masks:
            return self._masks[i].to(dtype)
        qs, qe, ks = self.chunks[i]
        q_pos, k_pos = self.chunk_positions(i)
        q_idx, k_idx = self.index[qs:qe], self.chunk_keys(i, self.index, -1)
        allowed = k_idx[None, :] <= q_idx[:, None]  # (q, k)
        if self.window is not None:
            allowed &= k_idx[None, :] > q_idx[:, None] - self.window
        if self.block is not None:  # keys from the query's previous block on
            allowed = allowed & (k_idx[None, :] >= (q_idx[:, None] // self.block - 1) * self.block)
        if self.sinks:  # the first S tokens stay visible (they are the first columns: key_span)
            allowed |= (k_idx[None, :] < self.sinks) & (k_idx[None, :] <= q_idx[:, None])
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.distance_bias is None):  # else: a constant
            if self.distance_bias is not None and q_pos.dim() == 2:
                bias = gather_distance_bias(self.distance_bias.detach(), q_pos, k_pos)
            else:
                bias = self.encoding.bias(q_pos, k_pos) if self.mask_bias else None  # (1 or B, H, q, k) or None
            if bias is not None and self.sinks:  # towards the sinks from the query's cache position
                bias = sink_bias(self, q_pos, k_pos, bias)
        if bias is None:
            mask = torch.zeros(1, 1, *allowed.shape, device=self.pos.device)
        else:
            mask = bias.float()  # a new tensor (``Encoding.bias``): the mask is written into it
        # (1 or B, H or 1, q, k); filled outside autograd: attention's gradient at a -inf logit is 0 (its
        # probability is), so a learned bias's gradient needs no masking pass of its own
        mask.detach().masked_fill_(~allowed, float("-inf"))
        if self._keep_masks:
            self._masks[i] = mask
        return mask.to(dtype)


def gather_distance_bias(r: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """r[h, min(pos_i - pos_j, W)] for (B, q), (B, k) positions -> (B, H, q, k), one row lookup per sequence
    and head written in place (future keys, which the mask hides, read distance 0)."""
    B, H = q_pos.shape[0], r.shape[0]
    out = torch.empty(B, H, q_pos.shape[1], k_pos.shape[1], dtype=r.dtype, device=r.device)
    for b in range(B):
        distance = (q_pos[b, :, None] - k_pos[b, None, :]).clamp_(0, r.shape[1] - 1).flatten()  # (q k,)
        for h in range(H):
            torch.index_select(r[h], 0, distance, out=out[b, h].view(-1))
    return out


class Chunk(NamedTuple):
    """What a path attends for query chunk i of one layer: q (B, H, q, D) rotated at the queries' positions;
    k, v (B, H, k, D) the chunk's keys (``AttentionPlan.key_span``), k rotated; the chunk's mask, None for a
    causal chunk; the logit scale; ``raw``: the layer's q and k (B, H, T, D) before ``rotate`` (the sink path
    rotates queries again, at their cache positions); ``encoding``: the layer's (``Encoding.for_layer``), whose
    own logits the explicit paths call."""

    i: int
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: Optional[torch.Tensor]
    scale: float
    raw: Optional[tuple[torch.Tensor, torch.Tensor]] = None
    encoding: Optional[encodings.Encoding] = None


# ---- attention sinks: which keys a chunk sees, and from where its queries see them -----------------------

def sink_window(encoding: encodings.Encoding | type[encodings.Encoding], window: Optional[int],
                length: Optional[int] = None) -> tuple[int, Optional[int]]:
    """(S sinks, the window) for this encoding (or class) and the model's window: S = 0 without sinks. For
    windows of ``length`` <= S + W tokens the cache holds them whole: (0, None), plain causal attention."""
    if encoding.attention_sinks is None:
        return 0, window
    sinks, own = encoding.attention_sinks
    if own is not None and window is not None and own != window:
        raise ConfigError(f"{encoding.name}: its sink window {own} differs from the model's window {window}")
    if own is None and window is None:
        raise ConfigError(f"{encoding.name}: attention sinks need a sliding window; name one, e.g. "
                          f"{encoding.name}+sw64, or evaluate a model trained with one")
    window = own if own is not None else window
    return (0, None) if sinks and length is not None and length <= sinks + window else (sinks, window)


def cache_positions(q_pos: torch.Tensor, sinks: int, window: int) -> torch.Tensor:
    """The queries' positions in a cache of S sinks and W recent tokens: min(i, S + W - 1)."""
    return q_pos.clamp(max=sinks + window - 1)


def sink_bias(plan: AttentionPlan, q_pos: torch.Tensor, k_pos: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """A chunk's bias (1 or B, H, q, k) with its first S columns, the sinks', taken from the queries' cache
    positions; the recent keys' columns stay as ``bias`` has them."""
    towards_sinks = plan.encoding.bias(cache_positions(q_pos, plan.sinks, plan.window), k_pos[..., :plan.sinks])
    return torch.cat((towards_sinks, bias[..., plan.sinks:]), dim=-1)
