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
    def findings(self) -> int:
        return sum(c.significant for c in self.members)

    @property
    def impossible(self) -> int:
        """Comparisons that could not be findings whatever the data (an exact test over too few seeds)."""
        return sum(not c.possible for c in self.members)

    def describe(self) -> str:
        """One line: the family, its size, the correction and what survives."""
        if not self.members:
            return f"family: {self.name}: no comparisons"
        text = (f"family: {self.name}, {self.size} comparisons; {self.method} at {1 - self.ci:.0%} "
                f"({'false discovery rate' if self.method == BH else 'family-wise error'}): {self.findings} hold")
        if self.impossible:
            text += f"; {self.impossible} could not at their number of seeds (exact test)"
        return text


def correct(name: str, comparisons: Sequence[Optional[Comparison]], ci: float, method: Optional[str] = None
            ) -> tuple[Family, list[Optional[Comparison]]]:
    """The family of ``comparisons`` (None entries skipped and returned as None) and each comparison with its
    adjusted p-value and the level its interval is printed at. ``method``: BH, HOLM, or None for BH (HOLM for a
    family of at most SMALL)."""
    present = [c for c in comparisons if c is not None]
    method = method or (HOLM if len(present) <= SMALL else BH)
    if method not in (BH, HOLM):
        raise ValueError(f"unknown correction {method!r}; valid: {BH}, {HOLM}")
    m = len(present)
    adjusted = (benjamini_hochberg if method == BH else holm)([c.p for c in present])
    alpha = 1 - ci
    trial = [c.adjusted(p, None) for c, p in zip(present, adjusted)]
    r = sum(c.significant for c in trial)
    shown = 1 - max(r, 1) * alpha / m if method == BH and m else 1 - alpha / max(m, 1)
    out_present = [c.adjusted(p, shown) for c, p in zip(present, adjusted)]
    family = Family(name, tuple(out_present), method, ci)
    it = iter(out_present)
    return family, [None if c is None else next(it) for c in comparisons]
