"""bench/eval/progress.py: an unfinished eval row's lengths and valid passes, kept per row under its eval key."""

import pytest

from posenc_bench.bench.eval.progress import PARTIAL, RowProgress
from posenc_bench.bench.records import ResultsError


def test_progress_is_kept_per_row_under_its_eval_key_and_dropped_when_the_row_is_whole(tmp_path):
    a = RowProgress(tmp_path, "m+yarn", "key-1")
    a.keep_valid(64, {"beta_fast": 32.0, "beta_slow": 1.0}, 3.25)
    a.keep_valid(64, {"beta_fast": 8.0, "beta_slow": 1.0}, None)  # could not run there: kept as such
    a.keep_record(32, {"eval_len": 32, "ppl": 0.1 + 0.2})
    RowProgress(tmp_path, "m+rerope", "key-2").keep_record(32, {"eval_len": 32, "ppl": 2.0})

    again = RowProgress(tmp_path, "m+yarn", "key-1")
    assert again.lengths() == [32] and again.record(32)["ppl"] == 0.1 + 0.2  # bit for bit through the file
    assert again.valid(64, {"beta_slow": 1.0, "beta_fast": 32.0}) == (True, 3.25)  # the point's key order aside
    assert again.valid(64, {"beta_fast": 8.0, "beta_slow": 1.0}) == (True, None)
    assert again.valid(96, {"beta_fast": 32.0, "beta_slow": 1.0}) == (False, None)
    assert RowProgress(tmp_path, "m+yarn", "key-3").lengths() == []  # another eval key: afresh

    again.drop()
    assert RowProgress(tmp_path, "m+yarn", "key-1").lengths() == []
    assert RowProgress(tmp_path, "m+rerope", "key-2").lengths() == [32]  # the other row's is kept
    RowProgress(tmp_path, "m+rerope", "key-2").drop()
    assert not (tmp_path / PARTIAL).exists()


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_an_unreadable_progress_file_is_refused_with_its_path_not_overwritten(tmp_path, text):
    (tmp_path / PARTIAL).write_text(text)
    with pytest.raises(ResultsError, match=f"{PARTIAL}.*delete it"):
        RowProgress(tmp_path, "m+yarn", "key-1")
    assert (tmp_path / PARTIAL).read_text() == text
