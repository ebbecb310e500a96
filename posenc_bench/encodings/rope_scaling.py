"""RoPE scalings applied to the trained ``rope`` model, zero-shot and fine-tuned: one table, ``SCALING_TABLE``.

Every variant here evaluates (or fine-tunes) the ``rope`` checkpoint with other frequencies; only the
frequencies and the attention scale change, through transformers' ``ROPE_INIT_FUNCTIONS`` where it has the
formula, with the scale applied to cos and sin as transformers applies it (so logits scale by its square).

- ``rope-linear``: position interpolation, Chen et al., "Extending Context Window of Large Language Models
  via Positional Interpolation" (arXiv:2306.15595): positions divided by s, i.e. inv_freq / s. Zero-shot
  here; the paper fine-tunes after scaling (``rope-linear-ft``).
- ``rope-ntk``: "NTK-aware" scaled RoPE, bloc97, r/LocalLLaMA (2023): keep positions, raise the base to
  theta * s^(d/(d-2)), so low frequencies are interpolated and high ones barely change. A pure function of
  ours: transformers only ships the dynamic form, which equals it at factor 1 and seq_len = s * T (tested).
- ``rope-dynamic``: dynamic NTK, emozilla, r/LocalLLaMA (2023), transformers' "dynamic": the base depends on
  the current sequence length L: theta * (f L / T - (f - 1))^(d/(d-2)), equal to plain RoPE up to T.
- ``rope-yarn``: Peng et al., "YaRN: Efficient Context Window Extension of Large Language Models", ICLR
  2024 (arXiv:2309.00071): per-frequency blend of interpolation and extrapolation, the ramp of its
  "NTK-by-parts" section between r = beta_slow (the paper's alpha) and beta_fast (its beta) rotations of a
  frequency over the original context, and the attention temperature of its "YaRN" section,
  sqrt(1/t) = temperature_coef ln s + 1.
  The defaults are the authors' (alpha 1, beta 32, 0.1): the paper's values for Llama, 128-dimensional heads
  at a 4k context, and the defaults of their code (jquesnelle/yarn at commit 995db5b,
  scaled_rope/LlamaYaRNScaledRotaryEmbedding.py: ``beta_fast=32, beta_slow=1`` line 30, the floor/ceil
  correction range lines 9-14, ``get_mscale`` 0.1 ln s + 1 lines 24-27) and of transformers'
  ``_compute_yarn_parameters``. The three are options (``beta_fast``, ``beta_slow``, ``temperature_coef``)
  for values fitted to another head size or context; none fitted to ours (32-dimensional heads at 512) is
  published. The ramp's bounds are counted in rotations per train length, so they carry over to any length;
  at head_dim 32, theta 10000 and train length 512 they fall on pairs 1 and 8 of 16: pairs 0-1 keep their
  frequency, 2-7 blend, 8-15 are interpolated (tests/encodings/test_rope_scaling.py checks it).
- ``rope-llama3``: the Llama 3.1 scaling (Dubey et al., "The Llama 3 Herd of Models", arXiv:2407.21783):
  wavelengths above T / low_freq_factor are divided by s, below T / high_freq_factor kept, smooth between.
- ``<name>-ft`` and ``rope-ft``: Chen et al., "Extending Context Window of Large Language Models via
  Positional Interpolation" (arXiv:2306.15595) fine-tune after scaling; zero-shot interpolation is far worse.
  These rows continue training the ``rope`` checkpoint at the fine-tune length with the scaling fixed at
  s = fine-tune length / train length (``rope-ft``: the same fine-tuning, no scaling, so the scaling's own
  effect is separated from the extra training), then evaluate with that fixed s at every length.

Each table entry is a pure function (head_dim, theta, factor, train_len, seq_len) -> (inv_freq, attention
scale) plus what the rows and the Hugging Face surgery (``posenc_bench/hf/rope.py``) need to know about it;
a loop registers ``rope-<name>`` and ``rope-<name>-ft`` for every entry, so a scaling is added in one place.

Zero-shot factor: ``factor`` 0 (default) means s = eval length / train length at each eval length (never
below 1, so 1x is plain RoPE); a number fixes s for every length (``model.encoding_options``). Dynamic NTK
takes a fixed factor (default 2, as in transformers' docs) and grows with the window length itself. A ``-ft``
row takes no factor: s is the fine-tune length's (config ``finetune.len``), so the row is what it says.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Mapping, Optional

import torch

from posenc_bench.encodings.registry import register
from posenc_bench.encodings.rope import RoPE, default_inv_freq

# (head_dim, theta, factor, train_len, seq_len, **the entry's parameters) -> (inv_freq float32 (head_dim / 2,),
# attention scale)
FrequencyFn = Callable[..., tuple[torch.Tensor, float]]

# Llama 3.1's published low/high frequency factors: rope-llama3's frequencies and the HF surgery's rope_parameters
LLAMA3_FREQ_FACTORS = {"low_freq_factor": 1.0, "high_freq_factor": 4.0}
# YaRN's published parameters, the defaults of rope-yarn's options: the ramp's bounds in rotations over the
# original context (beta_slow = the paper's alpha, beta_fast = its beta: 1 and 32 for the Llama family, its
# "NTK-by-parts" section) and the temperature's coefficient, sqrt(1/t) = 0.1 ln s + 1 (its "YaRN" section, fitted
# on Llama models); jquesnelle/yarn scaled_rope/LlamaYaRNScaledRotaryEmbedding.py lines 24-30 (commit 995db5b).
YARN_PARAMETERS = {"beta_fast": 32.0, "beta_slow": 1.0, "temperature_coef": 0.1}
# rope-yarn's ``eval.tune`` grid of the ramp's bounds (the temperature kept at 0.1): the authors' Llama values
# first, then their Mistral ones (jquesnelle/yarn scaled_rope/modeling_mistral_yarn.py line 254 at 995db5b:
# ``beta_fast=128, beta_slow=2``), then ours: beta_fast halved down to 2 with beta_slow 1. The bounds count
# rotations over the train length, and a short one turns the fastest pair few times (L / 2 pi: 4.5 at 28
# tokens, 81 at 512), so the published 32 keeps no pair's frequency there; the smaller bounds keep the fastest.
YARN_GRID = ({"beta_fast": 32.0, "beta_slow": 1.0}, {"beta_fast": 128.0, "beta_slow": 2.0},
             *({"beta_fast": b, "beta_slow": 1.0} for b in (16.0, 8.0, 4.0, 2.0)))


def hf_scaled_inv_freq(rope_type: str, head_dim: int, theta: float, original_len: int, *,
                       seq_len: Optional[int] = None, **params: float) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_scale) from transformers' ``ROPE_INIT_FUNCTIONS[rope_type]``.

    ``params`` are the rope_parameters of that type (e.g. ``factor=4.0``). With an
    ``original_max_position_embeddings`` parameter (yarn, llama3) the config's max_position_embeddings is the
    extended context, original length x factor, as transformers expects; the frequencies do not depend on it.
    ``seq_len``: the current sequence length, for the types that depend on it (dynamic).
    """
    from transformers import LlamaConfig  # imported here: transformers takes seconds to import
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if head_dim % 2:
        raise ValueError(f"RoPE needs an even head dimension, got head_dim={head_dim}")
    config = LlamaConfig(
        hidden_size=head_dim,
        num_attention_heads=1,
        head_dim=head_dim,
        max_position_embeddings=(math.ceil(original_len * params.get("factor", 1.0))
                                 if "original_max_position_embeddings" in params else original_len),
        rope_parameters={"rope_type": rope_type, "rope_theta": theta, **params},
    )
    extra = {} if seq_len is None else {"seq_len": seq_len}
    inv_freq, attention_scale = ROPE_INIT_FUNCTIONS[rope_type](config, "cpu", **extra)
    return inv_freq.to(torch.float32), float(attention_scale)


