"""Rendering: the report's Markdown, HTML, LaTeX, CSV and JSON carry the same cells; README blocks update in
place; the committed tables (table.md, README and docs blocks) are what `report` renders from the results."""

import csv
import io
import json
import re
from pathlib import Path

import pytest

from tests.analysis.fake_results import rec, results, unit_results, write
from posenc_bench.analysis import report
from posenc_bench.analysis.runs import ReportError, Run, load_runs
from posenc_bench.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_markdown_cells_show_mean_and_std_and_footnotes():
    text = report.render([Run("", "", results())], values="ppl", mark_best=False)
    assert "| rope       |  5.00 ± 1.41 |  8.50 ± 0.71 |" in text
    assert "| learned    |         5.00 |      n/a [1] |" in text
    assert "| bad        | diverged [2] | diverged [2] |" in text
    assert text.endswith("\n[1] table has 100 rows\n[2] diverged at step 3\nSeeds per row (each row's interval rests "
                         "on its own): rope: 2 seeds (0,1); learned, bad: 1 seed (0)\n")
    ratio = report.render([Run("", "", results())], values="ratio", mark_best=False)
    assert "| rope       |  1.00 ± 0.00 |  1.75 ± 0.35 |" in ratio


def test_markdown_report_has_caption_tables_footnotes_and_is_stable():
    run = Run("", "", results())
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
    run = Run("", "", results())
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
    latex = report.render([Run("", "", results(rows=["rope_x"], records=[rec("rope_x", 0, 100, 4.0),
                                                                                  rec("rope_x", 1, 100, 5.0)]))],
                          fmt="latex", values="ppl")
    assert r"4.50 $\pm$ 0.71" in latex and r"rope\_x" in latex and r"\begin{tabular}" in latex
    assert r"\caption{Perplexity" in latex
    html = report.render([run], fmt="html", values="ppl")
    assert "<b>5.00 ± 1.41</b>" in html and "<table>" in html and "diverged [2]" in html


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
    with pytest.raises(ReportError, match=r"no block marked <!-- posenc-bench table: results/c -->.*"
                                                 r"it has table blocks for: results/a, results/b"):
        report.update_file(readme, "results/c", "x\n")
    with pytest.raises(ReportError, match=r"no block marked <!-- posenc-bench findings: results/a -->.*"
                                          r"it has no findings block"):
        report.update_file(readme, "results/a", "x\n", "findings")
    with pytest.raises(ReportError, match=r"unknown block kind 'figure'; valid: table, findings"):
        report.update_file(readme, "results/a", "x\n", "figure")
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temporary left behind


def test_report_cli_prints_writes_and_updates(tmp_path, capsys, monkeypatch):
    folder = write(tmp_path / "results" / "r1", results())
    monkeypatch.chdir(tmp_path)
    assert main(["report", "results/r1"]) == 0
    printed = capsys.readouterr().out
    assert printed == report.render(load_runs(["results/r1"]))
    assert main(["report", "results/r1/", "--out", "t.csv", "--value", "ppl,bpb"]) == 0
    assert (tmp_path / "t.csv").read_text() == report.render(load_runs([folder]), fmt="csv", values="ppl,bpb")
    (tmp_path / "README.md").write_text("# x\n<!-- posenc-bench table: results/r1 -->\n<!-- /posenc-bench table -->\n")
    assert main(["report", "./results/r1", "--update", "README.md"]) == 0
    assert report.read_block((tmp_path / "README.md").read_text(), "results/r1") == printed
    assert "updated: README.md (table block results/r1)" in capsys.readouterr().out
    (tmp_path / "README.md").write_text("<!-- posenc-bench findings: results/r1 -->\n<!-- /posenc-bench findings -->\n")
    assert main(["report", "results/r1", "--findings"]) == 0
    findings = capsys.readouterr().out
    assert findings == report.render_findings(load_runs(["results/r1"]))
    assert main(["report", "results/r1", "--findings", "--update", "README.md"]) == 0
    assert report.read_block((tmp_path / "README.md").read_text(), "results/r1", "findings") == findings


