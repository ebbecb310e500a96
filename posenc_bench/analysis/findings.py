"""Findings: every claim the statistics of a results file support after the correction for their number, in words.

Three kinds of claim, each at one eval length, each with its estimate, interval and level
(``analysis/stats/intervals.py``: "method" when two or more seeds are compared, "this checkpoint" with one):

- **between rows**: row A's ppl over row B's (paired by seed and text), for every pair of rows; written so that
  the ratio is below 1 (A is better); a task's exact match as A - B (A better);
- **against its own 1x**: a row's ppl at a length over its ppl at the train length;
- **extrapolation between rows**: row A's ratio to its own 1x over row B's, past 1x (A keeps its 1x better),
  the claim "A extrapolates better than B" whatever their 1x.

Every comparison made is one member of the run's **family** (``analysis/stats/family.py``), corrected together
by Benjamini-Hochberg at 1 - level: a claim is listed when its adjusted p-value is below 1 - level and its effect
is at least the metric's smallest. Ratios are inferred on the log scale, so naming B first gives the reciprocal
estimate and bounds and the same p-value: which row is named first never decides a finding. Lines are grouped by
pair (or row) and ordered by their largest effect (|log ratio|), so the strongest findings come first. A README's
findings block is this text (``posenc-bench report RUN --findings --update README.md``), and its prose claims
nothing the block does not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Optional, Sequence

from posenc_bench import metrics
from posenc_bench.analysis.stats.estimate import CHECKPOINT, Comparison
from posenc_bench.analysis.stats.family import Family, correct
from posenc_bench.analysis.stats.intervals import Intervals
from posenc_bench.analysis.runs import ReportError, Run, row_order, train_len

FAMILY = "every pair of rows at every length, by ppl and past 1x by ratio to 1x, and every row against its 1x"
TASK_FAMILY = "every pair of rows at every size"


@dataclass(frozen=True)
class Finding:
    better: str  # the row with the lower ppl (for a claim against 1x: the row itself)
    worse: str  # the other row, or "" for a claim against the row's own 1x
    length: int
    train_len: int
    comparison: Comparison  # better / worse (ratio below 1), or the row at ``length`` / at 1x

    @property
    def effect(self) -> float:
        return self.comparison.effect


@dataclass
class Findings:
    run: str  # the run's label ("" when the report has one run)
    between: list[Finding]
    from_1x: list[Finding]
    extrapolation: list[Finding]
    made: int  # comparisons made: the family's size
    levels: set[str]
    metric: str = "ppl"  # the metric compared between rows: the kind's primary ("accuracy" for a task run)
    family: Optional[Family] = None
    to_1x: bool = True  # the claims about each row's own 1x were made (the primary metric of a text run)


def run_findings(run: Run, iv: Intervals, by: Optional[str] = None) -> Findings:
    """Every finding of one run (``iv``: its intervals), after the correction within its family. ``by``: the
    metric compared between rows (default: the kind's primary, with the claims about 1x; another metric of a
    text run, e.g. longppl, is compared between rows alone, at the lengths where it has values, as its own
    family)."""
    rows = row_order(run.data)
    T = train_len(run.data["run"])
    lengths = sorted({r["eval_len"] for r in run.data["records"]})
    between = by or iv.kind.primary
    metric = metrics.get(between)
    valid = [iv.kind.primary] if iv.kind.instances else [
        m.name for m in metrics.of_kind(iv.kind.name) if m.of is None and m.ranked]
    if between not in valid:  # a task's findings are its exact match's (its sizes' instances differ)
        raise ReportError(f"findings compare rows by a metric of the run's records: {between!r} is not one; "
                          f"valid: {', '.join(valid)}")
    ratio = iv.kind.to_1x if between == iv.kind.primary else None  # a task run compares A - B, and has no ratio
    family_name = (TASK_FAMILY if iv.kind.instances else FAMILY if between == iv.kind.primary else
                   f"every pair of rows at every length{'' if metric.at_1x else ' past 1x'}, by {between}")
    made: list[tuple[str, str, str, int, Comparison]] = []  # (value or "1x", a, b, length, comparison)
    for length in lengths if metric.at_1x else [L for L in lengths if L != T]:
        for a, b in combinations(rows, 2):
            for value in (between, ratio) if length != T and ratio else (between,):
                if (c := iv.compare(value, a, b, length)) is not None:
                    made.append((value, a, b, length, c))
        for row in rows if length != T and ratio else []:
            if (c := iv.against_null(ratio, row, length)) is not None:
                made.append(("1x", row, "", length, c))
    family, adjusted = correct(family_name, [m[4] for m in made], iv.ci)
    found: dict[str, list[Finding]] = {between: [], "1x": [], **({ratio: []} if ratio else {})}
    for (value, a, b, length, _), c in zip(made, adjusted):
        if not c.significant:
            continue
        if value != "1x" and not metrics.get(value).better(c.value, c.null):  # b is better: name it first
            a, b = b, a
            c = iv.compare(value, a, b, length).adjusted(c.p_adjusted, c.shown_ci)
        found[value].append(Finding(a, b, length, T, c))
    levels = {f.comparison.level for fs in found.values() for f in fs}
    return Findings(run.label, found[between], found["1x"], found[ratio] if ratio else [], family.size, levels,
                    between, family, ratio is not None)


def _multiple(length: int, T: int) -> str:
    r = length / T
    return f"{r:g}x" if r == int(r) else f"{r:.3g}x"


def _claim(f: Finding, show_level: bool) -> str:
    c = f.comparison
    level = f", {c.level}" if show_level else ""
    i = c.interval
    if math.isfinite(i.lo):
        return f"{_multiple(f.length, f.train_len)} {c.value:.3f} [{i.lo:.3f}, {i.hi:.3f}] (p {_p(c.p_adjusted)}{level})"
    seeds = f"{c.seeds} seed{'s' if c.seeds > 1 else ''}"
    return f"{_multiple(f.length, f.train_len)} {c.value:.3f} (p {_p(c.p_adjusted)}, {seeds}{level})"


def _p(p: float) -> str:
    """An adjusted p-value, two significant digits (three where two would round it onto 0.05 or 0.01)."""
    if p < 1e-12:
        return "< 1e-12"
    text = f"{p:.2g}"
    return f"{p:.3g}" if any(float(text) == a != p for a in (0.05, 0.01)) else text


def _grouped(items: list[Finding], key, show_level: bool) -> list[tuple[float, str, str]]:
    """(largest effect, group, its claims in length order) per group, strongest first."""
    groups: dict[tuple, list[Finding]] = {}
    for f in items:
        groups.setdefault(key(f), []).append(f)
    out = []
    for k, fs in groups.items():
        fs.sort(key=lambda f: f.length)
        out.append((max(f.effect for f in fs), k, "; ".join(_claim(f, show_level) for f in fs)))
    return sorted(out, key=lambda x: (-x[0], x[1]))


def markdown(all_findings: Sequence[Findings], ci: float) -> str:
    """The findings of every run as Markdown (the README block)."""
    out = []
    for fs in all_findings:
        mixed = len(fs.levels) > 1
        level = next(iter(fs.levels)) if len(fs.levels) == 1 else ""
        head = f"{fs.run}: " if fs.run else ""
        metric = metrics.get(fs.metric)
        task = metric.difference
        rule = (f"effect at least {metric.smallest * 100:g} point" if task
                else f"effect at least {metric.smallest:.1%}")
        fam = fs.family
        what = f"{head}{fam.describe() if fam else 'no comparisons'} ({rule})"
        if fam and fam.findings and not task:
            shown = fam.members[0].shown_ci
            what += (f"; each interval below is at the false-coverage-adjusted level {shown:.2%} (Benjamini-Yekutieli), "
                     "so it excludes 1 exactly when its adjusted p-value (p) is below "
                     f"{1 - ci:.0%}")
        elif fam and fam.findings:
            what += ("; a task compares seeds by the exact sign-flip test (one seed: McNemar's), so no interval is "
                     "shown: (p) is the adjusted p-value")
        if level:
            what += "; every one is " + ("about this checkpoint (one seed), not the method" if level == CHECKPOINT
                                         else "method-level (over the training seeds)")
        out.append(what + ".\n")
        out.append("Between rows: A - B of exact match at a size (A better), strongest first:\n" if task
                   else f"Between rows: A / B of {fs.metric} at a length (A better), strongest first:\n")
        lines = _grouped(fs.between, lambda f: (f.better, f.worse), mixed)
        out += [f"- {a} {'>' if task else '<'} {b}: {claims}" for _, (a, b), claims in lines] or ["- none"]
        if task or not fs.to_1x:  # a task's sizes have their own test instances (the table shows the decline);
            # another metric than the primary (longppl) is compared between rows only
            out.append("")
            continue
        out.append("\nAgainst its own 1x: ppl at a length / ppl at the train length, largest change first:\n")
        lines = _grouped(fs.from_1x, lambda f: (f.better,), mixed)
        out += [f"- {row}: {claims}" for _, (row,), claims in lines] or ["- none"]
        out.append("\nExtrapolation between rows: A's ppl / its 1x over B's (A keeps its 1x better), strongest "
                   "first:\n")
        lines = _grouped(fs.extrapolation, lambda f: (f.better, f.worse), mixed)
        out += [f"- {a} < {b}: {claims}" for _, (a, b), claims in lines] or ["- none"]
        out.append("")
    return "\n".join(out)
