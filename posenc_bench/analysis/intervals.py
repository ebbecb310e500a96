"""Intervals from the per-unit numbers of results files: a paired two-level bootstrap.

Every record of a run keeps, for each resampling unit (a block of consecutive targets, the run's longest eval
length long, see ``bench/evaluate.py``), the NLL sum, target count and byte count. A unit is the same text at
every length and for every row, so one bootstrap draw picks a multiset of units (the same for every row and
length: comparisons stay paired) and, with several seeds, a multiset of training seeds (the same seed numbers
for every row: seed s of two rows saw the same batches in the same order). Each draw recomputes every
statistic exactly as the table does (ppl = exp(sum NLL / targets) per seed, then the mean over seeds), and
the interval is the percentile interval of the draws.

What it covers: the sampling of the eval text (units) and, with two or more seeds, of the training seed. What
it does not: units of one segment are consecutive text, so neighbours are mildly dependent, and at a length
that does not divide the unit (1.5x) a window spans two units and the second one's first targets see the
first one's text. Both make the interval a little narrow; the unit is as long as the longest window so that at
the longest length each unit is its own window and no unit's context reaches into another.

With fewer than ``MIN_SEEDS`` seeds the interval between two different trained models covers the text only:
another seed can move a model by more than that, so such comparisons carry no significance mark. Rows that
evaluate the same trained model (a zero-shot scaling against its base) differ only through the text, and may
be compared with one seed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

CI = 0.95  # default level
DRAWS = 2000  # bootstrap draws: the percentile bounds move by well under a tenth of the width between seeds
SEED = 0  # the bootstrap's own seed: the same results give the same intervals
MIN_SEEDS = 3  # seeds needed before two different trained models are compared
MIN_WINDOWS = 30  # below this many independent windows at a length, the table says so
VALUES = ("ppl", "bpb", "ratio")


@dataclass(frozen=True)
class Interval:
    value: float  # the point estimate (what the table prints)
    lo: float
    hi: float

    def excludes(self, x: float) -> bool:
        return self.lo > x or self.hi < x


@dataclass(frozen=True)
class Comparison:
    """``row`` / ``ref`` of one value at one length, paired: ``kind`` is "paired" (text and seeds, or the same
    trained model), "text-only" (different trained models, too few seeds: no significance claimed)."""

    interval: Interval
    kind: str

    @property
    def significant(self) -> Optional[bool]:
        return None if self.kind == "text-only" else self.interval.excludes(1.0)


def model_of(rec: dict) -> str:
    """What a record evaluated: its cell key (a trained or fine-tuned model of ours), or the pretrained model."""
    if rec.get("cell_key"):
        return rec["cell_key"]
    return json.dumps(rec.get("model") or {}, sort_keys=True)


class Intervals:
    """The bootstrap draws of every (row, length) of a set of records measured on the same text.

    ``records``: results records (one run, or several runs of the same text whose rows are told apart by
    ``label(rec)``, as the gate does with a baseline and a current run)."""

    def __init__(self, records: Iterable[dict], *, ci: float = CI, draws: int = DRAWS, seed: int = SEED,
                 label=lambda r: r["encoding"]) -> None:
        if not 0 < ci < 1:
            raise ValueError(f"confidence level must be between 0 and 1, got {ci!r}")
        self.ci = ci
        records = list(records)
        self.rows = list(dict.fromkeys(label(r) for r in records))
        self.seeds = sorted({r["seed"] for r in records})
        self.lengths = sorted({r["eval_len"] for r in records})
        self.train_len = {label(r): r["train_len"] for r in records}
        self.models: dict[tuple[str, int], str] = {(label(r), r["seed"]): model_of(r) for r in records}
        self.problem = _units_problem(records)
        self.unit_size = self.n_units = 0
        self._measured = np.zeros((len(self.rows), len(self.seeds), len(self.lengths)), dtype=bool)  # (R, S, L)
        if self.problem:
            return
        units = next(r["units"] for r in records if r.get("units"))
        self.unit_size, self.n_units = units["size"], len(units["nll"])
        R, S, L = len(self.rows), len(self.seeds), len(self.lengths)
        nll = np.full((R, S, L, self.n_units), np.nan)  # (rows, seeds, lengths, units); NaN: no number
        for r in records:
            if r["status"] == "ok" and r.get("units"):
                nll[self.rows.index(label(r)), self.seeds.index(r["seed"]), self.lengths.index(r["eval_len"])] = \
                    r["units"]["nll"]
        self._measured = ~np.isnan(nll[..., 0])  # (R, S, L): this row has a number at this seed and length
        tokens = np.asarray(units["tokens"], dtype=float)  # (units,)
        nbytes = np.asarray(units["bytes"], dtype=float)
        rng = np.random.default_rng(seed)
        # counts: row 0 is the data itself (every unit and seed once), rows 1.. the bootstrap draws
        w = np.vstack([np.ones(self.n_units), rng.multinomial(self.n_units, np.full(self.n_units, 1 / self.n_units),
                                                              size=draws)])  # (1 + draws, units)
        v = np.vstack([np.ones(S), rng.multinomial(S, np.full(S, 1 / S), size=draws)])  # (1 + draws, seeds)
        missing = np.isnan(nll[..., 0]).reshape(-1, 1)  # (R * S * L, 1): no record, or not measured
        sums = np.where(missing, np.nan, np.nan_to_num(nll).reshape(-1, self.n_units) @ w.T)  # (R * S * L, 1 + draws)
        mean_nll = (sums / (w @ tokens)).reshape(R, S, L, -1)  # (R, S, L, 1 + draws)
        per_seed = {"ppl": np.exp(mean_nll), "bpb": (sums / (w @ nbytes) / np.log(2)).reshape(R, S, L, -1)}
        if self.train_len and all(t in self.lengths for t in self.train_len.values()):
            at_1x = np.stack([per_seed["ppl"][i, :, self.lengths.index(self.train_len[row])]
                              for i, row in enumerate(self.rows)])  # (R, S, 1 + draws)
            per_seed["ratio"] = per_seed["ppl"] / at_1x[:, :, None, :]
        self._seed_weights = v  # (1 + draws, S)
        self._draws = {k: self._over_seeds(x) for k, x in per_seed.items()}  # value -> (R, L, 1 + draws)

    def _over_seeds(self, per_seed: np.ndarray) -> np.ndarray:
        """The mean over a draw's seeds of the seeds with a number (R, S, L, D) -> (R, L, D); NaN where none."""
        has = np.isfinite(per_seed[..., 0])  # (R, S, L): this seed has a number here
        weight = self._seed_weights.T[None, :, None, :] * has[..., None]  # (R, S, L, D)
        total = weight.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(total > 0, (np.nan_to_num(per_seed) * weight).sum(1) / total, np.nan)

    @property
    def available(self) -> bool:
        return not self.problem

    def _bounds(self, draws: np.ndarray) -> Interval:
        q = (1 - self.ci) / 2
        lo, hi = np.nanquantile(draws[1:], [q, 1 - q])
        return Interval(float(draws[0]), float(lo), float(hi))

    def _draws_of(self, value: str, row: str, length: int) -> Optional[np.ndarray]:
        if self.problem or value not in self._draws or row not in self.rows or length not in self.lengths:
            return None
        d = self._draws[value][self.rows.index(row), self.lengths.index(length)]
        return None if np.isnan(d[0]) else d

    def interval(self, value: str, row: str, length: int) -> Optional[Interval]:
        """``value`` (ppl | bpb | ratio to 1x) of ``row`` at ``length`` with its interval; None without numbers."""
        d = self._draws_of(value, row, length)
        return None if d is None else self._bounds(d)

    def same_model(self, a: str, b: str) -> bool:
        """Whether rows a and b evaluate the same trained model at every seed (a scaling and its base)."""
        return all(self.models.get((a, s)) == self.models.get((b, s)) for s in self.seeds)

    def compare(self, value: str, row: str, ref: str, length: int, *, paired: bool = True) -> Optional[Comparison]:
        """``row`` / ``ref`` of ``value`` at ``length``. ``paired=False`` resamples the two rows' units
        independently (what a comparison without shared targets would give), for reference only."""
        a, b = self._draws_of(value, row, length), self._draws_of(value, ref, length)
        if a is None or b is None:
            return None
        if not paired:
            b = np.concatenate([b[:1], np.random.default_rng(SEED + 1).permutation(b[1:])])
        # seeds are resampled only where both rows have enough of them: a folder can hold rows run with
        # different --seeds, and a one-seed row's interval knows nothing of how another seed moves it
        seeds = min(self.seeds_measured(r, length) for r in (row, ref))
        kind = "paired" if self.same_model(row, ref) or seeds >= MIN_SEEDS else "text-only"
        return Comparison(self._bounds(a / b), kind)

    def seeds_measured(self, row: str, length: int) -> int:
        """How many training seeds of ``row`` have a number at ``length``."""
        if row not in self.rows or length not in self.lengths:
            return 0
        return int(self._measured[self.rows.index(row), :, self.lengths.index(length)].sum())

    def windows(self, length: int) -> int:
        """Independent windows at ``length``: the targets / length (windows share no context)."""
        return max(1, round(self.n_units * self.unit_size / length)) if self.unit_size else 0

    def describe(self) -> str:
        """One line for a caption: what the intervals resample."""
        if self.problem:
            return f"intervals: not available ({self.problem})"
        seeds = (f"{len(self.seeds)} training seeds and " if len(self.seeds) > 1 else "")
        text_only = ""
        if len(self.seeds) < MIN_SEEDS:
            text_only = (f"; with fewer than {MIN_SEEDS} seeds, rows that are different trained models are not "
                         "compared (text-only intervals)")
        elif any(self._measured[i].any(axis=1).sum() < MIN_SEEDS for i in range(len(self.rows))):
            text_only = (f"; rows with fewer than {MIN_SEEDS} seeds are not compared with other trained models "
                         "(text-only intervals)")
        return (f"intervals: {self.ci:.0%}, paired bootstrap over {seeds}{self.n_units} units of "
                f"{self.unit_size} targets{text_only}")


def _units_problem(records: list[dict]) -> str:
    """Why these records cannot give intervals ("" when they can): no per-unit numbers, or units that are not
    the same text in every record."""
    ok = [r for r in records if r["status"] == "ok"]
    if not ok:
        return "no measured records"
    if not any(r.get("units") for r in ok):
        return "these results predate per-unit numbers; rerun to get them"
    shapes = {(r["units"]["size"], tuple(r["units"]["tokens"])) for r in ok if r.get("units")}
    if len(shapes) > 1:
        return "the records' units are not the same text"
    if len(next(iter(shapes))[1]) < 2:  # a bootstrap of one unit has no spread: no interval, no finding
        return "one resampling unit holds all the eval text: score more text, or use a smaller unit"
    return ""
