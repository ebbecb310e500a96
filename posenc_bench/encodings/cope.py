"""CoPE: contextual position encoding.

Golovneva, Wang, Weston & Sukhbaatar, "Contextual Position Encoding: Learning to Count What's Important",
2024 (arXiv:2405.18719), sec. 3: positions are counted by the content. For query i and key j <= i,

    g_ij = sigmoid(q_i . k_j / sqrt(D)),   p_ij = sum_{t = j .. i} g_it,

and the logit gains q_i . e[p_ij], where e holds ``npos_max`` learned vectors of the head dimension and a
fractional p_ij interpolates e[floor p] and e[ceil p] (by the logits q . e, as the paper does). As the
authors' code (facebookresearch/RAM, projects/cope), positions are clamped to npos_max - 1, the table starts
at zero, the position logit is added before the 1/sqrt(D) scale, and npos_max defaults to the train length +
1 (a count can reach the number of keys). The table is shared by all layers (the authors' ``--cope-shared``
option; their default keeps one per layer), as every encoding here is one module for the whole model.

CoPE reads q . k, so it computes each query chunk's whole logits (``has_attention_logits``): attention runs
explicitly, chunk by chunk, with memory bounded by the chunk size.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import register


@register("cope")
class CoPE(Encoding):
    summary = "positions counted by sigmoid(q.k) gates, interpolated position logits (CoPE); Golovneva et al. 2024"
    family = "contextual"
    newer = True
    paper = "Golovneva et al. 2024 (arXiv:2405.18719)"
    has_attention_logits = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, npos_max: int = 0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if npos_max < 0:
            raise ValueError(f"npos_max must be >= 0 (0: train length + 1), got {npos_max}")
        self.npos_max = npos_max or train_len + 1
        self.pos_emb = nn.Parameter(torch.zeros(self.head_dim, self.npos_max))  # e[p] = pos_emb[:, p]

    def positions_of(self, logits: torch.Tensor, visible: torch.Tensor) -> torch.Tensor:
        """p_ij = sum_{t >= j} g_it over visible keys, clamped to npos_max - 1: (B, H, q, k) from scaled q . k."""
        gates = torch.sigmoid(logits) * visible
        return gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos_max - 1)

    def attention_logits(self, q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                         mask: torch.Tensor, scale: float) -> torch.Tensor:
        qf = q.float()
        content = qf @ k.float().transpose(-1, -2)  # (B, H, q, k)
        p = self.positions_of(content * scale, torch.isfinite(mask).float())
        fixed = qf @ self.pos_emb.float()  # (B, H, q, npos_max): q . e[n] for every integer position n
        floor = p.floor()
        w = p - floor  # differentiable in the gates
        lo = fixed.gather(-1, floor.long())
        hi = fixed.gather(-1, p.ceil().long())
        return (content + hi * w + lo * (1 - w)) * scale + mask
