"""The text level: one bootstrap of the eval text, shared by every row, seed and length of a set of records.

Each draw picks a multiset of the text's **clusters** and gives every unit its cluster's count: every metric of
every (row, seed, length) is then recomputed from the weighted unit sums, so comparisons stay paired (the same
draw of the text for both rows). A cluster is what is independent:

- text whose units record their document (``units["doc"]``, ``bench/eval/evaluate.py``): a document (a speech,
  a source file, a play). Units of one document share its topic and style, so resampling units as if
  independent makes the spread several times too small;
- text whose units lack document ids (folders made before they were recorded), or that holds fewer than
  MIN_DOCUMENTS documents: a unit, and the caption says so. With so few documents nothing can be said about
  other documents (t(1) is 12.7), so the interval is about these documents' text, resampled by units, and too
  narrow for other text by the documents' share of the variance;
- a task: a test instance (each its own sequence, drawn independently).

A bootstrap of G clusters underestimates the variance of a mean by (G - 1) / G, and its spread is read with
t(G - 1) quantiles (``intervals.py``), so a handful of documents gives a wide interval rather than a wrong one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from posenc_bench import metrics

MIN_DOCUMENTS = 5  # fewer documents than this: the units are resampled (an interval about these documents' text)
DRAWS = 2000  # text bootstrap draws: the bounds move by well under a tenth of the width between bootstrap seeds
SEED = 0  # the bootstrap's own seed: the same results give the same intervals


@dataclass
class Draws:
    """Each metric's per-seed statistic over the text draws, and what was resampled."""

    problem: str = ""  # why there are no draws ("" when there are)
    unit_size: int = 0
    n_units: int = 0
    clusters: int = 0  # independent clusters resampled (documents, units or instances)
    documents: Optional[int] = None  # documents in the text, where the units record them
    measured: np.ndarray = field(default_factory=lambda: np.zeros((0, 0, 0), dtype=bool))  # (R, S, L)
    per_seed: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> (R, S, L, 1 + draws)
    outcomes: dict[str, np.ndarray] = field(default_factory=dict)  # 0/1 unit field -> (R, S, L, units)
    holding: dict[str, np.ndarray] = field(default_factory=dict)  # metric with a weight -> (R, S, L) clusters with some

    def describe(self, kind: metrics.Kind) -> str:
        """What one draw resamples, for a caption."""
        if kind.instances:
            return f"the {self.n_units} {kind.samples} of each size resampled"
        units = f"{self.n_units} units of {self.unit_size} targets"
        if self.documents is None:
            return (f"the text resampled over {units} as if independent (their documents are not recorded: too "
                    "narrow where units share a document)")
        if self.documents < MIN_DOCUMENTS:
            which = "its one document" if self.documents == 1 else f"its {self.documents} documents"
            return (f"the text resampled over {units} of {which} (about this text: units of one document are not "
                    "independent)")
        return f"the text resampled by document ({self.documents} documents, {units})"


