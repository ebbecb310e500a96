import csv
import io
import json
from pathlib import Path

import pytest

from posenc_bench.analysis import report
from posenc_bench.commands.cli import main
from posenc_bench.bench.config import RunConfig
from posenc_bench.analysis.report import ppl_table, training_table

ROOT = Path(__file__).resolve().parents[2]


def rec(enc, seed, L, ppl, status="ok", reason=""):
    return {"encoding": enc, "seed": seed, "train_len": 100, "eval_len": L, "ratio": L / 100, "status": status,
            "reason": reason, "ppl": ppl, "bpb": None, "loss": None, "tokens": 10}


RECORDS = [
    rec("rope", 0, 100, 4.0), rec("rope", 1, 100, 6.0), rec("rope", 0, 200, 8.0), rec("rope", 1, 200, 9.0),
    rec("learned", 0, 100, 5.0), rec("learned", 0, 200, None, "n/a", "table has 100 rows"),
    rec("bad", 0, 100, None, "diverged", "diverged at step 3"), rec("bad", 0, 200, None, "diverged", "diverged at step 3"),
]


def test_ppl_table_mean_std_and_footnotes():
    table, notes = ppl_table(RECORDS, row_order=["rope", "learned", "bad"])
    assert list(table.columns) == ["1x (100)", "2x (200)"]
    assert table.loc["rope", "1x (100)"] == "5.00 ± 1.41"
    assert table.loc["rope", "2x (200)"] == "8.50 ± 0.71"
    assert table.loc["learned", "2x (200)"] == "n/a [1]"
    assert table.loc["bad", "1x (100)"] == "diverged [2]"
    assert notes == ["[1] table has 100 rows", "[2] diverged at step 3"]
    text = report._tabulate(table, "md")
    assert "| rope       |  5.00 ± 1.41 |  8.50 ± 0.71 |" in text


def test_relative_table_divides_by_the_same_seed_at_1x():
    table, _ = ppl_table(RECORDS, relative=True, row_order=["rope"])
    # seed 0: 8/4 = 2.0, seed 1: 9/6 = 1.5 -> mean 1.75, std 0.35
    assert table.loc["rope", "2x (200)"] == "1.75 ± 0.35"
    assert table.loc["rope", "1x (100)"] == "1.00 ± 0.00"


def test_training_table_reads_curves_and_positions():
    r = rec("rope", 0, 100, 4.0)
    r["train_curve"] = [[10, 3.0], [20, 2.5], [30, 2.2], [40, 2.0]]
    r["loss_by_position"] = [{"start": 0, "end": 10, "loss": 2.0, "tokens": 5},
                             {"start": 50, "end": 60, "loss": 1.0, "tokens": 5},
                             {"start": 60, "end": 100, "loss": 1.5, "tokens": 5}]
    t = training_table([r])
    assert t.loc["rope", "train loss @ step 40"] == "2.000"
    assert t.loc["rope", "1x loss, positions 0-9"] == "2.000"
    assert t.loc["rope", "1x loss, positions 50-99"] == "1.250"


def test_caption_states_what_was_measured_and_keeps_the_dirty_mark():
    from posenc_bench.bench.config import RunConfig
    from posenc_bench.analysis.report import caption

    run = {"config": RunConfig().to_dict(), "params": 821632, "corpus": {"source": "stdlib", "fingerprint": "abc"},
           "eval_tokens": 66048, "eval_fingerprint": "def", "device": "cpu:x86_64 (2 threads)",
           "versions": {"torch": "2.13.0+cpu"}, "git_commit": "0123456789abcdef0123-dirty"}
    text = caption(run)
    for fact in ("821,632 parameters", "4 layers, width 128, 4 heads", "400 steps x 32 x 128 tokens", "stdlib (abc)",
                 "66,048 test tokens", "seeds 0", "cpu:x86_64", "torch 2.13.0+cpu", "commit 0123456789ab-dirty"):
        assert fact in text, fact


# ------------------------------------------------------------------ report: render, update, CLI


def run_meta(rows, train_len=100, seeds=(0, 1)):
    cfg = RunConfig().to_dict()
    cfg["train"]["train_len"] = train_len
    cfg["seeds"] = list(seeds)
    return {"config": cfg, "rows": rows, "params": 1000, "corpus": {"source": "stdlib", "fingerprint": "abc"},
            "eval_tokens": 40, "eval_fingerprint": "def", "device": "cpu", "versions": {"torch": "2"},
            "git_commit": "0123456789abcdef"}


def results(rows=("rope", "learned", "bad"), records=None, **kw):
    recs = [dict(r, bpb=(r["ppl"] or 0) / 10 or None) for r in (records or RECORDS)]
    return {"schema_version": 1, "run": run_meta(list(rows), **kw), "records": recs}


