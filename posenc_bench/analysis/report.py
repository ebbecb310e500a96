"""Rendering: the report's tables as Markdown, HTML or LaTeX (via tabulate), or as long-format CSV / JSON.

``render`` builds the tables of one report (``analysis/tables.py``: ppl, bits per byte or ppl relative to 1x,
with intervals; ``--compare REF``: each row's ppl relative to REF) and the context tables
(``analysis/context.py``: training, cost), and writes them with their captions (``analysis/captions.py``) and
footnotes. The number format is fixed and depends only on the results, so a regenerated table diffs cleanly.
The README's result blocks (``--update``) and the table.md and results.csv of each results folder are written
here too.
"""

from __future__ import annotations

import html
import io
import json
import re
from dataclasses import asdict
from pathlib import Path
from typing import Iterable, Optional, Sequence

import pandas as pd
from tabulate import tabulate

from posenc_bench import metrics
from posenc_bench.analysis.captions import caption, scored_split
from posenc_bench.analysis.context import CONTEXT_TABLES, context_title
from posenc_bench.analysis import findings, robustness
from posenc_bench.analysis.stats.intervals import CI, Intervals
from posenc_bench.analysis.tables import Cell, Table, annotate, build_table, compare_table
from posenc_bench.analysis.runs import ReportError, Run, kind_of, run_intervals
from posenc_bench.files import atomic_write_text

DEFAULT_VALUES = metrics.kind("ppl").tables  # a text run's tables; a task run's are its kind's (``render``)
FORMATS = ("md", "csv", "latex", "html", "json")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".tex": "latex", ".html": "html", ".htm": "html",
                  ".json": "json"}
BEST_NOTE = "bold: best in its column"
MARKER_OPEN = "<!-- posenc-bench {kind}: {key} -->"
MARKER_CLOSE = "<!-- /posenc-bench {kind} -->"
BLOCK_KINDS = ("table", "findings", "robustness")  # what a README block holds: `report` tables, --findings, --robustness


def records_frame(records: Iterable[dict]) -> pd.DataFrame:
    cols = ["encoding", "seed", "train_len", "eval_len", "ratio", "status", "reason", "ppl", "bpb", "loss", "tokens",
            "accuracy", "token_accuracy"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in records], columns=cols)


def values() -> list[str]:
    """Every table a report can hold: each registered metric's, then the context tables."""
    return metrics.tabled() + list(CONTEXT_TABLES)


def parse_values(text: str | Sequence[str]) -> list[str]:
    items = [v.strip() for v in text.split(",")] if isinstance(text, str) else list(text)
    items = [v for v in items if v]
    for v in items:
        if v not in values():
            raise ReportError(f"unknown table value {v!r}; valid: {', '.join(values())}")
    if not items:
        raise ReportError(f"no table value given; valid: {', '.join(values())}")
    return list(dict.fromkeys(items))


def best_note(metric: metrics.Metric) -> str:
    """What bold and ≈ mean in ``metric``'s table, when its marks rest on paired comparisons."""
    effect = (f"{metric.smallest * 100:g} percentage point" if metric.difference else f"{metric.smallest:.1%}")
    extreme = "highest" if metric.higher_is_better else "lowest"
    return (f"bold: best in its column and better than every other row (each paired comparison a finding after the "
            f"correction for the table's comparisons, with an effect of at least {effect}); ≈: tied for best (the "
            f"{extreme} mean when it is not bold, and the rows not shown to differ from it)")


# ------------------------------------------------------------------------------------------- cell text


def _escape(text: str, fmt: str) -> str:
    if fmt == "html":
        return html.escape(text)
    if fmt == "latex":
        text = text.replace("\\", "\x00")  # backslashes last, so their braces are not escaped again
        for a in "&%$#_{}":
            text = text.replace(a, "\\" + a)
        text = text.replace("~", r"\textasciitilde{}").replace("^", r"\^{}")
        return text.replace("\x00", r"\textbackslash{}")
    return text


def cell_text(cell: Cell, digits: int, fmt: str = "md") -> str:
    if cell.status == "missing":
        return ""
    if cell.status != "ok":
        text = cell.status
    else:
        pm = {"latex": r"$\pm$"}.get(fmt, "±")
        text = f"{cell.mean:.{digits}f}"
        if cell.lo is not None and not cell.lo == cell.hi == cell.mean:  # no interval on 1.00 by definition
            text += f" [{cell.lo:.{digits}f}, {cell.hi:.{digits}f}]"
        elif cell.spread is not None:  # no valid interval: the lowest and highest seed
            lo, hi = (f"{v:.{digits}f}" for v in cell.spread)
            text += " (every seed)" if lo == hi else f" ({lo}–{hi})"
        elif cell.std is not None:
            text += f" {pm} {cell.std:.{digits}f}"
        if cell.tied:
            text = {"latex": r"$\approx$"}.get(fmt, "≈") + text
        if cell.best:
            text = {"md": "**{}**", "html": "<b>{}</b>", "latex": r"\textbf{{{}}}"}.get(fmt, "{}").format(text)
        if cell.checkpoint:
            text += "†"
        if cell.seeds_ok < cell.seeds:
            text += f" ({cell.seeds_ok}/{cell.seeds} seeds)"
    if cell.note:
        text += f" {cell.note}"
    return text


