"""The table model: results files become tables of cells, one value per table, with intervals and flags.

One or several runs (``results.json`` each) become :class:`Table` s: rows are encoding rows, columns are (run,
eval length), cells are :class:`Cell` s (mean over seeds, std, its interval, seeds, status, footnote, best in
its column or tied with it). ``compare_table`` holds each row's ppl relative to a reference row with its
paired interval. Numbers over seeds come from ``analysis/stats/seeds.py``, intervals and significance from
``analysis/stats/intervals.py``; ``annotate`` adds the flags a reader needs beside the numbers (a row whose model
does not use its context, few windows, text-only comparisons). Row order, column order and footnote numbering
depend only on the results, so a regenerated table diffs cleanly. ``analysis/report.py`` renders them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Sequence

from posenc_bench import metrics
from posenc_bench.analysis.context import plateau_note
from posenc_bench.analysis.stats.estimate import CHECKPOINT
from posenc_bench.analysis.stats.family import Family, correct
from posenc_bench.analysis.stats.intervals import CI, MIN_SEEDS, MIN_WINDOWS, Intervals
from posenc_bench.analysis.stats.seeds import mean_std, over_seeds, with_value
from posenc_bench.analysis.runs import ReportError, Run, is_pretrained, kind_of, row_order

CHECKPOINT_NOTE = (f"† this checkpoint: fewer than {MIN_SEEDS} seeds in common, so the interval covers the text only and "
                   "describes these trained models, not their recipe; another seed can move a model by more")
ONE_SEED_NOTE = ("one seed: every interval and mark in this table is about this checkpoint (these trained models on "
                 "this text), not about the methods; another seed can move a model by more than the text does")
PRETRAINED_NOTE = ("one pretrained model: every interval and mark in this table is about this checkpoint on this text, "
                   "not about the methods; another model can rank its rows differently")


def _fmt_ratio(r: float) -> str:
    return f"{r:g}x" if r == int(r) else f"{r:.3g}x"


@dataclass
class Cell:
    status: str = "missing"  # ok | n/a | diverged | missing (no record: the run did not have this row)
    mean: float | None = None
    std: float | None = None  # sample std over seeds (ddof 1); None with one seed
    seeds_ok: int = 0
    seeds: int = 0
    reason: str = ""  # of the first seed that is not ok
    note: str = ""  # footnote mark, e.g. "[1]"
    best: bool = False
    lo: float | None = None  # the interval (analysis/stats/intervals.py); None without per-unit numbers
    hi: float | None = None
    tied: bool = False  # with the best of its column: the interval of the ratio to it includes 1
    significant: Optional[bool] = None  # best: better than every other row; other rows: differs from the best
    checkpoint: bool = False  # its mark rests on a comparison of one seed: about this checkpoint (shown †)
    spread: Optional[tuple[float, float]] = None  # (lowest, highest seed) where no interval is valid (a task)


@dataclass
class Column:
    run: str  # run label ("" when the report has one run)
    eval_len: int
    train_len: int

    def header(self) -> str:
        text = f"{_fmt_ratio(self.eval_len / self.train_len)} ({self.eval_len})"
        return f"{self.run}: {text}" if self.run else text


@dataclass
class Table:
    value: str
    title: str
    rows: list[str]
    columns: list[Column]
    cells: dict[tuple[str, int], Cell] = field(default_factory=dict)  # (row, column index) -> Cell
    digits: int = 2
    row_notes: dict[str, str] = field(default_factory=dict)  # row -> footnote mark on its name (the plateau flag)
    notes: list[str] = field(default_factory=list)  # footnote lines of the table as a whole
    family: Optional[Family] = None  # the comparisons its marks rest on, corrected together


# ----------------------------------------------------------------------------------------------- the tables


def _summarize(group: list[dict], value: str) -> Cell:
    seeds = over_seeds(group, value)
    cell = Cell(seeds.status, seeds_ok=len(seeds.values), seeds=seeds.seeds, reason=seeds.reason)
    if seeds.values:
        cell.mean, cell.std = mean_std(seeds.values)
    return cell


def build_table(runs: Sequence[Run], value: str, *, digits: int = 2, mark_best: bool = True,
                notes: dict[str, str] | None = None, intervals: Optional[dict[str, Intervals]] = None) -> Table:
    """One value (a registered metric: 'ppl' | 'bpb' | 'ratio' | ...) for every row of every run. ``notes`` (reason -> mark) is shared
    between the tables of one report, so a reason has the same footnote number everywhere. ``intervals`` (run
    label -> Intervals) adds each cell's interval and decides bold and ties by significance."""
    if value not in metrics.tabled():
        raise ReportError(f"unknown table value {value!r}; valid: {', '.join(metrics.tabled())}")
    metric = metrics.get(value)
    notes = {} if notes is None else notes
    intervals = intervals or {}
    rows = list(dict.fromkeys(r for run in runs for r in row_order(run.data)))
    columns: list[Column] = []
    groups: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        records, key = with_value(run.data["records"], metric)
        for L, T in sorted({(rec["eval_len"], rec["train_len"]) for rec in records}):
            columns.append(Column(run.label, L, T))
            for rec in records:
                if rec["eval_len"] == L and rec["train_len"] == T:
                    groups.setdefault((rec["encoding"], len(columns) - 1), []).append(rec)
    rows = [r for r in rows if any((r, j) in groups for j in range(len(columns)))]
    table = Table(value, metric.title, rows, columns, digits=max(digits, metric.digits))
    for row in rows:  # reading order, so footnotes number left to right, top to bottom
        for j in range(len(columns)):
            group = groups.get((row, j))
            cell = _summarize(group, key) if group else Cell()
            if cell.status == "n/a" and not cell.reason and metric.no_value and metric.held_by(group):
                cell.reason = metric.no_value  # the records hold its unit fields, which give no value (a 0/0)
            if cell.reason:
                cell.note = notes.setdefault(cell.reason, f"[{len(notes) + 1}]")
            iv = intervals.get(columns[j].run)
            if cell.status == "ok" and iv is not None and iv.available:
                if (i := iv.interval(value, row, columns[j].eval_len)) is not None:
                    cell.mean, cell.lo, cell.hi = i.value, i.lo, i.hi  # the estimate the interval is about
                elif metric.weight and (e := iv.estimate(value, row, columns[j].eval_len)) and e.declined:
                    cell.note = notes.setdefault(e.declined, f"[{len(notes) + 1}]")  # e.g. its key tokens in one unit
                elif cell.seeds_ok >= MIN_SEEDS:  # no valid interval (a task over seeds): the seeds' range
                    g = [float(x) for x in over_seeds(group, key).values]
                    cell.spread, cell.std = (min(g), max(g)), None
            table.cells[row, j] = cell
    if not metric.ranked:
        _one_row(table)
    if mark_best and metric.ranked:
        _mark_best(table, intervals)
    return table


