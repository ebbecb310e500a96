"""The ``eval`` section: the eval lengths, the tokens scored at each, and the protocol that scores them.

Every field but ``batch_tokens`` (how the work is cut) is part of a record's eval key (``bench/keys.py``); ``tune``
is, as the grids it chooses from, in the keys of the rows it tunes only; ``key_tokens``, off by default, is in
every key (with its evaluator's model key) only when on, so the keys results were made with stay as they were.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from posenc_bench.bench.eval.key_tokens import ALPHA, BETA, KeyTokenRule
from posenc_bench.errors import ConfigError

DEFAULT_EVAL_LENS = ["1x", "1.5x", "2x", "4x"]


@dataclass
class KeyTokensConfig:
    """Key tokens for LongPPL (``bench/eval/key_tokens.py``, docs/longppl.md): a row of the run whose model, at
    ``seed`` (None: the run's first seed), chooses the key tokens for every row; "" (default): none."""

    evaluator: str = ""
    seed: Optional[int] = None
    alpha: float = ALPHA  # the paper's thresholds
    beta: float = BETA
    short_context: str = "train"  # train: at most L_train tokens; longppl: the package's, at least L_train
    stride: int = 0  # targets sharing one short context; 0: L_train / 4

    def rule(self) -> Optional[KeyTokenRule]:
        """The ``key_tokens.KeyTokenRule`` of this section (it checks the values); None when off."""
        if not self.evaluator:
            return None
        return KeyTokenRule(self.evaluator, self.alpha, self.beta, self.short_context, self.stride or None)


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
    key_tokens: KeyTokensConfig = field(default_factory=KeyTokensConfig)  # LongPPL's key tokens: off by default


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
    if e.key_tokens.stride < 0:
        raise ConfigError(f"eval.key_tokens.stride must be >= 0 (0: a quarter of the train length), got "
                          f"{e.key_tokens.stride}")
    e.key_tokens.rule()  # a bad short_context, named with the valid ones
    for key in ("tokens", "batch_tokens", "position_buckets"):
        if getattr(e, key) < 1:
            raise ConfigError(f"eval.{key} must be >= 1, got {getattr(e, key)}")
