"""RoPE surgery on a Hugging Face model: the rope_parameters transformers reads for one of our scalings.

The model's rotary modules are rebuilt from a config copy with these parameters (``HFModel.scaled``), so
transformers' own ``ROPE_INIT_FUNCTIONS`` (and, for dynamic NTK, its per-forward update) compute the
frequencies. factor = eval length / train length (never below 1); yarn and llama3 get
``original_max_position_embeddings`` = the train length (llama3 also its published low/high frequency factors).

The scalings and their parameters are the entries of ``encodings.rope_scaling.SCALING_TABLE`` that transformers
has a rope_type for (not ntk), so our own rows and a Hugging Face model's are scaled by the same definitions.
The other zero-shot rows (ntk, and the fixes that re-position query-key pairs or re-index the cache) do not
fit in rope_parameters: ``hf/attention.py`` runs them through our attention.
"""

from __future__ import annotations

from typing import Optional

from posenc_bench.encodings import sinks
from posenc_bench.encodings.rope_scaling import LLAMA3_FREQ_FACTORS, SCALING_TABLE, Scaling
from posenc_bench.errors import ConfigError

_HF_SCALINGS: dict[str, Scaling] = {s.name: s for s in SCALING_TABLE if s.hf_rope_type}
SCALINGS = tuple(_HF_SCALINGS)  # linear, dynamic, yarn, llama3: the --rope-scaling names
__all__ = ["LLAMA3_FREQ_FACTORS", "SCALINGS", "checkpoint_scalings", "parse_scalings", "require_hf", "scaled_max_positions",
           "scaling_parameters"]


def _scaling(name: str) -> Scaling:
    try:
        return _HF_SCALINGS[name]
    except KeyError:
        raise ConfigError(f"unknown RoPE scaling {name!r}; valid: {', '.join(SCALINGS)}") from None


def _sinks(item: str) -> Optional[tuple[int, Optional[int]]]:
    """(S, W) of a sinks row's suffix (sink4+sw124 -> (4, 124); sink4 -> (4, None)) in the sinks grammar of
    ``encodings/sinks.py``, or None for any other suffix."""
    parsed = sinks.parse(f"rope+{item}")
    return None if parsed is None or parsed[0] != "rope" else parsed[1:]


def checkpoint_scalings() -> list[str]:
    """What ``eval --rope-scaling`` takes for our checkpoints: every zero-shot row of the trained rope model
    by its suffix (linear, ntk, dynamic, yarn, llama3, rerope, leaky, selfextend), plus sink<S>+sw<W>."""
    from posenc_bench import encodings

    return [n.removeprefix("rope-") for n in encodings.variants("rope")]


def parse_scalings(value: str) -> list[str]:
    """'linear,yarn' -> ['linear', 'yarn']; 'all' = every scaling transformers has; 'none' or '' = none.
    Also every other zero-shot row of the rope model (``checkpoint_scalings``: ntk, rerope, leaky, selfextend)
    and attention sinks, sink<S>+sw<W> (or sink<S> on a model trained with a window)."""
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    out: list[str] = []
    ours = checkpoint_scalings()
    for item in items:
        if item == "all":
            out.extend(SCALINGS)
        elif item in SCALINGS or item in ours or _sinks(item) is not None:
            out.append(item)
        elif item != "none":
            raise ConfigError(f"--rope-scaling {item!r} is not a scaling; valid: {', '.join(dict.fromkeys([*SCALINGS, *ours]))}, "
                              f"sink<S>+sw<W>, all, none")
    return list(dict.fromkeys(out))


def require_hf(scalings: list[str]) -> None:
    """Refuse the rows a Hugging Face model cannot take. Frequency scalings transformers has go through its
    rope_parameters; every other zero-shot row (ntk, ReRoPE, Leaky ReRoPE, Self-Extend, sinks with a window)
    reroutes its attention through our encoding (``hf/attention.py``). Only sink<S> without +sw<W> is refused:
    it means "the window the model was trained with", and a Hugging Face model here has none."""
    bad = [s for s in scalings if (sinks := _sinks(s)) is not None and sinks[1] is None]
    if bad:
        raise ConfigError(f"--rope-scaling {bad[0]}: a Hugging Face model was trained without a sliding window; "
                          f"name one, e.g. {bad[0]}+sw<W> with S + W = its train length (StreamingLLM's cache)")


def scaling_parameters(base: dict, scaling: str, factor: float, train_len: int) -> dict:
    """The rope_parameters transformers reads for ``scaling`` at ``factor``; keeps theta and partial rotary."""
    entry = _scaling(scaling)
    params = {"rope_type": entry.hf_rope_type, "rope_theta": base["rope_theta"], "factor": float(factor)}
    if "partial_rotary_factor" in base:
        params["partial_rotary_factor"] = base["partial_rotary_factor"]
    if entry.hf_original_len:
        params["original_max_position_embeddings"] = int(train_len)
    params.update(entry.hf_parameters)
    return params


def scaled_max_positions(scaling: str, factor: float, train_len: int) -> int:
    """max_position_embeddings of the scaled config: dynamic NTK measures growth against it (= train length);
    for the others (and an unscaled model, scaling "") it is the extended context, train length x factor."""
    entry = _HF_SCALINGS.get(scaling)
    return train_len if entry is not None and entry.length_dependent else int(round(train_len * factor))
