"""Task exact match and the answer-token share: shares of instances (tokens), compared as differences."""

import numpy as np
import pytest

from posenc_bench import metrics
from posenc_bench.analysis.stats.intervals import Intervals
from tests.analysis.fake_results import arec, task_results


def test_exact_match_and_token_share_by_hand():
    acc, tok = metrics.get("accuracy"), metrics.get("token_accuracy")
    sums = {"correct": np.array([3.0]), "count": np.array([4.0]), "right": np.array([14.0]), "tokens": np.array([16.0])}
    assert acc.formula(sums)[0] == 0.75 and tok.formula(sums)[0] == 14 / 16
    units = {"size": 1, "correct": [1, 0, 1, 1], "right": [4, 2, 4, 4], "tokens": [4, 4, 4, 4]}
    assert acc.of_units(units) == 0.75 and tok.of_units(units) == 14 / 16


def test_shares_are_higher_better_differences_kept_in_their_range():
    acc = metrics.get("accuracy")
    assert acc.higher_is_better and acc.difference and acc.null == 0.0 and acc.bounds == (0.0, 1.0)
    assert acc.smallest == metrics.MIN_POINTS and acc.gate_tolerance == "acc_tol"
    assert metrics.kind("accuracy").instances and metrics.kind("accuracy").to_1x is None
    records = [arec("rope", s, 100, [1] * 40) for s in (0, 1)] + [arec("alibi", s, 100, [1] * 20 + [0] * 20)
                                                                  for s in (0, 1)]
    iv = Intervals(task_results(records)["records"], draws=200)
    c = iv.compare("accuracy", "rope", "alibi", 100)
    assert c.value == pytest.approx(0.5) and c.null == 0.0 and c.p == 0.5 and not c.significant  # sign flip, 2 seeds
    assert c.note == "no finding possible at 2 seeds"
    one = Intervals(task_results(records)["records"][::2], draws=200)  # seed 0 of each row
    assert one.interval("accuracy", "rope", 100).hi == 1.0  # every instance right: the exact interval reaches 1
    assert one.interval("accuracy", "alibi", 100).lo > 0.3 and one.interval("accuracy", "alibi", 100).hi < 0.7
