"""ALiBi: attention with linear biases.

Press, Smith & Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", ICLR 2022 (arXiv:2108.12409). Each head h adds -m_h * (i - j) to the logit of query i and
key j. The model never builds that (Tq, Tk) tensor: ``bias_factors`` gives it as one extra q/k channel (up to
a per-query constant), which keeps attention on SDPA's fused kernels. Slopes form a geometric sequence starting at 2^(-8/n) with that same ratio; for a head count n that
is not a power of two, take the slopes of the closest smaller power of two p, then every other slope of 2p
(the paper's reference code, sec. 3).
"""

from __future__ import annotations

import math

import torch

from posenc_bench.encodings.base import Encoding, pair_score_mod
from posenc_bench.encodings.registry import register


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """(n_heads,) float32 slopes; for 8 heads 1/2, 1/4, ..., 1/256."""

    def power_of_two(n: int) -> list[float]:
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))  # 2^(-8/n)
        return [start ** (i + 1) for i in range(n)]

    if n_heads < 1:
        raise ValueError(f"ALiBi needs at least one head, got n_heads={n_heads}")
    p = 2 ** math.floor(math.log2(n_heads))
    slopes = power_of_two(p)
    if p != n_heads:
        slopes += power_of_two(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)


@register("alibi")
class ALiBi(Encoding):
    summary = "fixed per-head linear distance penalty on attention logits; Press et al. 2022"
    family = "relative bias"
    paper = "Press et al., ICLR 2022 (arXiv:2108.12409)"
    has_bias = True
    has_low_rank_bias = True
    distance_only = True
    batched_positions = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        self.slopes = alibi_slopes(n_heads)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        if q_pos.dim() == 2:  # per-sequence positions (B, q), (B, k)
            relative = (k_pos[:, None, :] - q_pos[:, :, None]).to(torch.float32)  # (B, q, k)
            return self.slopes.to(relative.device)[None, :, None, None] * relative[:, None]  # (B, H, q, k)
        relative = (k_pos[None, :] - q_pos[:, None]).to(torch.float32)  # (Tq, Tk), <= 0 for visible keys
        return (self.slopes.to(relative.device)[:, None, None] * relative).unsqueeze(0)  # (1, H, Tq, Tk)

    def bias_factors(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Within a query row -m * (i - j) is linear in the key position j: it equals m * (j - c) up to the
        per-row constant m * (c - i), which softmax ignores. So the bias is the product of a ones column for
        the queries and m * (j - c) for the keys; c, the middle of the query chunk, keeps the values near the
        diagonal small, so float32 logits lose no precision. Per-sequence positions (B, q), (B, k) give key
        factors (B, H, k, 1), each sequence centred on its own query chunk."""
        if q_pos.dim() == 2:
            c = (q_pos[:, :1] + q_pos[:, -1:]) // 2  # (B, 1)
            slopes = self.slopes.to(device=k_pos.device, dtype=torch.float64)
            qf = torch.ones(self.n_heads, q_pos.shape[1], 1, dtype=torch.float64, device=q_pos.device)  # (H, q, 1)
            kf = slopes[None, :, None, None] * (k_pos - c).to(torch.float64)[:, None, :, None]  # (B, H, k, 1)
            return qf, kf
        c = (q_pos[0] + q_pos[-1]) // 2  # a 0-d tensor: no host sync (k_pos - c is exact in int64 and in float64)
        slopes = self.slopes.to(device=k_pos.device, dtype=torch.float64)
        qf = torch.ones(self.n_heads, q_pos.shape[0], 1, dtype=torch.float64, device=q_pos.device)  # (H, Tq, 1)
        kf = slopes[:, None, None] * (k_pos - c).to(torch.float64)[None, :, None]  # (H, Tk, 1)
        return qf, kf

    has_score_mod = True

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """The bias as a FlexAttention score_mod: m_h (j - i) from the (H,) slopes, as ``bias`` computes it."""
        slopes = self.slopes.to(q_pos.device)  # (H,)
        return pair_score_mod(lambda h, i, j: slopes[h] * (j - i).to(torch.float32), q_pos, k_pos)
