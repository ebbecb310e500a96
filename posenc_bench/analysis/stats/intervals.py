"""Estimates from the per-unit numbers of results files: a seed level valid for few seeds, a text level for one.

Every record of a run keeps, for each resampling unit (a block of consecutive targets, the run's longest eval
length long, see ``bench/eval/evaluate.py``; a test instance for a task), the sums its metrics are computed from.
A unit is the same text at every length and for every row, so one bootstrap draw of the text (``text.py``) gives
every row, seed and length the same weights: comparisons stay paired. Each draw recomputes each seed's statistic
exactly as the table does (ppl = exp(sum NLL / targets), or a ratio of two of them). The draws resample whole
documents where the units record theirs: units of one speech, file or play are not independent.

A statistic (a row's ppl, or the paired ratio of two rows at one length) has one value per training seed.

- **Text values, seed level** (two or more seeds with a number in both rows): the claim is about the recipe and
  the seeds are the samples. On the log scale (``estimate.py``), the estimate is the mean of the k per-seed logs
  with two parts of error: the seeds' (s / sqrt(k), k - 1 degrees of freedom) and the text's (the standard error
  of the seed mean over the document bootstrap, G - 1 for G documents). The text is shared by every seed, so s
  does not see it. A metric that rests on a few units (LongPPL: key tokens, often in a handful of units) counts
  only the clusters holding any (its ``weight``): its draws vary over those alone, and with one there is no
  interval (``ONE_CLUSTER``); ``tests/analysis/stats/test_coverage.py`` checks it covers where counting every
  cluster does not.
- **Text values, checkpoint level** (one seed in common): the text's part alone. It describes these trained
  models on this population of text and nothing else: another seed of the same recipe can move them by more.
- **Task exact match** (a share over test instances; seeds learn the task or do not, so their values are
  bimodal): at the seed level no interval over a few seeds is valid for every distribution, so none is printed;
  two rows are compared by the exact sign-flip test of their paired per-seed differences, whose smallest p-value
  at n seeds is 2 / 2^n ("no finding possible at n seeds" where that cannot reach the level). At one seed a row's
  exact match has its exact (Clopper-Pearson) interval from the instances' counts, and two rows compare by
  McNemar's exact test on the same instances. Other task shares (answer tokens right) keep the instance
  bootstrap at one seed.

Every value is a registered metric (``posenc_bench/metrics``): its formula over the weighted unit sums gives
each draw's statistic, and it says how two rows compare (a ratio, or a difference of shares). Whether a
comparison is a finding is decided in its family (``family.py``), after the correction for the number made.
"""

from __future__ import annotations

import json
import math
from typing import Iterable, Optional

import numpy as np

from posenc_bench import metrics
from posenc_bench.analysis.learned import seed_learned
from posenc_bench.analysis.stats.distributions import clopper_pearson, mcnemar_p, sign_flip_p, smallest_sign_flip_p
from posenc_bench.analysis.stats.estimate import (CHECKPOINT, METHOD, NORMAL_DF, Comparison, Estimate, Interval,
                                                  within)
from posenc_bench.analysis.stats.text import DRAWS, SEED, Draws, draws_of

CI = 0.95  # default level
MIN_SEEDS = 2  # seeds in common for a seed-level (method) estimate; with fewer it is about this checkpoint
MIN_WINDOWS = 30  # below this many independent windows at a length, the table says so
BIMODAL = ("no interval: exact match over seeds is bimodal (a seed learns the task or not), and no interval over "
           "{k} seeds is valid for every distribution")
MIXED = "no interval: {n} of {k} seeds learned, and seeds that did and did not are two populations"
ONE_CLUSTER = "no interval: all its {weight} lie in one resampling cluster of the text, and one cluster has no spread"


def model_of(rec: dict) -> str:
    """What a record evaluated: its cell key (a trained or fine-tuned model of ours), or the pretrained model."""
    if rec.get("cell_key"):
        return rec["cell_key"]
    return json.dumps(rec.get("model") or {}, sort_keys=True)


