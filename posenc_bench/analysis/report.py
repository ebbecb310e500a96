"""Tables built from results files alone: ppl, bits per byte or ppl relative to 1x, with intervals.

One or several runs (``results.json`` each) become a list of :class:`Table` s: rows are encoding rows, columns
are (run, eval length), cells are :class:`Cell` s (mean over seeds, std, its interval, seeds, status, footnote,
best-in-column or tied with it). ``--compare REF`` adds each row's ppl relative to REF with its paired
interval. Intervals and significance come from ``analysis/intervals.py``; a row whose model does not use its
context (``plateau``) is flagged. The same tables are then written as Markdown, HTML or LaTeX (via tabulate),
or as long-format CSV / JSON. Row order, column order, number format and footnote numbering depend only on
the results, so a regenerated table diffs cleanly.
"""

from __future__ import annotations

import html
import io
import json
import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterable, Optional, Sequence

import pandas as pd
from tabulate import tabulate

from posenc_bench.errors import PosencError
from posenc_bench.bench.records import read_results
from posenc_bench.analysis.intervals import CI, MIN_SEEDS, MIN_WINDOWS, Intervals
from posenc_bench.files import atomic_write_text

VALUES = ("ppl", "bpb", "ratio", "training", "cost")
DEFAULT_VALUES = ("ppl", "ratio", "training", "cost")
FORMATS = ("md", "csv", "latex", "html", "json")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".tex": "latex", ".html": "html", ".htm": "html",
                  ".json": "json"}
TITLES = {
    "ppl": "Perplexity (lower is better; columns: eval length as a multiple of the train length)",
    "bpb": "Bits per byte (lower is better; columns: eval length as a multiple of the train length)",
    "ratio": "Perplexity relative to the same model at the train length (1x)",
    "training": "Training (train loss, nats) and context use at 1x (test loss early vs late in the window), each the "
                "mean over the row's seeds",
    "cost": "Cost of each evaluation: wall time, and peak memory (records that measured it; = base: the row reuses "
            "the base model's numbers there)",
}
BEST_NOTE = "bold: best in its column"
SIGNIFICANT_BEST_NOTE = ("bold: best in its column and better than every other row (the paired interval of the "
                         "ratio excludes 1); ≈: tied with the best (its interval includes 1)")
COMPARE_TITLE = "Perplexity relative to {ref} at the same length (paired); *: the interval excludes 1"
TEXT_ONLY_NOTE = (f"text-only interval: a different trained model and fewer than {MIN_SEEDS} seeds, so another seed could "
                  "move it by more than the text does; no significance claimed")
# A model that uses its context predicts later positions of a window better than the first ones. At 1x, the
# test loss over the second half of the window must be this many nats below the first position bucket's (the
# bucket is the longest eval length / eval.position_buckets wide: positions 0-7 in the default run, 0-31 in
# sotu-512), averaged over the row's seeds. The note names the positions, so "local" has its width.
PLATEAU_MARGIN = 0.05
PLATEAU_NOTE = ("uses only local context: at 1x its loss over positions {late} is not {margin:g} nats below its loss "
                "over positions {early}, so its extrapolation numbers say little about the encoding")
MARKER_OPEN = "<!-- posenc-bench table: {} -->"
MARKER_CLOSE = "<!-- /posenc-bench table -->"


class ReportError(PosencError):
    pass


def _fmt_ratio(r: float) -> str:
    return f"{r:g}x" if r == int(r) else f"{r:.3g}x"


def records_frame(records: Iterable[dict]) -> pd.DataFrame:
    cols = ["encoding", "seed", "train_len", "eval_len", "ratio", "status", "reason", "ppl", "bpb", "loss", "tokens"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in records], columns=cols)


# ----------------------------------------------------------------------------------------------- the tables


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
    lo: float | None = None  # the interval (analysis/intervals.py); None without per-unit numbers
    hi: float | None = None
    tied: bool = False  # with the best of its column: the interval of the ratio to it includes 1
    significant: Optional[bool] = None  # best: better than every other row; other rows: differs from the best


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


