"""The train section (bench/config/train.py): every value that could not train is refused up front."""

import pytest

from posenc_bench.bench.config import TrainConfig, load_config
from posenc_bench.errors import ConfigError


@pytest.mark.parametrize("overrides,match", [
    ({"train.log_every": 0}, "log_every must be >= 1"),
    ({"train.steps": 0}, "train.steps must be >= 1"),
    ({"train.grad_clip": 0}, "grad_clip must be a positive number"),
    ({"train.lr": float("inf")}, "train.lr must be a positive number"),
    ({"train.min_lr_ratio": 2}, r"train.min_lr_ratio in \[0, 1\]"),
    ({"train.betas": [0.9, 2]}, "betas must be two numbers"),
    ({"train.betas": "0.9,x"}, r"train.betas\[1\] must be float"),
    ({"train.divergence_factor": 1}, "divergence_factor must be > 1"),
])
def test_values_that_would_crash_later_are_refused_up_front(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/ci.yaml", overrides)


def test_the_defaults_are_the_default_runs():
    assert load_config("default").train == TrainConfig()
