"""A family's correction: adjusted p-values, what survives, and the level its intervals are printed at."""

import math

import pytest

from posenc_bench.analysis.stats.estimate import METHOD, Comparison, Estimate
from posenc_bench.analysis.stats.family import BH, HOLM, correct


def _c(p: float) -> Comparison:
    return Comparison(Estimate(math.log(0.8), exact_p=p, log=True), METHOD, 6)


def test_benjamini_hochberg_over_a_family_and_the_false_coverage_level():
    ps = [0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205]
    family, out = correct("a test family", [_c(p) for p in ps], 0.95)
    assert family.method == BH and family.size == 8
    assert [c.p_adjusted for c in out] == pytest.approx([0.008, 0.032, 0.0672, 0.0672, 0.0672, 0.08, 0.0846, 0.205],
                                                        rel=1e-3)
    assert family.findings == 2 and [c.significant for c in out] == [True, True] + [False] * 6
    assert out[0].shown_ci == pytest.approx(1 - 2 * 0.05 / 8)  # R = 2 of m = 8 (Benjamini-Yekutieli)
    assert family.describe() == ("family: a test family, 8 comparisons; Benjamini-Hochberg at 5% (false discovery "
                                 "rate): 2 hold")


def test_a_small_family_is_corrected_by_holm_and_none_entries_pass_through():
    family, out = correct("small", [_c(0.01), None, _c(0.04)], 0.95)
    assert family.method == HOLM and family.size == 2 and out[1] is None
    assert out[0].p_adjusted == pytest.approx(0.02) and out[2].p_adjusted == pytest.approx(0.04)
    with pytest.raises(ValueError):
        correct("bad", [_c(0.01)], 0.95, method="bonferroni")


def test_an_impossible_comparison_is_counted():
    impossible = Comparison(Estimate(0.5, exact_p=0.25, min_p=0.25), METHOD, 3, null=0.0,
                            note="no finding possible at 3 seeds")
    family, _ = correct("tasks", [impossible] * 6, 0.95)
    assert family.findings == 0 and family.impossible == 6 and family.tested == 0
    assert "6 could not be findings whatever their data" in family.describe()
    possible = Comparison(Estimate(0.5, exact_p=0.002, min_p=0.002), METHOD, 10, null=0.0)
    family, out = correct("tasks", [impossible] * 6 + [possible] * 2, 0.95)  # the correction is over the 2 only
    assert family.method == HOLM and family.tested == 2 and out[-1].p_adjusted == pytest.approx(0.004)
    assert out[0].p_adjusted == 0.25 and family.findings == 2