def _frame(table: Table, fmt: str) -> pd.DataFrame:
    headers = [_escape(c.header(), fmt) for c in table.columns]
    frame = pd.DataFrame(
        [[cell_text(table.cells[row, j], table.digits, fmt) for j in range(len(table.columns))] for row in table.rows],
        index=[_escape(r + (f" {table.row_notes[r]}" if r in table.row_notes else ""), fmt) for r in table.rows],
        columns=headers, dtype=object)
    frame.index.name = "encoding"
    return frame


def _footnotes(tables: Sequence[Table], notes: dict[str, str]) -> list[str]:
    used = {c.note for t in tables for c in t.cells.values() if c.note} | {m for t in tables for m in t.row_notes.values()}
    return [f"{mark} {reason}" for reason, mark in notes.items() if mark in used] + [n for t in tables for n in t.notes]


# ------------------------------------------------------------------------------------------- rendering


def _tabulate(frame: pd.DataFrame, fmt: str) -> str:
    tablefmt = {"md": "github", "html": "unsafehtml", "latex": "latex_raw"}[fmt]
    align = ("left",) + ("right",) * len(frame.columns)  # row names left, numbers right
    return tabulate(frame, headers="keys", tablefmt=tablefmt, colalign=align, disable_numparse=True)


def _context_frame(run: Run, fmt: str, value: str) -> pd.DataFrame:
    frame = CONTEXT_TABLES[value](run.data["records"], run.data["run"].get("rows")).fillna("")
    if frame.empty:
        return frame
    frame = frame.rename(index=lambda r: _escape(r, fmt), columns=lambda c: _escape(c, fmt))
    frame.index.name = "encoding"
    return frame


def _compared_values(values: list[str], kind: metrics.Kind) -> dict[int, str]:
    """Where ``--compare`` tables go among ``values`` (after the table each one compares) and what each compares:
    every metric of the runs' kind that has a comparison table (ppl for text runs; exact match and the
    answer-token share for task runs), each where it was asked for, or the kind's primary metric at the end when
    none was."""
    shown = {values.index(m.name) + 1: m.name for m in metrics.of_kind(kind.name)
             if m.compare_title and m.name in values}
    return shown or {len(values): kind.primary}


def runs_kind(runs: Sequence[Run]) -> metrics.Kind:
    """The runs' common kind of record; text when they mix kinds."""
    kinds = {kind_of(run).name for run in runs}
    return metrics.kind(kinds.pop() if len(kinds) == 1 else "ppl")


