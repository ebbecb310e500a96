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


def test_training_table_is_the_mean_over_seeds_that_the_plateau_flag_reads():
    recs = []
    for seed, (curve_end, early, late) in enumerate([(2.0, 2.00, 1.97), (1.0, 2.20, 2.11)]):
        r = rec("learned", seed, 100, 4.0)
        r["train_curve"] = [[20, 3.0], [40, curve_end]]
        r["loss_by_position"] = [{"start": 0, "end": 8, "loss": early, "tokens": 5},
                                 {"start": 50, "end": 100, "loss": late, "tokens": 5}]
        recs.append(r)
    t = training_table(recs)
    assert t.loc["learned", "train loss @ step 40"] == "1.500"
    assert t.loc["learned", "1x loss, positions 0-7"] == "2.100"  # seed 0 alone: 2.000
    assert t.loc["learned", "1x loss, positions 50-99"] == "2.040"
    # the mean gains 0.06 nats: not flagged, though seed 0 alone (0.03) would be
    assert not report.on_plateau(recs, "learned") and report.on_plateau(recs[:1], "learned")
    flagged = report.render([report.Run("", "", results(["learned"], recs[:1]))], values=["ppl"])
    assert "| learned [1] |" in flagged and (
        "[1] uses only local context: at 1x its loss over positions 50-99 is not 0.05 nats below its loss over "
        "positions 0-7, so its extrapolation numbers say little about the encoding") in flagged
    assert "[1]" not in report.render([report.Run("", "", results(["learned"], recs))], values=["ppl"])


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


@pytest.mark.parametrize("name", ["default", "full", "sotu-512", "sotu-512-full"])
def test_committed_table_md_is_what_report_builds(name):
    folder = ROOT / "results" / name
    assert (folder / "table.md").read_text() == report.render(report.load_runs([folder]))


@pytest.mark.parametrize("page,folder,values", [
    ("README.md", "default", "ppl"),
    ("README.md", "sotu-512", "ppl,ratio"),
    ("docs/results.md", "default", report.DEFAULT_VALUES),
    ("docs/results.md", "sotu-512", report.DEFAULT_VALUES),
    ("docs/results.md", "full", "ppl,ratio"),
    ("results/sotu-512/README.md", "sotu-512", "ppl,ratio"),
    ("results/sotu-512-full/README.md", "sotu-512-full", "ppl,ratio"),
])
def test_readme_and_docs_tables_are_what_report_builds_from_the_committed_results(page, folder, values):
    key = f"results/{folder}"
    block = report.read_block((ROOT / page).read_text(), key)
    assert block is not None, f"{page} lost its <!-- posenc-bench table: {key} --> block"
    value_flag = "" if values == report.DEFAULT_VALUES else f" --value {values}"
    assert block == report.render(report.load_runs([ROOT / key]), values=values), (
        f"the table in {page} is stale: run `posenc-bench report {key}{value_flag} --update {page}`")


def test_caption_names_every_commit_when_rows_were_added_later():
    recs = [dict(r, git_commit="a" * 40) for r in RECORDS[:4]] + [dict(r, git_commit="b" * 40 + "-dirty") for r in RECORDS[4:6]]
    text = report.caption(run_meta(["rope", "learned"]), recs)
    assert text.endswith(f"commits {'a' * 12} (rope); {'b' * 12}-dirty (learned).")
    assert report.caption(run_meta(["rope"]), RECORDS[:4]).endswith("commit 0123456789ab.")  # records without commits


# ------------------------------------------------------------------ intervals in the tables


def urec(enc, seed, L, unit_nll, key=None, tokens=50, by_pos=None):
    """A record with per-unit numbers (as bench/evaluate writes them) and the ppl they give."""
    import math

    r = rec(enc, seed, L, math.exp(sum(unit_nll) / (tokens * len(unit_nll))))
    r.update(cell_key=key or f"{enc}-{seed}", bpb=None,
             units={"size": 200, "nll": list(unit_nll), "tokens": [tokens] * len(unit_nll),
                    "bytes": [tokens] * len(unit_nll)})
    if by_pos is not None:
        r["loss_by_position"] = [{"start": 0, "end": 8, "loss": by_pos[0], "tokens": 5},
                                 {"start": 50, "end": 100, "loss": by_pos[1], "tokens": 5}]
    return r


