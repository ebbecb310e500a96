"""RoPE scalings applied to the trained ``rope`` model, zero-shot and fine-tuned.

Every variant here evaluates (or fine-tunes) the ``rope`` checkpoint with other frequencies; only the
frequencies and the attention scale change, through transformers' ``ROPE_INIT_FUNCTIONS`` where it has the
formula, with the scale applied to cos and sin as transformers applies it (so logits scale by its square).

- ``rope-ntk``: "NTK-aware" scaled RoPE, bloc97, r/LocalLLaMA (2023): keep positions, raise the base to
  theta * s^(d/(d-2)), so low frequencies are interpolated and high ones barely change. A pure function of
  ours: transformers only ships the dynamic form, which equals it at factor 1 and seq_len = s * T (tested).
- ``rope-dynamic``: dynamic NTK, emozilla, r/LocalLLaMA (2023), transformers' "dynamic": the base depends on
  the current sequence length L: theta * (f L / T - (f - 1))^(d/(d-2)), equal to plain RoPE up to T.
- ``rope-yarn``: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", ICLR
  2024 (arXiv:2309.00071): per-frequency blend of interpolation and extrapolation (beta_fast 32, beta_slow
  1) and an attention temperature 0.1 ln s + 1.
- ``rope-llama3``: the Llama 3.1 scaling (Dubey et al., "The Llama 3 Herd of Models", arXiv:2407.21783):
  wavelengths above T / low_freq_factor are divided by s, below T / high_freq_factor kept, smooth between.
- ``<name>-ft`` and ``rope-ft``: Chen et al., "Extending Context Window of Large Language Models via
  Positional Interpolation" (arXiv:2306.15595) fine-tune after scaling; zero-shot interpolation is far worse.
  These rows continue training the ``rope`` checkpoint at the fine-tune length with the scaling fixed at
  s = fine-tune length / train length (``rope-ft``: the same fine-tuning, no scaling, so the scaling's own
  effect is separated from the extra training), then evaluate with that fixed s at every length.

Zero-shot factor: ``factor`` 0 (default) means s = eval length / train length at each eval length (never
below 1, so 1x is plain RoPE); a number fixes s for every length (``model.encoding_options``).
"""

from __future__ import annotations

from typing import ClassVar, Optional

import torch

from posenc_bench.encodings import register
from posenc_bench.encodings.rope import RoPE, default_inv_freq, hf_scaled_inv_freq, linear_inv_freq


def ntk_inv_freq(head_dim: int, theta: float, factor: float) -> tuple[torch.Tensor, float]:
    """NTK-aware scaling: the default frequencies of base theta * factor^(d/(d-2)); attention scale 1."""
    if factor < 1:
        raise ValueError(f"NTK scaling needs factor >= 1, got {factor}")
    return default_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2)))


