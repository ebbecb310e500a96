"""A cell's numbers over its seeds: the mean and spread, and each seed's ppl relative to 1x.

A cell (a row at one eval length) holds one record per training seed. The report's tables, the gate and the
figures all reduce it the same way, here: its status is ok when any seed has a number, else diverged when any
seed diverged, else n/a; its number is the mean over the ok seeds with the sample std (ddof 1), none with one
seed. The ratio to 1x divides each seed's ppl by the same row's and seed's ppl at the train length before any
mean, so what a seed's training gave every length cancels and only the extrapolation is left.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

from posenc_bench import metrics

RATIO = "ratio_1x"  # the key ``with_ratio_to_1x`` adds to each record


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def mean_std(values: Sequence[float]) -> tuple[float, Optional[float]]:
    """The mean and the sample standard deviation (ddof 1); the std is None for one value: no spread to see."""
    m = mean(values)
    if len(values) < 2:
        return m, None
    return m, math.sqrt(sum((v - m) ** 2 for v in values) / (len(values) - 1))


def ratios_to_1x(records: Sequence[dict]) -> list[Optional[float]]:
    """Each record's ppl divided by the ppl of the same row and seed at the train length (1x); None where
    either is not an ok number (the record's own, or its row and seed have no ok 1x)."""
    at_1x = {(r["encoding"], r["seed"]): r.get("ppl") for r in records
             if r["eval_len"] == r["train_len"] and r["status"] == "ok"}
    out = []
    for r in records:
        base = at_1x.get((r["encoding"], r["seed"]))
        out.append(r["ppl"] / base if r["status"] == "ok" and base and r.get("ppl") is not None else None)
    return out


def with_ratio_to_1x(records: Sequence[dict]) -> list[dict]:
    """Copies of ``records``, each with its ratio to 1x under RATIO (None where there is none)."""
    return [{**r, RATIO: x} for r, x in zip(records, ratios_to_1x(records))]


def with_value(records: Sequence[dict], metric: metrics.Metric) -> tuple[Sequence[dict], str]:
    """``records`` and the key under which each holds ``metric``'s value: its own field; RATIO for a ratio to
    1x; or, for a metric no record field holds (a plugin's), copies with the value computed from the record's
    per-unit numbers under the metric's name."""
    if metric.of is not None:
        return with_ratio_to_1x(records), RATIO
    field = metric.record_field
    if all(field in r for r in records):
        return records, field
    return [{**r, field: metrics.record_value(metric, r)} for r in records], field


@dataclass
class Seeds:
    """One cell's records reduced to one value (``over_seeds``)."""

    status: str  # ok | diverged | n/a
    values: list[float]  # one per ok seed that has the value
    seeds: int  # records in the cell
    reason: str = ""  # of the first seed that is not ok (its status where it gives no reason)


def over_seeds(group: Sequence[dict], key: str) -> Seeds:
    """The records of one cell, one per seed, for the value ``key`` ('ppl', 'bpb', RATIO)."""
    ok = [float(r[key]) for r in group if r["status"] == "ok" and r.get(key) is not None]
    bad = [r for r in group if r["status"] != "ok"]
    status = "ok" if ok else "diverged" if any(r["status"] == "diverged" for r in group) else "n/a"
    return Seeds(status, ok, len(group), str(bad[0].get("reason") or bad[0]["status"]) if bad else "")