def render(runs: Sequence[Run], *, fmt: str = "md", values: Sequence[str] = DEFAULT_VALUES, digits: int = 2,
           mark_best: bool = True, ci: float = CI, compare: Optional[str] = None) -> str:
    """The report for ``runs`` in ``fmt``: Markdown / HTML / LaTeX tables with caption and footnotes, or the
    long-format CSV / JSON of the same cells. ``ci``: the intervals' level; ``compare``: a reference row, every
    row's ppl relative to it follows the ppl table."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; valid: {', '.join(FORMATS)}")
    values = parse_values(values)
    kind = runs_kind(runs)
    if tuple(values) == DEFAULT_VALUES:
        values = list(kind.tables)
    compared = {}  # position in values -> the value compared there
    if compare is not None:
        compared = _compared_values(values, kind)
        for at in sorted(compared, reverse=True):
            values = values[:at] + ["compare"] + values[at:]
        compared = {at + i: v for i, (at, v) in enumerate(sorted(compared.items()))}
    notes: dict[str, str] = {}
    intervals = run_intervals(runs, ci)
    tables = [compare_table(runs, compare, intervals, digits=max(digits, 3), value=compared[i], notes=notes)
              if v == "compare" else
              build_table(runs, v, digits=digits, mark_best=mark_best, notes=notes, intervals=intervals)
              for i, v in enumerate(values) if v not in CONTEXT_TABLES]
    for t in tables:
        annotate(t, runs, intervals, notes)
    if fmt == "csv":
        return _csv(runs, tables)
    if fmt == "json":
        return _json(runs, tables, notes, values)
    captions = [(f"{r.label}: " if r.label else "") + caption(r.data["run"], r.data["records"])
                + " " + intervals[r.label].describe().capitalize() + "." for r in runs]
    blocks: list[tuple[str, str, list[str]]] = []  # (title, table text, footnotes)
    it = iter(tables)
    for v in values:
        if v in CONTEXT_TABLES:
            for run in runs:
                frame = _context_frame(run, fmt, v)
                if not frame.empty:
                    title = context_title(v, frame, scored_split(run.data["run"])) + (f", {run.label}" if run.label else "")
                    blocks.append((title, _tabulate(frame, fmt), []))
            continue
        table = next(it)
        title = table.title + _best_note(table, intervals, mark_best)
        blocks.append((title, _tabulate(_frame(table, fmt), fmt), _footnotes([table], notes)))
    if fmt == "md":
        out = [*(c + "\n" for c in captions)]
        for title, text, foot in blocks:
            out.append(f"{title}:\n\n{text}\n" + ("\n" + "\n".join(foot) + "\n" if foot else ""))
        return "\n".join(out)
    if fmt == "html":
        out = [f"<p>{html.escape(c)}</p>" for c in captions]
        for title, text, foot in blocks:
            out += [f"<p>{html.escape(title)}:</p>", text]
            out += [f"<p>{html.escape(f)}</p>" for f in foot]
        return "\n".join(out) + "\n"
    out = []  # latex: one table environment per table; the caption facts in the first one's caption
    for i, (title, text, foot) in enumerate(blocks):
        cap = _escape(title + ". " + (" ".join(captions) if i == 0 else ""), "latex").strip()
        out += ["\\begin{table}", "\\centering", f"\\caption{{{cap}}}", text]
        out += [f"\\par\\footnotesize {_escape(f, 'latex')}" for f in foot]
        out += ["\\end{table}", ""]
    return "\n".join(out)


def render_findings(runs: Sequence[Run], *, ci: float = CI, by: Optional[str] = None) -> str:
    """`report --findings`: every claim the intervals of each run support (``analysis/findings.py``), after the
    run's caption; ``by``: the metric compared (default: the kind's primary, ppl or exact match)."""
    intervals = run_intervals(runs, ci)
    out = []
    for run in runs:
        out.append((f"{run.label}: " if run.label else "") + caption(run.data["run"], run.data["records"]) + " "
                   + intervals[run.label].describe().capitalize() + ".\n")
        out.append(findings.markdown([findings.run_findings(run, intervals[run.label], by)], ci))
    return "\n".join(out)


def render_robustness(runs: Sequence[Run], claims: Optional[Run] = None, *, ci: float = CI) -> str:
    """`report --robustness`: the same rows under several settings (``analysis/robustness.py``), after each
    setting's caption."""
    if len(runs) < 2:
        raise ReportError(f"--robustness compares settings: give two or more results folders, got {len(runs)}")
    out = ["Settings:\n"]
    out += [f"- {run.label}: {caption(run.data['run'], run.data['records'])}" for run in runs]
    if claims is not None:
        out.append(f"- claims from {claims.path}: {caption(claims.data['run'], claims.data['records'])}")
    return "\n".join(out) + "\n\n" + robustness.markdown(runs, claims, ci=ci)


def _best_note(table: Table, intervals: dict[str, Intervals], mark_best: bool) -> str:
    family = f"; {table.family.describe()}" if table.family is not None and table.family.size else ""
    if table.value == "compare":
        return family
    if not mark_best or not any(c.best or c.tied for c in table.cells.values()):
        return ""
    if not any(iv.available for iv in intervals.values()):
        return "; " + BEST_NOTE
    return "; " + best_note(metrics.get(table.value)) + family


def _long_rows(runs: Sequence[Run], tables: Sequence[Table]) -> list[dict]:
    rows = []
    for t in tables:
        for j, col in enumerate(t.columns):
            for row in t.rows:
                c = t.cells[row, j]
                if c.status == "missing":
                    continue
                rows.append({
                    "run": col.run, "value": t.value, "encoding": row, "train_len": col.train_len,
                    "eval_len": col.eval_len, "multiple": round(col.eval_len / col.train_len, 6), "mean": c.mean,
                    "std": c.std, "lo": c.lo, "hi": c.hi, "seeds_ok": c.seeds_ok, "seeds": c.seeds,
                    "status": c.status, "reason": c.reason, "best": c.best, "tied": c.tied,
                    "significant": c.significant, "checkpoint": c.checkpoint, "plateau": row in t.row_notes,
                })
    return rows


def _csv(runs: Sequence[Run], tables: Sequence[Table]) -> str:
    cols = ["run", "value", "encoding", "train_len", "eval_len", "multiple", "mean", "std", "lo", "hi", "seeds_ok",
            "seeds", "status", "reason", "best", "tied", "significant", "checkpoint", "plateau"]
    buf = io.StringIO()
    pd.DataFrame(_long_rows(runs, tables), columns=cols).to_csv(buf, index=False, float_format="%.6g",
                                                                lineterminator="\n")
    return buf.getvalue()


