"""An estimate's interval, p-value and orientation, and what makes a comparison a finding."""

import math

import pytest

from posenc_bench.analysis.stats.distributions import t_quantile
from posenc_bench.analysis.stats.estimate import METHOD, Comparison, Estimate


def test_a_log_scale_interval_is_positive_and_its_reciprocal_is_exact():
    e = Estimate(math.log(1.99), ((0.6, 2),), log=True)  # a wide ratio: the old arithmetic interval went negative
    i = e.interval(0.95)
    assert i.lo > 0 and i.lo * i.hi == pytest.approx(1.99 ** 2)
    back = Estimate(-math.log(1.99), ((0.6, 2),), log=True).interval(0.95)
    assert (back.lo, back.hi) == pytest.approx((1 / i.hi, 1 / i.lo))


def test_the_p_value_is_the_level_at_which_the_interval_reaches_the_null():
    for parts in (((0.01, 4),), ((0.01, 4), (0.008, 10)), ((0.002, 2), (0.01, math.inf))):
        e = Estimate(math.log(1.03), parts, log=True)
        p = e.p(1.0)
        assert 0 < p < 1
        lo = e.interval(1 - p).lo
        assert lo == pytest.approx(1.0, abs=2e-4)  # the edge sits on the null at level 1 - p
    assert Estimate(0.0, ((0.1, 3),), log=True).p(1.0) == 1.0
    assert Estimate(0.2, (), log=False).p(0.0) == 0.0  # no error at all, away from the null
    assert Estimate(0.2, exact_p=0.03).p(0.0) == 0.03


def test_two_parts_add_their_t_half_widths_in_quadrature():
    e = Estimate(0.0, ((0.01, 2), (0.02, 10)))
    assert e.half(0.95) == pytest.approx(math.hypot(t_quantile(0.975, 2) * 0.01, t_quantile(0.975, 10) * 0.02))


def test_a_declined_estimate_prints_no_interval_and_a_comparison_is_judged_by_its_adjusted_p():
    declined = Estimate(0.3, exact_p=0.25, declined="no interval: bimodal")
    assert declined.interval(0.95) is None
    c = Comparison(Estimate(math.log(0.9), ((0.01, 4),), log=True), METHOD, 5)
    assert c.significant and c.p < 0.01
    assert not c.adjusted(0.2, 0.99).significant and c.adjusted(0.2, 0.99).interval.lo < c.interval.lo
    tiny = Comparison(Estimate(math.log(1.0005), ((1e-6, 4),), log=True), METHOD, 5)
    assert tiny.p < 1e-6 and not tiny.significant  # under the smallest effect: never a finding
