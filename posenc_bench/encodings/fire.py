"""FIRE: functional interpolation for relative positions.

Li, Zhu, Huang, Sheng, Chen, Wu, Chang, Wang, Bhojanapalli & Chen, "Functional Interpolation for Relative
Positions Improves Long Context Transformers", ICLR 2024 (arXiv:2310.04418), sec. 3: a per-head bias

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

for a query at position i and a key at j <= i. f_theta: R -> R^H is a small MLP (one hidden layer of
``mlp_width`` units, ReLU), c > 0 is learned, and L is a learned threshold (the paper's "progressive
interpolation": up to L the bias is a function of the distance; past it the normalised distance stays in
[0, 1] whatever the length, which is what lets the bias interpolate instead of extrapolate). The paper's
listing learns L as |multiplier * L_init| with the multiplier starting at 1, and adds eps = 1e-6 to the
denominator; c starts at 0.1.

Defaults: ``mlp_width`` 32 and c = 0.1 as in the paper's listing; ``threshold`` (L's initial value) 0 means a
quarter of the train length, the paper's ratio (L_init 512 for training at 2048 tokens); give a number of
tokens to set it directly. The bias depends on (i - j, i), not on the distance alone, so it goes through the
chunked mask path; its MLP runs on blocks of query rows so that its hidden activations stay bounded at any
length.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc_bench.encodings.base import Encoding
from posenc_bench.encodings.registry import register

EPS = 1e-6
HIDDEN_ELEMENTS = 1 << 22  # the most (rows x keys x width) hidden activations one MLP call builds


@register("fire")
class FIRE(Encoding):
    summary = "learned MLP of log distance normalised by log query position (FIRE); Li et al. 2024"
    family = "relative bias"
    newer = True
    paper = "Li et al., ICLR 2024 (arXiv:2310.04418)"
    has_bias = True
    batched_positions = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, mlp_width: int = 32, threshold: float = 0.0,
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
        """L = |multiplier * L_init|, learned."""
        return (self.threshold_multiplier * self.threshold_init).abs()

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """psi(i - j) / (psi(max(L, i)) + eps): (Tq, Tk) or (B, Tq, Tk); future keys (i < j) get distance 0."""
        i = q_pos.to(torch.float32)[..., :, None]  # (..., Tq, 1)
        j = k_pos.to(torch.float32)[..., None, :]  # (..., 1, Tk)
        c = self.c.abs()
        numerator = torch.log(c * (i - j).clamp(min=0) + 1)
        denominator = torch.log(c * torch.maximum(i, self.threshold()) + 1) + EPS
        return numerator / denominator

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        u = self.normalized_distance(q_pos, k_pos)  # (..., Tq, Tk)
        Tq, Tk = u.shape[-2:]
        width = self.mlp[0].out_features
        rows = max(1, HIDDEN_ELEMENTS // max(1, Tk * width * (u.shape[0] if u.dim() == 3 else 1)))
        parts = [self.mlp(u[..., a:a + rows, :, None]) for a in range(0, Tq, rows)]  # (..., rows, Tk, H) each
        b = torch.cat(parts, dim=-3) if len(parts) > 1 else parts[0]  # (..., Tq, Tk, H)
        return b.movedim(-1, -3) if b.dim() == 4 else b.movedim(-1, 0).unsqueeze(0)  # (1 or B, H, Tq, Tk)