EVERY_ROW = "every row"  # the one row of a value that is the same for every row (``Metric.ranked`` False)


def _one_row(table: Table) -> None:
    """A value the same for every row (the evaluator's share of key tokens) as one row, ``EVERY_ROW``, where every
    row's cells agree at every length (a row without a value there aside); rows that disagree stay as they are,
    each shown, since then the value is not what its metric says it is."""
    merged: dict[int, Cell] = {}
    for j in range(len(table.columns)):
        cells = [table.cells[r, j] for r in table.rows if table.cells[r, j].status == "ok"]
        if any((c.mean, c.lo, c.hi, c.note) != (cells[0].mean, cells[0].lo, cells[0].hi, cells[0].note) for c in cells):
            return
        merged[j] = cells[0] if cells else table.cells[table.rows[0], j]
    table.rows = [EVERY_ROW]
    table.cells = {(EVERY_ROW, j): cell for j, cell in merged.items()}


def _mark_best(table: Table, intervals: dict[str, Intervals]) -> None:
    """In each column, the best mean. With intervals it is bold only when it is a finding against every other row
    (each row compared with it, the table's comparisons corrected together by Benjamini-Hochberg: ``Table.family``);
    otherwise it and the rows not shown to differ from it are marked tied (for best). A mark that rests on a
    comparison of one seed is about this checkpoint (``Cell.checkpoint``). Without intervals (older results) the
    best mean at the printed precision is bold. Never in a ratio table's 1x column (all 1.00 by definition), nor in
    a column with fewer than two numbers."""
    pending = []  # (column, best row, {row: comparison})
    for j, col in enumerate(table.columns):
        if table.value == "ratio" and col.eval_len == col.train_len:
            continue
        shown = {row: c.mean for row in table.rows if (c := table.cells[row, j]).status == "ok" and c.mean is not None}
        if len(shown) < 2:
            continue
        iv = intervals.get(col.run)
        pick = max if metrics.get(table.value).higher_is_better else min  # accuracy: the highest
        if iv is None or not iv.available:
            best = pick(round(v, table.digits) for v in shown.values())
            for row, v in shown.items():
                table.cells[row, j].best = round(v, table.digits) == best
            continue
        best = pick(shown, key=shown.get)
        pending.append((j, best, {row: iv.compare(table.value, row, best, col.eval_len) for row in shown
                                  if row != best}))
    undecided: set[str] = set()
    flat = [c for _, _, cs in pending for c in cs.values()]
    table.family, adjusted = correct("each row against the best of its column", flat, _level(intervals))
    it = iter(adjusted)
    for j, best, cs in pending:
        comparisons = {row: next(it) for row in cs}
        for row, c in comparisons.items():
            cell = table.cells[row, j]
            cell.significant = None if c is None else c.significant
            cell.tied = cell.significant is False and c.possible  # a test that could not decide ties nothing
            cell.checkpoint = cell.tied and c.level == CHECKPOINT
        top = table.cells[best, j]
        decided = [c for c in comparisons.values() if c is not None and c.possible]  # an exact test over too few
        # seeds cannot decide: such a row neither stops a bold nor is tied (the table's note names it)
        top.significant = top.best = bool(decided) and all(c is not None and (c.significant or not c.possible)
                                                           for c in comparisons.values())
        undecided.update(row for row, c in comparisons.items() if c is not None and not c.possible)
        top.tied = any(cell.tied for row, cell in ((r, table.cells[r, j]) for r in comparisons))  # tied for best
        top.checkpoint = (top.best or top.tied) and any(c.level == CHECKPOINT for c in comparisons.values()
                                                        if c is not None)
    if undecided:
        table.notes.append(f"{', '.join(r for r in table.rows if r in undecided)}: in some column no test could tell it "
                           "from the best (the exact sign-flip test, used for a task or where a row's seeds disagree "
                           "on learning, cannot go below p = 2 / 2^n over n seeds that differ): unmarked there")


