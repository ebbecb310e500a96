"""The ``train`` section: how a model is pre-trained (length, batch, steps, AdamW and its schedule).

Every field but ``compile`` is part of a trained model's cell key (``bench/keys.py``): changing one retrains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from posenc_bench.errors import ConfigError


@dataclass
class TrainConfig:
    train_len: int = 128
    batch_size: int = 32
    steps: int = 400
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # cosine decays to lr * min_lr_ratio
    warmup_steps: int = 40
    weight_decay: float = 0.1
    betas: list = field(default_factory=lambda: [0.9, 0.95])
    grad_clip: float = 1.0
    # a run diverged when a loss is not finite, or when the mean loss of divergence_patience logged windows in a
    # row (log_every steps each), or of its last window, is above divergence_factor x the first step's loss: a
    # one-batch spike that training recovers from is not a divergence. Changes no finished model's weights, so
    # patience is not part of the cell key (a diverged checkpoint records the rule it was judged by)
    divergence_factor: float = 2.0
    divergence_patience: int = 3
    log_every: int = 20
    # run each transformer block through torch.compile while training: the same model within float rounding
    # (tested to 1e-5), so not part of the cell key (``bench/keys.py``) or of a result's identity
    compile: bool = False


def validate_train(t: TrainConfig) -> None:
    """ConfigError naming the first ``train`` key whose value cannot train."""
    for key in ("train_len", "batch_size", "steps", "log_every"):
        if getattr(t, key) < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {getattr(t, key)}")
    for key in ("lr", "grad_clip"):
        if not (getattr(t, key) > 0 and math.isfinite(getattr(t, key))):
            raise ConfigError(f"train.{key} must be a positive number, got {getattr(t, key)}")
    if t.warmup_steps < 0 or not 0 <= t.min_lr_ratio <= 1 or t.weight_decay < 0:
        raise ConfigError("train.warmup_steps and train.weight_decay must be >= 0, train.min_lr_ratio in [0, 1]")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise ConfigError(f"train.betas must be two numbers in [0, 1), got {t.betas!r}")
    if not isinstance(t.compile, bool):
        raise ConfigError(f"train.compile must be true or false, got {t.compile!r}")
    if not t.divergence_factor > 1:
        raise ConfigError(f"train.divergence_factor must be > 1, got {t.divergence_factor}")
    if not (isinstance(t.divergence_patience, int) and t.divergence_patience >= 1):
        raise ConfigError(f"train.divergence_patience must be an integer >= 1 (logged windows), got "
                          f"{t.divergence_patience!r}")
