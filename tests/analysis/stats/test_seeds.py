"""The one home of numbers over seeds: mean and std, each seed's ratio to 1x, a cell's status; the report's
tables and the gate read the same numbers from it."""

import math

import pytest

from tests.analysis.fake_results import RECORDS, rec, results
from posenc_bench.analysis.stats.seeds import RATIO, mean_std, over_seeds, ratios_to_1x, with_ratio_to_1x


def test_mean_and_sample_std_with_one_and_several_seeds():
    assert mean_std([4.0]) == (4.0, None)  # one seed: no spread to estimate, not 0
    assert mean_std([4.0, 6.0]) == (5.0, math.sqrt(2))  # ddof 1: (1 + 1) / (2 - 1)
    m, s = mean_std([1.0, 2.0, 6.0])
    assert m == 3.0 and s == pytest.approx(math.sqrt((4 + 1 + 9) / 2))
    assert mean_std([2.5, 2.5, 2.5]) == (2.5, 0.0)


def test_ratio_to_1x_divides_by_the_same_row_and_seed():
    # rope seed 0: 8 / 4; seed 1: 9 / 6; learned's 2x is n/a; bad never has a 1x
    assert ratios_to_1x(RECORDS) == [1.0, 1.0, 2.0, 1.5, 1.0, None, None, None]
    other_row = [rec("a", 0, 100, 2.0), rec("b", 0, 200, 8.0)]  # b has no 1x of its own: never a's
    assert ratios_to_1x(other_row) == [1.0, None]


def test_ratio_to_1x_is_none_without_an_ok_1x_for_that_seed():
    recs = [rec("rope", 0, 100, 4.0), rec("rope", 1, 100, None, "diverged", "nan"),
            rec("rope", 0, 200, 8.0), rec("rope", 1, 200, 9.0), rec("rope", 2, 200, 7.0)]
    assert ratios_to_1x(recs) == [1.0, None, 2.0, None, None]


def test_with_ratio_to_1x_adds_the_key_to_copies():
    recs = [rec("rope", 0, 100, 4.0), rec("rope", 0, 200, 10.0)]
    out = with_ratio_to_1x(recs)
    assert [r[RATIO] for r in out] == [1.0, 2.5] and all(RATIO not in r for r in recs)
    assert {k: v for k, v in out[1].items() if k != RATIO} == recs[1]


def test_over_seeds_status_values_and_reason():
    ok = over_seeds(RECORDS[:2], "ppl")
    assert (ok.status, ok.values, ok.seeds, ok.reason) == ("ok", [4.0, 6.0], 2, "")
    some = over_seeds([rec("r", 0, 100, 4.0), rec("r", 1, 100, None, "diverged", "diverged at step 9")], "ppl")
    assert (some.status, some.values, some.seeds, some.reason) == ("ok", [4.0], 2, "diverged at step 9")
    assert over_seeds(RECORDS[5:6], "ppl").status == "n/a" and over_seeds(RECORDS[6:7], "ppl").status == "diverged"
    assert over_seeds([rec("r", 0, 100, None, "diverged")], "ppl").reason == "diverged"  # no reason: its status
    # an ok record without this value (bpb not measured) has no number, and is not a failure either
    none = over_seeds([rec("r", 0, 100, 4.0)], "bpb")
    assert (none.status, none.values, none.reason) == ("n/a", [], "")


def test_the_table_and_the_gate_read_the_same_numbers():
    from posenc_bench.analysis import gate
    from posenc_bench.analysis.tables import build_table
    from posenc_bench.analysis.runs import Run

    data = results()
    table = build_table([Run("", "", data)], "ratio", mark_best=False)
    cells = gate._cells(data)["rope", 200]
    ppl, ratio = cells["ppl"], cells["ratio"]
    assert table.cells["rope", 1].mean == mean_std(ratio.values)[0] == 1.75
    assert table.cells["rope", 1].std == mean_std(ratio.values)[1] == pytest.approx(math.sqrt(0.125))
    assert ppl.values == [8.0, 9.0] and gate._cells(data)["learned", 200]["ppl"].reason == "table has 100 rows"