def linear_inv_freq(head_dim: int, theta: float, factor: float, original_len: int) -> tuple[torch.Tensor, float]:
    """Position interpolation: inv_freq / factor, through transformers' "linear" init function."""
    return hf_scaled_inv_freq("linear", head_dim, theta, original_len, factor=float(factor))


def ntk_inv_freq(head_dim: int, theta: float, factor: float) -> tuple[torch.Tensor, float]:
    """NTK-aware scaling: the default frequencies of base theta * factor^(d/(d-2)); attention scale 1."""
    if factor < 1:
        raise ValueError(f"NTK scaling needs factor >= 1, got {factor}")
    return default_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2)))


# ---- the table's frequency functions, all (head_dim, theta, factor, train_len, seq_len) ----------------------


def linear_frequencies(head_dim: int, theta: float, factor: float, train_len: int, seq_len: int
                       ) -> tuple[torch.Tensor, float]:
    """Position interpolation at factor s, whatever the window length."""
    return linear_inv_freq(head_dim, theta, factor, train_len)


def ntk_frequencies(head_dim: int, theta: float, factor: float, train_len: int, seq_len: int
                    ) -> tuple[torch.Tensor, float]:
    """NTK-aware base scaling at factor s, whatever the window length."""
    return ntk_inv_freq(head_dim, theta, factor)


