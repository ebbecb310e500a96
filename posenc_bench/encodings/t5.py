"""T5 relative position bias.

Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text Transformer",
JMLR 2020 (arXiv:1910.10683), sec. 2.1: a learned scalar per head and per bucket of the relative distance,
added to the attention logits; distances below num_buckets/2 get a bucket each, larger ones share
logarithmically wider buckets up to max_distance, and everything beyond shares the last bucket.
Causal (decoder) form: only keys at or before the query are bucketed.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from posenc_bench.encodings.base import Encoding, pair_score_mod, toeplitz_bias
from posenc_bench.encodings.registry import register


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128) -> torch.Tensor:
    """Causal T5 bucket of ``key_pos - query_pos`` (<= 0 for the keys a decoder sees)."""
    distance = (-relative_position).clamp(min=0)  # how far back the key is
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    # log-spaced buckets for max_exact <= distance < max_distance; clamp(min=1) only guards log(0) in the
    # branch torch.where discards
    log_ratio = torch.log(distance.clamp(min=1).float() / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).to(torch.long)
    large = large.clamp(max=num_buckets - 1)
    return torch.where(is_small, distance, large)


@register("t5")
class T5Bias(Encoding):
    summary = "learned per-head bias on log-spaced relative-distance buckets; Raffel et al. 2020"
    family = "relative bias"
    paper = "Raffel et al., JMLR 2020 (arXiv:1910.10683)"
    has_bias = True
    distance_only = True
    has_distance_bias = True

    def __init__(
        self, *, d_model: int, n_heads: int, train_len: int, num_buckets: int = 32, max_distance: int = 128
    ) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if num_buckets < 2 or max_distance <= num_buckets // 2:
            raise ValueError(
                f"T5 buckets need num_buckets >= 2 and max_distance > num_buckets // 2, "
                f"got num_buckets={num_buckets}, max_distance={max_distance}"
            )
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        nn.init.normal_(self.relative_attention_bias.weight, std=d_model**-0.5)  # T5's own init

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        # buckets depend only on the distance, and all distances >= max_distance share the last one: look the
        # (H, max_distance + 1) values up by clamped distance instead of bucketing Tq x Tk entries
        r = self.distance_bias(0)  # (H, max_distance + 1)
        return toeplitz_bias(lambda d: r[:, d.clamp(max=self.max_distance)], q_pos, k_pos)  # (1, H, Tq, Tk)

    def distance_bias(self, length: int) -> torch.Tensor:
        """r (H, max_distance + 1): the bias at distances 0 .. max_distance; every larger distance shares the
        last bucket, so bias(i, j) = r[h, min(i - j, max_distance)] at any ``length``."""
        distance = torch.arange(self.max_distance + 1, device=self.relative_attention_bias.weight.device)
        buckets = relative_position_bucket(-distance, self.num_buckets, self.max_distance)
        return self.relative_attention_bias(buckets).t()  # (H, max_distance + 1)

    has_score_mod = True

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """The bias as a FlexAttention score_mod: r[h, min(max(i - j, 0), max_distance)] read from the
        (H, max_distance + 1) line of ``distance_bias``, as ``bias`` reads it."""
        r, last = self.distance_bias(0), self.max_distance  # (H, max_distance + 1)
        return pair_score_mod(lambda h, i, j: r[h, (i - j).clamp(0, last)], q_pos, k_pos)