def write(folder: Path, data: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(data))
    return folder


def test_best_in_each_column_is_marked_and_ties_all_count():
    recs = [rec("a", 0, 100, 4.001), rec("b", 0, 100, 3.999), rec("c", 0, 100, 5.0),
            rec("a", 0, 200, 6.0), rec("b", 0, 200, 7.0), rec("c", 0, 200, None, "n/a", "why")]
    run = report.Run("", "", {"run": {"rows": ["a", "b", "c"]}, "records": recs})
    t = report.build_table([run], "ppl")
    best = {(row, j) for (row, j), c in t.cells.items() if c.best}
    assert best == {("a", 0), ("b", 0), ("a", 1)}  # 4.00 and 4.00 tie at two decimals
    text = report.cell_text(t.cells["a", 0], 2, "md")
    assert text == "**4.00**"
    assert report.cell_text(t.cells["c", 1], 2, "md") == "n/a [1]"
    ratio = report.build_table([run], "ratio")
    assert not any(ratio.cells[row, 0].best for row in "abc")  # 1x is 1.00 by definition: no mark
    assert ratio.cells["a", 1].best and ratio.cells["a", 1].mean == pytest.approx(6.0 / 4.001)


def test_markdown_report_has_caption_tables_footnotes_and_is_stable():
    run = report.Run("", "", results())
    text = report.render([run], values=["ppl", "bpb", "ratio"])
    assert text == report.render([run], values=["ppl", "bpb", "ratio"])
    assert text.startswith("Byte-level LM, 1,000 parameters")
    assert text.index("Perplexity (lower") < text.index("Bits per byte") < text.index("relative to the same model")
    # rope and learned tie at 5.00 in the 1x column: both bold; 2x has one number only: nothing to mark
    assert "| rope       | **5.00 ± 1.41** |  8.50 ± 0.71 |" in text
    assert "| learned    |        **5.00** |      n/a [1] |" in text
    assert "| bad        |    diverged [2] | diverged [2] |" in text
    assert text.count("[1] table has 100 rows") == 3  # every table that uses a note lists it
    assert "0.50 ± 0.14" in text  # bpb = ppl / 10 in this fixture


def test_other_formats_carry_the_same_cells():
    run = report.Run("", "", results())
    rows = list(csv.DictReader(io.StringIO(report.render([run], fmt="csv", values="ppl"))))
    by = {(r["encoding"], r["eval_len"]): r for r in rows}
    assert float(by["rope", "100"]["mean"]) == 5.0 and float(by["rope", "100"]["std"]) == pytest.approx(1.41421, 1e-5)
    assert by["rope", "100"]["seeds"] == "2" and by["learned", "200"]["status"] == "n/a"
    assert by["learned", "200"]["reason"] == "table has 100 rows" and by["bad", "100"]["status"] == "diverged"
    data = json.loads(report.render([run], fmt="json"))
    assert [t["value"] for t in data["tables"]] == ["ppl", "ratio"]
    rope = data["tables"][0]["rows"][0]
    assert rope["encoding"] == "rope" and rope["cells"][1]["mean"] == 8.5
    assert data["footnotes"] == {"[1]": "table has 100 rows", "[2]": "diverged at step 3"}
    assert data["training"]["run"][0]["encoding"] == "rope"
    latex = report.render([report.Run("", "", results(rows=["rope_x"], records=[rec("rope_x", 0, 100, 4.0),
                                                                                  rec("rope_x", 1, 100, 5.0)]))],
                          fmt="latex", values="ppl")
    assert r"4.50 $\pm$ 0.71" in latex and r"rope\_x" in latex and r"\begin{tabular}" in latex
    assert r"\caption{Perplexity" in latex
    html = report.render([run], fmt="html", values="ppl")
    assert "<b>5.00 ± 1.41</b>" in html and "<table>" in html and "diverged [2]" in html


def test_several_runs_side_by_side(tmp_path):
    a = write(tmp_path / "T100", results(rows=["rope", "learned"]))
    other = [dict(r, train_len=200, eval_len=r["eval_len"] * 2) for r in RECORDS if r["encoding"] in ("rope", "bad")]
    b = write(tmp_path / "T200", results(rows=["rope", "bad"], records=other, train_len=200))
    runs = report.load_runs([a, b])
    t = report.build_table(runs, "ppl")
    assert [c.header() for c in t.columns] == ["T100: 1x (100)", "T100: 2x (200)", "T200: 1x (200)", "T200: 2x (400)"]
    assert t.rows == ["rope", "learned", "bad"]
    assert t.cells["learned", 2].status == "missing" and report.cell_text(t.cells["learned", 2], 2) == ""
    assert t.cells["rope", 3].mean == 8.5
    text = report.render(runs, values="ppl")
    assert text.startswith("T100: Byte-level LM") and "\nT200: Byte-level LM" in text