def dynamic_frequencies(head_dim: int, theta: float, factor: float, train_len: int, seq_len: int
                        ) -> tuple[torch.Tensor, float]:
    """transformers' "dynamic" frequencies for a sequence of ``seq_len`` tokens (plain RoPE up to train_len)."""
    return hf_scaled_inv_freq("dynamic", head_dim, theta, train_len, seq_len=seq_len, factor=float(factor))


def yarn_frequencies(head_dim: int, theta: float, factor: float, train_len: int, seq_len: int, *,
                     beta_fast: float = 32.0, beta_slow: float = 1.0, temperature_coef: float = 0.1
                     ) -> tuple[torch.Tensor, float]:
    """transformers' "yarn" frequencies, the original context being the train length, with the ramp between
    beta_slow and beta_fast rotations and the attention scale temperature_coef ln s + 1 (1 at s <= 1), the
    temperature transformers computes itself at the default 0.1 (``get_mscale``), here passed explicitly."""
    check_yarn(beta_fast=beta_fast, beta_slow=beta_slow, temperature_coef=temperature_coef)
    attention_factor = temperature_coef * math.log(factor) + 1.0 if factor > 1 else 1.0
    return hf_scaled_inv_freq("yarn", head_dim, theta, train_len, factor=factor,
                              original_max_position_embeddings=train_len, beta_fast=float(beta_fast),
                              beta_slow=float(beta_slow), attention_factor=attention_factor)


def check_yarn(*, beta_fast: float, beta_slow: float, temperature_coef: float) -> None:
    """ValueError unless 0 < beta_slow < beta_fast (rotations) and temperature_coef >= 0."""
    if not 0 < beta_slow < beta_fast:
        raise ValueError(f"YaRN needs 0 < beta_slow < beta_fast (rotations over the train length), got "
                         f"beta_slow={beta_slow}, beta_fast={beta_fast}")
    if temperature_coef < 0:
        raise ValueError(f"YaRN needs temperature_coef >= 0 (sqrt(1/t) = c ln s + 1), got {temperature_coef}")


def llama3_frequencies(head_dim: int, theta: float, factor: float, train_len: int, seq_len: int
                       ) -> tuple[torch.Tensor, float]:
    """transformers' "llama3" frequencies with Llama 3.1's frequency factors, original context = train length."""
    return hf_scaled_inv_freq("llama3", head_dim, theta, train_len, factor=factor, **LLAMA3_FREQ_FACTORS,
                              original_max_position_embeddings=train_len)


@dataclass(frozen=True)
class Scaling:
    """One RoPE scaling: its frequencies, the two rows it registers, and how transformers names it."""

    name: str  # rows rope-<name> and rope-<name>-ft
    citation: str  # where the scaling comes from (the module docstring has the full references)
    frequencies: FrequencyFn
    summary: str  # rope-<name>'s one-line summary
    ft_summary: str  # rope-<name>-ft's
    length_dependent: bool = False  # the frequencies depend on the window length itself (dynamic NTK)
    default_factor: float = 0.0  # zero-shot factor when none is configured; 0 = eval length / train length
    hf_rope_type: Optional[str] = None  # transformers' rope_type, where it has the scaling (hf/rope.py)
    hf_parameters: Mapping[str, float] = field(default_factory=dict)  # its fixed rope_parameters besides factor
    hf_original_len: bool = False  # its rope_parameters take original_max_position_embeddings = train length
    # its own options with their defaults (the authors' values), passed to ``frequencies`` as keywords
    parameters: Mapping[str, float] = field(default_factory=dict)
    check: Optional[Callable[..., None]] = None  # raises ValueError for bad parameters, at construction
    # the zero-shot row's ``eval.tune`` grid over ``parameters`` (points, the default first); (): nothing tuned
    grid: tuple[Mapping[str, float], ...] = ()


