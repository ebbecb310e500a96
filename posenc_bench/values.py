"""Config values every layer shares, importable without torch (the command line builds its parser from them).

- The precision names: ``PRECISIONS`` is every ``--precision`` a command takes (``env.DTYPES`` maps each to
  its torch dtype); ``TRAIN_PRECISIONS`` are those our own models train and are evaluated in (autocast; fp32
  is no autocast). ``eval`` of a Hugging Face model also loads fp16 weights.
- The one YAML number rule: YAML 1.1 reads ``1e9`` as a string, so a string given where the default is a
  number becomes that number (config keys and encoding options alike).
- The eval lengths: ``parse_eval_lens`` reads absolute lengths and multiples of the train length.
"""

from __future__ import annotations

import math
from typing import Any, Union

from posenc_bench.errors import ConfigError

PRECISIONS = ("fp32", "bf16", "fp16")
TRAIN_PRECISIONS = ("fp32", "bf16")


def yaml_number(value: Any, default: Any) -> Any:
    """``value`` as the number type of ``default`` when it is a string and ``default`` a number (bool is not a
    number here): "1e6" -> 1000000.0 for a float default, "1e3" -> 1000 for an int default. Any other value
    comes back unchanged. ValueError when the string is not a number (or not whole, for an int default)."""
    if not isinstance(value, str) or isinstance(default, bool) or not isinstance(default, (int, float)):
        return value
    number = float(value)
    if isinstance(default, float):
        return number
    if not number.is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)


def parse_eval_lens(items: Union[str, list], train_len: int) -> list[int]:
    """Absolute lengths or multiples -> sorted unique lengths, always including train_len.

    "1,1.5,2,4x": an x on the last item makes the whole list multiples. Otherwise each item stands alone:
    "2x,4096" is 2 x train_len and 4096 tokens. A plain number of tokens below the train length ("1,2,4") is
    almost always a list of multiples without its x: it is refused with that question, and a window shorter
    than the train length is written as a multiple ("0.5x").
    """
    if isinstance(items, str):
        items = [s for s in items.split(",") if s.strip()]
    items = [str(i).strip().lower() for i in items]
    if not items:
        raise ConfigError("eval lengths are empty; give lengths like 4096 or multiples like 1,1.5,2,4x")
    all_multiples = items[-1].endswith("x")
    lengths = {train_len}
    for item in items:
        is_multiple = all_multiples or item.endswith("x")
        try:
            value = float(item.rstrip("x"))
        except ValueError:
            raise ConfigError(f"eval length {item!r} is not a number; give lengths like 4096 or multiples like 2x") from None
        if all_multiples and not item.endswith("x") and value > 64:
            raise ConfigError(
                f"eval length {item!r} in {','.join(items)!r} reads as {item}x the train length; for {item} tokens "
                f"put the multiples first ({','.join(i for i in items if i != item)},{item}), or write {item}x"
            )
        length = value * train_len if is_multiple else value
        if not math.isfinite(length) or length < 1:
            raise ConfigError(f"eval length {item!r} gives {length:g} tokens; an eval length must be at least 1")
        if not is_multiple and value != int(value):
            raise ConfigError(f"eval length {item!r} is not a whole number of tokens; for a multiple write {item}x")
        if not is_multiple and length < train_len:
            multiples = ",".join(i.rstrip("x") for i in items) + "x"
            raise ConfigError(f"eval length {item} reads as {item} token{'s' * (value != 1)}, below the train length "
                              f"{train_len}: did you mean multiples of it ({multiples})? A window shorter than the "
                              f"train length is written as a multiple (e.g. {length / train_len:g}x)")
        lengths.add(int(round(length)))
    return sorted(lengths)