class Intervals:
    """The text bootstrap of every (row, seed, length) of a set of records measured on the same text, and the
    estimate, interval and paired comparison of each statistic built from it.

    ``records``: results records (one run, or several runs of the same text whose rows are told apart by
    ``label(rec)``, as the gate does with a baseline and a current run)."""

    def __init__(self, records: Iterable[dict], *, ci: float = CI, draws: int = DRAWS, seed: int = SEED,
                 label=lambda r: r["encoding"]) -> None:
        if not 0 < ci < 1:
            raise ValueError(f"confidence level must be between 0 and 1, got {ci!r}")
        self.ci = ci
        records = list(records)
        self.kind = metrics.kind_of(records)
        self.metric = self.kind.name  # what the records measure: "ppl" (text) or "accuracy" (a task)
        self.rows = list(dict.fromkeys(label(r) for r in records))
        self.seeds = sorted({r["seed"] for r in records})
        self.lengths = sorted({r["eval_len"] for r in records})
        self.train_len = {label(r): r["train_len"] for r in records}
        self.models: dict[tuple[str, int], str] = {(label(r), r["seed"]): model_of(r) for r in records}
        flags = {enc: seed_learned(records, enc) for enc in dict.fromkeys(r["encoding"] for r in records)}
        self.learned: dict[tuple[str, int], bool] = {  # (row, seed) -> its model learned (``analysis/learned.py``)
            (label(r), r["seed"]): flags[r["encoding"]][r["seed"]] for r in records if r["seed"] in flags[r["encoding"]]}
        self.draws: Draws = draws_of(records, self.kind, (self.rows, self.seeds, self.lengths, self.train_len), label,
                                     draws, seed)
        self.problem = self.draws.problem
        self.unit_size, self.n_units = self.draws.unit_size, self.draws.n_units

    @property
    def available(self) -> bool:
        return not self.problem

    # ------------------------------------------------------------------------------------------- the values

    def _at(self, value: str, rows: tuple[str, ...], length: int
            ) -> Optional[tuple[tuple[np.ndarray, ...], list, int]]:
        """(each of ``rows``' statistic (k, 1 + draws) at the seeds where every one has a number, data first and
        then the text draws; those seeds; the text's independent clusters behind them: every one, or for a
        metric with a weight (LongPPL) the fewest holding any of it in a row and seed compared); None without."""
        per_seed = self.draws.per_seed
        if self.problem or value not in per_seed or length not in self.lengths or any(r not in self.rows for r in rows):
            return None
        j, at = self.lengths.index(length), [self.rows.index(r) for r in rows]
        x = [per_seed[value][i, :, j] for i in at]  # each (S, 1 + draws)
        log = not metrics.get(value).difference  # on the log scale a value must be above 0 (a share of 0 has no log)
        keep = np.all([np.isfinite(a[:, 0]) & ((a[:, 0] > 0) if log else True) for a in x], axis=0)  # (S,)
        if not keep.any():
            return None
        holding = self.draws.holding.get(value)
        clusters = self.draws.clusters if holding is None else int(holding[at][:, keep, j].min())
        return tuple(a[keep] for a in x), [s for s, k in zip(self.seeds, keep) if k], clusters

    def _counts(self, value: str, row: str, length: int) -> Optional[np.ndarray]:
        """(k, instances) 0/1 outcomes of each seed of ``row`` at ``length``, for a binomial share."""
        field = metrics.get(value).counts
        got = self.draws.outcomes.get(field) if field else None
        if got is None:
            return None
        a = got[self.rows.index(row), :, self.lengths.index(length)]  # (S, instances)
        return a[np.isfinite(a[:, 0])]

    def estimate(self, value: str, row: str, length: int) -> Optional[Estimate]:
        """``value`` of ``row`` at ``length`` over its seeds; None without numbers. A task's exact match over
        several seeds declines an interval (module docstring); at one seed it is exact (Clopper-Pearson)."""
        got = self._at(value, (row,), length)
        if got is None:
            return None
        metric, x = metrics.get(value), got[0][0]
        if metric.difference and len(x) >= MIN_SEEDS:
            return Estimate(float(x[:, 0].mean()), declined=BIMODAL.format(k=len(x)))
        e = _estimate(metric, got[2], x)
        if len(x) >= MIN_SEEDS and (mixed := _mixed(self, (row,), got[1])):
            return Estimate(e.center, log=e.log, declined=MIXED.format(n=mixed[0], k=mixed[1]))
        return e

    def interval(self, value: str, row: str, length: int) -> Optional[Interval]:
        """``value`` (a metric's name: ppl, bpb, ratio to 1x, ...) of ``row`` at ``length`` with its interval, kept
        within the metric's range; None without numbers or where no interval is valid (a task over seeds)."""
        e = self.estimate(value, row, length)
        if e is None:
            return None
        metric = metrics.get(value)
        counts = self._counts(value, row, length) if metric.difference else None
        if counts is not None and len(counts) == 1:  # one seed's exact match: its exact binomial interval
            lo, hi = clopper_pearson(int(counts[0].sum()), counts.shape[1], self.ci)
            return Interval(e.value, lo, hi)
        return e.interval(self.ci, metric.bounds)

    def level(self, row: str, length: int) -> Optional[str]:
        """The level of ``row``'s own interval at ``length``: METHOD with MIN_SEEDS seeds, else CHECKPOINT."""
        n = self.seeds_measured(row, length)
        return None if n == 0 else METHOD if n >= MIN_SEEDS else CHECKPOINT

    # ------------------------------------------------------------------------------------- the comparisons

    def against_null(self, value: str, row: str, length: int) -> Optional[Comparison]:
        """``row``'s ``value`` at ``length`` against the metric's null (a ratio to 1x against 1): its estimate, or
        the exact sign-flip test of its per-seed logs where its seeds disagree on learning."""
        got = self._at(value, (row,), length)
        if got is None:
            return None
        metric, (x,), seeds, clusters = metrics.get(value), got[0], got[1], got[2]
        k, common = len(x), _common(self, metric, len(x))
        if k >= MIN_SEEDS and (mixed := _mixed(self, (row,), seeds)):
            return _sign_flip(np.log(x[:, 0]), MIXED.format(n=mixed[0], k=mixed[1]), True, common)
        return Comparison(_estimate(metric, clusters, x), **common)

    def compare(self, value: str, row: str, ref: str, length: int) -> Optional[Comparison]:
        """``row`` / ``ref`` of ``value`` at ``length`` (``row`` - ``ref`` for a metric compared as a difference),
        paired by seed and text; None without a seed where both have a number."""
        got = self._at(value, (row, ref), length)
        if got is None:
            return None
        metric = metrics.get(value)
        (a, b), seeds, clusters = got
        k, common = len(a), _common(self, metric, len(a))
        mixed = _mixed(self, (row, ref), seeds) if k >= MIN_SEEDS else None
        if not metric.difference and not mixed:
            return Comparison(_estimate(metric, clusters, a / b), **common)
        diff = a[:, 0] - b[:, 0] if metric.difference else np.log(a[:, 0] / b[:, 0])  # (k,)
        if k >= MIN_SEEDS:  # the exact sign-flip test over seeds: valid whatever the seeds' distribution
            why = MIXED.format(n=mixed[0], k=mixed[1]) if mixed else BIMODAL.format(k=k)
            return _sign_flip(diff, why, not metric.difference, common)
        ca, cb = self._counts(value, row, length), self._counts(value, ref, length)
        if ca is not None and cb is not None:  # one seed, 0/1 outcomes on the same instances: McNemar's exact test
            only_a, only_b = int(((ca == 1) & (cb == 0)).sum()), int(((ca == 0) & (cb == 1)).sum())
            e = Estimate(float(diff[0]), exact_p=mcnemar_p(only_a, only_b), declined="no interval: McNemar's exact test",
                         min_p=mcnemar_p(only_a + only_b, 0))
            return Comparison(e, **common)
        bounds = (metric.bounds[0] - metric.bounds[1], metric.bounds[1] - metric.bounds[0]) if metric.bounds else None
        return Comparison(_estimate(metric, clusters, a - b), bounds=bounds, **common)

    # ----------------------------------------------------------------------------------------- description

    def seeds_measured(self, row: str, length: int) -> int:
        """How many training seeds of ``row`` have a number at ``length``."""
        if row not in self.rows or length not in self.lengths:
            return 0
        return int(self.draws.measured[self.rows.index(row), :, self.lengths.index(length)].sum())

    def windows(self, length: int) -> int:
        """Independent windows at ``length``: the targets / length (windows share no context)."""
        if self.kind.instances:
            return self.n_units  # test instances, each its own sequence
        return max(1, round(self.n_units * self.unit_size / length)) if self.unit_size else 0

    def describe(self) -> str:
        """One line for a caption: what the intervals are."""
        return _describe(self)