def test_update_rewrites_only_its_block_atomically(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("intro `<!-- posenc-bench table: results/a -->` quoted in a sentence is no block\n"
                      "<!-- posenc-bench table: results/a -->\nold\n<!-- /posenc-bench table -->\nmiddle\n"
                      "<!-- posenc-bench table: results/b -->\nkeep\n<!-- /posenc-bench table -->\nend\n")
    assert report.update_file(readme, "results/a", "new table\n")
    assert readme.read_text() == ("intro `<!-- posenc-bench table: results/a -->` quoted in a sentence is no block\n"
                                  "<!-- posenc-bench table: results/a -->\nnew table\n<!-- /posenc-bench "
                                  "table -->\nmiddle\n<!-- posenc-bench table: results/b -->\nkeep\n<!-- /posenc-bench "
                                  "table -->\nend\n")
    assert not report.update_file(readme, "results/a", "new table\n")  # unchanged the second time
    with pytest.raises(report.ReportError, match=r"no block marked <!-- posenc-bench table: results/c -->.*"
                                                 r"it has blocks for: results/a, results/b"):
        report.update_file(readme, "results/c", "x\n")
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary left behind


def test_report_cli_prints_writes_and_updates(tmp_path, capsys, monkeypatch):
    folder = write(tmp_path / "results" / "r1", results())
    monkeypatch.chdir(tmp_path)
    assert main(["report", "results/r1"]) == 0
    printed = capsys.readouterr().out
    assert printed == report.render(report.load_runs(["results/r1"]))
    assert main(["report", "results/r1/", "--out", "t.csv", "--value", "ppl,bpb"]) == 0
    assert (tmp_path / "t.csv").read_text() == report.render(report.load_runs([folder]), fmt="csv", values="ppl,bpb")
    (tmp_path / "README.md").write_text("# x\n<!-- posenc-bench table: results/r1 -->\n<!-- /posenc-bench table -->\n")
    assert main(["report", "./results/r1", "--update", "README.md"]) == 0
    assert report.read_block((tmp_path / "README.md").read_text(), "results/r1") == printed
    assert "updated: README.md (block results/r1)" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["report", "nowhere"], "no results file at 'nowhere'"),
    (["report", "results/r1", "--value", "ppl,speed"], "unknown table value 'speed'; valid: ppl, bpb, ratio, training"),
    (["report", "results/r1", "--out", "t.xlsx"], "cannot tell the format of 't.xlsx'"),
    (["report", "results/r1", "--format", "csv", "--update", "README.md"], "--update writes a Markdown table"),
    (["report", "results/r1", "--update", "README.md"], "no block marked <!-- posenc-bench table: results/r1 -->"),
    (["plot", "results/r1", "--formats", "gif"], "unknown figure format(s) 'gif'; valid: png, svg"),
])
def test_report_and_plot_bad_input_is_one_line_exit_2(tmp_path, capsys, monkeypatch, args, message):
    write(tmp_path / "results" / "r1", results())
    (tmp_path / "README.md").write_text("no markers\n")
    monkeypatch.chdir(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.parametrize("name", ["default", "default-3seeds"])
def test_committed_table_md_is_what_report_builds(name):
    folder = ROOT / "results" / name
    assert (folder / "table.md").read_text() == report.render(report.load_runs([folder]))


@pytest.mark.parametrize("page,values,command", [
    ("README.md", "ppl", "posenc-bench report results/default --value ppl --update README.md"),
    ("docs/results.md", report.DEFAULT_VALUES, "posenc-bench report results/default --update docs/results.md"),
])
def test_readme_and_docs_tables_are_what_report_builds_from_the_committed_results(page, values, command):
    block = report.read_block((ROOT / page).read_text(), "results/default")
    assert block is not None, f"{page} lost its <!-- posenc-bench table: results/default --> block"
    assert block == report.render(report.load_runs([ROOT / "results" / "default"]), values=values), (
        f"the table in {page} is stale: run `{command}`")


def test_caption_names_every_commit_when_rows_were_added_later():
    recs = [dict(r, git_commit="a" * 40) for r in RECORDS[:4]] + [dict(r, git_commit="b" * 40 + "-dirty") for r in RECORDS[4:6]]
    text = report.caption(run_meta(["rope", "learned"]), recs)
    assert text.endswith(f"commits {'a' * 12} (rope); {'b' * 12}-dirty (learned).")
    assert report.caption(run_meta(["rope"]), RECORDS[:4]).endswith("commit 0123456789ab.")  # records without commits
