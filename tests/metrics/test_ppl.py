"""Perplexity from per-unit numbers: exp(sum NLL / sum targets), checked by hand and against the records."""

import math

import numpy as np
import pytest

from posenc_bench import metrics
from posenc_bench.analysis.stats.intervals import Intervals
from tests.analysis.fake_results import unit_results


def test_ppl_is_exp_of_the_token_weighted_mean_nll_by_hand():
    ppl = metrics.get("ppl")
    # two units: 2.0 nats over 2 targets, 9.0 nats over 3: token-weighted mean 11 / 5, not (1.0 + 3.0) / 2
    sums = {"nll": np.array([11.0]), "tokens": np.array([5.0])}
    assert ppl.formula(sums)[0] == pytest.approx(math.exp(11 / 5))
    assert ppl.of_units({"size": 3, "nll": [2.0, 9.0], "tokens": [2, 3], "bytes": [2, 3]}) == pytest.approx(math.exp(2.2))


def test_ppl_is_lower_better_compared_as_a_ratio_and_gated_by_ppl_tol():
    ppl = metrics.get("ppl")
    assert (ppl.kind, ppl.higher_is_better, ppl.difference, ppl.null, ppl.gate_tolerance) == ("ppl", False, False, 1.0,
                                                                                              "ppl_tol")
    assert ppl.better(3.0, 4.0) and not ppl.better(4.0, 3.0) and ppl.compare(np.array(6.0), np.array(3.0)) == 2.0
    assert metrics.kind("ppl").primary == "ppl" and metrics.kind("ppl").to_1x == "ratio"


def test_the_intervals_ppl_is_each_records_own_ppl():
    """The bootstrap's data column (every unit once) gives back the ppl each record stores."""
    data = unit_results()
    iv = Intervals(data["records"], draws=10)
    for r in data["records"]:
        assert iv.interval("ppl", r["encoding"], r["eval_len"]).value == pytest.approx(r["ppl"], rel=1e-12)
        assert metrics.record_value(metrics.get("ppl"), r) == r["ppl"]
