"""Intervals from the per-unit numbers of results files: a seed level valid for few seeds, a text level for one.

Every record of a run keeps, for each resampling unit (a block of consecutive targets, the run's longest eval
length long, see ``bench/eval/evaluate.py``), the NLL sum, target count and byte count. A unit is the same text at
every length and for every row, so one bootstrap draw of the text picks a multiset of units, the same for
every row, seed and length: comparisons stay paired. Each draw recomputes each seed's statistic exactly as the
table does (ppl = exp(sum NLL / targets), or a ratio of two of them).

A statistic (a row's ppl, or the paired ratio of two rows at one length) has one value per training seed.

- **Seed level** (two or more seeds with a number in both rows): what the table claims is about the recipe,
  and the seeds are the samples. The interval is the mean over the k per-seed values +- h, where h combines
  the seeds' t half-width, t(k - 1) * s / sqrt(k), with the text's, z * the sd of the seed mean over the text
  bootstrap: h^2 = h_seed^2 + h_text^2. The text is shared by every seed, so s does not see it. Each part is
  exact when it dominates; in between, h is at least what is needed (it covers 95-98% at 3 seeds with a
  nominal 95%, where Welch-Satterthwaite's t over s^2 / k + var_text covers 92%). A percentile bootstrap over
  3 seeds gives about [worst seed, best seed], which covers the truth far less often than its level says
  (``tests/analysis/test_coverage.py`` measures both on simulated results with a known answer). A scaling or
  fix against its base over every seed of the base (each seed's own base checkpoint) is such a comparison.
- **Checkpoint level** (one seed in common): the percentile interval of the text bootstrap. It describes these
  trained models on this population of text and nothing else: another seed of the same recipe can move them by
  more than the text does. Tables, findings and figures say "this checkpoint" wherever it is used.

Every value is a registered metric (``posenc_bench/metrics``): its formula over the weighted unit sums gives
each draw's statistic, and it says how two rows compare (a ratio, or a difference of shares). A difference
counts only when its interval excludes the null (1, or 0) and its point estimate is at least the metric's
smallest effect from it: a path that differs from another by float rounding, consistently over every unit, is
not a finding.

What the text level does not cover: units of one segment are consecutive text, so neighbours are mildly
dependent, and at a length that does not divide the unit (1.5x) a window spans two units and the second one's
first targets see the first one's text. Both make it a little narrow; the unit is as long as the longest
window so that at the longest length each unit is its own window and no unit's context reaches into another.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Iterable, Optional

import numpy as np

from posenc_bench import metrics
from posenc_bench.metrics import MIN_EFFECT

CI = 0.95  # default level
DRAWS = 2000  # text bootstrap draws: the bounds move by well under a tenth of the width between bootstrap seeds
SEED = 0  # the bootstrap's own seed: the same results give the same intervals
MIN_SEEDS = 2  # seeds in common for a seed-level (method) interval; with fewer it is about this checkpoint
MIN_WINDOWS = 30  # below this many independent windows at a length, the table says so
METHOD, CHECKPOINT = "method", "this checkpoint"  # the two levels of a comparison


@dataclass(frozen=True)
class Interval:
    value: float  # the point estimate (what the table prints)
    lo: float
    hi: float

    def excludes(self, x: float) -> bool:
        return self.lo > x or self.hi < x


def within(interval: Interval, bounds: Optional[tuple[float, float]]) -> Interval:
    """``interval`` kept within ``bounds`` (None: as it is). A t-interval over a few seeds that disagree can reach
    past a share's range; the mean cannot, so the interval is cut there, and what it says about 0 is unchanged."""
    if bounds is None:
        return interval
    return Interval(interval.value, max(bounds[0], interval.lo), min(bounds[1], interval.hi))