@pytest.mark.parametrize("args, message", [
    (["report", "nowhere"], "no results file at 'nowhere'"),
    (["report", "results/r1", "--value", "ppl,speed"], "unknown table value 'speed'; valid: ppl, bpb, ratio, accuracy, token_accuracy, longppl, key_share, training"),
    (["report", "results/r1", "--out", "t.xlsx"], "cannot tell the format of 't.xlsx'"),
    (["report", "results/r1", "--format", "csv", "--update", "README.md"], "--update writes Markdown; drop --format csv"),
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


TASKS = ["tasks/copy", "tasks/reverse", "tasks/needle", "tasks/addition", "tasks/addition-hints", "tasks/copy-full"]


ROBUSTNESS = ["robustness/bpe-4096", "robustness/large", "robustness/bpe-4096-large"]  # each setting's folder of results/robustness


COMMITTED_TABLES = sorted(str(p.parent.relative_to(ROOT / "results")) for p in (ROOT / "results").rglob("table.md")
                          if "in-progress" not in p.parts)  # every committed folder's, probes and timing runs too


@pytest.mark.parametrize("name", COMMITTED_TABLES)
def test_committed_table_md_is_what_report_builds(name):
    folder = ROOT / "results" / name
    assert (folder / "table.md").read_text() == report.render(load_runs([folder]))


SMOLLM2_COMPARE = "hf:SmolLM2-135M-Instruct.Q4_1+yarn"  # its README's table has the ratios to YaRN


@pytest.mark.parametrize("page,folder,values", [
    ("README.md", "sotu-512", "ppl,ratio"),
    ("docs/results.md", "default", report.DEFAULT_VALUES),
    ("docs/results.md", "sotu-512", report.DEFAULT_VALUES),
    ("docs/results.md", "full", "ppl,ratio"),
    ("results/sotu-512/README.md", "sotu-512", "ppl,ratio"),
    ("results/sotu-512-full/README.md", "sotu-512-full", "ppl,ratio"),
    ("results/smollm2/README.md", "smollm2", "ppl,ratio,cost"),
    *[("results/tasks/README.md", task, "accuracy,depths" if task == "tasks/needle" else "accuracy")
      for task in TASKS],
])
def test_readme_and_docs_tables_are_what_report_builds_from_the_committed_results(page, folder, values):
    key = f"results/{folder}"
    block = report.read_block((ROOT / page).read_text(), key)
    assert block is not None, f"{page} lost its <!-- posenc-bench table: {key} --> block"
    value_flag = "" if values == report.DEFAULT_VALUES else f" --value {values}"
    compare = SMOLLM2_COMPARE if folder == "smollm2" else None
    assert block == report.render(load_runs([ROOT / key]), values=values, compare=compare), (
        f"the table in {page} is stale: run `posenc-bench report {key}{value_flag} --update {page}`")


FINDINGS_PAGES = [(f"results/{name}/README.md", f"results/{name}")
                  for name in ("default", "full", "smollm2", "sotu-512", "sotu-512-full")]
FINDINGS_PAGES += [("results/tasks/README.md", f"results/{task}") for task in TASKS]


@pytest.mark.parametrize("page,key", FINDINGS_PAGES)
def test_committed_readmes_findings_blocks_are_what_report_finds(page, key):
    """Each results README holds its folder's findings as a generated block (the task track's README one per
    task), so its prose can be checked against it and a re-render shows any change."""
    block = report.read_block((ROOT / page).read_text(), key, "findings")
    assert block is not None, f"{page} lost its <!-- posenc-bench findings: {key} --> block"
    assert block == report.render_findings(load_runs([ROOT / key])), (
        f"the findings in {page} are stale: run `posenc-bench report {key} --findings --update {page}`")


def test_few_test_instances_are_named_as_instances(tmp_path, capsys):
    from tests.analysis.fake_results import arec, task_results

    correct = [1] * 15 + [0] * 5  # 20 instances a size: fewer than the 30 an interval should rest on
    folder = write(tmp_path / "run", task_results([arec(e, s, L, correct) for e in ("rope", "alibi")
                                                   for s in (0, 1) for L in (100, 200)]))
    assert main(["report", str(folder), "--value", "accuracy"]) == 0
    out = capsys.readouterr().out
    assert "2x (200): only 20 test instances; its intervals rest on few samples" in out
    assert "independent windows" not in out
    assert main(["report", str(folder), "--value", "training"]) == 0  # no loss by position: no context-use claim
    out = capsys.readouterr().out
    assert "Training (train loss, nats), each the mean over the row's seeds:" in out and "context use" not in out


def test_compare_on_a_task_run_is_the_paired_difference_of_exact_match(tmp_path, capsys):
    from tests.analysis.fake_results import arec, task_results

    rope, alibi = [1] * 30 + [0] * 10, [1] * 40  # alibi gets the 10 that rope misses, at every seed
    folder = write(tmp_path / "run", task_results([arec(e, s, L, c) for e, c in (("rope", rope), ("alibi", alibi))
                                                   for s in range(7) for L in (100, 200)], seeds=tuple(range(7))))
    assert main(["report", str(folder), "--value", "accuracy", "--compare", "rope"]) == 0
    out = capsys.readouterr().out
    assert "Exact match minus rope's at the same size (paired by instance and seed)" in out
    assert "Perplexity relative" not in out
    alibi_line = next(line for line in out.splitlines() if line.startswith("| alibi") and "0.250" in line)
    # 10 of 40 instances at both sizes on all 7 seeds: sign-flip p = 2 / 2^7 each, 0.031 after Holm over the two
    assert alibi_line.count("0.250") == 2 and alibi_line.count("*") == 2
    assert "family: every row against rope at every length, 2 comparisons; Holm at 5% (family-wise error): 2 hold" in out
    two = write(tmp_path / "two", task_results([arec(e, s, 100, c) for e, c in (("rope", rope), ("alibi", alibi))
                                                for s in (0, 1)]))
    assert main(["report", str(two), "--value", "accuracy", "--compare", "rope"]) == 0
    two_out = capsys.readouterr().out  # 2 seeds: the smallest p of the sign-flip test is 0.5, no finding possible
    assert "*" not in next(line for line in two_out.splitlines() if line.startswith("| alibi"))
    assert "1 could not be findings whatever their data" in two_out
    assert "Answer tokens right minus" not in out  # only what --value asked for
    assert main(["report", str(folder), "--value", "accuracy,token_accuracy", "--compare", "rope"]) == 0
    out = capsys.readouterr().out
    titles = [line for line in out.splitlines() if line.startswith(("Exact match", "Answer tokens right"))]
    assert [t.split(" (")[0].split(":")[0] for t in titles] == [
        "Exact match", "Exact match minus rope's at the same size", "Answer tokens right",
        "Answer tokens right minus rope's at the same size"]  # each comparison after the table it compares
    alibi_tokens = [line for line in out.splitlines() if line.startswith("| alibi") and "0.125" in line]
    assert len(alibi_tokens) == 1 and alibi_tokens[0].count("*") == 2  # 2 of 4 tokens on 10 of 40 instances: 0.125


def test_plateau_flag_and_few_windows_and_csv_columns(tmp_path, capsys):
    folder = write(tmp_path / "run", unit_results(n=20))
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| nope [1]" in out and "[1] uses only local context" in out  # 2.20 -> 2.19 nats is not 0.05 below
    assert "| rope " in out and "| rope [" not in out
    assert "2x (200): only 20 independent windows of 200 tokens" in out  # 20 units of 200 targets
    two = unit_results(n=2)
    two["records"] += [dict(r, eval_len=400, ratio=4.0) for r in two["records"] if r["eval_len"] == 200]
    assert main(["report", str(write(tmp_path / "two", two))]) == 0
    assert "4x (400): only 1 independent window of 400 tokens; its intervals" in capsys.readouterr().out
    assert main(["report", str(folder), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    rope = next(r for r in rows if r["encoding"] == "rope" and r["value"] == "ppl" and r["eval_len"] == "200")
    assert float(rope["lo"]) < float(rope["mean"]) < float(rope["hi"])
    assert {r["plateau"] for r in rows if r["encoding"] == "nope"} == {"True"}
    assert main(["report", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"][0]["intervals"].startswith("intervals: 95%; one seed: the text resampled over 20 units of 200")


def test_old_results_without_units_report_and_say_so_once():
    text = report.render([Run("", "", results())])
    assert text.count("Intervals: not available (these results predate per-unit numbers; rerun to get them).") == 1
    assert "[" not in text.split("\n\n", 1)[1].replace("[1]", "").replace("[2]", "")  # no interval in any cell


def test_a_results_folder_gets_the_report_as_table_md_and_its_records_as_csv(tmp_path):
    data = results()
    report.write_tables(tmp_path, data)
    assert (tmp_path / "table.md").read_text() == report.results_markdown(data) == report.render([Run("", "", data)])
    rows = list(csv.DictReader(io.StringIO((tmp_path / "results.csv").read_text())))
    assert [(r["encoding"], r["seed"], r["eval_len"], r["status"], r["ppl"]) for r in rows[:2]] == [
        ("rope", "0", "100", "ok", "4.0"), ("rope", "1", "100", "ok", "6.0")]
    assert len(rows) == len(data["records"]) and rows[5]["reason"] == "table has 100 rows"


ROBUSTNESS_BLOCK = ["results/sotu-512", *[f"results/{name}" for name in ROBUSTNESS]]  # the headline, then each setting


def _robustness_readme() -> tuple[str, str | None]:
    """results/robustness/README.md's text and its generated block (None when the block is gone)."""
    text = (ROOT / "results/robustness/README.md").read_text()
    return text, report.read_block(text, report.marker_key(ROBUSTNESS_BLOCK), "robustness")


def test_robustness_readmes_block_is_what_report_builds(monkeypatch):
    """results/robustness/README.md holds `report --robustness` over the four settings as a generated block, so its
    headline paragraph can be checked against it and a rerun shows any change."""
    monkeypatch.chdir(ROOT)  # the block names its folders as given on the command line: relative to the repository
    key = report.marker_key(ROBUSTNESS_BLOCK)
    _, block = _robustness_readme()
    assert block is not None, f"results/robustness/README.md lost its <!-- posenc-bench robustness: {key} --> block"
    assert block == report.render_robustness(load_runs(ROBUSTNESS_BLOCK), load_runs(["results/sotu-512"])[0]), (
        f"the robustness block is stale: run `posenc-bench report {key} --robustness --claims results/sotu-512 "
        "--update results/robustness/README.md`")


def test_robustness_readmes_headline_counts_are_the_blocks():
    """The headline paragraph's three counts (held everywhere, same way at every seed, not held) are the
    generated block's: a rerun that moves a claim makes the prose stale, and this says so."""
    text, block = _robustness_readme()
    held, total, same = map(int, re.search(r"(\d+) of (\d+) claims hold in every setting; (\d+) more point", block).groups())
    prose = text.split("## What it shows", 1)[1].split("## Every finding", 1)[0]
    assert f"**Held in every setting ({held} of {total})**" in prose
    assert f"not shown at the seed level in each ({same})**" in prose
    assert f"**Not held ({total - held - same})**" in prose
