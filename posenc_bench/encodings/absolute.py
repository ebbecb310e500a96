"""Absolute position encodings added to the token embeddings.

- ``sinusoidal``: Vaswani et al., "Attention Is All You Need", NeurIPS 2017 (arXiv:1706.03762), sec. 3.5:
  PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), added to the token
  embeddings. The paper multiplies the embeddings by sqrt(d) (sec. 3.4), with embeddings initialised at std
  d^-0.5 (tensor2tensor's ``embedding``): the tokens enter at RMS 1 beside the table's RMS 1/sqrt(2), a
  ratio of 1.41 to 1. Every model here shares one initialisation instead, std ``INIT_STD`` = 0.02 (GPT-2's),
  under which sqrt(d) x the embeddings (RMS 0.23 at d = 128) would sit *below* the table (0.71, a ratio of
  0.32) and start the residual stream 11x larger than every other encoding's. So the default keeps the
  paper's ratio at the shared scale: x + PE * INIT_STD (table RMS 0.014 beside the tokens' 0.02), with the
  token embeddings unscaled as in every other row. ``token_scale`` (0: sqrt(d)) and ``pe_scale`` give the
  other choices; results/default/README.md measures them (the literal x * sqrt(d) + PE is token_scale 0,
  pe_scale 1).
- ``learned``: a trained table of one vector per position, as in GPT-2 (Radford et al., 2019) and
  BERT (Devlin et al., 2019); it has exactly train-length rows and cannot go past them.
"""

from __future__ import annotations

import inspect
import math

import torch
from torch import nn

from posenc_bench.encodings.base import INIT_STD, Encoding, consecutive_start
from posenc_bench.encodings.registry import register
from posenc_bench.encodings.phasors import unit_phasors
from posenc_bench.errors import PositionOutOfRange


def sinusoidal_table(length: int, d_model: int, base: float = 10000.0, *, device=None) -> torch.Tensor:
    """(length, d_model) float32 table of the original formula, sin in even and cos in odd columns.

    Built by angle addition from float64 factors (``phasors.unit_phasors``): within 3e-7 of the exact
    values at every position, where the textbook float32 version drifts by ~4e-4 at position 5000, and
    several times faster than it (one complex multiply per sin/cos pair instead of two transcendentals).
    """
    if d_model % 2:
        raise ValueError(f"sinusoidal encoding needs an even model width, got d_model={d_model}")
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d/2,)
    # (sin x, cos x) = (cos(pi/2 - x), sin(pi/2 - x)): the phasor of pi/2 - pos * inv_freq
    pairs = unit_phasors(length, inv_freq, sign=-1.0, phase=math.pi / 2, device=device)  # (L, d/2, 2)
    return pairs.view(length, d_model)


def rows(table: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """table[pos]: a view for consecutive positions (no copy, unlike the gather), else a gather."""
    start = consecutive_start(pos)
    return table[pos] if start is None else table[start:start + pos.shape[0]]


def _end(pos: torch.Tensor) -> int:
    """One past the largest position: from ``consecutive_start``'s memo for the model's positions (no host
    sync), else read from the values."""
    start = consecutive_start(pos)
    return start + pos.shape[0] if start is not None else int(pos.max()) + 1


@register("sinusoidal")
class Sinusoidal(Encoding):
    summary = "fixed absolute sin/cos added to embeddings; Vaswani et al. 2017"
    family = "classic absolute"
    paper = "Vaswani et al., NeurIPS 2017 (arXiv:1706.03762)"
    batched_positions = True
    positions_in_embedding = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, base: float = 10000.0,
                 token_scale: float = 1.0, pe_scale: float = INIT_STD) -> None:
        """embed(x) = x * token_scale + PE * pe_scale; token_scale 0 means sqrt(d) (the paper's sec. 3.4)."""
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if d_model % 2:
            raise ValueError(f"sinusoidal encoding needs an even model width, got d_model={d_model}")
        if token_scale < 0 or pe_scale <= 0:
            raise ValueError(f"sinusoidal needs token_scale >= 0 (0: sqrt(d)) and pe_scale > 0, got {token_scale}, {pe_scale}")
        self.base = base
        self.scale = token_scale or math.sqrt(d_model)  # the token embeddings' multiplier
        self.pe_scale = float(pe_scale)
        self._table = torch.empty(0, d_model)

    @classmethod
    def key_options(cls, train_len: int, options: dict) -> dict:
        # the defaults changed from the literal x * sqrt(d) + PE: the key names the scales, so models trained
        # under the old defaults are not taken for these
        defaults = inspect.signature(cls.__init__).parameters
        return {k: float(options.get(k, defaults[k].default)) for k in ("token_scale", "pe_scale")}

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        needed = _end(pos)
        if self._table.shape[0] < needed or self._table.device != x.device:
            self._table = sinusoidal_table(max(needed, self.train_len), self.d_model, self.base, device=x.device)
        pe = rows(self._table, pos)  # (T, C) broadcast over the batch, or (B, T, C)
        if self.pe_scale != 1.0:
            pe = pe * self.pe_scale
        return x * self.scale + pe.to(x.dtype)


@register("learned")
class Learned(Encoding):
    summary = "trained absolute table of train-length rows (GPT-2 style); n/a past the train length"
    family = "classic absolute"
    paper = "Radford et al. 2019 (GPT-2); Devlin et al., NAACL 2019 (arXiv:1810.04805)"
    batched_positions = True
    positions_in_embedding = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, init_std: float = INIT_STD,
                 max_positions: int = 0) -> None:
        """``max_positions``: rows of the table, 0 = the train length (``learned+rand`` sets its range M)."""
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if max_positions < 0:
            raise ValueError(f"max_positions must be >= 0 (0: the train length), got {max_positions}")
        self.table = nn.Parameter(torch.randn(max_positions or train_len, d_model) * init_std)

    def _check(self, length: int) -> None:
        if length > self.table.shape[0]:
            n = self.table.shape[0]
            what = "the train length" if n == self.train_len else "its position range"
            raise PositionOutOfRange(f"learned position table has {n} rows ({what}): no position {n} or later")

    def set_eval_length(self, length: int) -> None:
        self._check(length)

    def embed(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self._check(_end(pos))
        return x + rows(self.table, pos).to(x.dtype)
