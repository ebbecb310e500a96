"""The metric registry: one registration per metric, which every table, finding, plot and gate check asks.

A **metric** (:class:`Metric`) says how one number is computed from a record's per-unit numbers, whether lower
or higher is better, how two rows are compared (a ratio, or a difference of shares), the smallest difference
worth marking, the gate's tolerance for it and the captions of its table and figure. A **kind**
(:class:`Kind`) is what a record measures, its ``metric`` field: text (``ppl``: units of consecutive targets
with their NLL, token and byte counts) or a task (``accuracy``: one unit per test instance). A kind names the
metric compared between rows, the metric of its ratio to 1x (if it has one) and the report's default tables.

Each module of this package registers its metrics when imported (``MODULES`` first, in table order, then any
other module of the package by name, so a new metric is its file and its test); a plugin registers more from
its own package through the entry-point group ``posenc_bench.metrics`` (each entry point names a module that
calls :func:`register` when imported), so adding a metric touches one file and its test, never the tables,
findings, plots or gate. ``analysis/stats/intervals.py`` draws every metric of a kind from the same bootstrap of the
units, so a new metric gets its seed-level and text-level intervals with no code of its own.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Iterable, Optional

import numpy as np

from posenc_bench.errors import PosencError

MIN_EFFECT = 0.001  # a relative difference below this is never marked, whatever its interval
MIN_POINTS = 0.01  # a share (exact match): a difference below one percentage point is never marked
SHARE = (0.0, 1.0)  # the range of a share
ENTRY_POINTS = "posenc_bench.metrics"  # the group a plugin's metrics are registered under
MODULES = ("ppl", "bpb", "ratio", "exact_match", "passkey")  # this package's first metrics, in table order

Sums = dict  # unit field -> its weighted sum over the units: (cells, 1 + draws), or (1 + draws,) for a shared field


class MetricError(PosencError):
    """An unknown metric or kind (the message lists the valid ones), or a metric registered twice."""


@dataclass(frozen=True)
class Kind:
    """What a record measures (its ``metric`` field) and how its per-unit numbers are laid out."""

    name: str  # the records' ``metric`` field: "ppl" (text), "accuracy" (a task)
    primary: str  # the metric compared between rows (findings, ``--compare``)
    tables: tuple[str, ...]  # the report's default tables (context tables included)
    to_1x: Optional[str] = None  # the metric of each row's ratio to its own 1x, where the kind has one
    shared_units: tuple[str, ...] = ()  # unit fields that are the text's, the same in every record
    instances: bool = False  # units are test instances (each its own sequence), not blocks of one text
    samples: str = "units"  # what a unit is, in a caption
    in_results: bool = True  # its records live in results.json (``report`` tables); the passkey test's do not


@dataclass(frozen=True)
class Metric:
    """One number of a results file: its table, its intervals, its comparisons and its gate check."""

    name: str  # the table value (``report --value``) and, where records hold it, their field
    kind: str  # the Kind whose records it is computed from
    title: str  # the table's title
    higher_is_better: bool = False
    difference: bool = False  # compared as A - B (shares), else as A / B
    units: tuple[str, ...] = ()  # the per-unit fields ``formula`` reads
    formula: Optional[Callable[[Sums], np.ndarray]] = None  # weighted unit sums -> the statistic
    of: Optional[str] = None  # a ratio to 1x: this metric of the row over the same metric at its train length
    field: Optional[str] = None  # the record field holding the value (default: ``name``; None with ``of``)
    bounds: Optional[tuple[float, float]] = None  # the range of the value (a share: 0 to 1)
    min_effect: Optional[float] = None  # smallest marked difference (default: MIN_POINTS for a difference)
    gate_tolerance: Optional[str] = None  # the gate config's field of its tolerance; None: not gated
    tolerance: float = 0.02  # the tolerance when the gate config has no such field (a plugin's metric)
    compare_title: str = ""  # ``report --compare``'s title, with {ref}
    plot: Optional[tuple[str, str, str]] = None  # (figure title with {ci}, y label, file stem); None: no figure
    at_1x: bool = True  # compared at the train length too (a ratio to 1x is 1 there by definition)
    counts: Optional[str] = None  # the unit field of 0/1 successes (one per instance) that makes a share binomial
    no_value: str = ""  # why a record with its unit fields can have no value (``formula``'s 0/0), for the footnote
    ranked: bool = True  # rows compare by it (best marks, findings); False: it is the same for every row
    digits: int = 0  # the fewest decimals its table shows (a share of a few per mille: 4)
    weight: Optional[str] = None  # the unit field its value rests on where units can hold none (LongPPL's key
    # tokens): the text's independent clusters are then only those holding some (``analysis/stats/text.py``)

    @property
    def null(self) -> float:
        """The value of a comparison that shows no difference: a ratio of 1, a difference of 0."""
        return 0.0 if self.difference else 1.0

    @property
    def smallest(self) -> float:
        """The smallest difference a table or finding marks, however narrow its interval."""
        if self.min_effect is not None:
            return self.min_effect
        return MIN_POINTS if self.difference else MIN_EFFECT

    @property
    def record_field(self) -> Optional[str]:
        """The record field that holds the value; None for a ratio to 1x (computed from two records)."""
        return None if self.of is not None else (self.field or self.name)

    def compare(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Row a against row b, elementwise: a - b for a difference, a / b for a ratio."""
        return a - b if self.difference else a / b

    def better(self, a: float, b: float) -> bool:
        return a > b if self.higher_is_better else a < b

    def of_units(self, units: dict) -> Optional[float]:
        """The value of one record from its own per-unit numbers (every unit once), for a metric that no record
        field holds (a plugin's); None without them, or where they give none (``no_value``: a 0/0)."""
        if self.formula is None or not units or any(u not in units for u in self.units):
            return None
        sums = {u: np.asarray([sum(units[u])], dtype=float) for u in self.units}
        sums["count"] = np.asarray([float(len(units[self.units[0]]))])
        with np.errstate(divide="ignore", invalid="ignore"):
            value = float(self.formula(sums)[0])
        return value if np.isfinite(value) else None

    def held_by(self, records: Iterable[dict]) -> bool:
        """Whether any of ``records`` holds the per-unit fields this metric is computed from: LongPPL's key-token
        sums are in the runs that identified key tokens only (``plot`` draws no LongPPL figure elsewhere)."""
        return any(set(self.units) <= set(r.get("units") or {}) for r in records)


