"""Loading results folders into runs: labels, row order, train length, errors."""

import pytest

from posenc_bench.analysis.runs import ReportError, load_runs, row_order, run_intervals, train_len
from tests.analysis.fake_results import results, unit_results, write


def test_rows_keep_the_declared_order_then_the_records_and_the_train_length_is_the_runs():
    data = results(rows=["learned"])
    assert row_order(data) == ["learned", "rope", "bad"]
    assert train_len(data["run"]) == 100  # an older run: its config's
    assert train_len({"train_len": 8192, "config": {"eval": {}}}) == 8192  # an eval of a pretrained model


def test_runs_are_labelled_by_folder_and_each_gets_its_intervals(tmp_path):
    a, b = write(tmp_path / "x" / "one", results()), write(tmp_path / "y" / "two", unit_results())
    runs = load_runs([a, b])
    assert [r.label for r in runs] == ["one", "two"] and load_runs([a])[0].label == ""
    twins = load_runs([write(tmp_path / "p" / "same", results()), write(tmp_path / "q" / "same", results())])
    assert [r.label for r in twins] == [str(tmp_path / "p" / "same"), str(tmp_path / "q" / "same")]
    ivs = run_intervals(runs)
    assert not ivs["one"].available and ivs["two"].available  # per-unit numbers only in the second
    with pytest.raises(ReportError, match="at least one results folder"):
        load_runs([])