def _summarize(group: list[dict], value: str) -> Cell:
    ok = [r for r in group if r["status"] == "ok" and r.get(value) is not None]
    bad = [r for r in group if r["status"] != "ok"]
    cell = Cell(seeds_ok=len(ok), seeds=len(group), reason=str(bad[0].get("reason") or bad[0]["status"]) if bad else "")
    if not ok:
        cell.status = "diverged" if any(r["status"] == "diverged" for r in group) else "n/a"
        return cell
    vals = [float(r[value]) for r in ok]
    cell.status = "ok"
    cell.mean = sum(vals) / len(vals)
    if len(vals) > 1:
        cell.std = math.sqrt(sum((v - cell.mean) ** 2 for v in vals) / (len(vals) - 1))
    return cell


def _values(records: list[dict], value: str) -> list[dict]:
    """For value 'ratio': each seed's ppl divided by the same row and seed's ppl at the train length."""
    if value != "ratio":
        return records
    ref = {(r["encoding"], r["seed"]): r.get("ppl") for r in records
           if r["eval_len"] == r["train_len"] and r["status"] == "ok"}
    out = []
    for r in records:
        base = ref.get((r["encoding"], r["seed"]))
        ratio = r["ppl"] / base if r["status"] == "ok" and base and r.get("ppl") is not None else None
        out.append({**r, "ratio_1x": ratio})
    return out


def build_table(runs: Sequence[Run], value: str, *, digits: int = 2, mark_best: bool = True,
                notes: dict[str, str] | None = None, intervals: Optional[dict[str, Intervals]] = None) -> Table:
    """One value ('ppl' | 'bpb' | 'ratio') for every row of every run. ``notes`` (reason -> mark) is shared
    between the tables of one report, so a reason has the same footnote number everywhere. ``intervals`` (run
    label -> Intervals) adds each cell's interval and decides bold and ties by significance."""
    if value not in VALUES or value in ("training", "cost"):
        raise ReportError(f"unknown table value {value!r}; valid: ppl, bpb, ratio")
    notes = {} if notes is None else notes
    intervals = intervals or {}
    key = "ratio_1x" if value == "ratio" else value
    rows: list[str] = []
    columns: list[Column] = []
    groups: dict[tuple[str, int], list[dict]] = {}
    for run in runs:
        records = _values(run.data["records"], value)
        order = run.data["run"].get("rows") or []
        for r in list(order) + [rec["encoding"] for rec in records]:
            if r not in rows:
                rows.append(r)
        lengths = sorted({(rec["eval_len"], rec["train_len"]) for rec in records})
        for L, T in lengths:
            columns.append(Column(run.label, L, T))
            for rec in records:
                if rec["eval_len"] == L and rec["train_len"] == T:
                    groups.setdefault((rec["encoding"], len(columns) - 1), []).append(rec)
    rows = [r for r in rows if any((r, j) in groups for j in range(len(columns)))]
    table = Table(value, TITLES[value], rows, columns, digits=digits)
    for row in rows:  # reading order, so footnotes number left to right, top to bottom
        for j in range(len(columns)):
            group = groups.get((row, j))
            cell = _summarize(group, key) if group else Cell()
            if cell.reason:
                cell.note = notes.setdefault(cell.reason, f"[{len(notes) + 1}]")
            iv = intervals.get(columns[j].run)
            if cell.status == "ok" and iv is not None and (i := iv.interval(value, row, columns[j].eval_len)):
                cell.lo, cell.hi = i.lo, i.hi
            table.cells[row, j] = cell
    if mark_best:
        _mark_best(table, intervals)
    return table


def _mark_best(table: Table, intervals: dict[str, Intervals]) -> None:
    """In each column, the lowest mean. With intervals it is bold only when it is significantly better than
    every other row (the paired interval of each row's ratio to it excludes 1), and rows whose interval
    includes 1 are marked tied; a text-only comparison (different models, too few seeds) is neither. Without
    intervals (older results) the lowest mean at the printed precision is bold. Never in a ratio table's 1x
    column (all 1.00 by definition), nor in a column with fewer than two numbers."""
    for j, col in enumerate(table.columns):
        if table.value == "ratio" and col.eval_len == col.train_len:
            continue
        shown = {row: c.mean for row in table.rows if (c := table.cells[row, j]).status == "ok" and c.mean is not None}
        if len(shown) < 2:
            continue
        iv = intervals.get(col.run)
        if iv is None or not iv.available:
            best = min(round(v, table.digits) for v in shown.values())
            for row, v in shown.items():
                table.cells[row, j].best = round(v, table.digits) == best
            continue
        best = min(shown, key=shown.get)
        verdicts = {}
        for row in shown:
            if row != best:
                c = iv.compare(table.value, row, best, col.eval_len)
                verdicts[row] = None if c is None else c.significant
                table.cells[row, j].significant = verdicts[row]
                table.cells[row, j].tied = verdicts[row] is False
        top = table.cells[best, j]
        top.significant = all(v is True for v in verdicts.values())
        top.best = top.significant