@dataclass(frozen=True)
class Comparison:
    """``row`` / ``ref`` of one value at one length, paired by seed and text. ``level`` is METHOD (seed level:
    a claim about the recipe) or CHECKPOINT (one seed in common: a claim about these trained models only)."""

    interval: Interval
    level: str
    seeds: int  # seeds in common
    null: float = 1.0  # no difference: a ratio of 1, or a difference of 0 (a task's accuracy)
    min_effect: float = MIN_EFFECT

    @property
    def significant(self) -> bool:
        """The interval excludes the null and the estimate is at least ``min_effect`` from it."""
        return self.interval.excludes(self.null) and abs(self.interval.value - self.null) >= self.min_effect


def model_of(rec: dict) -> str:
    """What a record evaluated: its cell key (a trained or fine-tuned model of ours), or the pretrained model."""
    if rec.get("cell_key"):
        return rec["cell_key"]
    return json.dumps(rec.get("model") or {}, sort_keys=True)


# --------------------------------------------------------------------------------- Student's t quantile


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


def _beta_inc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (any real df > 0)."""
    tail = 0.5 * _beta_inc(df / 2.0, 0.5, df / (df + t * t))
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


# ------------------------------------------------------------------------------------------ the intervals


class Intervals:
    """The text bootstrap of every (row, seed, length) of a set of records measured on the same text, and the
    seed- or checkpoint-level interval of each statistic built from it.

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
        self.problem = _units_problem(records, self.kind)
        self.unit_size = self.n_units = 0
        self._measured = np.zeros((len(self.rows), len(self.seeds), len(self.lengths)), dtype=bool)  # (R, S, L)
        self._per_seed: dict[str, np.ndarray] = {}
        if self.problem:
            return
        self.unit_size, self.n_units, self._measured, self._per_seed = _draws(records, self, label, draws, seed)

    @property
    def available(self) -> bool:
        return not self.problem

    def _values(self, value: str, rows: tuple[str, ...], length: int) -> Optional[np.ndarray]:
        """(k, 1 + draws): the statistic of each seed where every one of ``rows`` has a number (their ratio for
        two rows), data first and then the text draws; None where no seed has one."""
        if self.problem or value not in self._per_seed or length not in self.lengths \
                or any(r not in self.rows for r in rows):
            return None
        j = self.lengths.index(length)
        x = [self._per_seed[value][self.rows.index(r), :, j] for r in rows]  # each (S, 1 + draws)
        stat = x[0] if len(x) == 1 else metrics.get(value).compare(x[0], x[1])
        stat = stat[np.isfinite(stat[:, 0])]
        return stat if len(stat) else None

    def _interval(self, x: np.ndarray) -> tuple[Interval, str]:
        """The interval of the mean over seeds of ``x`` (k, 1 + draws), and its level (module docstring)."""
        k, value = len(x), float(x[:, 0].mean())
        text = x[:, 1:].mean(0)  # (draws,): the mean over seeds in each draw of the text
        if k < MIN_SEEDS:
            if not len(text):
                return Interval(value, value, value), CHECKPOINT
            q = (1 - self.ci) / 2
            lo, hi = np.quantile(text, [q, 1 - q])
            return Interval(value, float(lo), float(hi)), CHECKPOINT
        p = (1 + self.ci) / 2
        seed_half = t_quantile(p, k - 1) * float(x[:, 0].std(ddof=1)) / math.sqrt(k)  # the seeds' t half-width
        text_half = NormalDist().inv_cdf(p) * float(text.std(ddof=1)) if len(text) > 1 else 0.0
        half = math.hypot(seed_half, text_half)
        return Interval(value, value - half, value + half), METHOD

    def interval(self, value: str, row: str, length: int) -> Optional[Interval]:
        """``value`` (a metric's name: ppl, bpb, ratio to 1x, ...) of ``row`` at ``length`` (its mean over seeds)
        with its interval, kept within the metric's range; None without numbers."""
        x = self._values(value, (row,), length)
        return None if x is None else within(self._interval(x)[0], metrics.get(value).bounds)

    def level(self, row: str, length: int) -> Optional[str]:
        """The level of ``row``'s own interval at ``length``: METHOD with MIN_SEEDS seeds, else CHECKPOINT."""
        n = self.seeds_measured(row, length)
        return None if n == 0 else METHOD if n >= MIN_SEEDS else CHECKPOINT

    def same_model(self, a: str, b: str) -> bool:
        """Whether rows a and b evaluate the same trained model at every seed (a scaling and its base)."""
        return all(self.models.get((a, s)) == self.models.get((b, s)) for s in self.seeds)

    def compare(self, value: str, row: str, ref: str, length: int, *, paired: bool = True) -> Optional[Comparison]:
        """``row`` / ``ref`` of ``value`` at ``length`` (``row`` - ``ref`` for a metric compared as a difference):
        the mean over their common seeds of each seed's ratio (difference). ``paired=False`` draws the two rows' text independently (what a comparison without shared targets
        would give), for reference only."""
        x = self._values(value, (row, ref), length)
        if x is None:
            return None
        metric = metrics.get(value)
        if not paired:
            a, b = self._values(value, (row,), length), self._values(value, (ref,), length)
            shuffled = np.random.default_rng(SEED + 1).permutation(b[:, 1:].T).T  # (k, draws): other text draws
            x = metric.compare(a[: len(b)], np.concatenate([b[:, :1], shuffled], axis=1))
        interval, level = self._interval(x)
        if metric.difference and metric.bounds:  # a difference of two values in [lo, hi] lies in [lo - hi, hi - lo]
            lo, hi = metric.bounds
            interval = within(interval, (lo - hi, hi - lo))
        return Comparison(interval, level, len(x), null=metric.null, min_effect=metric.smallest)

    def seeds_measured(self, row: str, length: int) -> int:
        """How many training seeds of ``row`` have a number at ``length``."""
        if row not in self.rows or length not in self.lengths:
            return 0
        return int(self._measured[self.rows.index(row), :, self.lengths.index(length)].sum())

    def windows(self, length: int) -> int:
        """Independent windows at ``length``: the targets / length (windows share no context)."""
        if self.kind.instances:
            return self.n_units  # test instances, each its own sequence
        return max(1, round(self.n_units * self.unit_size / length)) if self.unit_size else 0

    def describe(self) -> str:
        """One line for a caption: what the intervals are."""
        if self.problem:
            return f"intervals: not available ({self.problem})"
        text = (f"the {self.n_units} {self.kind.samples} of each size resampled" if self.kind.instances else
                f"the text resampled over {self.n_units} units of {self.unit_size} targets")
        seed_level = (f"t-intervals over {_seeds_text(self)}, widened by {text}" if len(self.seeds) >= MIN_SEEDS
                      else "")
        one = self.seeds_one()
        checkpoint = (f"{'rows with one seed' if seed_level else 'one seed'}: {text} only, about this checkpoint"
                      if one else "")
        parts = [p for p in (seed_level, checkpoint) if p]
        primary = metrics.get(self.kind.primary)
        smallest = f"{primary.smallest * 100:g} percentage point" if primary.difference else f"{primary.smallest:.1%}"
        return f"intervals: {self.ci:.0%}; " + "; ".join(parts) + f"; differences under {smallest} are not marked"

    def seeds_one(self) -> bool:
        """Whether some row has a number at some length from fewer than MIN_SEEDS seeds."""
        counts = self._measured.sum(axis=1)  # (R, L)
        return bool(((counts > 0) & (counts < MIN_SEEDS)).any())


