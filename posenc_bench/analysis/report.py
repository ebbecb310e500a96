"""Tables built from results files alone: ppl, bits per byte or ppl relative to 1x, mean +- std over seeds.

One or several runs (``results.json`` each) become a list of :class:`Table` s: rows are encoding rows, columns
are (run, eval length), cells are :class:`Cell` s (mean, std, seeds, status, footnote, best-in-column). The
same tables are then written as Markdown, HTML or LaTeX (via tabulate), or as long-format CSV / JSON.
Row order, column order, number format and footnote numbering depend only on the results, so a regenerated
table diffs cleanly.
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
from posenc_bench.files import atomic_write_text

VALUES = ("ppl", "bpb", "ratio", "training")
DEFAULT_VALUES = ("ppl", "ratio", "training")
FORMATS = ("md", "csv", "latex", "html", "json")
SUFFIX_FORMATS = {".md": "md", ".markdown": "md", ".csv": "csv", ".tex": "latex", ".html": "html", ".htm": "html",
                  ".json": "json"}
TITLES = {
    "ppl": "Perplexity (lower is better; columns: eval length as a multiple of the train length)",
    "bpb": "Bits per byte (lower is better; columns: eval length as a multiple of the train length)",
    "ratio": "Perplexity relative to the same model at the train length (1x)",
    "training": "Training (mean train loss, nats) and context use at 1x (test loss early vs late in the window)",
}
BEST_NOTE = "bold: best in its column"
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
                notes: dict[str, str] | None = None) -> Table:
    """One value ('ppl' | 'bpb' | 'ratio') for every row of every run. ``notes`` (reason -> mark) is shared
    between the tables of one report, so a reason has the same footnote number everywhere."""
    if value not in VALUES or value == "training":
        raise ReportError(f"unknown table value {value!r}; valid: ppl, bpb, ratio")
    notes = {} if notes is None else notes
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
            table.cells[row, j] = cell
    if mark_best:
        _mark_best(table)
    return table


def _mark_best(table: Table) -> None:
    """Bold the lowest mean in each column (ties at the printed precision all count). Not in a ratio table's
    1x column (all 1.00 by definition), and not in a column with fewer than two numbers."""
    for j, col in enumerate(table.columns):
        if table.value == "ratio" and col.eval_len == col.train_len:
            continue
        shown = {row: round(c.mean, table.digits) for row in table.rows
                 if (c := table.cells[row, j]).status == "ok" and c.mean is not None}
        if len(shown) < 2:
            continue
        best = min(shown.values())
        for row, v in shown.items():
            table.cells[row, j].best = v == best


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
        if cell.std is not None:
            text += f" {pm} {cell.std:.{digits}f}"
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
        index=[_escape(r, fmt) for r in table.rows], columns=headers, dtype=object)
    frame.index.name = "encoding"
    return frame


def _footnotes(tables: Sequence[Table], notes: dict[str, str]) -> list[str]:
    used = {c.note for t in tables for c in t.cells.values() if c.note}
    return [f"{mark} {reason}" for reason, mark in notes.items() if mark in used]


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
    a few local bytes, so its loss hardly falls with position. Seed 0 (or the lowest seed) of each row."""
    rows = []
    for enc in row_order or list(dict.fromkeys(r["encoding"] for r in records)):
        recs = [r for r in records if r["encoding"] == enc and r["eval_len"] == r["train_len"]]
        if not recs:
            continue
        r = min(recs, key=lambda x: x["seed"])
        curve = r.get("train_curve") or []
        row = {"encoding": enc}
        for frac in (0.25, 0.5, 1.0):
            if curve:
                step, loss = min(curve, key=lambda c: abs(c[0] - frac * curve[-1][0]))
                row[f"train loss @ step {step}"] = f"{loss:.3f}"
        by_pos = r.get("loss_by_position") or []
        if r["status"] == "ok" and by_pos:
            first = by_pos[0]
            late = [b for b in by_pos if b["start"] >= r["eval_len"] // 2]
            late_loss = sum(b["loss"] * b["tokens"] for b in late) / max(1, sum(b["tokens"] for b in late))
            row[f"1x loss, positions {first['start']}-{first['end'] - 1}"] = f"{first['loss']:.3f}"
            row[f"1x loss, positions {r['eval_len'] // 2}-{r['eval_len'] - 1}"] = f"{late_loss:.3f}"
        else:
            row["status"] = r["status"]
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


def _training_frame(run: Run, fmt: str) -> pd.DataFrame:
    frame = training_table(run.data["records"], run.data["run"].get("rows")).fillna("")
    if frame.empty:
        return frame
    frame = frame.rename(index=lambda r: _escape(r, fmt), columns=lambda c: _escape(c, fmt))
    frame.index.name = "encoding"
    return frame


def render(runs: Sequence[Run], *, fmt: str = "md", values: Sequence[str] = DEFAULT_VALUES, digits: int = 2,
           mark_best: bool = True) -> str:
    """The report for ``runs`` in ``fmt``: Markdown / HTML / LaTeX tables with caption and footnotes, or the
    long-format CSV / JSON of the same cells."""
    if fmt not in FORMATS:
        raise ReportError(f"unknown report format {fmt!r}; valid: {', '.join(FORMATS)}")
    values = parse_values(values)
    notes: dict[str, str] = {}
    tables = [build_table(runs, v, digits=digits, mark_best=mark_best, notes=notes) for v in values if v != "training"]
    if fmt == "csv":
        return _csv(runs, tables)
    if fmt == "json":
        return _json(runs, tables, notes, values)
    captions = [(f"{r.label}: " if r.label else "") + caption(r.data["run"], r.data["records"]) for r in runs]
    blocks: list[tuple[str, str, list[str]]] = []  # (title, table text, footnotes)
    it = iter(tables)
    for v in values:
        if v == "training":
            for run in runs:
                frame = _training_frame(run, fmt)
                if not frame.empty:
                    title = TITLES["training"] + (f", {run.label}" if run.label else "")
                    blocks.append((title, _tabulate(frame, fmt), []))
            continue
        table = next(it)
        title = TITLES[v] + ("; " + BEST_NOTE if mark_best and any(c.best for c in table.cells.values()) else "")
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
                    "std": c.std, "seeds_ok": c.seeds_ok, "seeds": c.seeds, "status": c.status, "reason": c.reason,
                    "best": c.best,
                })
    return rows


def _csv(runs: Sequence[Run], tables: Sequence[Table]) -> str:
    cols = ["run", "value", "encoding", "train_len", "eval_len", "multiple", "mean", "std", "seeds_ok", "seeds",
            "status", "reason", "best"]
    buf = io.StringIO()
    pd.DataFrame(_long_rows(runs, tables), columns=cols).to_csv(buf, index=False, float_format="%.6g",
                                                                lineterminator="\n")
    return buf.getvalue()


def _json(runs: Sequence[Run], tables: Sequence[Table], notes: dict[str, str], values: Sequence[str]) -> str:
    out = {
        "runs": [{"label": r.label, "path": r.path, "caption": caption(r.data["run"], r.data["records"])} for r in runs],
        "tables": [{
            "value": t.value, "title": t.title,
            "columns": [asdict(c) | {"header": c.header()} for c in t.columns],
            "rows": [{"encoding": row, "cells": [asdict(t.cells[row, j]) for j in range(len(t.columns))]}
                     for row in t.rows],
        } for t in tables],
        "footnotes": {mark: reason for reason, mark in notes.items()},
    }
    if "training" in values:
        out["training"] = {r.label or "run": training_table(r.data["records"], r.data["run"].get("rows"))
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
