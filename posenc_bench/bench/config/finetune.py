"""The ``finetune`` section: how the -ft rows continue the trained rope model at a longer length, and the
resolved plan (``finetune_plan``: defaults filled in from the pre-training config)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from posenc_bench.bench.config.train import TrainConfig
from posenc_bench.errors import ConfigError
from posenc_bench.values import parse_eval_lens


@dataclass
class FinetuneConfig:
    """The -ft rows (rope-ft, rope-linear-ft, ...): the trained rope model trained further at a longer length
    with the row's scaling, as the position-interpolation paper does (Chen et al. 2023, sec. 3.2). The same
    optimizer settings as pre-training (AdamW betas, decay, clipping, warm-up then cosine to min_lr_ratio)
    and the same data stream, continued where pre-training stopped. The peak lr defaults to the rate
    pre-training ended at (train.lr x train.min_lr_ratio): PI fine-tunes at a small fraction of LLaMA's peak,
    and re-warming to the pre-training peak undoes part of pre-training (docs/rope-scaling.md)."""

    steps: int = 0  # 0: 10% of train.steps
    len: str = ""  # fine-tune length, "4x" or tokens; "": the longest eval length
    warmup_steps: int = -1  # -1: 10% of the fine-tune steps (at least 1)
    batch_size: int = 0  # sequences per step; 0: as many tokens per step as pre-training (B x T / len)
    lr: float = 0.0  # peak lr; 0: train.lr x train.min_lr_ratio


@dataclass
class FinetunePlan:
    steps: int
    len: int
    warmup_steps: int
    batch_size: int
    lr: float

    @property
    def tokens(self) -> int:
        return self.steps * self.batch_size * self.len


def finetune_plan(f: FinetuneConfig, t: TrainConfig, eval_lengths: list[int]) -> FinetunePlan:
    """The fine-tuning ``f`` resolved against pre-training ``t`` and the run's eval lengths (in tokens)."""
    length = max(eval_lengths) if not str(f.len).strip() else parse_eval_lens([str(f.len)], t.train_len)[-1]
    if length <= t.train_len:
        raise ConfigError(f"finetune.len {f.len or length!r} must be beyond the train length {t.train_len} "
                          "(e.g. 4x): fine-tuning teaches the scaled model a longer context")
    steps = f.steps or max(1, round(0.1 * t.steps))
    warmup = f.warmup_steps if f.warmup_steps >= 0 else max(1, round(0.1 * steps))
    batch = f.batch_size or max(1, round(t.batch_size * t.train_len / length))
    return FinetunePlan(steps, length, warmup, batch, f.lr or t.lr * t.min_lr_ratio)


def validate_finetune(f: FinetuneConfig) -> None:
    """ConfigError for a negative count or rate (0 and -1 mean the defaults); the length: ``finetune_plan``."""
    for key in ("steps", "batch_size", "lr"):
        value = getattr(f, key)
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"finetune.{key} must be >= 0 (0: the default), got {value}")
    if f.warmup_steps < -1:
        raise ConfigError(f"finetune.warmup_steps must be >= -1 (-1: the default), got {f.warmup_steps}")
