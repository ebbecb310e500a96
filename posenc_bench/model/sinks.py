"""The attention-sinks path: StreamingLLM's cache, applied by re-indexing positions inside attention.

Xiao, Tian, Chen, Han & Lewis, "Efficient Streaming Language Models with Attention Sinks", ICLR 2024
(arXiv:2309.17453), sec. 3.2: an encoding with ``attention_sinks`` = (S, W) (rows ``<encoding>+sink<S>+sw<W>``,
``encodings/sinks.py``) keeps the first S tokens visible beside a sliding window of W keys, and positions are
those within that cache of S + W tokens: once the cache is full (query i >= S + W) a query sits at S + W - 1
towards the sinks, which sit at 0 .. S - 1, while its recent keys keep their true distances. The plan (``plan.py``)
puts the sinks first among each chunk's keys (``AttentionPlan.key_span``) and their visible set and bias in the
masks (``sink_bias``); here the rotation towards them is taken at the queries' cache positions
(``cache_positions``), through the encoding's own hooks.
"""

from __future__ import annotations

import torch

from posenc_bench.model.plan import AttentionPlan, Chunk, cache_positions


def sink_attention(plan: AttentionPlan, c: Chunk) -> torch.Tensor:
    """Chunk ``c`` with attention sinks: softmax(q . k * scale + mask) @ v, where towards the first keys (the
    sinks, ``key_span``) q . k comes from the queries rotated at their cache positions instead (the bias there
    is in the mask already: ``sink_bias``). ``c.raw`` gives the layer's queries and sink keys before rotation."""
    qs, qe, _ = plan.chunks[c.i]
    q_pos, k_pos = plan.chunk_positions(c.i)
    logits = c.q @ c.k.transpose(-1, -2)  # (B, H, q, k)
    cache = cache_positions(q_pos, plan.sinks, plan.window)
    if not torch.equal(cache, q_pos):  # some queries are past the first S + W tokens
        q_raw, k_raw = c.raw  # (B, H, T, D) each
        q_raw, sinks_raw = q_raw[:, :, qs:qe], k_raw[:, :, :min(plan.sinks, qe)]  # (B, H, q, D), (B, H, n, D)
        n = sinks_raw.shape[-2]
        # one rotate call for both, so that an encoding whose rotation reads the whole position vector (xPos
        # centres its scales on it) treats queries and sinks alike: (B, H, q + n, D)
        both = torch.cat((q_raw, sinks_raw), dim=2)
        encoding = plan.encoding if c.encoding is None else c.encoding  # the layer's view (Encoding.for_layer)
        rq, rk = encoding.rotate(both, both, torch.cat((cache, k_pos[:n])))
        logits[..., :n] = rq[:, :, :-n] @ rk[:, :, -n:].transpose(-1, -2)
    return torch.softmax(logits.float() * c.scale + c.mask, dim=-1).to(c.v.dtype) @ c.v