def _level(intervals: dict[str, Intervals]) -> float:
    """The level of a table's intervals and of its correction: its runs' (the report's --ci), else CI."""
    return next(iter(intervals.values())).ci if intervals else CI


def compare_table(runs: Sequence[Run], ref: str, intervals: dict[str, Intervals], *, digits: int = 2,
                  value: Optional[str] = None, notes: dict[str, str] | None = None) -> Table:
    """Every row against ``ref`` at the same length (seed means), with the paired interval: ppl as a ratio, or a
    task's exact match (``value``: or its answer-token share) as a difference. A comparison without an interval
    (declined: e.g. its key tokens in one unit) gets the footnote of its reason from ``notes`` (shared as in
    ``build_table``)."""
    notes = {} if notes is None else notes
    rows = list(dict.fromkeys(r for run in runs for r in row_order(run.data)))
    if not any(ref == rec["encoding"] for run in runs for rec in run.data["records"]):
        raise ReportError(f"--compare {ref!r}: no such row in the results; rows: {', '.join(rows)}")
    columns = [Column(run.label, L, T) for run in runs
               for L, T in sorted({(r["eval_len"], r["train_len"]) for r in run.data["records"]})]
    kinds = {kind_of(run).name: kind_of(run) for run in runs}
    value = value or (next(iter(kinds.values())).primary if len(kinds) == 1 else "ppl")
    table = Table("compare", metrics.get(value).compare_title.format(ref=ref), rows, columns, digits=digits)
    made = {}
    for row in rows:
        for j, col in enumerate(columns):
            iv = intervals.get(col.run)
            made[row, j] = iv.compare(value, row, ref, col.eval_len) if iv is not None else None
    ci = _level(intervals)
    table.family, adjusted = correct(f"every row against {ref} at every length",  # the reference itself is no member
                                     [c if row != ref else None for (row, _), c in made.items()], ci)
    for (row, j), c in zip(made, adjusted):
        c = made[row, j] if row == ref else c
        if c is None:
            table.cells[row, j] = Cell()
            continue
        i = c.estimate.interval(ci, c.bounds)  # the table's level: the mark says what survives the correction
        lo, hi = (i.lo, i.hi) if i is not None else (None, None)
        if c.significant:
            note = "*"
        elif c.estimate.declined and row != ref:  # no interval: the footnote says why
            note = notes.setdefault(c.estimate.declined, f"[{len(notes) + 1}]")
        else:
            note = ""
        table.cells[row, j] = Cell("ok", c.value, lo=lo, hi=hi, significant=c.significant, note=note,
                                   checkpoint=c.level == CHECKPOINT)
    table.rows = [r for r in rows if any(table.cells[r, j].status == "ok" for j in range(len(columns)))]
    return table


