"""KERPLE: kernelized relative positional embedding.

Chi, Fan, Ramadge & Rudnicky, "KERPLE: Kernelized Relative Positional Embedding for Length Extrapolation",
NeurIPS 2022 (arXiv:2205.09921), sec. 4: a learned conditionally positive definite kernel of the distance,
added to the logits per head h:

- ``kerple`` (logarithmic variant): b(i, j) = -r1 log(1 + r2 |i - j|), r1, r2 > 0;
- ``kerple-power``: b(i, j) = -r1 |i - j|^r2, r1 > 0, 0 < r2 <= 2.

Initialisation as the authors' code (``ParallelKerpleLog`` / ``ParallelKerplePower`` in chijames/KERPLE):
r1 ~ U(0, 2), r2 ~ U(0, 1) per head, kept above 0.01 (and r2 <= 2 for the power variant). The authors clamp
the raw values in place every step; here the parameters are reparametrised so the constraint holds without
clamping (r = 0.01 + softplus(raw); the power variant's r2 = 0.01 + 1.99 sigmoid(raw)), started at the same
values, so every step has a gradient.

The bias depends only on i - j, like T5's, but never saturates. It is built from one line of its values per
distance, read as a Toeplitz view (no (Tq, Tk) gather), exact at every eval length; in training the model
takes the gradient of that line (``distance_bias``: one value per distance up to the window's longest, so
r[h, min(i - j, W)] never clamps) from the attention's own backward (model/distance_bias.py), so no (Tq, Tk)
bias is differentiated.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from posenc_bench.encodings.base import Encoding, pair_score_mod, toeplitz_bias
from posenc_bench.encodings.registry import register

EPS = 0.01  # the authors' lower bound on r1, r2


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


class _Kerple(Encoding):
    family = "relative bias"
    newer = True
    paper = "Chi et al., NeurIPS 2022 (arXiv:2205.09921)"
    has_bias = True
    has_distance_bias = True
    distance_only = True
    batched_positions = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        r1 = (torch.rand(n_heads) * 2).clamp(min=EPS)  # the authors' init, clamped as their first step does
        r2 = torch.rand(n_heads).clamp(min=EPS)
        self.raw_r1 = nn.Parameter(_inverse_softplus(r1 - EPS + 1e-6))
        self.raw_r2 = nn.Parameter(self._raw_r2(r2))

    def r1(self) -> torch.Tensor:
        """(H,) the kernel's scale, > 0."""
        return EPS + F.softplus(self.raw_r1)

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        return toeplitz_bias(self.kernel, q_pos, k_pos)

    def distance_bias(self, length: int) -> torch.Tensor:
        """r (H, length): the bias at every distance 0 .. length - 1 of a window of ``length`` tokens (W =
        length - 1: nothing beyond it is clamped)."""
        return self.kernel(torch.arange(max(1, length), device=self.raw_r1.device))

    def kernel(self, distance: torch.Tensor) -> torch.Tensor:
        """(N,) distances -> (H, N) bias values."""
        raise NotImplementedError

    has_score_mod = True

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """The bias as a FlexAttention score_mod: one line of ``kernel`` values per distance 0 .. the chunk's
        largest (H, n), read at max(i - j, 0) (0 for future keys, as ``toeplitz_bias``). Sizing the line reads
        the positions' extremes (one device sync per chunk and forward)."""
        n = max(1, int(q_pos.max()) - int(k_pos.min()) + 1)
        line = self.kernel(torch.arange(n, device=q_pos.device))  # (H, n)
        return pair_score_mod(lambda h, i, j: line[h, (i - j).clamp(0, n - 1)], q_pos, k_pos)


@register("kerple")
class KerpleLog(_Kerple):
    summary = "learned per-head bias -r1 log(1 + r2 |i - j|) (KERPLE, logarithmic); Chi et al. 2022"

    @staticmethod
    def _raw_r2(r2: torch.Tensor) -> torch.Tensor:
        return _inverse_softplus(r2 - EPS + 1e-6)

    def r2(self) -> torch.Tensor:
        """(H,) > 0."""
        return EPS + F.softplus(self.raw_r2)

    def kernel(self, distance: torch.Tensor) -> torch.Tensor:
        d = distance.to(torch.float32)[None, :]  # (1, N)
        return -self.r1()[:, None] * torch.log1p(self.r2()[:, None] * d)  # (H, N)


@register("kerple-power")
class KerplePower(_Kerple):
    summary = "learned per-head bias -r1 |i - j|^r2, 0 < r2 <= 2 (KERPLE, power); Chi et al. 2022"

    @staticmethod
    def _raw_r2(r2: torch.Tensor) -> torch.Tensor:
        u = ((r2 - EPS) / (2 - EPS)).clamp(1e-6, 1 - 1e-6)
        return torch.log(u) - torch.log1p(-u)  # logit

    def r2(self) -> torch.Tensor:
        """(H,) in (0.01, 2)."""
        return EPS + (2 - EPS) * torch.sigmoid(self.raw_r2)

    def kernel(self, distance: torch.Tensor) -> torch.Tensor:
        d = distance.to(torch.float32)[None, :]  # (1, N)
        # d^r2 through a base >= 1: at d = 0 the exponent's gradient d^r2 log d would be nan
        power = torch.where(d > 0, d.clamp(min=1) ** self.r2()[:, None], torch.zeros((), device=d.device))
        return -self.r1()[:, None] * power  # (H, N)