SCALING_TABLE: tuple[Scaling, ...] = (
    Scaling("linear", "Chen et al. 2023, position interpolation (arXiv:2306.15595)", linear_frequencies,
            "the trained rope model with positions / (eval len / train len) (position interpolation, zero-shot)",
            "position interpolation fine-tuned at the fine-tune length, as in the paper; Chen et al. 2023",
            hf_rope_type="linear"),
    Scaling("ntk", "bloc97 2023, NTK-aware scaled RoPE (r/LocalLLaMA)", ntk_frequencies,
            "the trained rope model with NTK-aware base scaling (base x s^(d/(d-2))), zero-shot; bloc97 2023",
            "NTK-aware scaling fine-tuned at the fine-tune length"),
    Scaling("dynamic", "emozilla 2023, dynamic NTK (r/LocalLLaMA)", dynamic_frequencies,
            "the trained rope model with dynamic NTK (base grows with the window length), zero-shot; emozilla 2023",
            "dynamic NTK fine-tuned at the fine-tune length",
            length_dependent=True, default_factor=2.0, hf_rope_type="dynamic"),
    Scaling("yarn", "Peng et al. 2024, YaRN, ICLR 2024 (arXiv:2309.00071)", yarn_frequencies,
            "the trained rope model with YaRN (per-frequency interpolation, attention temperature), zero-shot; "
            "Peng et al. 2024",
            "YaRN fine-tuned at the fine-tune length, as in the paper; Peng et al. 2024",
            hf_rope_type="yarn", hf_original_len=True, parameters=YARN_PARAMETERS, check=check_yarn, grid=YARN_GRID),
    Scaling("llama3", "Dubey et al. 2024, The Llama 3 Herd of Models (arXiv:2407.21783)", llama3_frequencies,
            "the trained rope model with Llama 3.1 frequency-dependent scaling, zero-shot; Dubey et al. 2024",
            "Llama 3.1 scaling fine-tuned at the fine-tune length",
            hf_rope_type="llama3", hf_parameters=LLAMA3_FREQ_FACTORS, hf_original_len=True),
)


class ScaledRoPE(RoPE):
    """The trained rope model with one table entry's frequencies, recomputed for each eval length from the
    factor s that ``scale_for`` gives (plain RoPE at s = 1 unless the scaling follows the window length)."""

    trained_as: ClassVar[Optional[str]] = "rope"
    family = "rotary scaling (zero-shot)"
    scaling: ClassVar[Scaling]

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 factor: float = 0.0, **parameters: float) -> None:
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta)
        if factor != 0 and factor < 1:
            raise ValueError(f"factor must be 0 (eval length / train length) or >= 1, got {factor}")
        self.factor = float(factor)
        self.tuned_len: Optional[int] = None  # set by set_train_length on the fine-tuned rows
        unknown = sorted(set(parameters) - set(self.scaling.parameters))
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no parameter(s) {', '.join(unknown)}")
        # the entry's own options (YaRN's ramp and temperature), the authors' values unless configured
        self.parameters = {k: float(parameters.get(k, v)) for k, v in self.scaling.parameters.items()}
        if self.scaling.check is not None:
            self.scaling.check(**self.parameters)

    def scale_for(self, length: int) -> float:
        """The factor s used at this length: fixed by the config or by fine-tuning, else length / train_len."""
        if self.factor:
            return self.factor
        return max(1.0, (self.tuned_len or length) / self.train_len)

    def set_eval_length(self, length: int) -> None:
        s = self.scale_for(length)
        if s == 1.0 and not self.scaling.length_dependent:
            self._set_frequencies(*default_inv_freq(self.head_dim, self.theta))
        else:
            self._set_frequencies(*self.scaling.frequencies(self.head_dim, self.theta, s, self.train_len, length,
                                                            **self.parameters))


