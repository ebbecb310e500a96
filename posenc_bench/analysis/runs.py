"""The results files a report reads: each folder's ``results.json`` loaded once, labelled, with its rows in order.

Every other module of ``analysis/`` reads results through a :class:`Run` (its label, path and contents), so the
statistics, findings, tables, plots and gate see the same rows in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from posenc_bench import metrics
from posenc_bench.bench.records import read_results
from posenc_bench.errors import PosencError
from posenc_bench.analysis.stats.intervals import CI, Intervals


class ReportError(PosencError):
    pass


@dataclass
class Run:
    label: str
    path: str
    data: dict


def load_runs(paths: Sequence[str | Path]) -> list[Run]:
    """Read each results folder or file; label runs by folder name (the full path where names repeat)."""
    if not paths:
        raise ReportError("give at least one results folder or results.json")
    datas = [read_results(p) for p in paths]
    names = [Path(p).name if Path(p).is_dir() else Path(p).parent.name for p in paths]
    labels = names if len(set(names)) == len(names) else [str(p) for p in paths]
    if len(paths) == 1:
        labels = [""]
    return [Run(label, str(p), d) for label, p, d in zip(labels, paths, datas)]


def row_order(data: dict) -> list[str]:
    """The rows of one results file: its run's declared order, then any other row its records hold."""
    return list(dict.fromkeys([*(data["run"].get("rows") or []), *(r["encoding"] for r in data["records"])]))


def kind_of(run: Run) -> metrics.Kind:
    """What a results file's records measure (``metrics``): text (perplexity) or a task (exact match)."""
    return metrics.kind_of(run.data["records"])


def is_task(run: Run) -> bool:
    """Whether a results file holds a task run (exact match) rather than text (perplexity)."""
    return kind_of(run).instances


def is_pretrained(run: Run) -> bool:
    """Whether a results file holds an eval of a pretrained (Hugging Face) model: one checkpoint, no seeds."""
    return run.data["run"].get("kind") == "eval" and (run.data["run"].get("model") or {}).get("kind") == "hf"


def train_len(run: dict) -> int:
    """A results file's train length (1x): the run's own, or its config's in older training runs."""
    return run.get("train_len") or run["config"]["train"]["train_len"]


def run_intervals(runs: Sequence[Run], ci: float = CI) -> dict[str, Intervals]:
    """The intervals of each run (by label), built once per report."""
    return {run.label: Intervals(run.data["records"], ci=ci) for run in runs}
