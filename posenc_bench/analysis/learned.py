"""Did each model learn? Decided seed by seed from its records at 1x, before any statistics are made.

A model that did not learn says nothing about its encoding by failing past its train length, and a seed that did
not learn is a different population from one that did: the statistics (``stats/intervals.py``) give no seed-level
interval over seeds that disagree, and the tables flag the row, naming the seeds. Two rules:

- text: a model that uses its context predicts later positions of a window better than the first ones;
- a task: a model that solves the task at its train size gets at least LEARNED_ACCURACY of the instances.

A zero-shot row (a RoPE scaling, a fix, sinks) evaluates another row's trained model: it takes that model's flag
(a fix that fails at 1x is not a model that did not learn).
"""

from __future__ import annotations

from typing import Optional

from posenc_bench.bench.rows import Row
from posenc_bench.errors import PosencError

# A model that uses its context predicts later positions of a window better than the first ones. At 1x, the
# test loss over the second half of the window must be this many nats below the first position bucket's (the
# bucket is the longest eval length / eval.position_buckets wide: positions 0-7 in the default run, 0-31 in
# sotu-512), seed by seed: one seed that did not learn is flagged. The note names the positions and seeds.
PLATEAU_MARGIN = 0.05
# A task's counterpart: exact match at 1x at least this, seed by seed.
LEARNED_ACCURACY = 0.9


def late_buckets(rec: dict) -> list[dict]:
    """One record's position buckets over the second half of its window."""
    return [b for b in rec.get("loss_by_position") or [] if b["start"] >= rec["eval_len"] // 2]


def early_late(rec: dict) -> Optional[tuple[float, float]]:
    """One record's loss in its first position bucket and over the second half of its window."""
    late = late_buckets(rec)
    if rec["status"] != "ok" or not late:
        return None
    first = rec["loss_by_position"][0]["loss"]
    return first, sum(b["loss"] * b["tokens"] for b in late) / sum(b["tokens"] for b in late)


def model_row(records: list[dict], row: str) -> str:
    """The row whose trained model ``row`` evaluates, where the records hold it (a zero-shot scaling, fix or sinks
    row takes its checkpoint's flag: it was never trained, and a fix that fails at 1x is not a model that did not
    learn); else ``row`` itself."""
    try:
        model = Row.parse(row).model.name
    except PosencError:  # a row name this version does not know (an older results file): its own records
        return row
    return model if any(r["encoding"] == model for r in records) else row


def seed_learned(records: list[dict], row: str) -> dict[int, bool]:
    """seed -> whether the model ``row`` evaluates learned, seed by seed (a failed seed is not hidden in a mean): a
    task's exact match at 1x at least LEARNED_ACCURACY; text whose 1x loss late in the window is at least
    PLATEAU_MARGIN below its first position bucket's. Seeds without the numbers are left out."""
    model = model_row(records, row)
    out = {}
    for r in records:
        if r["encoding"] != model or r["eval_len"] != r["train_len"] or r["status"] != "ok":
            continue
        if r.get("metric") == "accuracy":
            if r.get("accuracy") is not None:
                out[r["seed"]] = r["accuracy"] >= LEARNED_ACCURACY
        elif (p := early_late(r)) is not None:
            out[r["seed"]] = p[0] - p[1] >= PLATEAU_MARGIN
    return dict(sorted(out.items()))


def unlearned_seeds(records: list[dict], row: str) -> list[int]:
    """The seeds of ``row`` whose model did not learn (``seed_learned``)."""
    return [s for s, ok in seed_learned(records, row).items() if not ok]
