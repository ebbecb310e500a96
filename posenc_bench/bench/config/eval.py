"""The ``eval`` section: the eval lengths, the tokens scored at each, and the protocol that scores them.

Every field but ``batch_tokens`` (how the work is cut) is part of a record's eval key (``bench/keys.py``); ``tune``
is, as the grids it chooses from, in the keys of the rows it tunes only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from posenc_bench.errors import ConfigError

DEFAULT_EVAL_LENS = ["1x", "1.5x", "2x", "4x"]


@dataclass
class EvalConfig:
    # absolute lengths (4096) or multiples of the train length ("2x"); the train length is always added
    lens: list = field(default_factory=lambda: list(DEFAULT_EVAL_LENS))
    tokens: int = 65536  # target tokens scored at every eval length (rounded up to whole segments)
    split: str = "test"
    batch_tokens: int = 16384  # tokens per forward pass
    position_buckets: int = 64  # loss-by-position buckets over the longest eval length
    # nonoverlapping (default): windows side by side; strided: each window scores only its last `stride`
    # targets, so each has at least L - stride tokens of context (see evaluate.windows)
    protocol: str = "nonoverlapping"
    stride: int = 0
    # stream (default): segments cut from the split's documents end to end, so windows may cross documents;
    # documents: every segment inside one document, spread over the split's documents (data.spread_segments)
    windows: str = "stream"
    # true: each zero-shot fix's options (ReRoPE's w, Self-Extend's G and W, YaRN's bounds, the sinks' count) are
    # chosen on the valid split at every eval length from the grid its class declares, and the records report
    # the test split at the choice (bench/eval/tune.py); false (default): every row at its authors' defaults
    tune: bool = False


def validate_eval(e: EvalConfig) -> None:
    """ConfigError naming the first ``eval`` key with a value no evaluation takes (the lengths: ``RunConfig``)."""
    if e.split not in ("train", "valid", "test"):
        raise ConfigError(f"eval.split {e.split!r} is not a split; valid splits: train, valid, test")
    if e.protocol not in ("nonoverlapping", "strided"):
        raise ConfigError(f"eval.protocol {e.protocol!r} is not a protocol; valid: nonoverlapping, strided")
    if (e.protocol == "strided") != (e.stride > 0) or e.stride < 0:
        raise ConfigError(f"eval.stride {e.stride}: the strided protocol needs a stride >= 1 token "
                          "(--protocol strided --stride 256), and only it takes one")
    if e.windows not in ("stream", "documents"):
        raise ConfigError(f"eval.windows {e.windows!r} is not a choice; valid: stream, documents")
    for key in ("tokens", "batch_tokens", "position_buckets"):
        if getattr(e, key) < 1:
            raise ConfigError(f"eval.{key} must be >= 1, got {getattr(e, key)}")
