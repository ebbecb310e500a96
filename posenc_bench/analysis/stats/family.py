"""A family of comparisons and its correction for their number: what a report may call a finding.

A report makes many comparisons (every pair of rows at every length, each row against its 1x), and at 95% about
one in twenty of those with no true difference would look like one. Each output that marks differences states
its family (what it compares, how many) and corrects within it:

- **Benjamini-Hochberg** (the findings, the tables' marks, ``--compare``): the false discovery rate, the expected
  share of false claims among those made, is kept at 1 - level. A finding's interval is printed at the false
  coverage-adjusted level 1 - R (1 - level) / m for R findings of m comparisons (Benjamini & Yekutieli 2005), so
  every printed interval excludes the null exactly when its finding survives.
- **Holm** (the gate, and any family of at most SMALL comparisons): the chance of even one false claim is kept at
  1 - level; a CI gate fails a build on one.

A comparison that no data of its shape could make a finding (an exact test whose smallest attainable p-value is
at least 1 - level: the sign-flip test over fewer than 6 seeds that differ, or over none) is counted and named,
and left out of the correction: it can never be rejected, and the tests it would dilute stay valid conditionally on which ones can be
(Tarone 1990; Gilbert 2005, for the false discovery rate with discrete tests). Its adjusted p-value is its own.

A comparison's adjusted p-value is printed beside it; one below 1 - level, with an effect of at least the
metric's smallest, is a finding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from posenc_bench.analysis.stats.distributions import benjamini_hochberg, holm
from posenc_bench.analysis.stats.estimate import Comparison

BH, HOLM = "Benjamini-Hochberg", "Holm"
SMALL = 5  # a family of at most this many comparisons is corrected by Holm: BH gains nothing there


@dataclass(frozen=True)
class Family:
    """Comparisons corrected together: ``members`` carry their adjusted p-values (same order as given)."""

    name: str  # what it compares, e.g. "every pair of rows at every length"
    members: tuple[Comparison, ...]
    method: str
    ci: float

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def tested(self) -> int:
        """Comparisons the correction is over: those that could be findings."""
        return self.size - self.impossible

    @property
    def findings(self) -> int:
        return sum(c.significant for c in self.members)

    @property
    def impossible(self) -> int:
        """Comparisons that could not be findings whatever the data (an exact test over too few seeds that differ)."""
        return sum(not testable(c) for c in self.members)

    def describe(self) -> str:
        """One line: the family, its size, the correction and what survives."""
        if not self.members:
            return f"family: {self.name}: no comparisons"
        over = f" over the {self.tested} that could be findings" if self.impossible else ""
        text = (f"family: {self.name}, {self.size} comparisons; {self.method} at {1 - self.ci:.0%}{over} "
                f"({'false discovery rate' if self.method == BH else 'family-wise error'}): {self.findings} hold")
        if self.impossible:
            text += (f"; {self.impossible} could not be findings whatever their data (an exact test over too few "
                     "seeds that differ, or none)")
        return text


def testable(c: Comparison) -> bool:
    """Whether some data of ``c``'s shape could make it a finding: its test's smallest attainable p-value is below
    1 - level (always, for a continuous estimate)."""
    return c.estimate.min_p < 1 - c.ci


def correct(name: str, comparisons: Sequence[Optional[Comparison]], ci: float, method: Optional[str] = None
            ) -> tuple[Family, list[Optional[Comparison]]]:
    """The family of ``comparisons`` (None entries skipped and returned as None) and each comparison with its
    adjusted p-value and the level its interval is printed at. ``method``: BH, HOLM, or None for BH (HOLM for a
    family of at most SMALL)."""
    present = [c for c in comparisons if c is not None]
    tested = [c for c in present if testable(c)]  # the others can never be findings: out of the correction
    method = method or (HOLM if len(tested) <= SMALL else BH)
    if method not in (BH, HOLM):
        raise ValueError(f"unknown correction {method!r}; valid: {BH}, {HOLM}")
    m = len(tested)
    adjusted = dict(zip(map(id, tested), (benjamini_hochberg if method == BH else holm)([c.p for c in tested])))
    alpha = 1 - ci
    r = sum(c.adjusted(adjusted[id(c)], None).significant for c in tested)
    shown = 1 - max(r, 1) * alpha / m if method == BH and m else 1 - alpha / max(m, 1)
    out_present = [c.adjusted(adjusted.get(id(c), c.p), shown) for c in present]
    family = Family(name, tuple(out_present), method, ci)
    it = iter(out_present)
    return family, [None if c is None else next(it) for c in comparisons]
