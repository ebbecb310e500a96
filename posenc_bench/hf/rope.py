"""RoPE surgery on a Hugging Face model: the rope_parameters transformers reads for one of our scalings.

The model's rotary modules are rebuilt from a config copy with these parameters (``HFModel.scaled``), so
transformers' own ``ROPE_INIT_FUNCTIONS`` (and, for dynamic NTK, its per-forward update) compute the
frequencies. factor = eval length / train length (never below 1); yarn and llama3 get
``original_max_position_embeddings`` = the train length (llama3 also its published low/high frequency factors).

The scalings and their parameters are the entries of ``encodings.rope_scaling.SCALING_TABLE`` that transformers
has a rope_type for (not ntk), so our own rows and a Hugging Face model's are scaled by the same definitions.
The other zero-shot rows (ntk, and the fixes that re-position query-key pairs or re-index the cache) do not
fit in rope_parameters: ``hf/attention.py`` runs them through our attention. Which names ``--rope-scaling``
takes is a question about rows (``bench/rows.Row``), answered in ``bench/eval/pretrained.py``; this module gets a
scaling's name and never reads a row's.
"""

from __future__ import annotations

from posenc_bench.encodings.rope_scaling import LLAMA3_FREQ_FACTORS, SCALING_TABLE, Scaling
from posenc_bench.errors import ConfigError

_HF_SCALINGS: dict[str, Scaling] = {s.name: s for s in SCALING_TABLE if s.hf_rope_type}
SCALINGS = tuple(_HF_SCALINGS)  # linear, dynamic, yarn, llama3: the --rope-scaling names
__all__ = ["LLAMA3_FREQ_FACTORS", "SCALINGS", "length_dependent", "scaled_max_positions", "scaling_parameters"]


def _scaling(name: str) -> Scaling:
    try:
        return _HF_SCALINGS[name]
    except KeyError:
        raise ConfigError(f"unknown RoPE scaling {name!r}; valid: {', '.join(SCALINGS)}") from None


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


def length_dependent(scaling: str) -> bool:
    """Whether transformers recomputes this scaling's frequencies from each forward's longest position (dynamic
    NTK): then a continuation over a KV cache is not the same computation as one forward over the whole."""
    return _scaling(scaling).length_dependent
