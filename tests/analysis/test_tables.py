"""The table model: cells over seeds with their footnotes, the best of each column and its ties, intervals,
several runs side by side, and the comparison with a reference row."""

import math

import pytest

from tests.analysis.fake_results import RECORDS, rec, results, unit_results, write
from posenc_bench.analysis.report import cell_text
from posenc_bench.analysis.tables import annotate, build_table, compare_table
from posenc_bench.analysis.runs import ReportError, Run, is_pretrained, load_runs, run_intervals
from posenc_bench.commands.cli import main


def test_cells_hold_mean_std_seeds_and_footnotes_shared_between_tables():
    notes = {}
    t = build_table([Run("", "", results())], "ppl", mark_best=False, notes=notes)
    assert [c.header() for c in t.columns] == ["1x (100)", "2x (200)"] and t.rows == ["rope", "learned", "bad"]
    rope = t.cells["rope", 0]
    assert (rope.status, rope.mean, rope.std, rope.seeds_ok, rope.seeds) == ("ok", 5.0, math.sqrt(2), 2, 2)
    assert t.cells["rope", 1].mean == 8.5 and t.cells["rope", 1].std == pytest.approx(math.sqrt(0.5))
    assert t.cells["learned", 0].std is None  # one seed
    learned, bad = t.cells["learned", 1], t.cells["bad", 0]
    assert (learned.status, learned.reason, learned.note) == ("n/a", "table has 100 rows", "[1]")
    assert (bad.status, bad.note) == ("diverged", "[2]")
    assert notes == {"table has 100 rows": "[1]", "diverged at step 3": "[2]"}
    bpb = build_table([Run("", "", results())], "bpb", notes=notes)
    assert bpb.cells["bad", 1].note == "[2]" and bpb.cells["rope", 0].mean == pytest.approx(0.5)  # same numbering


def test_relative_table_divides_by_the_same_seed_at_1x():
    t = build_table([Run("", "", results())], "ratio")
    # seed 0: 8/4 = 2.0, seed 1: 9/6 = 1.5 -> mean 1.75, std 0.35
    assert t.cells["rope", 1].mean == 1.75 and t.cells["rope", 1].std == pytest.approx(math.sqrt(0.125))
    assert (t.cells["rope", 0].mean, t.cells["rope", 0].std) == (1.0, 0.0)
    assert t.cells["learned", 1].status == "n/a" and t.cells["bad", 0].status == "diverged"
    with pytest.raises(ReportError, match="unknown table value 'training'; valid: ppl, bpb, ratio"):
        build_table([Run("", "", results())], "training")


def test_best_in_each_column_is_marked_and_ties_all_count():
    recs = [rec("a", 0, 100, 4.001), rec("b", 0, 100, 3.999), rec("c", 0, 100, 5.0),
            rec("a", 0, 200, 6.0), rec("b", 0, 200, 7.0), rec("c", 0, 200, None, "n/a", "why")]
    run = Run("", "", {"run": {"rows": ["a", "b", "c"]}, "records": recs})
    t = build_table([run], "ppl")
    best = {(row, j) for (row, j), c in t.cells.items() if c.best}
    assert best == {("a", 0), ("b", 0), ("a", 1)}  # 4.00 and 4.00 tie at two decimals
    assert cell_text(t.cells["a", 0], 2, "md") == "**4.00**"
    assert cell_text(t.cells["c", 1], 2, "md") == "n/a [1]"
    ratio = build_table([run], "ratio")
    assert not any(ratio.cells[row, 0].best for row in "abc")  # 1x is 1.00 by definition: no mark
    assert ratio.cells["a", 1].best and ratio.cells["a", 1].mean == pytest.approx(6.0 / 4.001)


def test_several_runs_side_by_side(tmp_path):
    from posenc_bench.analysis.report import render

    a = write(tmp_path / "T100", results(rows=["rope", "learned"]))
    other = [dict(r, train_len=200, eval_len=r["eval_len"] * 2) for r in RECORDS if r["encoding"] in ("rope", "bad")]
    b = write(tmp_path / "T200", results(rows=["rope", "bad"], records=other, train_len=200))
    runs = load_runs([a, b])
    t = build_table(runs, "ppl")
    assert [c.header() for c in t.columns] == ["T100: 1x (100)", "T100: 2x (200)", "T200: 1x (200)", "T200: 2x (400)"]
    assert t.rows == ["rope", "learned", "bad"]
    assert t.cells["learned", 2].status == "missing" and cell_text(t.cells["learned", 2], 2) == ""
    assert t.cells["rope", 3].mean == 8.5
    text = render(runs, values="ppl")
    assert text.startswith("T100: Byte-level LM") and "\nT200: Byte-level LM" in text
    with pytest.raises(ReportError, match="give at least one results folder"):
        load_runs([])


# ------------------------------------------------------------------ intervals in the tables