def compare_table(runs: Sequence[Run], ref: str, intervals: dict[str, Intervals], *, digits: int = 2) -> Table:
    """ppl of every row relative to ``ref`` at the same length (seed means), with the paired interval."""
    rows = list(dict.fromkeys(r for run in runs for r in (run.data["run"].get("rows") or [])
                              + [rec["encoding"] for rec in run.data["records"]]))
    if not any(ref == rec["encoding"] for run in runs for rec in run.data["records"]):
        raise ReportError(f"--compare {ref!r}: no such row in the results; rows: {', '.join(rows)}")
    columns = [Column(run.label, L, T) for run in runs
               for L, T in sorted({(r["eval_len"], r["train_len"]) for r in run.data["records"]})]
    table = Table("compare", COMPARE_TITLE.format(ref=ref), rows, columns, digits=digits)
    for row in rows:
        for j, col in enumerate(columns):
            iv = intervals.get(col.run)
            c = iv.compare("ppl", row, ref, col.eval_len) if iv is not None else None
            if c is None:
                table.cells[row, j] = Cell()
                continue
            table.cells[row, j] = Cell("ok", c.interval.value, lo=c.interval.lo, hi=c.interval.hi,
                                       significant=c.significant,
                                       note="†" if c.kind == "text-only" else "*" if c.significant else "")
    table.rows = [r for r in rows if any(table.cells[r, j].status == "ok" for j in range(len(columns)))]
    return table


def context_use(records: list[dict], row: str) -> Optional[tuple[float, float]]:
    """(loss of the first position bucket, loss over the second half of the window) at 1x for ``row``, the
    mean over its measured seeds: the measure of the training table. None without loss-by-position numbers."""
    pairs = [p for r in records if r["encoding"] == row and r["eval_len"] == r["train_len"]
             and (p := _early_late(r)) is not None]
    if not pairs:
        return None
    return sum(p[0] for p in pairs) / len(pairs), sum(p[1] for p in pairs) / len(pairs)


def plateau_rows(records: list[dict]) -> list[str]:
    """The rows of ``records`` whose model does not use its context (``on_plateau``)."""
    return [row for row in dict.fromkeys(r["encoding"] for r in records) if on_plateau(records, row)]


