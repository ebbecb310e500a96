"""One estimate and how far it can be off: its interval at any level, its p-value, and a comparison of two rows.

An :class:`Estimate` is a center on its inference scale and the independent sources of its error, each a
standard error with its degrees of freedom: the training seeds (s / sqrt(k), k - 1) and the text (the bootstrap's
standard error of the seed mean over documents, G - 1 for G documents). Its half-width at level c is
sqrt(sum (t_df((1 + c) / 2) * se)^2): each part is exact when it dominates, and in between the sum is at least
what is needed. Ratio-type values (perplexity, a ratio of two rows, a ratio to 1x) live on the log scale: the
center is the mean of the per-seed logs, the interval is exponentiated back, so it is never negative and B / A
is exactly the reciprocal of A / B, bounds included. Differences of shares (a task's exact match) stay as they
are. The p-value against the null is the level at which the interval's edge reaches the null, so "the interval
excludes the null" and "p < 1 - level" are the same statement at every level. An estimate made by an exact test
(a task over seeds) carries its p-value and no interval: none over a few bimodal seeds would be valid.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from posenc_bench.analysis.stats.distributions import t_cdf, t_quantile

NORMAL_DF = math.inf  # a part whose error is normal (many independent samples)
METHOD, CHECKPOINT = "method", "this checkpoint"  # the two levels of a comparison


@dataclass(frozen=True)
class Interval:
    value: float  # the point estimate (what the table prints)
    lo: float
    hi: float

    def excludes(self, x: float) -> bool:
        return self.lo > x or self.hi < x


def within(interval: Interval, bounds: Optional[tuple[float, float]]) -> Interval:
    """``interval`` kept within ``bounds`` (None: as it is)."""
    if bounds is None:
        return interval
    return Interval(interval.value, max(bounds[0], interval.lo), min(bounds[1], interval.hi))


def _df(df: float) -> float:
    """Degrees of freedom as the t functions take them: a normal part (NORMAL_DF) as a huge finite df."""
    return 1e8 if math.isinf(df) else df


def _quantile(p: float, df: float) -> float:
    return t_quantile(p, _df(df))


@functools.lru_cache(maxsize=None)
def _grid(df: float) -> tuple[np.ndarray, np.ndarray]:
    """(two-sided alphas, their t quantiles at ``df``): the table a p-value is read from, 1e-12 to 1."""
    alphas = np.concatenate([np.logspace(-12, -1, 221)[:-1], np.linspace(0.1, 1, 181)[:-1]])  # (400,)
    return alphas, np.array([_quantile(1 - a / 2, df) for a in alphas])


@dataclass(frozen=True)
class Estimate:
    """A center on its inference scale, and its error's independent parts ((standard error, df), ...)."""

    center: float  # log of a ratio-type value; a difference of shares as it is
    parts: tuple[tuple[float, float], ...] = ()
    log: bool = False
    exact_p: Optional[float] = None  # an exact test's p-value, where no interval is valid
    declined: str = ""  # why no interval is printed ("" where one is)
    min_p: float = 0.0  # the smallest p-value the test could give on any data of this shape (discrete tests)

    @property
    def value(self) -> float:
        return math.exp(self.center) if self.log else self.center

    def half(self, ci: float) -> float:
        return math.hypot(*(_quantile((1 + ci) / 2, df) * se for se, df in self.parts)) if self.parts else 0.0

    def interval(self, ci: float, bounds: Optional[tuple[float, float]] = None) -> Optional[Interval]:
        """The ``ci`` interval, back on the value's scale and within ``bounds``; None where it is declined."""
        if self.declined:
            return None
        h = self.half(ci)
        lo, hi = self.center - h, self.center + h
        if self.log:
            lo, hi = math.exp(lo), math.exp(hi)
        return within(Interval(self.value, lo, hi), bounds)

    def p(self, null: float) -> float:
        """The two-sided p-value against ``null`` (on the value's scale): the smallest 1 - level at which the
        interval excludes it (to about 1% of its size), or the exact test's."""
        if self.exact_p is not None:
            return self.exact_p
        if self.declined:  # no valid interval and no exact test: nothing can be claimed
            return 1.0
        d = abs(self.center - (math.log(null) if self.log else null))
        live = [(se, df) for se, df in self.parts if se > 0]
        if d == 0:
            return 1.0
        if not live:
            return 0.0
        if len(live) == 1:
            se, df = live[0]
            return min(1.0, 2 * (1 - t_cdf(d / se, _df(df))))
        alphas = _grid(live[0][1])[0]
        half = np.sqrt(sum((_grid(df)[1] * se) ** 2 for se, df in live))  # (400,), falling with alpha
        if d >= half[0]:
            return float(alphas[0])
        i = int(np.searchsorted(-half, -d))  # first alpha whose half-width is at most d
        if i >= len(alphas):
            return 1.0
        x0, x1, y0, y1 = math.log(alphas[i - 1]), math.log(alphas[i]), half[i - 1], half[i]
        return float(math.exp(x0 + (x1 - x0) * (y0 - d) / (y0 - y1)))


@dataclass(frozen=True)
class Comparison:
    """``row`` / ``ref`` (or ``row`` - ``ref`` for shares) of one value at one length, paired by seed and text.
    ``level`` is METHOD (seeds are the samples: a claim about the recipe) or CHECKPOINT (one seed in common: about
    these trained models only). ``p_adjusted`` is set when the comparison is part of a family (``family.py``); then
    significance uses it, and ``shown_ci`` is the level of the printed interval (false-coverage adjusted)."""

    estimate: Estimate
    level: str
    seeds: int  # seeds in common
    ci: float = 0.95
    null: float = 1.0  # no difference: a ratio of 1, or a difference of 0
    min_effect: float = 0.001
    bounds: Optional[tuple[float, float]] = None
    p_adjusted: Optional[float] = None
    shown_ci: Optional[float] = None
    note: str = field(default="", compare=False)  # e.g. "no finding possible at 3 seeds"

    @property
    def value(self) -> float:
        return self.estimate.value

    @property
    def interval(self) -> Interval:
        """The printed interval (at ``shown_ci``, else ``ci``); a point where the estimate declines one."""
        i = self.estimate.interval(self.shown_ci or self.ci, self.bounds)
        return i if i is not None else Interval(self.value, math.nan, math.nan)

    @property
    def p(self) -> float:
        return self.estimate.p(self.null)

    @property
    def possible(self) -> bool:
        """Whether this comparison can be a finding at all at its level (an exact test over few seeds cannot)."""
        return not self.note

    @property
    def significant(self) -> bool:
        """p (adjusted in a family) below 1 - ci, and the estimate at least ``min_effect`` from the null."""
        p = self.p if self.p_adjusted is None else self.p_adjusted
        return p < 1 - self.ci and self.effect >= (math.log1p(self.min_effect) if self.estimate.log else self.min_effect)

    @property
    def effect(self) -> float:
        """How far the estimate is from the null on its inference scale: |log ratio|, or |difference|."""
        return abs(self.estimate.center - (math.log(self.null) if self.estimate.log else self.null))

    def adjusted(self, p_adjusted: float, shown_ci: Optional[float]) -> "Comparison":
        return replace(self, p_adjusted=p_adjusted, shown_ci=shown_ci)