def test_cells_carry_intervals_and_bold_needs_significance():
    run = Run("", "", unit_results())
    iv = run_intervals([run])
    t = build_table([run], "ppl", intervals=iv)
    rope = t.cells["rope", 1]
    assert rope.lo < rope.mean < rope.hi
    assert cell_text(rope, 2) == f"{rope.mean:.2f} [{rope.lo:.2f}, {rope.hi:.2f}]"
    # 1x: rope and rope-ntk are the same model and the same numbers: tied, so the best is not bold; alibi is
    # another model with one seed: a comparison about this checkpoint, which the table states once
    assert not t.cells["rope", 0].best and t.cells["rope-ntk", 0].tied
    assert t.cells["alibi", 0].significant is True and not t.cells["alibi", 0].tied
    assert cell_text(t.cells["rope-ntk", 0], 2).startswith("≈")
    # 2x: alibi is best and better than every other row on this checkpoint: bold, and the note says so once
    assert t.cells["alibi", 1].best and t.cells["rope-ntk", 1].significant is True
    annotate(t, [run], iv, {})
    assert not any(c.checkpoint for c in t.cells.values())  # one seed: no per-cell mark, one note
    assert any(n.startswith("One seed: every interval and mark in this table is about this checkpoint") for n in t.notes)
    # the ratio to 1x of one row is paired across lengths: 1.00 at 1x by definition, shown without interval
    ratio = build_table([run], "ratio", intervals=iv)
    assert cell_text(ratio.cells["rope", 0], 2) == "1.00"
    # the same units at both lengths: alibi's 0.05% drop (x1.0005 against x1.001 of every unit) is resolved
    assert ratio.cells["rope", 1].lo > 1 and ratio.cells["alibi", 1].hi < 1


def test_three_seeds_allow_significance_between_models():
    run = Run("", "", unit_results(seeds=(0, 1, 2)))
    t = build_table([run], "ppl", intervals=run_intervals([run]))
    # 2x: alibi (x1.0005) is far below rope-ntk (x1.1), rope (x1.3) and nope (x1.6) on every unit and seed
    assert t.cells["alibi", 1].best and t.cells["alibi", 1].significant
    assert all(t.cells[r, 1].significant for r in ("rope", "rope-ntk", "nope"))
    # 1x: alibi (x1.001) against rope (x1): the seeds' spread dwarfs it: tied
    assert t.cells["alibi", 0].tied and not t.cells["rope", 0].best


def test_a_one_seed_row_in_a_three_seed_folder_is_marked_this_checkpoint():
    data = unit_results(seeds=(0, 1, 2))
    data["records"] = [r for r in data["records"] if r["encoding"] != "nope" or r["seed"] == 0]
    runs = [Run("", "", data)]
    iv = run_intervals(runs)
    t = build_table(runs, "ppl", intervals=iv)
    annotate(t, runs, iv, {})
    best = t.cells["alibi", 1]  # better than rope and rope-ntk over 3 seeds, than nope on seed 0 only
    assert best.best and best.checkpoint and cell_text(best, 2).endswith("]**†")
    assert not t.cells["rope", 1].checkpoint and t.notes[-1].startswith("† this checkpoint: fewer than 2 seeds")
    c = compare_table(runs, "alibi", iv)
    assert c.cells["nope", 1].checkpoint and not c.cells["rope", 1].checkpoint


def test_compare_table_and_its_marks(tmp_path, capsys):
    folder = write(tmp_path / "run", unit_results())
    assert main(["report", str(folder), "--compare", "rope", "--value", "ppl"]) == 0
    out = capsys.readouterr().out
    assert "Perplexity relative to rope at the same length (paired; the geometric mean over seeds); *: a finding after" in out
    lines = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith("| ")}
    assert " 1.000 |" in lines["rope"] and " 1.000 |" in lines["rope-ntk"]
    runs = [Run("", "", unit_results())]
    ntk = compare_table(runs, "rope", run_intervals(runs))
    c = ntk.cells["rope-ntk", 1]  # the same model: a paired comparison with one seed, 1.1 / 1.3 of the NLL
    assert c.significant is True and c.hi < 1 and c.note == "*"
    assert lines["rope-ntk"].rstrip(" |").endswith("] *")  # the mark the title promises, printed
    assert ntk.cells["alibi", 1].note == "*" and ntk.cells["alibi", 1].checkpoint  # another model, one seed
    assert "One seed: every interval and mark in this table is about this checkpoint" in out
    hf = unit_results()
    hf["run"] = {**hf["run"], "kind": "eval", "model": {"kind": "hf"}}  # a pretrained model's zero-shot rows
    assert is_pretrained(Run("", "", hf)) and not is_pretrained(runs[0])
    hf_runs = [Run("", "", hf)]
    table = compare_table(hf_runs, "rope", run_intervals(hf_runs))
    annotate(table, hf_runs, run_intervals(hf_runs), {})
    notes = table.notes
    assert not any(n.startswith("One seed") for n in notes)
    assert "One pretrained model: every interval and mark in this table is about this checkpoint on this text" in notes[-1]
    assert main(["report", str(folder), "--compare", "t5"]) == 2
    assert "--compare 't5': no such row in the results; rows: rope, rope-ntk, alibi, nope" in capsys.readouterr().err
    assert main(["report", str(folder), "--ci", "95"]) == 2
    assert "--ci 95: the level must be between 0 and 1" in capsys.readouterr().err