def draws_of(records: list[dict], kind: metrics.Kind, grid: tuple[list, list, list, dict], label, draws: int,
             seed: int) -> Draws:
    """The draws of records of one ``kind``: the units' fields summed with the same bootstrap weights for every row,
    seed and length (the text's shared fields once), and each registered metric of the kind computed from them.
    ``grid``: (rows, seeds, lengths, each row's train length)."""
    rows, seeds, lengths, train_len = grid
    problem = units_problem(records, kind)
    if problem:
        return Draws(problem, measured=np.zeros((len(rows), len(seeds), len(lengths)), dtype=bool))
    units = next(r["units"] for r in records if r.get("units"))
    # fields of each record, of any record (key-token fields only where key tokens were identified: NaN elsewhere)
    own = [k for k in dict.fromkeys(k for r in records for k in (r.get("units") or {}))
           if k not in ("size", "doc") and k not in kind.shared_units]
    R, S, L, n = len(rows), len(seeds), len(lengths), len(units[own[0]])
    arrays = {k: np.full((R, S, L, n), np.nan) for k in own}  # (rows, seeds, lengths, units); NaN: no number
    for r in records:
        if r["status"] == "ok" and r.get("units"):
            at = (rows.index(label(r)), seeds.index(r["seed"]), lengths.index(r["eval_len"]))
            for k, a in arrays.items():
                if k in r["units"]:
                    a[at] = r["units"][k]
    measured = ~np.isnan(arrays[own[0]][..., 0])  # (R, S, L): this row has a number at this seed and length
    doc = next((r["units"]["doc"] for r in records if r.get("units") and r["units"].get("doc")), None)
    cluster, documents = _clusters(doc, kind, n)  # (units,) each unit's cluster
    G = int(cluster.max()) + 1
    rng = np.random.default_rng(seed)
    picked = rng.multinomial(G, np.full(G, 1 / G), size=draws)  # (draws, G): each cluster's count in each draw
    # unit weights: row 0 is the data itself (every unit once), rows 1.. the bootstrap draws of the text
    w = np.vstack([np.ones(n), picked[:, cluster]])  # (1 + draws, units)
    missing = ~measured.reshape(-1, 1)  # (R * S * L, 1): no record, or not measured
    sums = {k: np.where(missing, np.nan, np.nan_to_num(a).reshape(-1, n) @ w.T)  # (R * S * L, 1 + draws)
            for k, a in arrays.items()}
    sums |= {k: w @ np.asarray(units[k], dtype=float) for k in kind.shared_units}  # (1 + draws,)
    sums["count"] = w.sum(1)  # (1 + draws,): units drawn
    per_seed: dict[str, np.ndarray] = {}
    with np.errstate(divide="ignore", invalid="ignore"):
        for m in metrics.of_kind(kind.name):
            if m.formula is not None and all(u in sums for u in m.units):
                per_seed[m.name] = m.formula(sums).reshape(R, S, L, -1)  # (R, S, L, 1 + draws)
    for m in metrics.of_kind(kind.name):  # ratios to 1x, from the statistic they divide
        if m.of in per_seed and train_len and all(t in lengths for t in train_len.values()):
            at_1x = np.stack([per_seed[m.of][i, :, lengths.index(train_len[row])]
                              for i, row in enumerate(rows)])  # (R, S, 1 + draws)
            per_seed[m.name] = per_seed[m.of] / at_1x[:, :, None, :]
    outcomes = {m.counts: arrays[m.counts] for m in metrics.of_kind(kind.name) if m.counts in arrays}
    weighted = [m for m in metrics.of_kind(kind.name) if m.weight in arrays]  # LongPPL's, where key tokens are
    in_cluster = np.eye(G)[cluster] if weighted else None  # (units, G): made only for a metric that needs it
    holding = {m.name: ((np.nan_to_num(arrays[m.weight]) @ in_cluster) > 0).sum(-1) for m in weighted}  # (R, S, L)
    return Draws("", units.get("size", 1), n, G, documents, measured, per_seed, outcomes, holding)


def _clusters(doc: Optional[list], kind: metrics.Kind, n: int) -> tuple[np.ndarray, Optional[int]]:
    """(each unit's cluster index (units,), the number of documents or None where the units do not record them)."""
    if kind.instances or doc is None:
        return np.arange(n), None
    ids = {d: i for i, d in enumerate(dict.fromkeys(doc))}
    if len(ids) < MIN_DOCUMENTS:
        return np.arange(n), len(ids)
    return np.array([ids[d] for d in doc]), len(ids)


def units_problem(records: list[dict], kind: metrics.Kind) -> str:
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
    shapes = {(r["units"]["size"], *(tuple(r["units"][k]) for k in kind.shared_units[:1]),
               tuple(r["units"].get("doc") or ())) for r in ok if r.get("units")}
    if len({s[:2] for s in shapes}) > 1:
        return "the records' units are not the same text"
    if len({s[2] for s in shapes if s[2]}) > 1:
        return "the records' units are not the same documents"
    if len(next(iter(shapes))[1]) < 2:  # a bootstrap of one unit has no spread: no interval, no finding
        return "one resampling unit holds all the eval text: score more text, or use a smaller unit"
    return ""