class FineTunedRoPE(ScaledRoPE):
    """A scaling fine-tuned at the fine-tune length: s = fine-tune length / train length, fixed by
    set_train_length before fine-tuning and kept at every eval length. A configured factor is refused: it
    would silently make the row a different experiment from the one its name and summary describe."""

    finetuned = True
    family = "rotary scaling (fine-tuned)"

    def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                 factor: Optional[float] = None, **parameters: float) -> None:
        if factor is not None:
            raise ValueError(f"{self.name} takes no factor (got {factor}): its factor is the fine-tune length "
                             f"(config finetune.len) / train length; set finetune.len instead")
        super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta, factor=0.0,
                         **parameters)

    def set_train_length(self, length: int) -> None:
        self.tuned_len = length
        self.set_eval_length(length)


def _zero_shot_row(entry: Scaling) -> type[ScaledRoPE]:
    """rope-<name>: the scaling applied zero-shot, with the entry's default factor as the option's default."""

    class ZeroShot(ScaledRoPE):
        scaling = entry
        summary = entry.summary
        paper = entry.citation

        def __init__(self, *, d_model: int, n_heads: int, train_len: int, theta: float = 10000.0,
                     factor: float = entry.default_factor, **parameters: float) -> None:
            super().__init__(d_model=d_model, n_heads=n_heads, train_len=train_len, theta=theta, factor=factor,
                             **parameters)
            if self.scaling.length_dependent and self.factor < 1:  # it takes the length from the input
                raise ValueError(f"{self.name} needs factor >= 1, got {factor}")

        @classmethod
        def tuning_grid(cls, train_len: int, eval_len: int, options: dict) -> list[dict]:
            """The entry's ``grid`` where the scaling acts: past the train length, or everywhere at a fixed factor."""
            acting = eval_len > train_len or float(options.get("factor") or entry.default_factor) > 1
            return [dict(point) for point in entry.grid] if acting else []

    _with_parameters(ZeroShot, entry)
    return _named(ZeroShot, f"RoPE{entry.name.capitalize()}")


def _finetuned_row(entry: Scaling) -> type[FineTunedRoPE]:
    """rope-<name>-ft: the scaling fine-tuned at the fine-tune length."""

    class FineTuned(FineTunedRoPE):
        scaling = entry
        summary = entry.ft_summary
        paper = entry.citation

        def __init__(self, **kwargs: Any) -> None:  # the signature below: FineTunedRoPE's and the entry's own
            super().__init__(**kwargs)

    _with_parameters(FineTuned, entry, FineTunedRoPE.__init__)
    return _named(FineTuned, f"RoPE{entry.name.capitalize()}FT")


def _with_parameters(cls: type, entry: Scaling, base: Optional[Callable[..., None]] = None) -> None:
    """Give ``cls.__init__`` the signature of ``base`` (its own by default) with the entry's parameters as keyword
    options, defaults included, in place of ``**parameters``: the registry reads a row's options from it."""
    init = cls.__init__
    signature = inspect.signature(base or init)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v, annotation=float)
             for k, v in entry.parameters.items()]
    init.__signature__ = signature.replace(parameters=own + extra)


def _named(cls: type, name: str) -> type:
    """Give a generated row class a module-level name (RoPEYarn, RoPEYarnFT, ...): reprs and pickling find it."""
    cls.__name__ = cls.__qualname__ = name
    globals()[name] = cls
    return cls


for _entry in SCALING_TABLE:
    register(f"rope-{_entry.name}")(_zero_shot_row(_entry))


@register("rope-ft")
class RoPEFT(RoPE):
    summary = "the trained rope model fine-tuned at the fine-tune length without scaling (the -ft rows' control)"
    family = "rotary scaling (fine-tuned)"
    paper = "Chen et al. 2023, position interpolation (arXiv:2306.15595): its fine-tuning, without the scaling"
    trained_as = "rope"
    finetuned = True


for _entry in SCALING_TABLE:
    register(f"rope-{_entry.name}-ft")(_finetuned_row(_entry))
