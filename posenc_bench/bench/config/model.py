"""The ``model`` section's checks: ``ModelConfig`` itself is the model's (``model/transformer.py``); here what
a run asks of it: each encoding's options, a vocabulary for the tokenizer, and every row's shape and options."""

from __future__ import annotations

import inspect
from typing import Optional

from posenc_bench import encodings
from posenc_bench.bench.rows import Row
from posenc_bench.errors import ConfigError
from posenc_bench.model.plan import sink_window
from posenc_bench.model.transformer import ModelConfig, build_encoding, validate_shape
from posenc_bench.tokenizer import vocab_size_of


def validate_encoding_options(m: ModelConfig) -> None:
    """``model.encoding_options``: a mapping per encoding, and an eval-only row's own options only (the trained
    model's are set under the trained encoding)."""
    for name, options in m.encoding_options.items():
        cls = encodings.get_class(name)
        if not isinstance(options, dict):
            raise ConfigError(f"model.encoding_options.{name} must be a mapping of options, got {options!r}")
        if cls.trained_as:  # its own options (e.g. a fixed scaling factor) only; the trained model's are shared
            shared = [k for k in options if k in inspect.signature(encodings.get_class(cls.trained_as).__init__).parameters]
            if shared:
                raise ConfigError(
                    f"model.encoding_options.{name}.{shared[0]}: {name!r} evaluates the trained {cls.trained_as!r} "
                    f"model and takes its {shared[0]}; set it under model.encoding_options.{cls.trained_as}"
                )


MODEL_SIZES = ("d_model", "n_layers", "n_heads", "mlp_ratio", "vocab_size", "vocab_multiple")


def validate_sizes(m: ModelConfig) -> None:
    """Every size of the model a positive whole number (before anything is built of them)."""
    for key in MODEL_SIZES:
        value = getattr(m, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"model.{key} must be a whole number >= 1, got {value!r}")


def validate_vocabulary(m: ModelConfig, tokenizer: str) -> None:
    """The model's vocabulary holds the tokenizer's (ConfigError on an unknown tokenizer, naming the valid ones)."""
    vocab = vocab_size_of(tokenizer)
    if m.vocab_size < vocab:
        raise ConfigError(f"model.vocab_size must be at least {vocab} (the vocabulary of data.tokenizer "
                          f"{tokenizer}), got {m.vocab_size}")


def validate_rows(m: ModelConfig, specs: list, window: Optional[int], train_len: int) -> None:
    """Every row of ``specs`` (``encodings``) builds on this model: its sink window, its shape, its options."""
    for spec in specs:
        row = Row.parse(spec)
        try:  # a sink row needs a window: its own, the trained model's or the config's, and only one
            sink_window(row.cls, row.window if row.window is not None else window)
        except ValueError as e:
            raise ConfigError(f"row {spec!r}: {e}") from None
        validate_shape(m, row.encoding)
        build_encoding(m, row.encoding, train_len)  # the encoding's own checks and options