def _estimate(metric: metrics.Metric, clusters: int, x: np.ndarray) -> Estimate:
    """The estimate of the mean over seeds of ``x`` (k, 1 + draws) on ``metric``'s inference scale: the seeds' part
    (with two or more) and the text's, the bootstrap's spread over ``clusters`` independent clusters (declined
    with fewer than two: one cluster's draws all give the same value, a spread of 0 that is no interval)."""
    log = not metric.difference
    if clusters < 2:
        center = float((np.log(x[:, 0]) if log else x[:, 0]).mean())
        why = ONE_CLUSTER.format(weight=(metric.weight or "units").replace("_", " "))
        return Estimate(center, log=log, declined=why)
    if log:
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.log(x)
    k = len(x)
    center = float(x[:, 0].mean())
    parts = []
    if k >= MIN_SEEDS:
        parts.append((float(x[:, 0].std(ddof=1)) / math.sqrt(k), k - 1))
    text = x[:, 1:].mean(0)  # (draws,): the mean over seeds in each draw of the text
    text = text[np.isfinite(text)]
    if len(text) > 1:  # a bootstrap of G clusters sees (G - 1) / G of the variance of their mean
        parts.append((float(text.std(ddof=1)) * math.sqrt(clusters / (clusters - 1)),
                      clusters - 1 if clusters < 1000 else NORMAL_DF))
    return Estimate(center, tuple(parts), log=log)