def _early_late(rec: dict) -> Optional[tuple[float, float]]:
    """One record's loss in its first position bucket and over the second half of its window."""
    by_pos = rec.get("loss_by_position") or []
    late = [b for b in by_pos if b["start"] >= rec["eval_len"] // 2]
    if rec["status"] != "ok" or not late:
        return None
    return by_pos[0]["loss"], sum(b["loss"] * b["tokens"] for b in late) / sum(b["tokens"] for b in late)


def context_positions(records: list[dict], row: str) -> Optional[tuple[str, str]]:
    """The positions ``context_use`` compares for ``row`` at 1x, as text: ("0-7", "64-127") in the default run."""
    rec = next((r for r in records if r["encoding"] == row and r["eval_len"] == r["train_len"]
                and _early_late(r) is not None), None)
    if rec is None:
        return None
    first, L = rec["loss_by_position"][0], rec["eval_len"]
    return f"{first['start']}-{first['end'] - 1}", f"{L // 2}-{L - 1}"


def on_plateau(records: list[dict], row: str) -> bool:
    """Whether ``row``'s model did not learn to use its context (see PLATEAU_MARGIN)."""
    use = context_use(records, row)
    return use is not None and use[0] - use[1] < PLATEAU_MARGIN


def ppl_table(records: list[dict], *, value: str = "ppl", relative: bool = False, digits: int = 2,
              row_order: list[str] | None = None, mark_best: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """One run's table as a frame of Markdown cell strings, and its footnotes."""
    run = Run("", "", {"run": {"rows": row_order or []}, "records": records})
    notes: dict[str, str] = {}
    table = build_table([run], "ratio" if relative else value, digits=digits, mark_best=mark_best, notes=notes)
    frame = _frame(table, "md")
    if row_order:
        frame = frame.loc[[r for r in row_order if r in frame.index]]
    return frame, _footnotes([table], notes)


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
        elif cell.std is not None:
            text += f" {pm} {cell.std:.{digits}f}"
        if cell.tied:
            text = {"latex": r"$\approx$"}.get(fmt, "≈") + text
        if cell.best:
            text = {"md": "**{}**", "html": "<b>{}</b>", "latex": r"\textbf{{{}}}"}.get(fmt, "{}").format(text)
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


def run_intervals(runs: Sequence[Run], ci: float = CI) -> dict[str, Intervals]:
    """The bootstrap of each run (by label), once per report."""
    return {run.label: Intervals(run.data["records"], ci=ci) for run in runs}


def annotate(table: Table, runs: Sequence[Run], intervals: dict[str, Intervals], notes: dict[str, str]) -> None:
    """The flags a reader needs beside the numbers: rows whose model does not use its context (footnote on the
    row), lengths with few independent windows, and text-only comparisons."""
    for run in runs:
        for row in table.rows:
            if on_plateau(run.data["records"], row):
                early, late = context_positions(run.data["records"], row)
                note = PLATEAU_NOTE.format(early=early, late=late, margin=PLATEAU_MARGIN)
                table.row_notes[row] = notes.setdefault(note, f"[{len(notes) + 1}]")
    for j, col in enumerate(table.columns):
        iv = intervals.get(col.run)
        if iv is not None and iv.available and iv.windows(col.eval_len) < MIN_WINDOWS:
            table.notes.append(f"{col.header()}: only {iv.windows(col.eval_len)} independent windows of "
                               f"{col.eval_len} tokens; its intervals rest on few samples")
    if any(c.note == "†" for c in table.cells.values()):
        table.notes.append("† " + TEXT_ONLY_NOTE)


# ----------------------------------------------------------------------------------------- the caption


def _short_commit(commit: str) -> str:
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:12] + ("-dirty" if dirty else "")


def _commits(run: dict, records: Optional[list[dict]]) -> str:
    """'commit X', or, when rows were added by later invocations, every commit with its rows."""
    by_commit: dict[str, list[str]] = {}
    for r in records or []:
        rows = by_commit.setdefault(_short_commit(r.get("git_commit") or run["git_commit"]), [])
        if r["encoding"] not in rows:
            rows.append(r["encoding"])
    if len(by_commit) <= 1:
        return f"commit {_short_commit(next(iter(by_commit), run['git_commit']))}"
    return "commits " + "; ".join(f"{c} ({', '.join(rows)})" for c, rows in by_commit.items())


def _params(run: dict, records: Optional[list[dict]], digits: Optional[int] = None) -> str:
    """The parameter count of the models behind the rows: one number, or the range when rows differ
    (learned and T5 add their own parameters); older results carry one count for the run."""
    params = run.get("params")
    if isinstance(params, dict):
        rows = {r["encoding"] for r in records or []} or set(params)
        counts = sorted({n for row, n in params.items() if row in rows}) or [None]
    else:
        counts = [params]
    if counts == [None]:
        return "?"
    shown = [f"{c / 1e6:.{digits}f}M" if digits is not None else f"{c:,}" for c in (counts[0], counts[-1])]
    return shown[0] if len(counts) == 1 else f"{shown[0]}-{shown[1]}"


def caption(run: dict, records: Optional[list[dict]] = None) -> str:
    if run.get("kind") == "eval" and run["model"].get("kind") == "hf":
        return hf_caption(run)
    cfg = run["config"]
    m, t = cfg["model"], cfg["train"]
    seeds = cfg["seeds"]
    return (
        f"Byte-level LM, {_params(run, records)} parameters ({m['n_layers']} layers, width {m['d_model']}, "
        f"{m['n_heads']} heads), trained {t['steps']} steps x {t['batch_size']} x {t['train_len']} tokens "
        f"(lr {t['lr']:g}); corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), "
        f"{run['eval_tokens']:,} {cfg['eval']['split']} tokens scored at every length "
        f"(eval {run['eval_fingerprint']}){_protocol(cfg)}; seeds {','.join(map(str, seeds))}; device {run['device']}; "
        f"torch {run['versions']['torch']}; {_commits(run, records)}."
    )


def _protocol(cfg: dict) -> str:
    ev = cfg.get("eval", {})
    if ev.get("protocol", "nonoverlapping") == "strided":
        return f", strided protocol: each window scores its last {ev['stride']} targets"
    return ""


def short_caption(run: dict, records: Optional[list[dict]] = None) -> str:
    """The caption facts in two short lines, for figures."""
    if run.get("kind") == "eval" and run["model"].get("kind") == "hf":
        m = run["model"]
        return (f"{m['ref'].rsplit('/', 1)[-1]}{'/' + m['gguf_file'] if m.get('gguf_file') else ''}, "
                f"{m['params'] / 1e6:.0f}M params, train len {run['train_len']}, tokenizer {m['tokenizer']['class']}\n"
                f"corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), {run['eval_tokens']:,} tokens "
                f"per length; {run['device']}; commit {run['git_commit'][:12]}")
    cfg = run["config"]
    m, t = cfg["model"], cfg["train"]
    commits = list(dict.fromkeys(_short_commit(r.get("git_commit") or run["git_commit"]) for r in records or []))
    commit = ("commits " + ", ".join(commits)) if len(commits) > 1 else f"commit {_short_commit(run['git_commit'])}"
    return (
        f"{_params(run, records, 2)} params ({m['n_layers']}L, d{m['d_model']}, {m['n_heads']}H), "
        f"train len {t['train_len']}, {t['steps']} steps x {t['batch_size']}; seeds "
        f"{','.join(map(str, cfg['seeds']))}\ncorpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), "
        f"{run['eval_tokens']:,} tokens per length{_protocol(cfg)}; {run['device']}; {commit}"
    )


def hf_caption(run: dict) -> str:
    """Caption of a `posenc-bench eval` table of a pretrained Hugging Face model."""
    m = run["model"]
    sha, dirty, _ = run["git_commit"].partition("-dirty")
    what = m["ref"] + (f"/{m['gguf_file']}" if m.get("gguf_file") else "")
    revision = m.get("file_sha256") or m.get("files_sha256") or m.get("hub_commit") or "?"
    return (
        f"Pretrained {m['class']} {what} (revision {revision}), {m['params']:,} parameters, {m['dtype']}; "
        f"train length {run['train_len']} ({run['train_len_source']}); tokenizer {m['tokenizer']['class']} "
        f"(vocab {m['tokenizer']['vocab_size']:,}, document separator {run['doc_separator']}); "
        f"corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), {run['eval_tokens']:,} test tokens "
        f"({run['eval_bytes']:,} bytes) scored at every length (eval {run['eval_fingerprint']}); device {run['device']}; "
        f"torch {run['versions']['torch']}, transformers {run['versions']['transformers']}; "
        f"commit {sha[:12] + ('-dirty' if dirty else '')}."
    )


# ------------------------------------------------------------------------------------- training table


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
        for frac in (0.25, 0.5, 1.0):
            if curves:
                last = max(curves[0])
                step = min(curves[0], key=lambda s: abs(s - frac * last))
                losses = [c[step] for c in curves if step in c]
                row[f"train loss @ step {step}"] = f"{sum(losses) / len(losses):.3f}"
        if (use := context_use(records, enc)) is not None:
            early, late = context_positions(records, enc)
            row[f"1x loss, positions {early}"] = f"{use[0]:.3f}"
            row[f"1x loss, positions {late}"] = f"{use[1]:.3f}"
        else:
            row["status"] = recs[0]["status"]
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


# ------------------------------------------------------------------------------------------- rendering


def parse_values(text: str | Sequence[str]) -> list[str]:
    items = [v.strip() for v in text.split(",")] if isinstance(text, str) else list(text)
    items = [v for v in items if v]
    for v in items:
        if v not in VALUES:
            raise ReportError(f"unknown table value {v!r}; valid: {', '.join(VALUES)}")
    if not items:
        raise ReportError(f"no table value given; valid: {', '.join(VALUES)}")
    return list(dict.fromkeys(items))


def _tabulate(frame: pd.DataFrame, fmt: str) -> str:
    tablefmt = {"md": "github", "html": "unsafehtml", "latex": "latex_raw"}[fmt]
    align = ("left",) + ("right",) * len(frame.columns)  # row names left, numbers right
    return tabulate(frame, headers="keys", tablefmt=tablefmt, colalign=align, disable_numparse=True)


def _training_frame(run: Run, fmt: str, value: str = "training") -> pd.DataFrame:
    table = cost_table if value == "cost" else training_table
    frame = table(run.data["records"], run.data["run"].get("rows")).fillna("")
    if frame.empty:
        return frame
    frame = frame.rename(index=lambda r: _escape(r, fmt), columns=lambda c: _escape(c, fmt))
    frame.index.name = "encoding"
    return frame


def render(runs: Sequence[Run], *, fmt: str = "md", values: Sequence[str] = DEFAULT_VALUES, digits: int = 2,
           mark_best: bool = True, ci: float = CI, compare: Optional[str] = None) -> str:
    """The report for ``runs`` in ``fmt``: Markdown / HTML / LaTeX tables with caption and footnotes, or the
    long-format CSV / JSON of the same cells. ``ci``: the intervals' level; ``compare``: a reference row, every
    row's ppl relative to it follows the ppl table."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; valid: {', '.join(FORMATS)}")
    values = parse_values(values)
    if compare is not None:
        at = values.index("ppl") + 1 if "ppl" in values else len(values)
        values = values[:at] + ["compare"] + values[at:]
    notes: dict[str, str] = {}
    intervals = run_intervals(runs, ci)
    tables = [compare_table(runs, compare, intervals, digits=max(digits, 3)) if v == "compare" else
              build_table(runs, v, digits=digits, mark_best=mark_best, notes=notes, intervals=intervals)
              for v in values if v not in ("training", "cost")]
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
        if v in ("training", "cost"):
            for run in runs:
                frame = _training_frame(run, fmt, v)
                if not frame.empty:
                    title = TITLES[v] + (f", {run.label}" if run.label else "")
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


def _best_note(table: Table, intervals: dict[str, Intervals], mark_best: bool) -> str:
    if table.value == "compare" or not mark_best:
        return ""
    if any(c.best or c.tied for c in table.cells.values()):
        return "; " + (SIGNIFICANT_BEST_NOTE if any(iv.available for iv in intervals.values()) else BEST_NOTE)
    return ""


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
                    "significant": c.significant, "plateau": row in t.row_notes,
                })
    return rows


def _csv(runs: Sequence[Run], tables: Sequence[Table]) -> str:
    cols = ["run", "value", "encoding", "train_len", "eval_len", "multiple", "mean", "std", "lo", "hi", "seeds_ok",
            "seeds", "status", "reason", "best", "tied", "significant", "plateau"]
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
    for value, table in (("training", training_table), ("cost", cost_table)):
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


# Markers are whole lines, so a marker quoted inside a sentence (as in the README's own docs) is not a block.
_BLOCK = re.compile(r"^<!-- posenc-bench table: (?P<key>[^\n]+?) -->\n(?P<body>.*?)^<!-- /posenc-bench table -->$",
                    re.DOTALL | re.MULTILINE)


def read_block(text: str, key: str) -> str | None:
    for m in _BLOCK.finditer(text):
        if m.group("key").strip() == key:
            return m.group("body")
    return None


def update_file(path: str | Path, key: str, table: str) -> bool:
    """Replace the body of every block marked ``<!-- posenc-bench table: KEY -->`` in ``path`` with ``table``;
    atomically. Returns whether the file changed."""
    path = Path(path)
    if not path.is_file():
        raise ReportError(f"--update {str(path)!r}: no such file")
    text = path.read_text()
    found = [m for m in _BLOCK.finditer(text) if m.group("key").strip() == key]
    if not found:
        keys = [m.group("key").strip() for m in _BLOCK.finditer(text)]
        have = f"it has blocks for: {', '.join(keys)}" if keys else "it has none"
        raise ReportError(
            f"--update {str(path)!r}: no block marked {MARKER_OPEN.format(key)} ... {MARKER_CLOSE} ({have}); "
            "add those two lines where the table should go")
    new = _BLOCK.sub(lambda m: m.group(0) if m.group("key").strip() != key
                     else f"{MARKER_OPEN.format(key)}\n{table}{MARKER_CLOSE}", text)
    if new != text:
        atomic_write_text(path, new)
    return new != text


def write_report(text: str, out: str | Path) -> None:
    atomic_write_text(out, text)


# ------------------------------------------------------------- what `run` writes beside results.json


def write_tables(out: Path | str, data: dict) -> None:
    """results.csv and table.md of a results folder, from its results (``run``, ``eval`` and ``merge`` write them)."""
    atomic_write_text(Path(out) / "results.csv", results_csv(data))
    atomic_write_text(Path(out) / "table.md", results_markdown(data))


def results_markdown(data: dict) -> str:
    """table.md of a run: the same text as `posenc-bench report <folder>`."""
    return render([Run("", "", data)])


def results_csv(data: dict) -> str:
    return records_frame(data["records"]).to_csv(index=False)
