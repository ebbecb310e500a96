"""What the numbers rest on: did each model learn to use its context, and what did each evaluation cost.

The training table shows each row's train loss along the run and, at 1x, its test loss early in the window
against the second half: a model stuck on the no-position plateau predicts from a few local bytes, so its loss
hardly falls with position, and its extrapolation numbers say little about its encoding. The report flags such
a row (``on_plateau``, PLATEAU_MARGIN) on every table. The cost table shows each evaluation's wall time and
peak memory, for results that measured it (``eval`` of a Hugging Face model).
"""

from __future__ import annotations

from typing import Optional

import pandas as pd

from posenc_bench import metrics
from posenc_bench.analysis.learned import (LEARNED_ACCURACY, PLATEAU_MARGIN, early_late, late_buckets, model_row,
                                           seed_learned, unlearned_seeds)
from posenc_bench.analysis.stats.seeds import mean

CONTEXT_TITLES = {
    "training": "Training (train loss, nats) and context use at 1x (test loss early vs late in the window), each the "
                "mean over the row's seeds",
    "cost": "Cost of each evaluation: wall time, and peak memory (records that measured it; = base: the row reuses "
            "the base model's numbers there)",
    "depths": "The needle: exact match at each depth of the filler (0: first, 1: last; lines) and size (columns), the "
              "mean over the row's seeds; effective size: the largest size at which every depth is at least 90%",
}
TRAINING_ONLY_TITLE = "Training (train loss, nats), each the mean over the row's seeds"
CONTEXT_USE_ONLY_TITLE = "Context use at 1x (test loss early vs late in the window, nats), each the mean over the row's seeds"


def context_title(value: str, frame: pd.DataFrame, split: str = "test") -> str:
    """The title of a context table, saying only what it shows: a training table without context-use columns (a
    task's: its records have no loss by position) or without train-loss columns (a pretrained model's: we did
    not train it); one scored on another split than test names it."""
    title = CONTEXT_TITLES[value]
    if value == "training" and not any(str(c).startswith("1x loss") for c in frame.columns):
        title = TRAINING_ONLY_TITLE
    elif value == "training" and not any(str(c).startswith("train loss") for c in frame.columns):
        title = CONTEXT_USE_ONLY_TITLE
    return title.replace("(test loss", f"({'eval' if split == 'all' else split} loss")


PLATEAU_NOTE = ("uses only local context on {seeds}: at 1x its loss over positions {late} is not {margin:g} nats below "
                "its loss over positions {early}, so on {those} its extrapolation numbers say little about the encoding")


def context_use(records: list[dict], row: str) -> Optional[tuple[float, float]]:
    """(loss of the first position bucket, loss over the second half of the window) at 1x for ``row``, the
    mean over its measured seeds: the measure of the training table. None without loss-by-position numbers."""
    pairs = [p for r in records if r["encoding"] == row and r["eval_len"] == r["train_len"]
             and (p := early_late(r)) is not None]
    if not pairs:
        return None
    return mean([p[0] for p in pairs]), mean([p[1] for p in pairs])


def late_spread(records: list[dict], row: str) -> Optional[float]:
    """The noise scale of ``context_use`` for ``row``: how much its 1x bucket losses over the second half of the
    window scatter (there the loss has about stopped falling, and buckets differ by their text), the mean over its
    seeds. Measured from neighbouring buckets (von Neumann: the root of half their mean squared difference), so a
    slow trend along the half, as in a row that degrades with position, hardly counts as scatter. A gap within a
    few of these is not measured by the row's eval text."""
    sds = []
    for r in records:
        if r["encoding"] == row and r["eval_len"] == r["train_len"] and early_late(r) is not None:
            late = [b["loss"] for b in late_buckets(r)]
            if len(late) > 1:
                sds.append((sum((y - x) ** 2 for x, y in zip(late, late[1:])) / (2 * (len(late) - 1))) ** 0.5)
    return mean(sds) if sds else None


