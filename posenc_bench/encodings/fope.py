"""FoPE: Fourier Position Embedding.

Hua, Jiang, Lv, Zhang, Sun, Fan, Zhu, Qi, Ding & Zhou, "Fourier Position Embedding: Enhancing Attention's
Periodic Extension for Length Generalization", ICML 2025 (arXiv:2412.17739). The paper's argument: RoPE gives
each dimension pair one frequency, but linear layers and activations leak other frequencies into it, and the
lowest frequencies never complete a period within the train length, so they are under-trained and break the
periodic extension past it. FoPE (1) makes each pair's rotation a Fourier series over several frequencies, and
(2) clips the frequencies whose period exceeds the train length to zero frequency.

What is taken from the authors' code, TsinghuaC3I/Fourier-Position-Embedding at commit
bd94b20d82bf11240ad3584c515c790d255da919 (an OLMo fork), file ``olmo/model.py``:

- **Frequencies** (``RotaryEmbedding.get_inv_freq``): RoPE's theta^(-2i/D), i = 0 .. D/2 - 1, theta 10000
  (``rope_theta``), in float32. With ``rope_clamp_floor_freq`` and ``rope_clamp_floor_to_zero`` (set in every
  released FoPE config, ``configs/*/ce-fourier/*.yaml``) and ``rope_floor_freq_ratio`` 1.0, those below
  2 pi / ``max_sequence_length`` (the train length) are set to 0, and ``fourier_ignore_zero`` (default True)
  drops the zeros: the series runs over the M kept frequencies omega_f (at least one turn per train window).
- **Coefficients** (``FourierEmbedding.__init__``, ``fourier_separate_basis`` and ``fourier_separate_head``,
  both default True): per head h, two (M, O) matrices, one for the cosines and one for the sines, with
  O = min(M, D // 4) (``output_dim``; ``fourier_dim`` 0 keeps the head dimension). One module per attention
  layer (``OLMoBlock.__init__`` builds ``self.pos_emb = FourierEmbedding(...)``), so every layer has its own.
  Not trained: ``fourier_learnable`` defaults to False and no released config sets it.
- **Initialisation** (``FourierEmbedding.reset_parameters``, ``fourier_init`` "eye_xavier_norm", the default
  and every config's): ``xavier_normal_`` with gain ``fourier_init_norm_gain`` on the (H, M, O) tensor (so
  std = gain sqrt(2 / (M O + H O))), plus the identity when M = O, else ``get_step_eye``: 1 at (i s, i) for
  s = ceil(M / O) wherever i s < M. The gain is 0.3, the config default and the 60M models' (0.4 and 0.6 for
  their 180M and 1.2B models); our models are smaller still.
- **Rotation** (``FourierEmbedding.apply_rotary_pos_emb``, ``fourier_norm`` False): for position t,
  C_h(t) = cos(t omega) @ cos_coef_h and S_h(t) = sin(t omega) @ sin_coef_h, each (O,), padded to D/2 entries
  with **ones** (``F.pad(..., value=1)`` on both), then x * [C, C] + rotate_half(x) * [S, S]: pair d of
  (x_d, x_{d + D/2}) becomes (x_d C_d - x_{d+D/2} S_d, x_{d+D/2} C_d + x_d S_d), the half-split layout of
  ``rope.py``. The D/2 - O padded pairs (the clipped frequencies' place) are zero-frequency in that they never
  change with position; with cos = sin = 1 there they are the fixed map (x1 - x2, x2 + x1), not the identity
  that cos 0 = 1, sin 0 = 0 would give. Taken as the authors' code has it, since it is what their models
  trained with. Queries and keys are rotated alike (``OLMoBlock.attention``).

The logit of q at i and k at j is a function of i - j when each head's sine and cosine coefficients are one
and the same matrix with at most one nonzero entry per column: gain 0, the authors' "eye" init, gives the
identity (M <= D/4: RoPE on the first M pairs, plus the constant pairs) or the step identity (M > D/4: pair i
turns at omega_{i s}, and the columns past the last step are zero, so those pairs drop out of the logit).
The default init adds independent noise to the two bases, so the logit also carries terms in i + j and
cross-frequency terms, the Fourier series by design: it is not shift-invariant.

Deviations, each with its reason:

- The coefficients are persistent buffers, not ``nn.Parameter(requires_grad=False)``: the same values, saved
  with the checkpoint, but never counted as trained weights nor handed to the optimizer.
- The angles t omega are exact (float64) before cos and sin are rounded to float32 (``rope_cos_sin_halves``,
  the house RoPE's tables); the authors round t omega to float32 first. The series is summed in float32 with
  autocast off, as their ``rope_full_precision`` does, but q and k are rotated in their own dtype, as the
  house ``rope`` row is, so the two rows compare at one precision (the same numbers in fp32).
- ``batched_positions`` is False: ``fope`` is listed after ``randomized`` (registry.MODULES), so no
  ``fope+rand`` row exists, and declaring it would make one appear only when this module is imported first.

Not a deviation but a limit of the model today: a ``fope+sink<S>+sw<W>`` row re-rotates the queries towards
the sinks through ``plan.encoding.rotate`` (``model/sinks.py``), which is layer 0's series in every layer; the
chunk's own layer (``Chunk.encoding``) would give each layer its own.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

from posenc_bench.encodings.base import Encoding, LayerOf, consecutive_start
from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import apply_rotary, default_inv_freq, rope_cos_sin_halves


def fope_frequencies(head_dim: int, theta: float, train_len: int) -> torch.Tensor:
    """(M,) float32: RoPE's theta^(-2i/D) that are at least 2 pi / train_len, in RoPE's order (the authors'
    floor clamp to zero with ratio 1, then ``fourier_ignore_zero`` dropping the zeros)."""
    if train_len < 1:
        raise ValueError(f"FoPE needs train_len >= 1 (its frequency floor is 2 pi / train_len), got {train_len}")
    inv_freq, _ = default_inv_freq(head_dim, theta)  # (D/2,) float32, ValueError for an odd head_dim
    return inv_freq[inv_freq >= 2 * math.pi / train_len]


def series_width(n_freq: int, head_dim: int) -> int:
    """O, the pairs of a head that carry a Fourier series: min(M, D // 4) (the authors' ``output_dim``)."""
    return min(n_freq, head_dim // 4)


def step_eye(n_freq: int, width: int) -> torch.Tensor:
    """(M, O) float32: 1 at (i s, i) for s = ceil(M / O) wherever i s < M, else 0 (the identity when M = O):
    pair i starts on the i s-th kept frequency (the authors' ``get_step_eye``)."""
    eye = torch.zeros(n_freq, width)
    if width:
        step = -(-n_freq // width)
        rows = torch.arange(0, n_freq, step)  # i s < M
        eye[rows, torch.arange(rows.numel())] = 1.0
    return eye


def init_coefficients(n_heads: int, n_freq: int, width: int, gain: float) -> torch.Tensor:
    """(H, M, O) float32: xavier_normal_(gain) over the (H, M, O) tensor (std gain sqrt(2 / (M O + H O)))
    plus ``step_eye``, the authors' "eye_xavier_norm"; from torch's global generator."""
    coef = torch.zeros(n_heads, n_freq, width)
    if coef.numel():  # xavier's std divides by M O + H O: no draw for an empty series
        torch.nn.init.xavier_normal_(coef, gain=gain)
    return coef + step_eye(n_freq, width)


@register("fope")
class FoPE(Encoding):
    """FoPE, Hua et al., ICML 2025 (arXiv:2412.17739), as the authors' code computes it:
    TsinghuaC3I/Fourier-Position-Embedding at commit bd94b20d82bf11240ad3584c515c790d255da919, ``olmo/model.py``:
    ``FourierEmbedding.apply_rotary_pos_emb`` (the series and the rotation), ``FourierEmbedding.reset_parameters``
    and ``get_step_eye`` (the coefficients), ``RotaryEmbedding.get_inv_freq`` (the clipped frequencies), with the
    defaults of ``olmo/config.py`` and the released FoPE configs (the module docstring gives each one).

    ``theta``: RoPE's base (10000, the authors' ``rope_theta``); ``gain``: the std gain of the coefficients'
    noise around the identity (0.3, the authors' ``fourier_init_norm_gain``; 0 gives their "eye" init).
    ``n_layers``: the model's attention layers, each with its own coefficients (the model passes it).

    Deviations (reasons in the module docstring): the coefficients are saved buffers, not frozen parameters;
    angles t omega exact before cos/sin (theirs rounded to float32); q, k rotated in their own dtype like the
    ``rope`` row (the series itself in float32, as theirs); no per-sequence positions (no ``fope+rand`` row)."""

    summary = ("RoPE with each pair's rotation a Fourier series of the kept frequencies, those with a period "
               "past the train length clipped to zero frequency (FoPE); Hua et al. 2025")
    family = "rotary"
    newer = True
    paper = "Hua et al., ICML 2025 (arXiv:2412.17739)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0, gain: float = 0.3,
                 n_layers: int = 1) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len)
        if not gain >= 0:
            raise ValueError(f"FoPE gain must be >= 0 (0: the identity coefficients, RoPE), got {gain}")
        if n_layers < 1:
            raise ValueError(f"FoPE needs n_layers >= 1 (coefficients per attention layer), got {n_layers}")
        self.theta, self.gain, self.n_layers = float(theta), float(gain), n_layers
        self.inv_freq = fope_frequencies(self.head_dim, self.theta, train_len)  # (M,) kept frequencies
        self.width = series_width(self.inv_freq.numel(), self.head_dim)
        M, O = self.inv_freq.numel(), self.width
        # per layer, the sine basis then the cosine basis, as each layer's module of the authors draws them
        coef = [init_coefficients(n_heads, M, O, self.gain) for _ in range(2 * n_layers)]
        self.register_buffer("sin_coef", torch.stack(coef[0::2]))  # (n_layers, H, M, O)
        self.register_buffer("cos_coef", torch.stack(coef[1::2]))  # (n_layers, H, M, O)
        self._cache: Optional[tuple[tuple, torch.Tensor, torch.Tensor]] = None

    def phases(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos(t omega), sin(t omega) (..., T, M) float32 for positions pos (T,) or (B, T); cached for
        consecutive positions, which every layer shares."""
        start = consecutive_start(pos)
        key = (pos.shape[0], start, pos.device)
        if start is not None and self._cache is not None and self._cache[0] == key:
            return self._cache[1], self._cache[2]
        flat = pos if pos.dim() == 1 else pos.reshape(-1)  # a 1-D pos as is: its memoized start is read
        cos, sin = rope_cos_sin_halves(flat, self.inv_freq, 1.0)  # (N, M)
        cos, sin = (t.view(*pos.shape, -1) for t in (cos, sin))  # (..., T, M)
        if start is not None:
            self._cache = (key, cos, sin)
        return cos, sin

    def tables(self, pos: torch.Tensor, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """C, S (H, T, D/2) for (T,) positions ((B, H, T, D/2) for (B, T)) of layer ``layer``: the Fourier
        series of its coefficients on the first O pairs, ones on the rest; summed in float32, then ``dtype``."""
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"FoPE has coefficients for {self.n_layers} layer(s) (n_layers={self.n_layers}); "
                             f"layer {layer} has none: build it with the model's n_layers")
        cos, sin = self.phases(pos)
        pad = (0, self.head_dim // 2 - self.width)
        with torch.autocast(pos.device.type, enabled=False):  # the series in float32, as rope_full_precision
            c = torch.einsum("...tm,hmo->...hto", cos, self.cos_coef[layer].float())  # (..., H, T, O)
            s = torch.einsum("...tm,hmo->...hto", sin, self.sin_coef[layer].float())
            c, s = F.pad(c, pad, value=1.0), F.pad(s, pad, value=1.0)  # (..., H, T, D/2): the clipped pairs
        return c.to(dtype), s.to(dtype)

    def rotate_layer(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor,
                     layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """q, k (B, H, T, D) rotated by layer ``layer``'s series: (x1 C - x2 S, x2 C + x1 S) per pair. The
        map is linear with transpose (x1 C + x2 S, x2 C - x1 S), which ``apply_rotary``'s backward computes
        for any C, S (not only unit ones), and the coefficients take no gradient."""
        c, s = self.tables(pos, layer, q.dtype)
        return apply_rotary(q, c, s), apply_rotary(k, c, s)

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """With layer 0's coefficients (the model rotates through each layer's view, ``for_layer``)."""
        return self.rotate_layer(q, k, pos, 0)

    def for_layer(self, layer: int) -> "FoPELayer":
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"FoPE has coefficients for {self.n_layers} layer(s) (n_layers={self.n_layers}); "
                             f"layer {layer} has none: build it with the model's n_layers")
        return FoPELayer(self, layer)


class FoPELayer(LayerOf):
    """FoPE as attention layer ``layer`` sees it (``FoPE.for_layer``): its own coefficients for ``rotate``."""

    def rotate(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.encoding.rotate_layer(q, k, pos, self.layer)
