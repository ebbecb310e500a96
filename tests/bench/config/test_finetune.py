"""The finetune section (bench/config/finetune.py): the resolved plan of the -ft rows, and the values it refuses.
The -ft rows end to end: tests/bench/test_sweep.py, test_passkey.py, test_pretrained.py."""

import pytest

from posenc_bench.bench.config import FinetuneConfig, TrainConfig, finetune_plan, load_config
from posenc_bench.errors import ConfigError


def test_the_plan_defaults_to_a_tenth_of_pre_training_at_the_longest_length():
    cfg = load_config("configs/ci.yaml", {"encodings": ["rope", "rope-linear-ft"]})  # T=64, B=16, 300 steps
    plan = cfg.finetune_plan()
    assert (plan.steps, plan.len, plan.warmup_steps, plan.batch_size) == (30, 256, 3, 4)
    assert plan.lr == pytest.approx(3e-3 * 0.1)  # where pre-training's cosine ended
    assert plan.tokens == 30 * 4 * 256 == 0.1 * 300 * 16 * 64  # 10% of the pre-training tokens
    cfg = load_config("configs/ci.yaml", {"finetune.len": "2x", "finetune.steps": 7})
    assert (cfg.finetune_plan().len, cfg.finetune_plan().steps, cfg.finetune_plan().batch_size) == (128, 7, 8)
    with pytest.raises(ConfigError, match="finetune.len '1x' must be beyond the train length 64"):
        load_config("configs/ci.yaml", {"encodings": ["rope-ft"], "finetune.len": "1x"})


def test_the_plan_is_a_function_of_the_sections_alone():
    t = TrainConfig(train_len=100, batch_size=10, steps=50, lr=1.0, min_lr_ratio=0.5)
    plan = finetune_plan(FinetuneConfig(len="3x", warmup_steps=0, batch_size=2, lr=0.25), t, [100, 200])
    assert (plan.steps, plan.len, plan.warmup_steps, plan.batch_size, plan.lr) == (5, 300, 0, 2, 0.25)
    assert finetune_plan(FinetuneConfig(), t, [100, 400]).len == 400 and finetune_plan(FinetuneConfig(), t, [100, 400]).lr == 0.5


@pytest.mark.parametrize("overrides,match", [
    ({"finetune.steps": -1}, r"finetune.steps must be >= 0 \(0: the default\), got -1"),
    ({"finetune.batch_size": -2}, r"finetune.batch_size must be >= 0 \(0: the default\), got -2"),
    ({"finetune.warmup_steps": -2}, r"finetune.warmup_steps must be >= -1 \(-1: the default\), got -2"),
    ({"finetune.lr": -1e-3}, r"finetune.lr must be >= 0 \(0: the default\), got -0.001"),
])
def test_negative_counts_and_rates_are_refused_naming_the_value(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("ci", overrides)