def context_positions(records: list[dict], row: str) -> Optional[tuple[str, str]]:
    """The positions ``context_use`` compares for ``row`` at 1x, as text: ("0-7", "64-127") in the default run."""
    rec = next((r for r in records if r["encoding"] == row and r["eval_len"] == r["train_len"]
                and early_late(r) is not None), None)
    if rec is None:
        return None
    first, L = rec["loss_by_position"][0], rec["eval_len"]
    return f"{first['start']}-{first['end'] - 1}", f"{L // 2}-{L - 1}"


def on_plateau(records: list[dict], row: str) -> bool:
    """Whether some seed of ``row``'s model did not learn to use its context (see PLATEAU_MARGIN)."""
    return not metrics.kind_of(records).instances and bool(unlearned_seeds(records, row))


def plateau_rows(records: list[dict]) -> list[str]:
    """The rows of ``records`` with a seed whose model does not use its context (``on_plateau``)."""
    return [row for row in dict.fromkeys(r["encoding"] for r in records) if on_plateau(records, row)]


UNLEARNED_NOTE = ("did not learn the task on {seeds} (exact match at 1x {values}, below {threshold:.0%}): on "
                  "{those} its extrapolation numbers say nothing about the encoding")


def unlearned(records: list[dict], row: str) -> bool:
    """Whether some seed of a task row's model has exact match at 1x below LEARNED_ACCURACY."""
    return metrics.kind_of(records).instances and bool(unlearned_seeds(records, row))


def unlearned_rows(records: list[dict]) -> list[str]:
    """The rows of a task run with a seed that did not learn the task (``unlearned``)."""
    return [row for row in dict.fromkeys(r["encoding"] for r in records) if unlearned(records, row)]


def _which(bad: list[int], of: int) -> tuple[str, str]:
    """("seeds 1, 2 of 6", "those seeds"): the seeds a note names, and how it refers back to them."""
    if len(bad) == of:
        return (f"every seed ({of})" if of > 1 else "its one seed"), ("every seed" if of > 1 else "it")
    return f"seed{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))} of {of}", \
        ("those seeds" if len(bad) > 1 else "that seed")


def plateau_note(records: list[dict], row: str) -> Optional[str]:
    """The footnote of a row with a seed whose model did not learn, naming the seeds (and a task's exact match at
    1x on each, or the positions a text row's loss compares); None where every seed learned. A zero-shot row's
    note is its model's, and says so."""
    flags = seed_learned(records, row)
    bad = [s for s, ok in flags.items() if not ok]
    if not bad:
        return None
    model = model_row(records, row)
    seeds, those = _which(bad, len(flags))
    whose = f"its model ({model}) " if model != row else ""
    if metrics.kind_of(records).instances:
        at_1x = {r["seed"]: r["accuracy"] for r in records if r["encoding"] == model and r["eval_len"] == r["train_len"]
                 and r["status"] == "ok"}
        values = ", ".join(f"{at_1x[s]:.3f}" for s in bad)
        return whose + UNLEARNED_NOTE.format(seeds=seeds, values=values, threshold=LEARNED_ACCURACY, those=those)
    early, late = context_positions(records, model)
    return whose + PLATEAU_NOTE.format(early=early, late=late, margin=PLATEAU_MARGIN, seeds=seeds, those=those)


# ------------------------------------------------------------------------------------------ the tables


