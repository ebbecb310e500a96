"""The distributions and exact tests the statistics rest on, in plain Python (no SciPy in the install).

- Student's t: its CDF through the regularized incomplete beta function, its quantile by bisection.
- The binomial: exact tail sums; the Clopper-Pearson interval of one seed's exact match (its instances' counts).
- The exact sign-flip test of paired per-seed differences: under "no difference" each seed's difference is as
  likely positive as negative, whatever the distribution of per-seed accuracy (bimodal included), so the p-value
  is the share of the 2^n sign assignments whose mean is at least as far from 0 as the one observed. Its smallest
  p-value is 2 / 2^n (two-sided): 0.25 at 3 seeds, 0.0625 at 5, 0.031 at 6.
- McNemar's exact test of two rows on the same test instances (one seed): the instances one row gets right and
  the other does not, against a fair coin.
- Multiplicity: Benjamini-Hochberg's step-up adjusted p-values (false discovery rate) and Holm's step-down ones
  (family-wise error).
"""

from __future__ import annotations

import itertools
import math
from statistics import NormalDist
from typing import Sequence


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (any real df > 0)."""
    tail = 0.5 * beta_inc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (0.5 < p < 1), by bisection on ``t_cdf``; the normal's for huge df."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile takes 0.5 < p < 1, got {p!r}")
    if df > 1e7:
        return NormalDist().inv_cdf(p)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
        if hi - lo < 1e-12 * hi:
            break
    return (lo + hi) / 2


def binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p)."""
    if k < 0:
        return 0.0
    if k >= n:
        return 1.0
    return 1.0 - beta_inc(k + 1, n - k, p)  # the identity P(X <= k) = I_{1-p}(n - k, k + 1)


def clopper_pearson(k: int, n: int, ci: float) -> tuple[float, float]:
    """The exact (Clopper-Pearson) ``ci`` interval of a share from ``k`` successes in ``n`` trials: it covers the
    true share at least ``ci`` of the time for every share. Bounds by bisection on the binomial tails."""
    if not 0 <= k <= n or n < 1:
        raise ValueError(f"clopper_pearson takes 0 <= k <= n, n >= 1; got k={k}, n={n}")
    tail = (1 - ci) / 2

    def solve(f, target: float) -> float:  # f increasing in p on [0, 1]
        lo, hi = 0.0, 1.0
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        return (lo + hi) / 2

    lower = 0.0 if k == 0 else solve(lambda p: 1.0 - binom_cdf(k - 1, n, p), tail)  # P(X >= k) = tail
    upper = 1.0 if k == n else solve(lambda p: 1.0 - binom_cdf(k, n, p), 1.0 - tail)  # P(X <= k) = tail
    return lower, upper


def sign_flip_p(diffs: Sequence[float]) -> float:
    """The two-sided exact p-value of the paired sign-flip (permutation) test of mean ``diffs`` = 0: the share of
    the 2^n sign assignments whose |mean| is at least the observed |mean| (1e-12 tolerance for float ties)."""
    d = [float(x) for x in diffs]
    if not d:
        return 1.0
    observed = abs(sum(d))
    hits = sum(1 for signs in itertools.product((1, -1), repeat=len(d))
               if abs(sum(s * x for s, x in zip(signs, d))) >= observed - 1e-12)
    return hits / 2 ** len(d)


def smallest_sign_flip_p(n: int) -> float:
    """The smallest p-value the sign-flip test can give over ``n`` paired seeds: every seed the same way."""
    return min(1.0, 2.0 / 2 ** n)


def mcnemar_p(only_a: int, only_b: int) -> float:
    """Exact two-sided McNemar p-value: ``only_a`` instances right in row a only, ``only_b`` in row b only."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    return min(1.0, 2.0 * binom_cdf(min(only_a, only_b), n, 0.5))


def benjamini_hochberg(p: Sequence[float]) -> list[float]:
    """Benjamini-Hochberg adjusted p-values (step-up): rejecting those <= q controls the false discovery rate at
    q for independent or positively dependent tests."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [1.0] * m, 1.0
    for rank in range(m, 0, -1):
        i = order[rank - 1]
        running = min(running, p[i] * m / rank)
        out[i] = min(1.0, running)
    return out


def holm(p: Sequence[float]) -> list[float]:
    """Holm's adjusted p-values (step-down): rejecting those <= alpha controls the family-wise error at alpha for
    any dependence."""
    m = len(p)
    order = sorted(range(m), key=lambda i: p[i])
    out, running = [1.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, p[i] * (m - rank)))
        out[i] = running
    return out
