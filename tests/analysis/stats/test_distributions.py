"""The distributions and exact tests against published values and direct sums."""

import itertools
import math

import pytest

from posenc_bench.analysis.stats.distributions import (benjamini_hochberg, binom_cdf, clopper_pearson, holm, mcnemar_p,
                                                       sign_flip_p, smallest_sign_flip_p, t_cdf, t_quantile)


def test_t_quantiles_match_the_tables():
    for df, q in ((1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139), (100, 1.983972)):
        assert t_quantile(0.975, df) == pytest.approx(q, rel=1e-6)
        assert t_cdf(q, df) == pytest.approx(0.975, abs=1e-6)  # the tables give 6 decimals
    with pytest.raises(ValueError):
        t_quantile(0.4, 3)


def test_binomial_tail_is_the_direct_sum():
    for n, p in ((10, 0.3), (25, 0.5), (60, 0.9)):
        for k in (0, 3, n // 2, n - 1, n):
            direct = sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))
            assert binom_cdf(k, n, p) == pytest.approx(direct, abs=1e-12)


def test_clopper_pearson_bounds_are_the_exact_tails():
    assert clopper_pearson(0, 10, 0.95) == pytest.approx((0.0, 1 - 0.025 ** 0.1), abs=1e-9)
    assert clopper_pearson(10, 10, 0.95) == pytest.approx((0.025 ** 0.1, 1.0), abs=1e-9)
    lo, hi = clopper_pearson(7, 20, 0.95)
    assert 1 - binom_cdf(6, 20, lo) == pytest.approx(0.025, abs=1e-9)  # P(X >= 7 | lo) = 2.5%
    assert binom_cdf(7, 20, hi) == pytest.approx(0.025, abs=1e-9)  # P(X <= 7 | hi) = 2.5%
    with pytest.raises(ValueError):
        clopper_pearson(11, 10, 0.95)


def test_sign_flip_p_enumerates_every_assignment():
    assert sign_flip_p([0.2, 0.1, 0.3]) == 0.25  # only all + and all - reach the observed |mean|
    assert sign_flip_p([0.1] * 6) == pytest.approx(2 / 64) == smallest_sign_flip_p(6)
    assert sign_flip_p([1.0, -1.0]) == 1.0 and sign_flip_p([]) == 1.0
    d = [0.5, -0.1, 0.3, 0.2, 0.05]
    direct = sum(abs(sum(s * x for s, x in zip(signs, d))) >= abs(sum(d)) - 1e-12
                 for signs in itertools.product((1, -1), repeat=5)) / 32
    assert sign_flip_p(d) == direct
    assert smallest_sign_flip_p(3) == 0.25 and smallest_sign_flip_p(5) == 0.0625 and smallest_sign_flip_p(0) == 1.0


def test_mcnemar_is_the_binomial_test_of_the_discordant_pairs():
    assert mcnemar_p(10, 0) == pytest.approx(2 * 0.5 ** 10)
    assert mcnemar_p(5, 5) == 1.0 and mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(8, 2) == pytest.approx(2 * sum(math.comb(10, i) for i in range(3)) / 1024)


def test_benjamini_hochberg_and_holm_on_a_worked_example():
    p = [0.01, 0.04, 0.03, 0.005]
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])  # p * m / rank, then monotone
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])  # p * (m - rank + 1), then monotone
    assert benjamini_hochberg([0.9]) == [0.9] and holm([]) == []
