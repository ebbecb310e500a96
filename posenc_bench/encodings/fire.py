"""FIRE: functional interpolation for relative positions.

Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar & Bhojanapalli, "Functional Interpolation
for Relative Positions Improves Long Context Transformers", ICLR 2024 (arXiv:2310.04418), sec. 3: a per-head
bias

    b(i, j) = f_theta( psi(i - j) / psi(max(L, i)) ),   psi(x) = log(c x + 1),

for a query at position i and a key at j <= i. f_theta: R -> R^H is a small MLP, c > 0 sharpens the log
(the code's comment: "amplifying differences among local positions"), and L is a threshold: up to L the
normaliser is the constant psi(L), so the bias is a function of the distance; past it the normalised distance
stays in [0, 1] whatever the length (the paper's "progressive interpolation"), which lets the bias
interpolate instead of extrapolate.

Every default and every step of the computation is the public implementation ``class FIRE`` of
mcleish7/arithmetic, ``cramming/architectures/embeddings.py`` (lines 419-480 at commit 86022a5, cited as
``embeddings.py``; its docstrings cite the paper), which this module equals entry by entry
(tests/encodings/test_fire.py re-implements it in float64):

- ``mlp_width`` 32: ``__init__(..., mlp_width=32, ...)`` (line 420); the MLP is ``Linear(1, width) -> ReLU ->
  Linear(width, H)`` (line 435) with PyTorch's default initialisation (the model's std-0.02 init runs before
  the encoding is built and does not touch it).
- c starts at 0.1 (``init_c=0.1``, line 420) and is learned as a plain parameter (line 438); the code takes
  ``log(|c * d| + 1)`` for the distance and for the normaliser alike (lines 472-473), so c's sign never
  matters.
- L starts at 512 tokens (``init_L=512.0``, line 420): a fixed ``init_L`` (``requires_grad=False``, line 441)
  times a learned multiplier that starts at 1 (line 442), L = |multiplier * init_L| (line 468). It is a number
  of tokens, not a fraction of the train length (the caller, ``cramming/architectures/attention.py`` line
  182, builds FIRE with that default whatever the sequence length). ``threshold=0`` gives this repository's
  earlier default, a quarter of the train length.
- the normaliser is max(i, L) over the query position i, positions counted from 0 (lines 464, 469); eps =
  1e-6 is added to psi of it (``eps=1e-6``, lines 420, 476).
- future keys (j > i) get psi(|i - j|) (the ``abs`` of line 472), as there; the causal mask hides them.
- the paper's sec. 3 defines the same b(i, j); the values above are the code's, and its own runs use them
  (attention.py line 182 passes only the head count and ``max_length``, the randomised-positions range).

One difference stays: the reference builds one FIRE per attention layer (attention.py line 182), while this
model computes one bias shared by all layers (model/transformer.py), like T5's bias here.

The bias depends on (i - j, i), not on the distance alone, so it goes through the chunked mask path; its MLP
runs on blocks of query rows so that its hidden activations stay bounded at any length.
"""

from __future__ import annotations

import torch
from torch import nn

from posenc_bench.encodings.base import Encoding, pair_score_mod
from posenc_bench.encodings.registry import register

EPS = 1e-6  # eps=1e-6: mcleish7/arithmetic cramming/architectures/embeddings.py, FIRE.__init__ (line 420)
HIDDEN_ELEMENTS = 1 << 22  # the most (rows x keys x width) hidden activations one MLP call builds


@register("fire")
class FIRE(Encoding):
    summary = "learned MLP of log distance normalised by log query position (FIRE); Li et al. 2024"
    family = "relative bias"
    newer = True
    paper = "Li et al., ICLR 2024 (arXiv:2310.04418)"
    has_bias = True
    batched_positions = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, mlp_width: int = 32, threshold: float = 512.0,
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
        """L = |multiplier * L_init|, learned through the multiplier."""
        return (self.threshold_multiplier * self.threshold_init).abs()

    def normalized_distance(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """psi(|i - j|) / (psi(max(L, i)) + eps), psi(x) = log(|c x| + 1): (Tq, Tk) or (B, Tq, Tk)."""
        dtype = torch.promote_types(self.c.dtype, torch.float32)  # float32, or float64 for a float64 module
        i = q_pos.to(dtype)[..., :, None]  # (..., Tq, 1)
        j = k_pos.to(dtype)[..., None, :]  # (..., 1, Tk)
        return self.psi_ratio(i, j, self.c, self.threshold())

    def bias(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        u = self.normalized_distance(q_pos, k_pos)  # (..., Tq, Tk)
        Tq, Tk = u.shape[-2:]
        width = self.mlp[0].out_features
        rows = max(1, HIDDEN_ELEMENTS // max(1, Tk * width * (u.shape[0] if u.dim() == 3 else 1)))
        parts = [self.mlp(u[..., a:a + rows, :, None]) for a in range(0, Tq, rows)]  # (..., rows, Tk, H) each
        b = torch.cat(parts, dim=-3) if len(parts) > 1 else parts[0]  # (..., Tq, Tk, H)
        return b.movedim(-1, -3) if b.dim() == 4 else b.movedim(-1, 0).unsqueeze(0)  # (1 or B, H, Tq, Tk)

    @staticmethod
    def psi_ratio(i: torch.Tensor, j: torch.Tensor, c: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        """psi(|i - j|) / (psi(max(L, i)) + eps), psi(x) = log(|c x| + 1), for float positions i, j of any
        broadcastable shapes and L = ``threshold``."""
        numerator = torch.log(torch.abs(c * (i - j)) + 1)
        denominator = torch.log(torch.abs(c * torch.maximum(i, threshold)) + 1) + EPS
        return numerator / denominator

    has_score_mod = True

    def score_mod(self, q_pos: torch.Tensor, k_pos: torch.Tensor):
        """The bias as a FlexAttention score_mod: the MLP evaluated pair by pair on the normalised distance,
        its hidden width unrolled into scalar operations (a score_mod is pointwise: no matmul inside the
        kernel); only the MLP's weights, c and L are captured."""
        dtype = torch.promote_types(self.c.dtype, torch.float32)
        first, second = self.mlp[0], self.mlp[2]
        w1, b1, w2, b2 = first.weight[:, 0], first.bias, second.weight, second.bias  # (W,), (W,), (H, W), (H,)
        c, threshold, psi_ratio = self.c, self.threshold(), self.psi_ratio  # a staticmethod: no module captured

        def bias_at(h, i, j):
            u = psi_ratio(i.to(dtype), j.to(dtype), c, threshold)
            out = b2[h]
            for m in range(w1.shape[0]):
                out = out + w2[h, m] * torch.relu(w1[m] * u + b1[m])
            return out

        return pair_score_mod(bias_at, q_pos, k_pos)
