"""The zero-shot rows `eval --rope-scaling` (and `needles`) take by name: transformers' frequency scalings
(``hf/rope.py``), and every other zero-shot row of the trained rope model (``encodings.variants("rope")``), which
a Hugging Face model reaches through our attention (``hf/attention.py``)."""

from __future__ import annotations

from posenc_bench.bench.rows import Row, rope_row
from posenc_bench.errors import ConfigError
from posenc_bench.hf import rope as hf_rope


def checkpoint_scalings() -> list[str]:
    """What ``eval --rope-scaling`` takes for our checkpoints: every zero-shot row of the trained rope model
    by its suffix (linear, ntk, dynamic, yarn, llama3, rerope, leaky, selfextend, string), plus sink<S>+sw<W>."""
    from posenc_bench import encodings

    return [Row(n).suffix for n in encodings.variants("rope")]


def parse_scalings(value: str) -> list[str]:
    """'linear,yarn' -> ['linear', 'yarn']; 'all' = every scaling transformers has; 'none' or '' = none.
    Also every other zero-shot row of the rope model (``checkpoint_scalings``: ntk, rerope, leaky, selfextend, string)
    and attention sinks, sink<S>+sw<W> (or sink<S> on a model trained with a window)."""
    items = [v.strip().lower() for v in value.split(",") if v.strip()]
    out: list[str] = []
    for item in items:
        if item == "all":
            out.extend(hf_rope.SCALINGS)
        elif item in hf_rope.SCALINGS or rope_row(item) is not None:
            out.append(item)
        elif item != "none":
            valid = ", ".join(dict.fromkeys([*hf_rope.SCALINGS, *checkpoint_scalings()]))
            raise ConfigError(f"--rope-scaling {item!r} is not a scaling; valid: {valid}, sink<S>+sw<W>, all, none")
    return list(dict.fromkeys(out))


def require_hf(scalings: list[str]) -> None:
    """Refuse the rows a Hugging Face model cannot take. Frequency scalings transformers has go through its
    rope_parameters; every other zero-shot row (ntk, ReRoPE, Leaky ReRoPE, Self-Extend, sinks with a window)
    reroutes its attention through our encoding (``hf/attention.py``). Only sink<S> without +sw<W> is refused:
    it means "the window the model was trained with", and a Hugging Face model here has none."""
    bad = [s for s in scalings if (row := rope_row(s)) is not None and row.sinks is not None and row.sinks[1] is None]
    if bad:
        raise ConfigError(f"--rope-scaling {bad[0]}: a Hugging Face model was trained without a sliding window; "
                          f"name one, e.g. {bad[0]}+sw<W> with S + W = its train length (StreamingLLM's cache)")
