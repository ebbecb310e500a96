"""results.json (bench/records.py): the one record builder, the identity rule, the locked folder; read back with a
message for each way it can be wrong; a cell replaced as a unit."""

import pytest

from posenc_bench.bench.config import RunConfig
from posenc_bench.bench.records import (IncomparableError, ResultsError, ResultsFolder, ResultsStore, differences,
                                        finished, identity, model_record, new_record, read_results, score)
from posenc_bench.bench.rows import Row
from posenc_bench.errors import PositionOutOfRange

RUN = {"train_len": 64, "corpus": {"fingerprint": "c"}, "eval_fingerprint": "e", "git_commit": "abc", "device": "cpu",
       "versions": {"torch": "2"}, "config": RunConfig().to_dict()}
META = {"outcome": {"status": "ok", "time_s": 12.3456, "tokens_per_s": 1000.04, "final_loss": 1.5, "curve": [[10, 2.0]],
                    "reason": ""}}


def test_read_results_errors(tmp_path):
    with pytest.raises(ResultsError, match="no results file"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"run": {}, "records": [')
    with pytest.raises(ResultsError, match="truncated or corrupt"):
        read_results(tmp_path)
    (tmp_path / "results.json").write_text('{"a": 1}')
    with pytest.raises(ResultsError, match="not a posenc-bench results file"):
        read_results(tmp_path)


def test_store_replaces_a_cell_as_a_unit(tmp_path):
    store = ResultsStore(tmp_path / "results.json", {"k": 1})
    store.put_cell("rope", 0, [{"encoding": "rope", "seed": 0, "eval_len": 8, "ppl": 2.0}])
    store.put_cell("alibi", 0, [{"encoding": "alibi", "seed": 0, "eval_len": 8, "ppl": 3.0}])
    store.put_cell("rope", 0, [{"encoding": "rope", "seed": 0, "eval_len": 8, "ppl": 1.5}])
    data = read_results(tmp_path)
    assert sorted((r["encoding"], r["ppl"]) for r in data["records"]) == [("alibi", 3.0), ("rope", 1.5)]


def test_a_record_says_what_it_is_its_metric_and_where_it_was_measured():
    rec = new_record(RUN, "rope+sw16", 1, 128, base_encoding="rope", window=16, cell_key="k")
    assert (rec["encoding"], rec["base_encoding"], rec["window"], rec["seed"], rec["eval_len"]) == ("rope+sw16", "rope", 16, 1, 128)
    assert rec["ratio"] == 2.0 and rec["metric"] == "ppl" and rec["status"] == "ok" and rec["ppl"] is None
    assert (rec["corpus_fingerprint"], rec["eval_fingerprint"], rec["git_commit"], rec["device"]) == ("c", "e", "abc", "cpu")
    with pytest.raises(ValueError, match="unknown metric 'bleu'; valid: ppl, accuracy"):
        new_record(RUN, "rope", 0, 64, metric="bleu")
    task = new_record(RUN, "rope", 0, 64, metric="accuracy")  # a task run's record: exact match, not yet measured
    assert task["metric"] == "accuracy" and task["accuracy"] is None and task["token_accuracy"] is None


def test_one_builder_for_our_models_records_keys_training_and_the_protocol():
    config = RunConfig().to_dict()
    config["eval"].update(protocol="strided", stride=100)
    keys = {"cell_key": "ck", "eval_key": "ek"}
    rec = model_record(RUN, Row.parse("rope-yarn+sw16"), 0, 64, keys=keys, meta=META, config=config)
    assert (rec["base_encoding"], rec["window"], rec["cell_key"], rec["eval_key"]) == ("rope-yarn", 16, "ck", "ek")
    assert (rec["train_time_s"], rec["train_tokens_per_s"], rec["train_final_loss"]) == (12.35, 1000.0, 1.5)
    assert (rec["protocol"], rec["stride"]) == ("strided", 64)  # a stride is at most the window
    tuned = model_record(RUN, Row("rope-ft"), 0, 64, keys=keys, config=RunConfig().to_dict(),
                         meta={**META, "finetune": {"len": 256, "curve": [[1, 2.0]]}})
    assert tuned["finetune"] == {"len": 256} and tuned["stride"] is None and tuned["protocol"] == "nonoverlapping"
    diverged = {"outcome": {"status": "diverged", "reason": "diverged at step 3", "last_finite_loss": 9.0, "time_s": 1.0}}
    rec = model_record(RUN, Row("rope"), 0, 64, keys=keys, meta=diverged, config=config)
    assert (rec["status"], rec["reason"], rec["last_finite_loss"]) == ("diverged", "diverged at step 3", 9.0)
    assert score(rec, lambda: pytest.fail("a diverged model is not evaluated")) is rec


def test_a_rand_record_says_how_its_positions_were_evaluated_and_results_that_differ_are_told_apart():
    config = RunConfig().to_dict()
    rec = model_record(RUN, Row("rope+rand"), 0, 64, keys={}, meta=META, config=config)
    assert rec["eval_options"] == {"eval_positions": "random", "eval_seed": 0}
    assert "eval_options" not in model_record(RUN, Row("rope"), 0, 64, keys={}, meta=META, config=config)
    config = RunConfig().to_dict()
    config["model"]["encoding_options"] = {"rope+rand": {"eval_positions": "ordered"}}
    ordered = model_record(RUN, Row("rope+rand"), 0, 64, keys={}, meta=META, config=config)
    assert "eval_options" not in ordered  # at 0 .. L-1, as +rand rows were evaluated before the option existed
    before = {"encoding": "rope+rand", "config": RunConfig().to_dict()}
    assert differences(RUN, RUN, [before], [rec]) == [("rope+rand: eval_options.eval_positions", None, "random"),
                                                      ("rope+rand: eval_options.eval_seed", None, 0)]
    assert differences(RUN, RUN, [before], [{**ordered, "config": RunConfig().to_dict()}]) == []  # the same numbers


def test_score_measures_or_records_why_not():
    config = RunConfig().to_dict()
    rec = model_record(RUN, Row("rope"), 0, 64, keys={}, meta=META, config=config)
    assert score(rec, lambda: {"ppl": 3.0, "loss": 1.1, "tokens": 10, "other": 1})["ppl"] == 3.0 and "other" not in rec

    def cannot():
        raise PositionOutOfRange("no position 64")

    na = score(model_record(RUN, Row("learned"), 0, 128, keys={}, meta=META, config=config), cannot)
    assert (na["status"], na["reason"], na["ppl"]) == ("n/a", "no position 64", None)


def test_a_cell_is_finished_only_at_every_length_with_its_keys():
    recs = [{"eval_len": L, "cell_key": "a", "eval_key": "e"} for L in (64, 128)]
    assert finished(recs, [64, 128], {"cell_key": "a", "eval_key": "e"}) and finished(recs, [64])
    assert not finished(recs, [64, 128, 256]) and not finished([], [64])
    assert not finished(recs, [64, 128], {"cell_key": "b"})  # trained another way: evaluated again


def test_the_identity_rule_names_the_first_field_that_differs_and_ignores_how_the_work_was_cut():
    base = {**RUN, "rows": ["rope"], "eval_lengths": [64, 128], "config": RunConfig().to_dict()}
    same = {**base, "config": {**RunConfig().to_dict(), "out": "elsewhere", "threads": 2, "seeds": [0, 1, 2],
                               "encodings": ["alibi"], "eval": {**RunConfig().to_dict()["eval"], "batch_tokens": 7}}}
    assert differences(base, same) == []
    other = {**base, "config": {**RunConfig().to_dict(), "train": {**RunConfig().to_dict()["train"], "lr": 0.1}}}
    assert differences(base, other) == [("train.lr", 0.003, 0.1)]
    assert differences(base, {**base, "eval_fingerprint": "f"}) == [("eval fingerprint", "e", "f")]
    assert identity(base)["kind"] == "run" and identity({**base, "kind": "eval"})["kind"] == "eval"
    old = {**base, "config": {k: v for k, v in RunConfig().to_dict().items() if k != "grad_accum"}}
    assert differences(base, old) == []  # a setting added later compares as its default
    a = [{"encoding": "t5", "config": {"model": {"encoding_options": {"t5": {"num_buckets": 8}}}}}]
    b = [{"encoding": "t5", "config": {"model": {"encoding_options": {"t5": {"num_buckets": 16}}}}}]
    assert differences(base, base, a, b) == [("t5: encoding_options.t5.num_buckets", 8, 16)]


def test_the_folder_takes_one_writer_and_refuses_results_measured_another_way(tmp_path):
    run = {**RUN, "rows": ["rope"], "eval_lengths": [64], "config": RunConfig().to_dict()}
    with ResultsFolder(tmp_path / "out") as folder:
        assert (tmp_path / "out" / ".results.json.owner").read_text().startswith("pid ")
        with pytest.raises(ResultsError, match="is being written by pid"):
            with ResultsFolder(tmp_path / "out"):
                pass
        store = folder.open_store(dict(run))
        store.put_cell("rope", 0, [{"encoding": "rope", "seed": 0, "eval_len": 64}])
    assert not (tmp_path / "out" / ".results.json.owner").exists()
    with ResultsFolder(tmp_path / "out") as folder:
        other = {**run, "config": {**run["config"], "precision": "bf16"}}
        with pytest.raises(IncomparableError, match="different 'precision' config .*write this run to another folder with --out"):
            folder.open_store(other)
        assert folder.open_store(dict(run)).records == [{"encoding": "rope", "seed": 0, "eval_len": 64}]


def test_a_resumed_run_keeps_the_time_its_folder_was_started(tmp_path):
    run = {**RUN, "rows": ["rope"], "eval_lengths": [64], "config": RunConfig().to_dict(),
           "started": "2026-12-03T14:47:00+0000"}
    with ResultsFolder(tmp_path / "out") as folder:
        folder.open_store(dict(run)).put_cell("rope", 0, [{"encoding": "rope", "seed": 0, "eval_len": 64}])
    with ResultsFolder(tmp_path / "out") as folder:
        store = folder.open_store({**run, "started": "2026-12-04T05:51:43+0000"})
        assert store.run["started"] == "2026-12-03T14:47:00+0000"


def test_a_folder_that_cannot_be_made_is_one_error_naming_it(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ResultsError, match=r"output folder '.*file' cannot be written: it is a file, not a folder"):
        with ResultsFolder(tmp_path / "file"):
            pass
    with pytest.raises(ResultsError, match=r"'.*file/out' cannot be written: creating it failed \("):
        with ResultsFolder(tmp_path / "file" / "out"):
            pass