def dynamic_inv_freq(head_dim: int, theta: float, factor: float, original_len: int, seq_len: int
                     ) -> tuple[torch.Tensor, float]:
    """transformers' "dynamic" frequencies for a sequence of ``seq_len`` tokens."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(hidden_size=head_dim, num_attention_heads=1, head_dim=head_dim,
                         max_position_embeddings=original_len,
                         rope_parameters={"rope_type": "dynamic", "rope_theta": theta, "factor": float(factor)})
    inv_freq, scale = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=seq_len)
    return inv_freq.to(torch.float32), float(scale)


class _ScaledRoPE(RoPE):
    """RoPE whose frequencies are recomputed for each eval length (or fixed by fine-tuning)."""

    trained_as: ClassVar[Optional[str]] = "rope"
    length_dependent: ClassVar[bool] = False  # frequencies depend on the window length itself (dynamic)

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 factor: float = 0.0) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if factor != 0 and factor < 1:
            raise ValueError(f"factor must be 0 (eval length / train length) or >= 1, got {factor}")
        self.factor = float(factor)
        self.tuned_len: Optional[int] = None  # set by set_train_length for the fine-tuned variants

    def scale_for(self, length: int) -> float:
        """The factor s used at this length: fixed by the config or by fine-tuning, else length / train_len."""
        if self.factor:
            return self.factor
        return max(1.0, (self.tuned_len or length) / self.train_len)

    def set_train_length(self, length: int) -> None:
        if self.finetuned:
            self.tuned_len = length
            self.set_eval_length(length)

    def set_eval_length(self, length: int) -> None:
        s = self.scale_for(length)
        if s == 1.0 and not self.length_dependent:
            self._set_frequencies(*default_inv_freq(self.head_dim, self.theta))
        else:
            self._set_frequencies(*self.frequencies(s, length))

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        raise NotImplementedError


@register("rope-ntk")
class RoPENTK(_ScaledRoPE):
    summary = "the trained rope model with NTK-aware base scaling (base x s^(d/(d-2))), zero-shot; bloc97 2023"

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        return ntk_inv_freq(self.head_dim, self.theta, factor)


@register("rope-dynamic")
class RoPEDynamic(_ScaledRoPE):
    summary = "the trained rope model with dynamic NTK (base grows with the window length), zero-shot; emozilla 2023"
    length_dependent = True

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 factor: float = 2.0) -> None:
        # transformers' dynamic takes a fixed factor (2 in its docs) and the length from the input
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta, factor=factor)
        if self.factor < 1:
            raise ValueError(f"rope-dynamic needs factor >= 1, got {factor}")

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        return dynamic_inv_freq(self.head_dim, self.theta, factor, self.train_len, length)


@register("rope-yarn")
class RoPEYaRN(_ScaledRoPE):
    summary = "the trained rope model with YaRN (per-frequency interpolation, attention temperature), zero-shot; Peng et al. 2024"

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        return hf_scaled_inv_freq("yarn", self.head_dim, self.theta, self.train_len, factor=factor,
                                  original_max_position_embeddings=self.train_len)


@register("rope-llama3")
class RoPELlama3(_ScaledRoPE):
    summary = "the trained rope model with Llama 3.1 frequency-dependent scaling, zero-shot; Dubey et al. 2024"

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        return hf_scaled_inv_freq("llama3", self.head_dim, self.theta, self.train_len, factor=factor,
                                  low_freq_factor=1.0, high_freq_factor=4.0,
                                  original_max_position_embeddings=self.train_len)


# ---- fine-tuned: the same scalings after continuing training at the fine-tune length (see the runner) -----


@register("rope-ft")
class RoPEFT(RoPE):
    summary = "the trained rope model fine-tuned at the fine-tune length without scaling (the -ft rows' control)"
    trained_as = "rope"
    finetuned = True


@register("rope-linear-ft")
class RoPELinearFT(_ScaledRoPE):
    summary = "position interpolation fine-tuned at the fine-tune length, as in the paper; Chen et al. 2023"
    finetuned = True

    def frequencies(self, factor: float, length: int) -> tuple[torch.Tensor, float]:
        return linear_inv_freq(self.head_dim, self.theta, factor, self.train_len)


@register("rope-ntk-ft")
class RoPENTKFT(RoPENTK):
    summary = "NTK-aware scaling fine-tuned at the fine-tune length"
    finetuned = True


@register("rope-dynamic-ft")
class RoPEDynamicFT(RoPEDynamic):
    summary = "dynamic NTK fine-tuned at the fine-tune length"
    finetuned = True


@register("rope-yarn-ft")
class RoPEYaRNFT(RoPEYaRN):
    summary = "YaRN fine-tuned at the fine-tune length, as in the paper; Peng et al. 2024"
    finetuned = True


@register("rope-llama3-ft")
class RoPELlama3FT(RoPELlama3):
    summary = "Llama 3.1 scaling fine-tuned at the fine-tune length"
    finetuned = True