REGISTRY: dict[str, Metric] = {}
KINDS: dict[str, Kind] = {}


def register(metric: Metric) -> Metric:
    """Make ``metric`` known to every table, finding, plot and gate check. A name registered twice is an error."""
    if metric.name in REGISTRY:
        raise MetricError(f"metric {metric.name!r} is registered twice")
    REGISTRY[metric.name] = metric
    return metric


def register_kind(kind: Kind) -> Kind:
    if kind.name in KINDS:
        raise MetricError(f"kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def unregister(name: str) -> None:
    """Forget the metric ``name`` (a plugin's, in tests)."""
    REGISTRY.pop(name, None)


@functools.cache
def _load() -> None:
    """Import this package's metric modules, then every plugin's (entry-point group ``posenc_bench.metrics``),
    once: the first question asked of the registry does it."""
    others = sorted({p.stem for p in Path(__file__).parent.glob("*.py")} - {"__init__", "registry", *MODULES})
    for module in (*MODULES, *others):  # a new file here is found: nothing else to edit
        importlib.import_module(f"posenc_bench.metrics.{module}")  # each registers its metrics
    for entry in metadata.entry_points(group=ENTRY_POINTS):
        try:
            importlib.import_module(entry.value.split(":")[0])
        except Exception as e:  # a broken plugin: one line naming it, not a traceback
            raise MetricError(f"metric plugin {entry.value!r} (entry point {entry.name!r} of group {ENTRY_POINTS}) "
                              f"could not be imported: {type(e).__name__}: {e}") from None


def names(kind: Optional[str] = None) -> list[str]:
    """Every metric's name in registration order (this package's first); with ``kind``, that kind's only."""
    _load()
    return [m.name for m in REGISTRY.values() if kind is None or m.kind == kind]


def kinds(in_results: bool = False) -> list[str]:
    """Every kind of record's name (``in_results``: only those whose records live in results files)."""
    _load()
    return [k.name for k in KINDS.values() if k.in_results or not in_results]


def tabled() -> list[str]:
    """The metrics a report can tabulate: those of every kind whose records live in results files."""
    _load()
    return [m.name for m in REGISTRY.values() if KINDS[m.kind].in_results]


def get(name: str) -> Metric:
    """The metric ``name``; MetricError listing the valid ones for an unknown name."""
    _load()
    if name not in REGISTRY:
        raise MetricError(f"unknown metric {name!r}; valid: {', '.join(REGISTRY)}")
    return REGISTRY[name]


def kind(name: str) -> Kind:
    _load()
    if name not in KINDS:
        raise MetricError(f"unknown kind of record {name!r}; valid: {', '.join(KINDS)}")
    return KINDS[name]


def kind_of(records: Iterable[dict]) -> Kind:
    """What a set of records measures: a task when any record says so, else text (records written before the
    field existed are text records)."""
    _load()
    found = {r.get("metric") or "ppl" for r in records}
    return next((KINDS[k] for k in KINDS if k in found and k != "ppl"), KINDS["ppl"])


def of_kind(kind_name: str) -> list[Metric]:
    """The metrics computed from records of ``kind_name``, in registration order."""
    _load()
    return [m for m in REGISTRY.values() if m.kind == kind_name]


def record_value(metric: Metric, record: dict) -> Optional[float]:
    """``metric`` of one record: its field where the record holds one, else from its per-unit numbers."""
    field = metric.record_field
    if field is not None and record.get(field) is not None:
        return record[field]
    return metric.of_units(record.get("units") or {}) if field is not None and field not in record else None
