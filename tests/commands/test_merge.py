"""`posenc-bench merge`: what it writes beside the merged results, and bad input as one line (the merge rules
themselves are tested in tests/bench/run/test_shard.py)."""

import json
import shutil
from pathlib import Path

from posenc_bench.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_a_folder_with_nothing_to_merge_is_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["merge", str(tmp_path / "empty"), "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "holds no results.shard-<i>-of-<n>.json and no results.json" in err
    assert not (tmp_path / "m").exists()


def test_merging_one_finished_run_gives_its_records_and_the_tables_report_writes(tmp_path, capsys):
    from posenc_bench.analysis.report import results_markdown

    shutil.copy(ROOT / "results" / "default" / "results.json", tmp_path / "results.json")
    assert main(["merge", str(tmp_path), "--out", str(tmp_path / "m")]) == 0
    merged = json.loads((tmp_path / "m" / "results.json").read_text())
    original = json.loads((tmp_path / "results.json").read_text())
    assert merged["records"] == original["records"] and merged["run"]["merged_from"][0]["shard"] is None
    assert (tmp_path / "m" / "table.md").read_text() == results_markdown(merged)
    assert "merged 51 cell(s) from 1 file(s)" in capsys.readouterr().out