def unit_results(seeds=(0,), n=40):
    """rope and rope-ntk evaluate the same model (one cell key); alibi is another model; nope does not use context."""
    import numpy as np

    rng = np.random.default_rng(0)
    text = rng.gamma(50, 1.5, size=n)  # unit NLL sums: 50 targets each, mean NLL 1.5
    recs = []
    for s in seeds:
        shift = 0.0 if len(seeds) == 1 else 1.0 * (s - 1)
        recs += [urec("rope", s, 100, text + shift, key=f"m{s}", by_pos=(2.0, 1.6)),
                 urec("rope", s, 200, text * 1.3 + shift, key=f"m{s}"),
                 urec("rope-ntk", s, 100, text + shift, key=f"m{s}"),
                 urec("rope-ntk", s, 200, text * 1.1 + shift, key=f"m{s}"),
                 urec("alibi", s, 100, text * 1.001 - shift, by_pos=(2.0, 1.7)),  # another model: its own seed luck
                 urec("alibi", s, 200, text * 1.0005 - shift),
                 urec("nope", s, 100, text * 1.5 + shift, by_pos=(2.2, 2.19)),
                 urec("nope", s, 200, text * 1.6 + shift)]
    return {"schema_version": 1, "run": run_meta(["rope", "rope-ntk", "alibi", "nope"], seeds=seeds), "records": recs}


def test_cells_carry_intervals_and_bold_needs_significance():
    run = report.Run("", "", unit_results())
    iv = report.run_intervals([run])
    t = report.build_table([run], "ppl", intervals=iv)
    rope = t.cells["rope", 1]
    assert rope.lo < rope.mean < rope.hi
    assert report.cell_text(rope, 2) == f"{rope.mean:.2f} [{rope.lo:.2f}, {rope.hi:.2f}]"
    # 1x: rope and rope-ntk are the same model and the same numbers: tied, so the best is not bold; alibi is
    # another model with one seed: text-only, neither tied nor significant
    assert not t.cells["rope", 0].best and t.cells["rope-ntk", 0].tied
    assert t.cells["alibi", 0].significant is None and not t.cells["alibi", 0].tied
    assert report.cell_text(t.cells["rope-ntk", 0], 2).startswith("≈")
    # 2x: alibi is best, but rope-ntk and rope are other models compared on one seed: no claim, no bold
    assert not t.cells["alibi", 1].best and t.cells["rope-ntk", 1].significant is None
    # the ratio to 1x of one row is paired across lengths: 1.00 at 1x by definition, shown without interval
    ratio = report.build_table([run], "ratio", intervals=iv)
    assert report.cell_text(ratio.cells["rope", 0], 2) == "1.00"
    # the same units at both lengths: alibi's 0.05% drop (x1.0005 against x1.001 of every unit) is resolved
    assert ratio.cells["rope", 1].lo > 1 and ratio.cells["alibi", 1].hi < 1


def test_three_seeds_allow_significance_between_models():
    run = report.Run("", "", unit_results(seeds=(0, 1, 2)))
    t = report.build_table([run], "ppl", intervals=report.run_intervals([run]))
    # 2x: alibi (x1.0005) is far below rope-ntk (x1.1), rope (x1.3) and nope (x1.6) on every unit and seed
    assert t.cells["alibi", 1].best and t.cells["alibi", 1].significant
    assert all(t.cells[r, 1].significant for r in ("rope", "rope-ntk", "nope"))
    # 1x: alibi (x1.001) against rope (x1): the seeds' spread dwarfs it: tied
    assert t.cells["alibi", 0].tied and not t.cells["rope", 0].best


