"""Config values every layer shares, importable without torch (the command line builds its parser from them).

- The precision names: ``PRECISIONS`` is every ``--precision`` a command takes (``env.DTYPES`` maps each to
  its torch dtype); ``TRAIN_PRECISIONS`` are those our own models train and are evaluated in (autocast; fp32
  is no autocast). ``eval`` of a Hugging Face model also loads fp16 weights.
- The one YAML number rule: YAML 1.1 reads ``1e9`` as a string, so a string given where the default is a
  number becomes that number (config keys and encoding options alike).
"""

from __future__ import annotations

from typing import Any

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
