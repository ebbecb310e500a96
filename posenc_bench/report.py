"""Tables built from results records alone: the ppl table (mean +- std over seeds) and ratios to 1x."""

from __future__ import annotations

import math
from typing import Iterable

import pandas as pd
from tabulate import tabulate


def _fmt_ratio(r: float) -> str:
    return f"{r:g}x" if r == int(r) else f"{r:.3g}x"


def records_frame(records: Iterable[dict]) -> pd.DataFrame:
    cols = ["encoding", "seed", "train_len", "eval_len", "ratio", "status", "reason", "ppl", "bpb", "loss", "tokens"]
    return pd.DataFrame([{c: r.get(c) for c in cols} for r in records], columns=cols)


def _cell(group: pd.DataFrame, value: str, digits: int) -> str:
    ok = group[group["status"] == "ok"]
    if len(ok) == 0:
        return "diverged" if (group["status"] == "diverged").any() else "n/a"
    vals = ok[value].astype(float)
    text = f"{vals.mean():.{digits}f}"
    if len(vals) > 1:
        text += f" ± {vals.std(ddof=1):.{digits}f}"
    if len(ok) < len(group):
        text += f" ({len(ok)}/{len(group)} seeds)"
    return text


def ppl_table(records: list[dict], *, value: str = "ppl", relative: bool = False, digits: int = 2,
              row_order: list[str] | None = None) -> tuple[pd.DataFrame, list[str]]:
    """Rows: encodings; columns: eval lengths as '<k>x (<L>)'. Returns (frame of strings, footnotes).

    relative=True divides each seed's value by the same seed's value at the train length (the 1x column).
    """
    df = records_frame(records)
    if df.empty:
        return pd.DataFrame(), []
    if relative:
        ref = df[df["eval_len"] == df["train_len"]].set_index(["encoding", "seed"])[value]
        df[value] = [
            (v / ref.get((e, s), math.nan)) if st == "ok" else v
            for v, e, s, st in zip(df[value], df["encoding"], df["seed"], df["status"])
        ]
    rows = row_order or list(dict.fromkeys(df["encoding"]))
    rows = [r for r in rows if r in set(df["encoding"])]
    lengths = sorted(set(df["eval_len"]))
    train_lens = dict(zip(df["eval_len"], df["train_len"]))
    headers = [f"{_fmt_ratio(L / train_lens[L])} ({L})" for L in lengths]
    table = pd.DataFrame(index=rows, columns=headers, dtype=object)
    notes: dict[str, str] = {}
    for enc in rows:
        for L, h in zip(lengths, headers):
            group = df[(df["encoding"] == enc) & (df["eval_len"] == L)]
            if group.empty:
                table.loc[enc, h] = ""
                continue
            text = _cell(group, value, digits)
            bad = group[group["status"] != "ok"]
            if len(bad):
                reason = str(bad["reason"].iloc[0])
                mark = notes.setdefault(reason, f"[{len(notes) + 1}]")
                text += f" {mark}"
            table.loc[enc, h] = text
    table.index.name = "encoding"
    footnotes = [f"{mark} {reason}" for reason, mark in notes.items()]
    return table, footnotes


def markdown(table: pd.DataFrame, footnotes: list[str], caption: str = "") -> str:
    out = []
    if caption:
        out += [caption, ""]
    align = ("left",) + ("right",) * len(table.columns)  # row names left, numbers right
    out.append(tabulate(table, headers="keys", tablefmt="github", colalign=align, disable_numparse=True))
    if footnotes:
        out += [""] + footnotes
    return "\n".join(out) + "\n"


def caption(run: dict) -> str:
    if run.get("kind") == "eval" and run["model"].get("kind") == "hf":
        return hf_caption(run)
    cfg = run["config"]
    m, t = cfg["model"], cfg["train"]
    seeds = cfg["seeds"]
    sha, dirty, _ = run["git_commit"].partition("-dirty")
    commit = sha[:12] + ("-dirty" if dirty else "")
    return (
        f"Byte-level LM, {run.get('params', '?'):,} parameters ({m['n_layers']} layers, width {m['d_model']}, "
        f"{m['n_heads']} heads), trained {t['steps']} steps x {t['batch_size']} x {t['train_len']} tokens "
        f"(lr {t['lr']:g}); corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), "
        f"{run['eval_tokens']:,} {cfg['eval']['split']} tokens scored at every length "
        f"(eval {run['eval_fingerprint']}); seeds {','.join(map(str, seeds))}; device {run['device']}; "
        f"torch {run['versions']['torch']}; commit {commit}."
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


def results_markdown(data: dict) -> str:
    rows = data["run"].get("rows")
    ppl, notes = ppl_table(data["records"], row_order=rows)
    rel, rel_notes = ppl_table(data["records"], relative=True, row_order=rows)
    return (
        "Perplexity (lower is better; columns: eval length as a multiple of the train length):\n\n"
        + markdown(ppl, notes, caption(data["run"]))
        + "\nPerplexity relative to the same model at the train length (1x):\n\n"
        + markdown(rel, rel_notes)
        + "\nTraining (mean train loss, nats) and context use at 1x (test loss early vs late in the window):\n\n"
        + markdown(training_table(data["records"], rows).fillna(""), [])
    )


def results_csv(data: dict) -> str:
    return records_frame(data["records"]).to_csv(index=False)
