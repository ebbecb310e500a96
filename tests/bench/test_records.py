import json
import os

import pytest

from posenc_bench.bench.records import ResultsError, ResultsStore, read_results
from posenc_bench.files import atomic_write_json


def test_atomic_write_leaves_no_temporary_and_ordinary_permissions(tmp_path):
    target = tmp_path / "a" / "results.json"
    atomic_write_json(target, {"x": 1})
    assert json.loads(target.read_text()) == {"x": 1}
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "results.json"
    atomic_write_json(target, {"old": True})
    with pytest.raises(TypeError):
        atomic_write_json(target, {"bad": object()})
    assert json.loads(target.read_text()) == {"old": True}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


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
