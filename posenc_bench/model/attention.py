"""How one forward pass runs attention: query chunks, their masks, and the folded or banded bias paths.

The plan is chosen from the encoding's capabilities (``has_bias``, ``has_low_rank_bias``, ``has_distance_bias``,
``has_attention_logits``, ``attention_block``), never its name, once per forward and shared by all layers (see
:class:`AttentionPlan`).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from posenc_bench import encodings
from posenc_bench.model import distance_bias


def query_chunks(T: int, size: int, window: Optional[int], block: Optional[int]) -> list[tuple[int, int, int]]:
    """(qs, qe, ks) per chunk of at most ``size`` queries; with blocks, no chunk crosses a block boundary and
    its keys start at the previous block (or the window, whichever is later). With S sinks the plan puts the
    first S keys before [ks, qe) (``AttentionPlan.key_span``)."""
    chunks = []
    step = size if block is None else min(size, block)
    starts = range(0, T, step) if block is None else [s for b in range(0, T, block) for s in range(b, min(T, b + block), step)]
    for qs in starts:
        qe = min(T, qs + step, T if block is None else (qs // block + 1) * block)
        ks = 0 if window is None else max(0, qs - window + 1)
        if block is not None:
            ks = max(ks, (qs // block - 1) * block)
        chunks.append((qs, qe, ks))
    return chunks


def _fold_parts(dtype: torch.dtype) -> int:
    return 2 if dtype.itemsize >= 4 else 3  # float32: 2 parts; bf16/fp16: 3


class AttentionPlan:
    """How one forward pass at length T runs attention: query chunks and their masks, shared by all layers.

    Four ways, chosen from the encoding's capabilities (never its name):
    - fused: no bias, no window: one SDPA call on the fused causal path (``is_causal=True``).
    - low-rank bias (``encoding.has_low_rank_bias``, e.g. ALiBi): the bias is folded into extra q/k channels
      (``fold_bias``), so no (Tq, Tk) bias exists and SDPA stays on its fused kernels; queries come in chunks
      of at most ``FOLD_ROWS`` so the folded values stay small (float precision). The first chunk is square and
      causal; later ones get a causal (and window) mask without any bias.
    - mask: a 4-D (1, H or 1, q, k) float mask holding the bias and the causal/window -inf entries. In training
      on CPU a learned distance bias (``encoding.has_distance_bias``, e.g. T5) goes through
      ``distance_bias.distance_bias_attention`` (flash kernel + band gradient) in chunks of ``BIAS_ROWS`` queries,
      from ``BAND_MIN`` x its band width on (shorter sequences are cheaper on SDPA's math path).
    - logits (``encoding.has_attention_logits``, e.g. CoPE): the mask as above (bias included, if any) goes to
      ``encoding.attention_logits`` with the chunk's q and k, and the model applies softmax to what it returns
      (``explicit_attention``); chunks are sized for ``LOGIT_TENSORS`` tensors of (B, H, q, k) floats, or
      ``PART_TENSORS`` (q, k) masks where the encoding has ``attention_parts`` (``parts_attention``).

    Positions are (T,) or, from an encoding's ``positions`` hook, (B, T); causality, windows and blocks always
    count tokens (indices), never positions. ``encoding.attention_block(T)`` (blockwise causal attention)
    cuts the chunks at block boundaries, each chunk's keys starting one block back.

    Attention sinks (``encoding.attention_sinks`` = (S, W), StreamingLLM): keys j < S stay visible beside the
    window of W keys (the encoding's W, else the model's); towards them a query is biased and rotated from its
    cache position, min(i, S + W - 1) (``sink_attention``), its recent keys keep their true distances.

    Chunk i covers queries [qs, qe) and keys [ks, qe), after keys [0, min(S, ks)) with S sinks (``key_span``):
    a sink chunk costs its window, not its whole prefix. When all chunks' masks together fit in
    ``max_mask_bytes`` they are built once per forward and shared by the layers; otherwise each layer rebuilds
    them, so at most one chunk's mask is alive at a time.
    """

    FOLD_ROWS = 256
    BIAS_ROWS = 512  # query chunk of a learned distance bias in training (distance_bias.py)
    BAND_MIN = 4  # ... taken from T >= BAND_MIN x its band width on
    LOGIT_TENSORS = 8  # (B, H, q, k) float tensors an attention_logits chunk may hold at once (CoPE: ~6)
    PART_TENSORS = 8  # (q, k) 4-byte tensors of an attention_parts chunk: masks, pairs, distances (int64: 2)

    def __init__(self, encoding: encodings.Encoding, pos: torch.Tensor, window: Optional[int], max_mask_bytes: int,
                 batch: int = 1):
        self.encoding = encoding
        self.pos = pos  # (T,) or (B, T)
        T = pos.shape[-1]
        self.sinks, window = sink_window(encoding, window, T)
        self.window = window
        # token indices for causality and windows: the positions themselves when they are the plain (T,) ones
        self.index = pos if pos.dim() == 1 else torch.arange(T, device=pos.device)
        self.block = encoding.attention_block(T)
        self.logits = encoding.has_attention_logits
        self.folded = encoding.has_bias and encoding.has_low_rank_bias and not self.sinks
        explicit_bias = encoding.has_bias and not self.folded
        # a learned distance bias in training: flash kernel + band gradient instead of SDPA's math path, once
        # the sequence is long enough for that to pay (measured: 0.74x the time at 1024 tokens, 1.55x at 128)
        self.distance_bias = None
        if (explicit_bias and encoding.has_distance_bias and torch.is_grad_enabled() and pos.dim() == 1
                and distance_bias.supported(pos) and not self.logits and self.block is None and not self.sinks):
            r = encoding.distance_bias()  # (H, W + 1), carries the gradient
            if T >= self.BAND_MIN * (r.shape[1] - 1):
                self.distance_bias = r
        self.fused = not encoding.has_bias and window is None and self.block is None and not self.logits
        mask_batch = pos.shape[0] if pos.dim() == 2 and explicit_bias else 1  # a bias of per-sequence positions
        mask_heads = encoding.n_heads if explicit_bias else 1
        if self.fused:
            self.chunks = [(0, T, 0)]
        else:
            explicit = self.logits or self.sinks  # whole (B, H, q, k) logits, LOGIT_TENSORS of them
            parts = self.logits and encoding.has_attention_parts and not self.sinks  # (q, k) masks, no logits
            cell = 4 * (self.PART_TENSORS if parts else encoding.n_heads * batch * self.LOGIT_TENSORS
                        if explicit else max(1, mask_heads) * mask_batch)  # bytes per (query, key) pair
            if self.sinks:  # a chunk of q queries has at most S + W - 1 + q keys: the largest q that fits
                n = self.sinks + window
                size = int((math.sqrt(n * n + 4 * max_mask_bytes / cell) - n) / 2)
            else:  # at most T keys
                size = max_mask_bytes // (cell * T)
            size = max(1, min(T, size))
            if self.folded:
                size = min(size, self.FOLD_ROWS)
            elif self.distance_bias is not None:
                size = min(size, self.BIAS_ROWS)  # keys [0, qe) per chunk: skips most of the masked upper half
            self.chunks = query_chunks(T, size, window, self.block)
        # chunks that need no mask: SDPA's own causal mask is exact for a square chunk from position 0
        self.causal = [not explicit_bias and window is None and not self.logits and qs == 0 and ks == 0
                       for qs, _, ks in self.chunks]
        mask_bytes = sum(4 * mask_heads * mask_batch * (qe - qs) * (self.key_span(i)[0] + qe - ks)
                         for i, ((qs, qe, ks), c) in enumerate(zip(self.chunks, self.causal)) if not c)
        self._keep_masks = mask_bytes <= max_mask_bytes
        self._masks: dict[int, torch.Tensor] = {}
        self.factors: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # fold_bias's, per chunk

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
        if self.causal[i]:
            return None
        if i in self._masks:
            return self._masks[i].to(dtype)
        qs, qe, ks = self.chunks[i]
        q_pos, k_pos = self.chunk_positions(i)
        q_idx, k_idx = self.index[qs:qe], self.chunk_keys(i, self.index, -1)
        rel = k_idx[None, :] - q_idx[:, None]  # (q, k): key minus query index
        allowed = rel <= 0
        if self.window is not None:
            allowed = allowed & (rel > -self.window)
        if self.block is not None:  # keys from the query's previous block on
            allowed = allowed & (k_idx[None, :] >= (q_idx[:, None] // self.block - 1) * self.block)
        if self.sinks:  # the first S tokens stay visible (they are the first columns: key_span)
            allowed = allowed | ((k_idx[None, :] < self.sinks) & (rel <= 0))
        with torch.set_grad_enabled(torch.is_grad_enabled() and self.distance_bias is None):  # else: a constant
            bias = None if self.folded else self.encoding.bias(q_pos, k_pos)  # (1 or B, H, q, k) or None
            if bias is not None and self.sinks:  # towards the sinks from the query's cache position (class doc)
                bias = torch.cat((self.encoding.bias(self.cache_positions(q_pos), k_pos[..., :self.sinks]),
                                  bias[..., self.sinks:]), dim=-1)
        if bias is None:
            mask = torch.zeros(1, 1, *allowed.shape, device=self.pos.device)
        else:
            mask = bias.float()
        mask = mask.masked_fill(~allowed, float("-inf"))  # (1, H or 1, q, k)
        if self._keep_masks:
            self._masks[i] = mask
        return mask.to(dtype)

    def cache_positions(self, q_pos: torch.Tensor) -> torch.Tensor:  # in a cache of S sinks + W recent tokens
        return q_pos.clamp(max=self.sinks + self.window - 1)


def _bias_factors(plan: AttentionPlan, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    if i not in plan.factors:  # float64 factors, shared by all layers of this forward
        plan.factors[i] = plan.encoding.bias_factors(*plan.chunk_positions(i))
    return plan.factors[i]  # (H, q, E), (H or B, H, k, E)


def fold_channels(plan: AttentionPlan, head_dim: int, dtype: torch.dtype) -> int:
    """How many channels ``fold_bias`` appends to q and k (and the model to v) for this head dimension."""
    E2 = _bias_factors(plan, 0)[0].shape[-1] * _fold_parts(dtype)
    return E2 + (-(head_dim + E2) % 8)


def fold_bias(plan: AttentionPlan, i: int, q: torch.Tensor, k: torch.Tensor, scale: float
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Append the encoding's bias factors to chunk i's q (B, H, q, D) and k (B, H, k, D), so that
    scale * q' . k' = scale * q . k + bias + a per-query constant; v needs ``fold_channels`` zero channels
    to match (SDPA's fused kernels need one head dimension). Each key factor is split into a high part in
    q's dtype and rounding rests (2 parts in float32, 3 in bf16), so the bias keeps at least float32
    precision; channels are padded to a multiple of 8 for the GPU kernels."""
    qf, kf = _bias_factors(plan, i)  # (H, q, E), (H, k, E) or (B, H, k, E) for per-sequence positions
    parts, rest = [], kf / scale
    for _ in range(_fold_parts(k.dtype)):
        parts.append(rest.to(k.dtype))
        rest = rest - parts[-1].double()
    qx = torch.cat([qf] * len(parts), -1).to(q.dtype)  # (H, q, parts * E)
    kx = torch.cat(parts, -1)  # (H, k, parts * E)
    pad = fold_channels(plan, q.shape[-1], q.dtype) - qx.shape[-1]
    B = q.shape[0]
    q = torch.cat((q, F.pad(qx, (0, pad)).expand(B, -1, -1, -1)), -1)
    k = torch.cat((k, F.pad(kx, (0, pad)).expand(B, -1, -1, -1)), -1)
    return q, k


def attention_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(softmax(q k^T scale + mask) @ v (B, H, q, D), its log-sum-exp (B, H, q) in float32): SDPA's CPU flash
    kernel in float32 inference, else explicitly. A row with no visible key has lse -inf (the flash kernel
    says 0 there, with an output of zeros)."""
    if (q.device.type == "cpu" and q.dtype == torch.float32 and not torch.is_grad_enabled()
            and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=mask, scale=scale)
        return out, lse.masked_fill(~torch.isfinite(mask).any(-1), float("-inf"))
    logits = (q @ k.transpose(-1, -2)).float() * scale + mask  # (B, H, q, n)
    lse = torch.logsumexp(logits, dim=-1)
    return torch.exp(logits - lse[..., None]).nan_to_num(0.0).to(v.dtype) @ v, lse


def parts_attention(encoding: encodings.Encoding, plan: AttentionPlan, i: int, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """What ``explicit_attention`` computes, from ``encoding.attention_parts``: each part one attention over
    its pairs (the chunk's mask, -inf elsewhere), merged exactly: softmax over the union of disjoint sets is
    sum_p exp(lse_p - m) out_p / sum_p exp(lse_p - m), m the largest lse."""
    q_pos, k_pos = plan.chunk_positions(i)
    outs, lses = [], []
    for qp, kp, first, pairs in encoding.attention_parts(q, k, q_pos, k_pos):
        n = kp.shape[-2]
        part_mask = mask[..., first:first + n].masked_fill(~pairs, float("-inf"))  # (1, H or 1, q, n)
        out, lse = attention_lse(qp, kp, v[..., first:first + n, :], part_mask, scale)
        outs.append(out)
        lses.append(lse.float())
    top = torch.stack(lses).amax(0)  # (B, H, q): every query sees at least itself in some part
    num = torch.zeros(outs[0].shape, dtype=torch.float32, device=q.device)
    den = torch.zeros(top.shape, dtype=torch.float32, device=q.device)
    for out, lse in zip(outs, lses):
        w = torch.exp(lse - top)  # 0 for a query with no pair in this part (its out may be NaN there)
        num += torch.where(w[..., None] > 0, out.float(), 0.0) * w[..., None]
        den += w
    return (num / den[..., None]).to(v.dtype)


def explicit_attention(encoding: encodings.Encoding, plan: AttentionPlan, i: int, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax(encoding.attention_logits(...)) @ v for chunk i of the plan: q (B, H, q, D), k, v (B, H, k, D);
    through ``parts_attention`` where the encoding splits its logits into parts."""
    if encoding.has_attention_parts:
        return parts_attention(encoding, plan, i, q, k, v, mask, scale)
    q_pos, k_pos = plan.chunk_positions(i)
    logits = encoding.attention_logits(q, k, q_pos, k_pos, mask, scale)  # (B, H, q, k), -inf where invisible
    return torch.softmax(logits.float(), dim=-1).to(v.dtype) @ v


def sink_window(encoding: encodings.Encoding, window: Optional[int], length: Optional[int] = None
                ) -> tuple[int, Optional[int]]:
    """(S sinks, the window) for this encoding and the model's window: S = 0 without sinks. For windows of
    ``length`` <= S + W tokens the cache holds them whole: (0, None), plain causal attention."""
    if encoding.attention_sinks is None:
        return 0, window
    sinks, own = encoding.attention_sinks
    if own is not None and window is not None and own != window:
        raise ValueError(f"{encoding.name}: its sink window {own} differs from the model's window {window}")
    if own is None and window is None:
        raise ValueError(f"{encoding.name}: attention sinks need a sliding window; name one, e.g. "
                         f"{encoding.name}+sw64, or evaluate a model trained with one")
    window = own if own is not None else window
    return (0, None) if sinks and length is not None and length <= sinks + window else (sinks, window)


def sink_attention(plan: AttentionPlan, i: int, raw: tuple[torch.Tensor, torch.Tensor], q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Chunk i with attention sinks: q (B, H, q, D) rotated at the queries' positions, k, v (B, H, k, D) the
    chunk's keys, sinks first (``key_span``), ``raw`` the chunk's queries and the sink keys before ``rotate``. Towards the first S keys the
    logits come from the queries rotated at their cache positions (the bias there is in the mask already).
    An encoding with ``has_attention_logits`` (CoPE) derives positions from the visible set itself."""
    encoding = plan.encoding
    if plan.logits:  # the encoding computes its logits (CoPE): the visible set is what changes
        return explicit_attention(encoding, plan, i, q, k, v, mask, scale)
    q_pos, k_pos = plan.chunk_positions(i)
    logits = q @ k.transpose(-1, -2)  # (B, H, q, k)
    cache = plan.cache_positions(q_pos)
    if not torch.equal(cache, q_pos):  # some queries are past the first S + W tokens
        q_raw, sinks_raw = raw  # (B, H, q, D), (B, H, n, D)
        n = sinks_raw.shape[-2]
        # one rotate call for both, so that an encoding whose rotation reads the whole position vector (xPos
        # centres its scales on it) treats queries and sinks alike: (B, H, q + n, D)
        both = torch.cat((q_raw, sinks_raw), dim=2)
        rq, rk = encoding.rotate(both, both, torch.cat((cache, k_pos[:n])))
        logits[..., :n] = rq[:, :, :-n] @ rk[:, :, -n:].transpose(-1, -2)
    return torch.softmax(logits.float() * scale + mask, dim=-1).to(v.dtype) @ v


def attend(encoding: encodings.Encoding, plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           scale: float) -> torch.Tensor:
    """Attention of one layer along ``plan``: q, k, v (B, H, T, D) before the encoding's rotation -> (B, H, T, D).

    Our model calls it, and so does a Hugging Face model's attention rerouted through an encoding of ours
    (``hf/attention.py``), so both run the same chunks, masks and per-pair positions."""
    D = q.shape[-1]
    q_raw, k_raw = q, k  # sink_attention rotates queries again, at their cache positions
    q, k = encoding.rotate(q, k, plan.pos)
    if plan.folded:  # zero channels to match the bias channels folded into q and k, once for all chunks
        v = F.pad(v, (0, fold_channels(plan, D, v.dtype)))  # (B, H, T, D + extra)
    outs = []
    for i, (qs, qe, ks) in enumerate(plan.chunks):
        qc, kc, vc = q[:, :, qs:qe], plan.chunk_keys(i, k, 2), plan.chunk_keys(i, v, 2)
        if plan.folded:
            qc, kc = fold_bias(plan, i, qc, kc, scale)  # (B, H, *, D + extra channels)
        mask = plan.mask(i, q.dtype)  # None (causal chunk) or (1, H or 1, qe - qs, p + qe - ks)
        if plan.sinks:  # StreamingLLM's cache: the first S keys plus the window, re-indexed
            raw = (q_raw[:, :, qs:qe], k_raw[:, :, :min(plan.sinks, qe)])
            y = sink_attention(plan, i, raw, qc, kc, vc, mask, scale)
        elif plan.logits:  # the encoding computes the logits itself (CoPE, ReRoPE, Self-Extend)
            y = explicit_attention(encoding, plan, i, qc, kc, vc, mask, scale)
        elif plan.distance_bias is not None:
            y = distance_bias.distance_bias_attention(qc, kc, vc, plan.distance_bias, mask, scale, qs, ks)
        else:
            y = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask, is_causal=mask is None, scale=scale)
        outs.append(y[..., :D])
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, T, D)