def seeds_note(run: Run, rows: Sequence[str]) -> Optional[str]:
    """Which seeds each row was measured at, when rows differ (a sweep that added seeds to some rows later):
    the caption lists the run's seeds, and a row's interval rests on its own. None when every row has the same."""
    by_row: dict[str, list[int]] = {}
    for r in run.data["records"]:
        if r["encoding"] in rows:
            by_row.setdefault(r["encoding"], []).append(r["seed"])
    groups: dict[tuple[int, ...], list[str]] = {}
    for row in rows:
        if row in by_row:
            groups.setdefault(tuple(sorted(set(by_row[row]))), []).append(row)
    if len(groups) < 2:
        return None
    parts = [f"{', '.join(rs)}: {len(seeds)} seed{'s' if len(seeds) > 1 else ''} ({','.join(map(str, seeds))})"
             for seeds, rs in sorted(groups.items(), key=lambda g: (-len(g[0]), g[0]))]
    return (f"{run.label}: " if run.label else "") + "Seeds per row (each row's interval rests on its own): " + "; ".join(parts)


def annotate(table: Table, runs: Sequence[Run], intervals: dict[str, Intervals], notes: dict[str, str]) -> None:
    """The flags a reader needs beside the numbers: rows whose model does not use its context (footnote on the
    row), lengths with few independent windows, and marks about this checkpoint (one seed): said once for a
    run of one seed, with † on each such cell otherwise."""
    for run in runs:
        for row in table.rows:
            if (note := plateau_note(run.data["records"], row)) is not None:
                table.row_notes[row] = notes.setdefault(note, f"[{len(notes) + 1}]")
    for j, col in enumerate(table.columns):
        iv = intervals.get(col.run)
        if iv is not None and iv.available and iv.windows(col.eval_len) < MIN_WINDOWS:
            n = iv.windows(col.eval_len)
            samples = (iv.kind.samples if iv.kind.instances else
                       f"independent window{'s' if n != 1 else ''} of {col.eval_len} tokens")
            table.notes.append(f"{col.header()}: only {n} {samples}; its intervals rest on few samples")
    table.notes += [n for run in runs if (n := seeds_note(run, table.rows)) is not None]
    one_seed = [iv is not None and iv.available and len(iv.seeds) < MIN_SEEDS for iv in
                (intervals.get(col.run) for col in table.columns)]
    for (row, j), cell in table.cells.items():
        cell.checkpoint = cell.checkpoint and not one_seed[j]
    pretrained = {run.label for run in runs if is_pretrained(run)}
    for note, which in ((ONE_SEED_NOTE, False), (PRETRAINED_NOTE, True)):
        runs_one = sorted({col.run for col, one in zip(table.columns, one_seed) if one and (col.run in pretrained) == which})
        if runs_one:
            table.notes.append((f"{', '.join(runs_one)}: " if runs_one != [""] else "") + note[0].upper() + note[1:])
    if any(c.checkpoint for c in table.cells.values()):
        table.notes.append(CHECKPOINT_NOTE)
