"""p-RoPE: rotary embeddings on the highest frequencies only.

Barbero, Vitvitskyi, Perivolaropoulos, Pascanu & Velickovic, "Round and Round We Go! What makes Rotary
Positional Encodings useful?", ICLR 2025 (arXiv:2410.06205), sec. 6 and its ``apply_p_rope`` listing: of the
D/2 frequency pairs of a head, the first ``int(p * D // 2)`` keep RoPE's full-width frequencies
theta^(-2i/D) (the highest ones) and the rest get frequency 0, i.e. are left unrotated (NoPE channels). The
paper's argument: the lowest frequencies barely rotate within the context and act as semantic channels that
rotation only corrupts at long range.

This is not transformers' ``partial_rotary_factor``, which rotates the first p D dimensions with frequencies
recomputed over that smaller width, theta^(-2i/(pD)), so it keeps the whole range from 1 down to 1/theta.
"""

from __future__ import annotations

import torch

from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import RoPE, default_inv_freq


def partial_inv_freq(head_dim: int, theta: float, fraction: float) -> torch.Tensor:
    """RoPE's inv_freq with all but the first int(fraction * head_dim // 2) entries (the highest) set to 0."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"p-RoPE fraction must be in [0, 1], got {fraction}")
    inv_freq, _ = default_inv_freq(head_dim, theta)
    kept = int(fraction * head_dim // 2)
    inv_freq = inv_freq.clone()
    inv_freq[kept:] = 0.0  # angle 0: cos 1, sin 0, the pair passes unrotated
    return inv_freq


@register("rope-partial")
class PartialRoPE(RoPE):
    """``fraction``: the share of each head's frequency pairs that rotate (the highest); default 0.75, the
    larger of the two fractions the paper trains (0.25, 0.75): it drops the lowest quarter of the spectrum,
    the pairs that do not complete one turn within any window we evaluate, and keeps the rest of RoPE."""

    summary = "RoPE on the highest 75% of frequency pairs, the rest unrotated (p-RoPE); Barbero et al. 2025"
    family = "rotary"
    newer = True
    paper = "Barbero et al., ICLR 2025 (arXiv:2410.06205)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 fraction: float = 0.75) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        self.fraction = float(fraction)
        self._set_frequencies(partial_inv_freq(self.head_dim, theta, self.fraction), 1.0)
