"""eval.tune: the choice is made on the valid split alone and the test split is scored once, at it; the record
says what was chosen from what; grids hold a row's configured options; a tuned run resumes as any other."""

import json

import pytest

from posenc_bench.bench import checkpoint
from posenc_bench.bench.config import load_config
from posenc_bench.bench.eval import tune
from posenc_bench.bench.records import model_record, score
from posenc_bench.bench.rows import Row
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.errors import ConfigError, PositionOutOfRange

TINY = {"model.d_model": 16, "model.n_layers": 1, "model.n_heads": 2, "train.train_len": 32}
RT = Runtime.create("cpu", "fp32", show_progress=False, log=lambda line: None)


def config(rows=("rope", "rope-rerope"), tune_on=True, **extra):
    return load_config(overrides={"encodings": list(rows), **TINY, "eval.tune": tune_on, **extra})


class Work:
    """A run's work whose numbers are a function of the ReRoPE window the model was built with: valid and test
    prefer different windows; every call is logged (split, window)."""

    def __init__(self, metric="accuracy", valid=None, test=None, na=()):
        self.metric, self.calls, self.na = metric, [], set(na)
        self.valid_at, self.test_at = valid or {}, test or {}

    def evaluate(self, model, length, rt, valid=False):
        w = model.encoding.window
        self.calls.append(("valid" if valid else "test", w))
        if valid and w in self.na:
            raise PositionOutOfRange(f"window {w} cannot run")
        value = (self.valid_at if valid else self.test_at).get(w, 0.1)
        return {self.metric: value, "tokens": 1}

    def valid_meta(self):
        return {"split": "valid", "fingerprint": "v"}


def rope_model(cfg):
    """The model a sweep hands the tuner for rope-rerope: the rope weights with the row's encoding."""
    return checkpoint.build_model(cfg, Row("rope-rerope"), 0)


def test_the_choice_is_valids_and_the_test_number_is_at_it():
    cfg = config()
    assert tune.points(cfg, Row("rope-rerope"), 64) == [{"window": w} for w in (4, 8, 16, 24)]
    work = Work(valid={16: 0.9, 24: 0.2}, test={16: 0.4, 24: 0.95})  # test would pick 24
    result = tune.Tuner(cfg, work, RT).evaluate(rope_model(cfg), Row("rope-rerope"), 0, 64)
    assert result["accuracy"] == 0.4  # the test split at valid's choice, not test's best
    assert work.calls == [("valid", 4), ("valid", 8), ("valid", 16), ("valid", 24), ("test", 16)]
    t = result["tuning"]
    assert t["chosen"] == {"window": 16} and t["chosen_index"] == 2 and t["split"] == "valid"
    assert t["grid"] == [{"window": w} for w in (4, 8, 16, 24)] and t["values"] == [0.1, 0.1, 0.9, 0.2]
    assert t["metric"] == "accuracy" and t["higher_is_better"] and t["valid"] == {"split": "valid", "fingerprint": "v"}


def test_a_tie_keeps_the_authors_default_and_perplexity_is_chosen_lowest():
    cfg = config()
    tied = tune.Tuner(cfg, Work(), RT).evaluate(rope_model(cfg), Row("rope-rerope"), 0, 64)
    assert tied["tuning"]["chosen"] == {"window": 4}  # the author's eighth, first in the grid
    ppl = Work("ppl", valid={4: 30.0, 8: 20.0, 16: 25.0, 24: 40.0}, test={8: 21.0})
    result = tune.Tuner(cfg, ppl, RT).evaluate(rope_model(cfg), Row("rope-rerope"), 0, 64)
    assert result["tuning"]["chosen"] == {"window": 8} and result["ppl"] == 21.0
    assert tune.choose([None, 2.0, 1.0, 1.0], higher_is_better=False) == 2 and tune.choose([None], True) is None