def training_table(records: list[dict], row_order: list[str] | None = None) -> pd.DataFrame:
    """Did each model learn to use context? Train loss along the run, and at 1x the loss of the first
    positions of a window against its second half: a model stuck on the no-position plateau predicts from
    a few local bytes, so its loss hardly falls with position. The mean over each row's seeds, which is what
    the plateau flag reads (``on_plateau``)."""
    rows = []
    for enc in row_order or list(dict.fromkeys(r["encoding"] for r in records)):
        recs = sorted((r for r in records if r["encoding"] == enc and r["eval_len"] == r["train_len"]),
                      key=lambda x: x["seed"])
        if not recs:
            continue
        row = {"encoding": enc}
        curves = [dict(c[:2] for c in r["train_curve"]) for r in recs if r.get("train_curve")]
        full = max(curves, key=max, default=None)  # the longest curve: a diverged seed's stops early
        for frac in (0.25, 0.5, 1.0):
            if full:
                last = max(full)
                step = min(full, key=lambda s: abs(s - frac * last))
                row[f"train loss @ step {step}"] = f"{mean([c[step] for c in curves if step in c]):.3f}"
        if (use := context_use(records, enc)) is not None:
            early, late = context_positions(records, enc)
            row[f"1x loss, positions {early}"] = f"{use[0]:.3f}"
            row[f"1x loss, positions {late}"] = f"{use[1]:.3f}"
        else:
            bad = [f"{r['status']} (seed {r['seed']})" for r in recs if r["status"] != "ok"]
            row["status"] = "; ".join(bad) if bad else "ok"  # each seed that did not train, by name
        rows.append(row)
    return pd.DataFrame(rows).set_index("encoding") if rows else pd.DataFrame()


def cost_table(records: list[dict], row_order: list[str] | None = None) -> pd.DataFrame:
    """Wall time and peak memory of each (row, length) of seed 0, for runs whose records measured peak memory
    (``eval`` of a Hugging Face model); empty otherwise."""
    if not any(r.get("peak_memory_bytes") for r in records):
        return pd.DataFrame()
    rows = []
    for enc in row_order or list(dict.fromkeys(r["encoding"] for r in records)):
        recs = sorted((r for r in records if r["encoding"] == enc and r["seed"] == min(x["seed"] for x in records)),
                      key=lambda r: r["eval_len"])
        row = {"encoding": enc}
        for r in recs:
            col = f"{r['eval_len']:,}"
            if r.get("same_as"):
                row[col] = "= base"
            elif r["status"] != "ok":
                row[col] = r["status"]
            else:
                peak = r.get("peak_memory_bytes")
                row[col] = f"{r['eval_time_s']:.0f} s" + (f", {peak / 2**30:.2f} GiB" if peak else "")
        rows.append(row)
    return pd.DataFrame(rows).set_index("encoding") if rows else pd.DataFrame()


def depth_table(records: list[dict], row_order: list[str] | None = None) -> pd.DataFrame:
    """The needle (``bench/tasks/needle.py``): each row's exact match at each depth (a line each) and size (a
    column each), the mean over its seeds, and its effective size: the largest size at which every depth is
    answered at least LEARNED_ACCURACY of the time ("none" when no size is). Empty for other runs."""
    if not any(r.get("by_depth") for r in records):
        return pd.DataFrame()
    rows = []
    for enc in row_order or list(dict.fromkeys(r["encoding"] for r in records)):
        recs = [r for r in records if r["encoding"] == enc and r["status"] == "ok" and r.get("by_depth")]
        sizes = sorted({r["eval_len"] for r in recs})
        depths = sorted({d for r in recs for d in r["by_depth"]}, key=float)
        got = {(d, L): mean([r["by_depth"][d] for r in recs if r["eval_len"] == L]) for d in depths for L in sizes}
        effective = max((L for L in sizes if all(got[d, L] >= LEARNED_ACCURACY for d in depths)), default=None)
        for i, d in enumerate(depths):
            row = {"encoding": enc, "depth": d, **{f"{L:,}": f"{got[d, L]:.2f}" for L in sizes}}
            row["effective size"] = ("none" if effective is None else f"{effective:,}") if i == 0 else ""
            rows.append(row)
    return pd.DataFrame(rows).set_index("encoding") if rows else pd.DataFrame()


CONTEXT_TABLES = {"training": training_table, "cost": cost_table, "depths": depth_table}  # in CONTEXT_TITLES order
