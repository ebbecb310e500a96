"""The context tables: train loss along the run and context use at 1x (the plateau flag reads the same mean
over seeds), and the cost of each evaluation where it was measured."""

import pandas as pd
from pytest import approx

from tests.analysis.fake_results import rec, results
from posenc_bench.analysis.context import (CONTEXT_TITLES, context_positions, context_title, context_use, cost_table,
                                           late_spread, on_plateau, plateau_note, plateau_rows, training_table)
from posenc_bench.analysis.report import render
from posenc_bench.analysis.runs import Run


def positions(r, early, late):
    r["loss_by_position"] = [{"start": 0, "end": 8, "loss": early, "tokens": 5},
                             {"start": 50, "end": 100, "loss": late, "tokens": 5}]
    return r


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
    assert context_use([r], "rope") == (2.0, 1.25) and context_positions([r], "rope") == ("0-9", "50-99")


def test_late_spread_is_the_scatter_of_neighbouring_second_half_buckets_mean_over_seeds():
    recs = []
    for seed, losses in enumerate([(2.0, 1.5, 1.2, 1.4), (2.0, 9.0, 1.0, 1.0)]):  # second halves: 0.1414, then 0
        r = rec("rope", seed, 100, 4.0)
        r["loss_by_position"] = [{"start": 25 * i, "end": 25 * (i + 1), "loss": x, "tokens": 5}
                                 for i, x in enumerate(losses)]
        recs.append(r)
    assert late_spread(recs[:1], "rope") == approx(0.1414, abs=1e-4)  # buckets 50-74 and 75-99 only
    assert late_spread(recs, "rope") == approx(0.0707, abs=1e-4)  # bucket 25-49's 9.0 is in the first half
    assert late_spread(recs, "alibi") is None
    trend = rec("nope", 0, 100, 4.0)  # rising by 0.1 a bucket: sd 0.129, neighbours' scatter 0.0707
    trend["loss_by_position"] = [{"start": 20 * i, "end": 20 * (i + 1), "loss": x, "tokens": 5}
                                 for i, x in enumerate((2.0, 1.9, 1.0, 1.1, 1.2))]
    trend["loss_by_position"][2]["start"] = 50  # buckets from 50 on: 1.0, 1.1, 1.2 -> half of 0.01, rooted
    assert late_spread([trend], "nope") == approx(0.0707, abs=1e-4)


def test_training_table_is_the_mean_over_seeds_that_the_plateau_flag_reads():
    recs = []
    for seed, (curve_end, early, late) in enumerate([(2.0, 2.00, 1.97), (1.0, 2.20, 2.11)]):
        r = positions(rec("learned", seed, 100, 4.0), early, late)
        r["train_curve"] = [[20, 3.0], [40, curve_end]]
        recs.append(r)
    t = training_table(recs)
    assert t.loc["learned", "train loss @ step 40"] == "1.500"
    assert t.loc["learned", "1x loss, positions 0-7"] == "2.100"  # seed 0 alone: 2.000
    assert t.loc["learned", "1x loss, positions 50-99"] == "2.040"
    # the mean gains 0.06 nats, but seed 0 alone gains 0.03: the flag is per seed, so seed 0 is flagged
    assert on_plateau(recs, "learned") and on_plateau(recs[:1], "learned") and not on_plateau(recs[1:], "learned")
    flagged = render([Run("", "", results(["learned"], recs[:1]))], values=["ppl"])
    assert "| learned [1] |" in flagged and (
        "[1] uses only local context on its one seed: at 1x its loss over positions 50-99 is not 0.05 nats below its "
        "loss over positions 0-7, so on it its extrapolation numbers say little about the encoding") in flagged
    assert "[1] uses only local context on seed 0 of 2:" in render([Run("", "", results(["learned"], recs))],
                                                                     values=["ppl"])
    assert "[1]" not in render([Run("", "", results(["learned"], recs[1:]))], values=["ppl"])