def test_points_that_cannot_run_are_never_chosen_and_none_running_is_na():
    cfg = config()
    work = Work(valid={4: 0.9, 8: 0.5}, na={4})
    result = tune.Tuner(cfg, work, RT).evaluate(rope_model(cfg), Row("rope-rerope"), 0, 64)
    assert result["tuning"]["values"][0] is None and result["tuning"]["chosen"] == {"window": 8}
    rec = model_record({"train_len": 32, "corpus": {"fingerprint": "c"}, "eval_fingerprint": "e", "git_commit": "g",
                        "device": "cpu", "versions": {}}, Row("rope-rerope"), 0, 64, keys={}, meta={},
                       config=cfg.to_dict(), metric="accuracy")
    every = Work(na={4, 8, 16, 24})
    out = score(rec, lambda: tune.Tuner(cfg, every, RT).evaluate(rope_model(cfg), Row("rope-rerope"), 0, 64))
    assert out["status"] == "n/a" and "tuning grid" in out["reason"]
    assert ("test", 4) not in every.calls and not any(split == "test" for split, _ in every.calls)


def test_untuned_runs_rows_without_a_grid_and_held_options_evaluate_as_ever():
    work = Work(test={4: 0.3})
    result = tune.Tuner(config(tune_on=False), work, RT).evaluate(rope_model(config()), Row("rope-rerope"), 0, 64)
    assert "tuning" not in result and work.calls == [("test", 4)]
    cfg = config(rows=("rope", "rope-rerope", "rope-leaky"))
    assert tune.points(cfg, Row("rope"), 64) == [] and tune.grids(cfg, Row("rope")) == {}
    held = config(rows=("rope", "rope-rerope", "rope-leaky"),
                  **{"model.encoding_options": {"rope-rerope": {"window": 8}, "rope-leaky": {"window": 8}}})
    assert tune.points(held, Row("rope-rerope"), 64) == []  # its one option held: nothing to choose
    assert tune.points(held, Row("rope-leaky"), 128) == [{"slope": 16.0}, {"slope": 5.2}]  # k alone: w held at 8
    assert tune.grids(config(tune_on=False), Row("rope-rerope")) == {}
    assert set(tune.grids(config(rows=("rope", "rope-selfextend")), Row("rope-selfextend"))) == {"48", "64", "128"}


def test_a_task_runs_window_is_an_instances_input_and_tune_reports_the_test_split():
    cfg = load_config("tasks-needle", overrides={"eval.tune": True})
    assert cfg.train.train_len == 28 and tune.window_length(cfg, 64) == 76 and tune.window_length(config(), 64) == 64
    assert tune.points(cfg, Row("rope-selfextend"), 64)[0] == {"group": 8, "neighbor_window": 10}
    valid = config(**{"eval.split": "valid"})  # a config may say so (a checkpoint's, evaluated on valid) ...
    with pytest.raises(ConfigError, match="eval.split must be test with it, got 'valid'"):
        tune.Tuner(valid, Work(), RT)  # ... but no sweep tunes with it


def test_a_tuned_task_sweep_records_its_choices_prints_them_and_resumes(tmp_path, capsys):
    from posenc_bench.commands.cli import main

    out = tmp_path / "tuned"
    argv = ["run", "--config", "tasks-ci", "--encodings", "rope,rope-rerope", "--seeds", "1", "--steps", "5",
            "--set", "task.eval_instances=8", "--progress", "off", "--out", str(out), "--tune"]
    assert main(argv) == 0
    records = json.loads((out / "results.json").read_text())["records"]
    assert not any("tuning" in r for r in records if r["encoding"] == "rope")
    tuned = [r for r in records if r["encoding"] == "rope-rerope"]
    assert len(tuned) == 4 and all(r["tuning"]["grid"] == [{"window": w} for w in (2, 4, 8, 12)] for r in tuned)
    assert all(r["tuning"]["chosen"] in r["tuning"]["grid"] and r["tuning"]["valid"]["instances"]["8"] == 8
               for r in tuned)
    table = (out / "table.md").read_text()
    assert "Tuned on the valid split (eval.tune" in table and "rope-rerope window: 1x from 2, 4, 8, 12: " in table
    capsys.readouterr()
    assert main(argv) == 0  # resumed: both cells finished with their keys
    log = capsys.readouterr().out
    assert "rope seed 0: done before, skipped" in log and "rope-rerope seed 0: done before, skipped" in log
