"""Findings: every claim the intervals of a results file support, and nothing else, in words.

Three kinds of claim, each at one eval length, each with its ratio, interval and level
(``analysis/intervals.py``: "method" when two or more seeds are compared, "this checkpoint" with one):

- **between rows**: row A's ppl over row B's (paired by seed and text), for every pair of rows; listed where
  the interval excludes 1 and the difference is at least MIN_EFFECT, written so that the ratio is below 1
  (A is better);
- **against its own 1x**: a row's ppl at a length over its ppl at the train length, where that is a finding;
- **extrapolation between rows**: row A's ratio to its own 1x over row B's, past 1x (A keeps its 1x better),
  the claim "A extrapolates better than B" whatever their 1x.

Lines are grouped by pair (or row) and ordered by their largest effect (|log ratio|), so the strongest
findings come first. Every comparison is at the report's level (95% by default) and none is corrected for
the number made: the block says how many were made, so a reader can judge how many could be chance (about
1 in 40 of the comparisons with no true difference, in each direction). A README's findings block is this
text (``posenc-bench report RUN --findings --update README.md``), and its prose claims nothing the block does
not hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Sequence

from posenc_bench import metrics
from posenc_bench.analysis.intervals import CHECKPOINT, Comparison, Intervals
from posenc_bench.analysis.tables import Run, row_order, train_len


@dataclass(frozen=True)
class Finding:
    better: str  # the row with the lower ppl (for a claim against 1x: the row itself)
    worse: str  # the other row, or "" for a claim against the row's own 1x
    length: int
    train_len: int
    comparison: Comparison  # better / worse (ratio below 1), or the row at ``length`` / at 1x

    @property
    def effect(self) -> float:
        c = self.comparison
        return abs(c.interval.value - c.null) if c.null == 0 else abs(math.log(c.interval.value))


@dataclass
class Findings:
    run: str  # the run's label ("" when the report has one run)
    between: list[Finding]
    from_1x: list[Finding]
    extrapolation: list[Finding]
    made: int  # comparisons made (pairs x lengths, and rows x lengths past 1x)
    levels: set[str]
    metric: str = "ppl"  # the metric compared between rows: the kind's primary ("accuracy" for a task run)


def _oriented(iv: Intervals, value: str, a: str, b: str, length: int) -> tuple[str, str, Comparison] | None:
    """The significant comparison of ``value`` of a and b at ``length``, the better row first; None otherwise."""
    c = iv.compare(value, a, b, length)
    if c is None or not c.significant:
        return None
    if metrics.get(value).better(c.interval.value, c.null):  # a is better: more accurate, lower ppl
        return a, b, c
    return b, a, iv.compare(value, b, a, length)


def run_findings(run: Run, iv: Intervals) -> Findings:
    """Every finding of one run (``iv``: its intervals)."""
    rows = row_order(run.data)
    T = train_len(run.data["run"])
    lengths = sorted({r["eval_len"] for r in run.data["records"]})
    between, ratio = iv.kind.primary, iv.kind.to_1x  # a task run compares exact match (A - B) and has no ratio
    found: dict[str, list[Finding]] = {between: [], **({ratio: []} if ratio else {})}
    from_1x, made = [], 0
    for length in lengths:
        for a, b in combinations(rows, 2):
            for value in (between, ratio) if length != T and ratio else (between,):
                if iv.compare(value, a, b, length) is None:
                    continue
                made += 1
                if (o := _oriented(iv, value, a, b, length)) is not None:
                    found[value].append(Finding(o[0], o[1], length, T, o[2]))
        for row in rows if length != T and ratio else []:
            c = _ratio_to_1x(iv, ratio, row, length)
            if c is None:
                continue
            made += 1
            if c.significant:
                from_1x.append(Finding(row, "", length, T, c))
    levels = {f.comparison.level for f in found[between] + from_1x + found.get(ratio, [])}
    return Findings(run.label, found[between], from_1x, found[ratio] if ratio else [], made, levels, between)


def _ratio_to_1x(iv: Intervals, ratio: str, row: str, length: int) -> Comparison | None:
    """The row's ppl at ``length`` over its own 1x, as a Comparison (its interval is the ratio value's)."""
    interval = iv.interval(ratio, row, length)
    if interval is None:
        return None
    level = iv.level(row, length)
    return Comparison(interval, level, iv.seeds_measured(row, length))


def _multiple(length: int, T: int) -> str:
    r = length / T
    return f"{r:g}x" if r == int(r) else f"{r:.3g}x"


def _claim(f: Finding, show_level: bool) -> str:
    i = f.comparison.interval
    level = f" ({f.comparison.level})" if show_level else ""
    return f"{_multiple(f.length, f.train_len)} {i.value:.3f} [{i.lo:.3f}, {i.hi:.3f}]{level}"


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
        n = len(fs.between) + len(fs.from_1x) + len(fs.extrapolation)
        metric = metrics.get(fs.metric)
        task = metric.difference
        rule = (f"interval excludes 0, difference at least {metric.smallest * 100:g} point" if task
                else f"interval excludes 1, difference at least {metric.smallest:.1%}")
        what = f"{head}{n} of {fs.made} comparisons hold at {ci:.0%} ({rule}; not corrected for the number made)"
        if level:
            what += "; every one is " + ("about this checkpoint (one seed), not the method" if level == CHECKPOINT
                                         else "method-level (over the training seeds)")
        out.append(what + ".\n")
        out.append("Between rows: A - B of exact match at a size (A better), strongest first:\n" if task
                   else "Between rows: A / B of ppl at a length (A better), strongest first:\n")
        lines = _grouped(fs.between, lambda f: (f.better, f.worse), mixed)
        out += [f"- {a} {'>' if task else '<'} {b}: {claims}" for _, (a, b), claims in lines] or ["- none"]
        if task:  # each size has its own test instances: no pairing with 1x (the table shows the decline)
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