def _mixed(iv: "Intervals", rows: tuple[str, ...], seeds: list) -> Optional[tuple[int, int]]:
    """(seeds learned, seeds) of the first of ``rows`` whose seeds disagree on learning; None where none do."""
    for row in rows:
        flags = [iv.learned[row, s] for s in seeds if (row, s) in iv.learned]
        if len(set(flags)) > 1:
            return sum(flags), len(flags)
    return None


def _common(iv: "Intervals", metric: metrics.Metric, k: int) -> dict:
    """What every comparison of ``metric`` over ``k`` seeds in common carries besides its estimate."""
    return dict(level=METHOD if k >= MIN_SEEDS else CHECKPOINT, seeds=k, ci=iv.ci, null=metric.null,
                min_effect=metric.smallest)


def _sign_flip(diff: np.ndarray, why: str, log: bool, common: dict) -> Comparison:
    """The comparison of paired per-seed differences ``diff`` (k,) by the exact sign-flip test, no interval
    (``why``); "no finding possible at k seeds" where even every seed one way cannot reach the level."""
    nonzero = int((np.abs(diff) > 1e-12).sum())  # seeds that differ: the others give the test nothing
    k = len(diff)
    note = ("" if nonzero == 0 or smallest_sign_flip_p(nonzero) < 1 - common["ci"]  # no seed differs: a tie, decided
            else f"no finding possible at {k} seeds" if nonzero == k else f"no finding possible: {nonzero} of {k} seeds differ")
    e = Estimate(float(diff.mean()), exact_p=sign_flip_p(diff), declined=why, log=log,
                 min_p=smallest_sign_flip_p(nonzero))
    return Comparison(e, note=note, **common)


def _seeds_one(iv: "Intervals") -> bool:
    """Whether some row has a number at some length from fewer than MIN_SEEDS seeds."""
    counts = iv.draws.measured.sum(axis=1)  # (R, L)
    return bool(((counts > 0) & (counts < MIN_SEEDS)).any())


def _describe(self: "Intervals") -> str:
    """One line for a caption: what the intervals are."""
    if self.problem:
        return f"intervals: not available ({self.problem})"
    text = self.draws.describe(self.kind)
    if self.kind.instances:
        seed_level = (f"exact match over {_seeds_text(self)}: no interval (bimodal), rows compared by the exact "
                      f"sign-flip test of paired seeds" if len(self.seeds) >= MIN_SEEDS else "")
        one = "one seed: exact (Clopper-Pearson) intervals and McNemar's test on the same instances, " \
              "about this checkpoint" if _seeds_one(self) else ""
    else:
        seed_level = (f"on the log scale, t over {_seeds_text(self)} combined with {text}"
                      if len(self.seeds) >= MIN_SEEDS else "")
        one = (f"{'rows with one seed' if seed_level else 'one seed'}: {text} only, about this checkpoint"
               if _seeds_one(self) else "")
    parts = [p for p in (seed_level, one) if p]
    primary = metrics.get(self.kind.primary)
    smallest = f"{primary.smallest * 100:g} percentage point" if primary.difference else f"{primary.smallest:.1%}"
    return f"intervals: {self.ci:.0%}; " + "; ".join(parts) + f"; differences under {smallest} are not marked"


def seed_values(iv: Intervals, value: str, row: str, length: int, ref: Optional[str] = None) -> Optional[np.ndarray]:
    """(k,): each seed's ``value`` of ``row`` at ``length`` on the whole text (over ``ref``'s at the same seed when
    given: a ratio, or a difference of shares), for the seeds that have it; None without numbers. The seeds one by
    one, no interval: what a reader counts as "every seed points the same way"."""
    got = iv._at(value, (row,) if ref is None else (row, ref), length)
    if got is None:
        return None
    x = got[0]
    return x[0][:, 0] if ref is None else metrics.get(value).compare(x[0][:, 0], x[1][:, 0])


def _seeds_text(iv: Intervals) -> str:
    """Whose values a seed-level estimate is over: the run's seeds, or each row's own when the rows with
    several seeds have different numbers of them (seeds added to some rows later)."""
    per_row = sorted({n for row in iv.rows if (n := sum((row, s) in iv.models for s in iv.seeds)) >= MIN_SEEDS})
    if len(per_row) <= 1:
        return f"the {len(iv.seeds)} training seeds' values"
    return (f"each row's training seeds' values ({per_row[0]}-{per_row[-1]} seeds; a comparison pairs the seeds both "
            "rows have)")


__all__ = ["CI", "CHECKPOINT", "METHOD", "MIN_SEEDS", "MIN_WINDOWS", "Comparison", "Estimate", "Interval",
           "Intervals", "seed_values", "within"]