def _json(runs: Sequence[Run], tables: Sequence[Table], notes: dict[str, str], values: Sequence[str]) -> str:
    out = {
        "runs": [{"label": r.label, "path": r.path, "caption": caption(r.data["run"], r.data["records"]),
                  "intervals": Intervals(r.data["records"], draws=0).describe()} for r in runs],
        "tables": [{
            "value": t.value, "title": t.title,
            "columns": [asdict(c) | {"header": c.header()} for c in t.columns],
            "rows": [{"encoding": row, "plateau": row in t.row_notes,
                      "cells": [asdict(t.cells[row, j]) for j in range(len(t.columns))]} for row in t.rows],
            "notes": t.notes,
        } for t in tables],
        "footnotes": {mark: reason for reason, mark in notes.items()},
    }
    for value, table in CONTEXT_TABLES.items():
        if value in values:
            out[value] = {r.label or "run": table(r.data["records"], r.data["run"].get("rows"))
                          .fillna("").reset_index().to_dict(orient="records") for r in runs}
    return json.dumps(out, indent=1) + "\n"


def format_for(path: str | Path | None, fmt: str | None) -> str:
    """--format wins; else the --out file's suffix; else Markdown."""
    if fmt:
        return fmt
    if path is not None:
        suffix = Path(path).suffix.lower()
        if suffix in SUFFIX_FORMATS:
            return SUFFIX_FORMATS[suffix]
        raise ReportError(f"cannot tell the format of {str(path)!r} from its suffix; give --format "
                          f"({', '.join(FORMATS)})")
    return "md"


# ------------------------------------------------------------------------------ README blocks (--update)


def marker_key(paths: Sequence[str | Path]) -> str:
    return " ".join(Path(p).as_posix().rstrip("/") for p in paths)


def _block(kind: str) -> re.Pattern:
    """A README block of ``kind``. Markers are whole lines, so a marker quoted inside a sentence (as in the
    README's own docs) is not a block."""
    by_metric = kind.startswith("findings-") and kind.removeprefix("findings-") in metrics.tabled()
    if kind not in BLOCK_KINDS and not by_metric:  # findings-longppl: ``--findings --value longppl``
        raise ReportError(f"unknown block kind {kind!r}; valid: {', '.join(BLOCK_KINDS)}, findings-METRIC")
    return re.compile(rf"^<!-- posenc-bench {kind}: (?P<key>[^\n]+?) -->\n(?P<body>.*?)^<!-- /posenc-bench {kind} -->$",
                      re.DOTALL | re.MULTILINE)


def read_block(text: str, key: str, kind: str = "table") -> str | None:
    for m in _block(kind).finditer(text):
        if m.group("key").strip() == key:
            return m.group("body")
    return None


def update_file(path: str | Path, key: str, table: str, kind: str = "table") -> bool:
    """Replace the body of every block marked ``<!-- posenc-bench KIND: KEY -->`` in ``path`` with ``table``;
    atomically. Returns whether the file changed."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"--update {str(path)!r}: no such file")
    text = path.read_text()
    block = _block(kind)
    found = [m for m in block.finditer(text) if m.group("key").strip() == key]
    if not found:
        keys = [m.group("key").strip() for m in block.finditer(text)]
        have = f"it has {kind} blocks for: {', '.join(keys)}" if keys else f"it has no {kind} block"
        raise ReportError(
            f"--update {str(path)!r}: no block marked {MARKER_OPEN.format(kind=kind, key=key)} ... "
            f"{MARKER_CLOSE.format(kind=kind)} ({have}); add those two lines where it should go")
    new = block.sub(lambda m: m.group(0) if m.group("key").strip() != key
                    else f"{MARKER_OPEN.format(kind=kind, key=key)}\n{table}{MARKER_CLOSE.format(kind=kind)}", text)
    if new != text:
        atomic_write_text(path, new)
    return new != text


# ------------------------------------------------------------- what `run` writes beside results.json


def write_tables(out: Path | str, data: dict) -> str:
    """results.csv and table.md of a results folder, from its results (``run``, ``eval`` and ``merge`` write them);
    returns table.md's text, rendered once, for the command to print."""
    table = results_markdown(data)
    atomic_write_text(Path(out) / "results.csv", results_csv(data))
    atomic_write_text(Path(out) / "table.md", table)
    return table


def results_markdown(data: dict) -> str:
    """table.md of a run: the same text as `posenc-bench report <folder>`."""
    return render([Run("", "", data)])


def results_csv(data: dict) -> str:
    return records_frame(data["records"]).to_csv(index=False)