def seed_values(iv: Intervals, value: str, row: str, length: int, ref: Optional[str] = None) -> Optional[np.ndarray]:
    """(k,): each seed's ``value`` of ``row`` at ``length`` on the whole text (over ``ref``'s at the same seed when
    given), for the seeds that have it; None without numbers. The seeds one by one, no interval: what a reader
    counts as "every seed points the same way"."""
    x = iv._values(value, (row,) if ref is None else (row, ref), length)
    return None if x is None else x[:, 0]


def _seeds_text(iv: "Intervals") -> str:
    """Whose values a seed-level interval is over: the run's seeds, or each row's own when the rows with
    several seeds have different numbers of them (seeds added to some rows later)."""
    per_row = sorted({n for row in iv.rows if (n := sum((row, s) in iv.models for s in iv.seeds)) >= MIN_SEEDS})
    if len(per_row) <= 1:
        return f"the {len(iv.seeds)} training seeds' values"
    return (f"each row's training seeds' values ({per_row[0]}-{per_row[-1]} seeds; a comparison pairs the seeds both "
            "rows have)")


def _draws(records: list[dict], iv: Intervals, label, draws: int, seed: int
           ) -> tuple[int, int, np.ndarray, dict[str, np.ndarray]]:
    """(unit size, units, measured (R, S, L), each metric's per-seed statistic (R, S, L, 1 + draws)) of records
    of one kind: the units' fields summed with the same bootstrap weights for every row, seed and length (the
    text's shared fields once), and each registered metric of the kind computed from those sums."""
    units = next(r["units"] for r in records if r.get("units"))
    own = [k for k in units if k not in ("size", "doc") and k not in iv.kind.shared_units]  # fields of each record
    R, S, L, n = len(iv.rows), len(iv.seeds), len(iv.lengths), len(units[own[0]])
    arrays = {k: np.full((R, S, L, n), np.nan) for k in own}  # (rows, seeds, lengths, units); NaN: no number
    for r in records:
        if r["status"] == "ok" and r.get("units"):
            at = (iv.rows.index(label(r)), iv.seeds.index(r["seed"]), iv.lengths.index(r["eval_len"]))
            for k, a in arrays.items():
                a[at] = r["units"][k]
    measured = ~np.isnan(arrays[own[0]][..., 0])  # (R, S, L): this row has a number at this seed and length
    rng = np.random.default_rng(seed)
    # unit counts: row 0 is the data itself (every unit once), rows 1.. the bootstrap draws of the text
    w = np.vstack([np.ones(n), rng.multinomial(n, np.full(n, 1 / n), size=draws)])  # (1 + draws, units)
    missing = ~measured.reshape(-1, 1)  # (R * S * L, 1): no record, or not measured
    sums = {k: np.where(missing, np.nan, np.nan_to_num(a).reshape(-1, n) @ w.T)  # (R * S * L, 1 + draws)
            for k, a in arrays.items()}
    sums |= {k: w @ np.asarray(units[k], dtype=float) for k in iv.kind.shared_units}  # (1 + draws,)
    sums["count"] = w.sum(1)  # (1 + draws,): units drawn
    per_seed: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for m in metrics.of_kind(iv.kind.name):
            if m.formula is not None and all(u in sums for u in m.units):
                per_seed[m.name] = m.formula(sums).reshape(R, S, L, -1)  # (R, S, L, 1 + draws)
    for m in metrics.of_kind(iv.kind.name):  # ratios to 1x, from the statistic they divide
        if m.of in per_seed and iv.train_len and all(t in iv.lengths for t in iv.train_len.values()):
            at_1x = np.stack([per_seed[m.of][i, :, iv.lengths.index(iv.train_len[row])]
                              for i, row in enumerate(iv.rows)])  # (R, S, 1 + draws)
            per_seed[m.name] = per_seed[m.of] / at_1x[:, :, None, :]
    return units.get("size", 1), n, measured, per_seed


def _units_problem(records: list[dict], kind: metrics.Kind) -> str:
    """Why these records cannot give intervals ("" when they can): no per-unit numbers, or units that are not
    the same text (the same test instances) in every record."""
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        return "no measured records"
    if not any(r.get("units") for r in ok):
        return "these results predate per-unit numbers; rerun to get them"
    if not kind.shared_units:  # test instances: the same number at every size
        first = next(k for k in next(r["units"] for r in ok if r.get("units")) if k != "size")
        shapes = {len(r["units"][first]) for r in ok if r.get("units")}
        return f"the records' {kind.samples} differ in number" if len(shapes) > 1 else ""
    shapes = {(r["units"]["size"], *(tuple(r["units"][k]) for k in kind.shared_units[:1]))
              for r in ok if r.get("units")}
    if len(shapes) > 1:
        return "the records' units are not the same text"
    if len(next(iter(shapes))[1]) < 2:  # a bootstrap of one unit has no spread: no interval, no finding
        return "one resampling unit holds all the eval text: score more text, or use a smaller unit"
    return ""