def test_plateau_rows_and_their_note():
    recs = [positions(rec("nope", 0, 100, 9.0), 2.2, 2.19), positions(rec("rope", 0, 100, 4.0), 2.0, 1.6),
            rec("alibi", 0, 100, 5.0)]  # alibi: no loss by position, nothing to judge by
    assert plateau_rows(recs) == ["nope"]
    assert plateau_note(recs, "rope") is None and plateau_note(recs, "alibi") is None
    assert plateau_note(recs, "nope").startswith("uses only local context on its one seed: at 1x its loss over "
                                                 "positions 50-99")
    assert training_table([rec("bad", 0, 100, None, "diverged")]).loc["bad", "status"] == "diverged (seed 0)"


def test_a_seed_that_diverged_early_neither_sets_the_steps_shown_nor_hides_behind_the_others_status():
    """The steps shown are the longest curve's (the first seed's may have stopped early); the status names each
    seed that did not train."""
    first = rec("fire", 0, 100, None, "diverged")
    first["train_curve"] = [[10, 3.0], [20, 9.0]]
    recs = [first] + [rec("fire", s, 100, 4.0) for s in (1, 2)]
    for r in recs[1:]:
        r["train_curve"] = [[10, 3.0], [20, 2.0], [30, 1.5], [40, 1.0]]
    t = training_table(recs)
    assert list(t.columns) == ["train loss @ step 10", "train loss @ step 20", "train loss @ step 40", "status"]
    assert t.loc["fire", "train loss @ step 40"] == "1.000" and t.loc["fire", "train loss @ step 20"] == "4.333"
    assert t.loc["fire", "status"] == "diverged (seed 0)"


def test_cost_table_shows_time_and_peak_memory_only_where_measured():
    from posenc_bench.analysis.report import DEFAULT_VALUES
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


def test_task_rows_that_did_not_learn_are_flagged_and_the_needle_has_its_depth_table():
    from posenc_bench.analysis.context import depth_table, unlearned, unlearned_rows
    from tests.analysis.fake_results import arec

    good = [1] * 19 + [0]  # 95%
    recs = [arec("rope", 0, 100, good, by_depth={"0": 1.0, "1": 0.9}),
            arec("rope", 0, 200, [1] * 10 + [0] * 10, by_depth={"0": 1.0, "1": 0.0}),
            arec("nope", 0, 100, [1] * 10 + [0] * 10, by_depth={"0": 0.5, "1": 0.5}),
            arec("nope", 0, 200, [0] * 20, by_depth={"0": 0.0, "1": 0.0})]
    assert not unlearned(recs, "rope") and unlearned(recs, "nope") and unlearned_rows(recs) == ["nope"]
    assert "did not learn the task" in plateau_note(recs, "nope") and plateau_note(recs, "rope") is None
    table = depth_table(recs, ["rope", "nope"])
    assert list(table.columns) == ["depth", "100", "200", "effective size"]
    assert table["effective size"].tolist() == ["100", "", "none", ""]  # rope: every depth >= 90% at 100, not at 200
    assert table.loc["rope"]["200"].tolist() == ["1.00", "0.00"]
    assert depth_table([rec("rope", 0, 100, 3.0)]).empty


def test_the_training_tables_title_says_only_what_its_columns_show():
    both = pd.DataFrame({"train loss @ step 100": ["2.1"], "1x loss, positions 0-7": ["3.0"]})
    trained_only = pd.DataFrame({"train loss @ step 100": ["2.1"]})
    pretrained = pd.DataFrame({"1x loss, positions 0-7": ["3.0"], "1x loss, positions 64-127": ["2.0"]})
    assert context_title("training", both) == CONTEXT_TITLES["training"]
    assert context_title("training", trained_only) == "Training (train loss, nats), each the mean over the row's seeds"
    assert context_title("training", pretrained, split="all") == (
        "Context use at 1x (eval loss early vs late in the window, nats), each the mean over the row's seeds")
    assert "Training" not in context_title("training", pretrained)