def test_compare_table_and_its_marks(tmp_path, capsys):
    folder = write(tmp_path / "run", unit_results())
    assert main(["report", str(folder), "--compare", "rope", "--value", "ppl"]) == 0
    out = capsys.readouterr().out
    assert "Perplexity relative to rope at the same length (paired); *: the interval excludes 1" in out
    lines = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert " 1.000 |" in lines["rope"] and " 1.000 |" in lines["rope-ntk"]
    ntk = report.compare_table([report.Run("", "", unit_results())], "rope",
                               report.run_intervals([report.Run("", "", unit_results())]))
    c = ntk.cells["rope-ntk", 1]  # the same model: a paired comparison with one seed, 1.1 / 1.3 of the NLL
    assert c.significant is True and c.hi < 1 and c.note == "*"
    assert lines["rope-ntk"].rstrip(" |").endswith("] *")  # the mark the title promises, printed
    assert ntk.cells["alibi", 1].note == "†" and ntk.cells["alibi", 1].significant is None
    assert "† text-only interval" in out
    assert main(["report", str(folder), "--compare", "t5"]) == 2
    assert "--compare 't5': no such row in the results; rows: rope, rope-ntk, alibi, nope" in capsys.readouterr().err
    assert main(["report", str(folder), "--ci", "95"]) == 2
    assert "--ci 95: the level must be between 0 and 1" in capsys.readouterr().err


def test_plateau_flag_and_few_windows_and_csv_columns(tmp_path, capsys):
    folder = write(tmp_path / "run", unit_results(n=20))
    assert main(["report", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "| nope [1]" in out and "[1] uses only local context" in out  # 2.20 -> 2.19 nats is not 0.05 below
    assert "| rope " in out and "| rope [" not in out
    assert "2x (200): only 20 independent windows of 200 tokens" in out  # 20 units of 200 targets
    assert main(["report", str(folder), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    rope = next(r for r in rows if r["encoding"] == "rope" and r["value"] == "ppl" and r["eval_len"] == "200")
    assert float(rope["lo"]) < float(rope["mean"]) < float(rope["hi"])
    assert {r["plateau"] for r in rows if r["encoding"] == "nope"} == {"True"}
    assert main(["report", str(folder), "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["runs"][0]["intervals"].startswith("intervals: 95%, paired bootstrap over 20 units of 200 targets")


def test_old_results_without_units_report_and_say_so_once():
    text = report.render([report.Run("", "", results())])
    assert text.count("Intervals: not available (these results predate per-unit numbers; rerun to get them).") == 1
    assert "[" not in text.split("\n\n", 1)[1].replace("[1]", "").replace("[2]", "")  # no interval in any cell


def test_cost_table_shows_time_and_peak_memory_only_where_measured():
    from posenc_bench.analysis.report import DEFAULT_VALUES, cost_table
    from posenc_bench.commands.cli import build_parser

    base = {"seed": 0, "train_len": 8, "status": "ok", "eval_time_s": 12.4}
    recs = [{**base, "encoding": "m", "eval_len": 8, "peak_memory_bytes": 3 << 29},
            {**base, "encoding": "m", "eval_len": 16, "peak_memory_bytes": 1 << 31, "eval_time_s": 40.0},
            {**base, "encoding": "m+x", "eval_len": 8, "same_as": "m"},
            {**base, "encoding": "m+x", "eval_len": 16, "status": "n/a"}]
    table = cost_table(recs)
    assert table.loc["m", "8"] == "12 s, 1.50 GiB" and table.loc["m", "16"] == "40 s, 2.00 GiB"
    assert table.loc["m+x", "8"] == "= base" and table.loc["m+x", "16"] == "n/a"
    assert cost_table([{k: v for k, v in r.items() if k != "peak_memory_bytes"} for r in recs]).empty
    assert build_parser().parse_args(["report", "x"]).value == ",".join(DEFAULT_VALUES)
