"""RunConfig (bench/config/run.py): its rows and cells, its eval lengths, the run's own settings and the order
``validate`` checks them in; the expected time, which changes no key and no result's identity."""

import pytest

from posenc_bench.bench.config import RunConfig, load_config
from posenc_bench.errors import ConfigError


def test_rows_take_the_config_window_unless_they_name_one():
    cfg = load_config(None, {"encodings": ["rope", "alibi+sw32", "rope+sink4"], "window": 16})
    assert [row.name for row in cfg.rows()] == ["rope+sw16", "alibi+sw32", "rope+sw16+sink4"]
    assert [(row.name, seed) for row, seed in load_config(None, {"encodings": ["t5"], "seeds": [0, 2]}).cells()] == [
        ("t5", 0), ("t5", 2)]


def test_eval_lengths_are_tokens_or_a_tasks_instance_sizes():
    assert load_config("ci").eval_lengths() == [64, 96, 128, 256]
    assert load_config("tasks-ci").eval_lengths() == [8, 12, 16, 32]


@pytest.mark.parametrize("overrides,match", [
    ({"window": "sixty"}, "window must be int"),
    ({"window": 0}, "window must be >= 1 token"),
    ({"threads": 0}, "threads must be >= 1"),
    ({"save_every": -1}, "save_every must be >= 0 steps"),
    ({"grad_accum": 3}, "grad_accum must be >= 1 and divide train.batch_size 16"),
    ({"precision": "fp8"}, "precision 'fp8' is not supported"),
    ({"seeds": [-1]}, "seeds must be non-negative integers"),
    ({"encodings": []}, "no encodings selected; valid encodings: "),
    ({"expected_sweep_s": 0}, "expected_sweep_s must be a positive number of seconds"),
    ({"expected_sweep_s": "soon"}, "expected_sweep_s must be float"),
    ({"max_mask_bytes": 0}, "max_mask_bytes must be >= 1 byte, got 0"),
])
def test_the_runs_own_settings_are_refused_up_front(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config("configs/ci.yaml", overrides)


def test_validate_names_the_first_bad_key_in_section_order():
    """The run's settings, then the model, then train, eval, data, fine-tuning, task and gate."""
    with pytest.raises(ConfigError, match="threads must be >= 1"):
        load_config("ci", {"threads": 0, "train.steps": 0, "eval.split": "x"})
    with pytest.raises(ConfigError, match="train.steps must be >= 1"):
        load_config("ci", {"train.steps": 0, "eval.split": "x", "gate.ppl_tol": -1})
    with pytest.raises(ConfigError, match="eval.split 'x' is not a split"):
        load_config("ci", {"eval.split": "x", "data.test_fraction": 0, "gate.ppl_tol": -1})


@pytest.mark.parametrize("key", ["train_len", "batch_size", "steps", "log_every"])
def test_every_train_size_is_checked_before_a_model_is_built_of_it(key):
    """A negative train length reached the encoding's table (torch: "negative dimension -5") before train was
    checked; now train comes before the rows, and the message names the key, its range and the value."""
    with pytest.raises(ConfigError, match=rf"^train.{key} must be >= 1, got -5$"):
        load_config("ci", {f"train.{key}": -5, "encodings": ["learned", "t5"]})


@pytest.mark.parametrize("key", ["d_model", "n_layers", "n_heads", "mlp_ratio", "vocab_size"])
def test_every_model_size_is_a_positive_whole_number(key):
    with pytest.raises(ConfigError, match=rf"^model.{key} must be a whole number >= 1, got 0$"):
        load_config("ci", {f"model.{key}": 0})


def test_the_expected_time_is_the_configs_and_changes_no_key_and_no_identity():
    """The estimate's reference time is a field of the config (set where the config is sized), not part of a
    cell's key, an eval key or the identity rule: results made before it existed stay comparable."""
    from posenc_bench.bench.keys import cell_key, eval_key
    from posenc_bench.bench.records import differences
    from posenc_bench.bench.rows import Row

    assert RunConfig().expected_sweep_s is None and load_config(None).expected_sweep_s is None
    assert {name: load_config(name).expected_sweep_s for name in ("default", "ci", "tasks-ci", "sotu-512", "full")} == {
        "default": 600.0, "ci": 80.0, "tasks-ci": 180.0, "sotu-512": 14400.0, "full": None}
    ci, later = load_config("ci"), load_config("ci", {"expected_sweep_s": 1.0})
    assert cell_key(ci, Row("rope"), 0, "f") == cell_key(later, Row("rope"), 0, "f")
    assert eval_key(ci, Row("rope")) == eval_key(later, Row("rope"))
    before = {k: v for k, v in ci.to_dict().items() if k != "expected_sweep_s"}  # a run made before the field
    assert differences({"config": before}, {"config": ci.to_dict()}) == []
