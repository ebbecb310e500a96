"""Captions: what was measured, in words, from a results file's run metadata and records.

A table or figure is read away from its results file, so its caption carries what a reader needs to judge the
numbers: the model (ours: size and training; a Hugging Face model: its revision and tokenizer), the text scored
(corpus and eval fingerprints, tokens per length, protocol), the seeds, the device, the software versions and
the commit of the code, with the mark of uncommitted changes.
"""

from __future__ import annotations

from collections import Counter
from typing import Optional

from posenc_bench.env import every_value, short_commit


def _by_record(run: dict, records: Optional[list[dict]], field: str, word: str, short=lambda v: v) -> str:
    """'{word} X' for a run whose records share ``field`` (its header's value where they lack it), else every value
    with its rows (``env.every_value``)."""
    return every_value(((r["encoding"], short(r.get(field) or run[field])) for r in records or []), word,
                       short(run[field]))


def _commits(run: dict, records: Optional[list[dict]]) -> str:
    """'commit X', or, when rows were added by later invocations, every commit with its rows."""
    return _by_record(run, records, "git_commit", "commit", short_commit)


def _every(run: dict, records: Optional[list[dict]], field: str, word: str, short=lambda v: v) -> str:
    """Every value of ``field`` over the records, in order, for a figure's short caption: 'commit X', 'commits X, Y'
    (without a ``word``, the values alone)."""
    values = list(dict.fromkeys(short(r.get(field) or run[field]) for r in records or [run]))
    return (f"{word}{'s' if len(values) > 1 else ''} " if word else "") + ", ".join(values)


def _devices(run: dict, records: Optional[list[dict]]) -> str:
    """'device X', or, when rows ran on several machines, every device with its rows."""
    return _by_record(run, records, "device", "device")


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
    return shown[0] if shown[0] == shown[1] else f"{shown[0]}-{shown[1]}"  # rows apart by less than the rounding: one


def _protocol(cfg: dict) -> str:
    ev = cfg.get("eval", {})
    if ev.get("protocol", "nonoverlapping") == "strided":
        return f", strided protocol: each window scores its last {ev['stride']} targets"
    return ""


def kind(run: dict) -> tuple[str, Optional[str]]:
    """What made the results: ("run", None) for `posenc-bench run`; ("eval", "hf") for `posenc-bench eval` of a
    Hugging Face model, ("eval", "checkpoint") for one of a checkpoint of ours. Each kind has its own fields."""
    made_by = run.get("kind", "run")
    return made_by, (run.get("model") or {}).get("kind") if made_by == "eval" else None


def kind_text(run: dict) -> str:
    """``kind`` in words, naming the model an eval scored."""
    m = run.get("model") or {}
    made_by, model = kind(run)
    if made_by == "run":
        return "a training run (posenc-bench run)"
    if model == "hf":
        return f"an eval of the Hugging Face model {m.get('model') or m.get('ref')} (posenc-bench eval)"
    if model == "checkpoint":
        return f"an eval of the checkpoint {m.get('path')} (posenc-bench eval)"
    return f"results of kind {made_by!r} (model kind {model!r})"


def _is_hf(run: dict) -> bool:
    return kind(run) == ("eval", "hf")


def caption(run: dict, records: Optional[list[dict]] = None) -> str:
    if _is_hf(run):
        return hf_caption(run, records)
    cfg = run["config"]
    m, t = cfg["model"], cfg["train"]
    seeds = cfg["seeds"]
    if _is_task(run):
        return task_caption(run, records) + tuning_text(records)
    return (
        f"{_tokens(run)} LM, {_params(run, records)} parameters ({m['n_layers']} layers, width {m['d_model']}, "
        f"{m['n_heads']} heads), trained {t['steps']} steps x {t['batch_size']} x {t['train_len']} tokens "
        f"(lr {t['lr']:g}); corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), "
        f"{run['eval_tokens']:,} {_scored(run)} scored at every length "
        f"(eval {run['eval_fingerprint']}){_protocol(cfg)}; seeds {','.join(map(str, seeds))}; {_devices(run, records)}; "
        f"torch {run['versions']['torch']}; {_commits(run, records)}."
    ) + tuning_text(records) + untuned_text(run, records)


def tuning_text(records: Optional[list[dict]]) -> str:
    """" Tuned on the valid split ...": for every row whose options ``eval.tune`` chose (records with ``tuning``,
    ``bench/eval/tune.py``), at each length, the grid, the point chosen (on how many seeds) and each point's
    valid value (the mean over seeds); "" when no record was tuned: a row without ``tuning`` is at its authors'
    defaults."""
    by_row: dict[str, dict[float, list[dict]]] = {}
    for r in records or []:
        if r.get("tuning") and r.get("status") == "ok":
            by_row.setdefault(r["encoding"], {}).setdefault(r["ratio"], []).append(r)
    if not by_row:
        return ""
    rows = []
    for row, by_ratio in by_row.items():
        names = list(by_ratio[min(by_ratio)][0]["tuning"]["grid"][0])
        lengths = [_tuned_length(ratio, recs, names) for ratio, recs in sorted(by_ratio.items())]
        label = names[0] if len(names) == 1 else f"({', '.join(names)})"
        rows.append(f"{row} {label}: " + "; ".join(lengths))
    return (" Tuned on the valid split (eval.tune: at each length the grid's point with the best valid value, the "
            "authors' default first and kept on a tie; the test number is at that point): " + ". ".join(rows) + ".")


UNTUNED = "Not tuned (authors' defaults; eval.tune off)"  # untuned_text's clause: it names rows, and no number


def _row_of(run: dict, record: dict):
    """The zero-shot row a text record was scored as (``bench.rows.Row``; a pretrained model's scaling as the
    rope model's row of that name), or None: a trained row, the model itself, a name this install lacks."""
    from posenc_bench.bench.rows import Row, rope_row
    from posenc_bench.errors import ConfigError

    if _is_hf(run):
        return rope_row(record["scaling"]) if record.get("scaling") else None
    try:
        row = Row.parse(record["encoding"])
    except ConfigError:
        return None
    return row if row.eval_only else None


def untuned_text(run: dict, records: Optional[list[dict]]) -> str:
    """" At their authors' defaults ...": the zero-shot rows a text table shows without ``tuning`` although their
    grid has two or more points at one of its lengths (``Row.grid``: YaRN's ramp past 1x, ReRoPE's
    window, ...), so that an untuned table says so as a tuned one says what it chose; "" when there is none."""
    from posenc_bench.model.transformer import encoding_options

    if _is_task(run):
        return ""  # a task's windows are an instance's input (tune.window_length): its folders say it in prose
    cfg = run.get("config", {})
    options = cfg.get("model", {}).get("encoding_options", {})
    train_len = run.get("train_len") or cfg.get("train", {}).get("train_len")
    if train_len is None:
        return ""  # a hand-made results file without it: nothing to tell the grids by
    rows: dict[str, None] = {}
    for r in records or []:
        if r.get("status") != "ok" or r.get("tuning") or r["encoding"] in rows or (row := _row_of(run, r)) is None:
            continue
        held = {} if _is_hf(run) else encoding_options(options, row.encoding)  # held, as tune.points holds them
        if row.grid(train_len, r["eval_len"], held):
            rows[r["encoding"]] = None
    if not rows:
        return ""
    return f" {UNTUNED}: " + ", ".join(rows) + "."


def _tuned_length(ratio: float, records: list[dict], names: list[str]) -> str:
    """One length of ``tuning_text``: '4x from 8, 16: 8 on 2 of 3 seeds, 16 on 1; valid accuracy 0.75, 0.72'."""
    def point(p: dict) -> str:
        values = ", ".join(f"{p[k]:g}" for k in names)
        return values if len(names) == 1 else f"({values})"

    first = records[0]["tuning"]
    same = [r["tuning"] for r in records if r["tuning"]["grid"] == first["grid"]]
    chosen = Counter(point(r["tuning"]["chosen"]) for r in records)
    counts = [f"{p} on {n} of {len(records)} seed{'s' if len(records) > 1 else ''}" if i == 0 else f"{p} on {n}"
              for i, (p, n) in enumerate(chosen.most_common())]
    means = []
    for i in range(len(first["grid"])):
        vals = [t["values"][i] for t in same if t["values"][i] is not None]
        means.append(f"{sum(vals) / len(vals):.4g}" if vals else "n/a")
    return (f"{ratio:g}x from {', '.join(point(p) for p in first['grid'])}: {', '.join(counts)}; valid "
            f"{first['metric']} {', '.join(means)}")



def _is_task(run: dict) -> bool:
    return str(run["corpus"].get("source", "")).startswith("task:")


def _instances_per_size(run: dict) -> str:
    """The test instances a size (the needle's can differ by size: a whole number at each depth), as "256"."""
    return "/".join(map(str, sorted(set((run.get("eval_instances") or {}).values()))))


def task_caption(run: dict, records: Optional[list[dict]] = None) -> str:
    """Caption of a task run (``bench/tasks``)."""
    cfg, c = run["config"], run["corpus"]
    m, t, task = cfg["model"], cfg["train"], cfg["task"]
    options = ", ".join(f"{k} {v}" for k, v in (c.get("options") or {}).items())
    return (
        f"Task {c['task']}{' (' + options + ')' if options else ''}, after {c.get('paper', '?')}; byte-level LM, "
        f"{_params(run, records)} parameters ({m['n_layers']} layers, width {m['d_model']}, {m['n_heads']} heads), "
        f"trained {t['steps']} steps x {t['batch_size']} instances of sizes {task['min_size']}-{task['train_size']} "
        f"(up to {t['train_len']} tokens; lr {t['lr']:g}; task {c['fingerprint']}); "
        f"{_instances_per_size(run)} test instances at each size (eval {run['eval_fingerprint']}); seeds "
        f"{','.join(map(str, cfg['seeds']))}; {_devices(run, records)}; torch {run['versions']['torch']}; "
        f"{_commits(run, records)}."
    )


def scored_split(run: dict) -> str:
    """The split a run scored: "test" unless its config names another ("valid"; "all" for a pretrained model's
    every document, ``--split all``)."""
    return ((run.get("config") or {}).get("eval") or {}).get("split") or "test"


def _scored(run: dict, plural: bool = True) -> str:
    """What a run's tokens were scored on, for a caption: "test tokens", "valid tokens", "tokens of every document"."""
    split = scored_split(run)
    if split == "all":
        return "tokens of every document" if plural else "token"
    if split == "all-but-valid":
        return "tokens of every document but the valid split's" if plural else "token"
    return f"{split} token{'s' if plural else ''}"


def _tokens(run: dict) -> str:
    """"Byte-level", or the BPE a run was tokenized with, its fingerprint and its bytes per scored token."""
    tok = run.get("tokenizer")
    if not isinstance(tok, dict):
        return "Byte-level"
    per = f", {run['eval_bytes'] / run['eval_tokens']:.2f} bytes a {_scored(run, plural=False)}" if run.get("eval_bytes") else ""
    return f"Byte-level BPE ({tok['name']}, {tok['fingerprint']}{per})"


def _prefix(run: dict) -> str:
    """The token a pretrained model's eval put before each document (``--doc-sep``), in words. A run that records
    the choice (``config.eval.doc_sep``) scored none of them; the caption of one made before (which scored a
    separator where the stream had one among its targets) stays as it was."""
    if "doc_sep" in ((run.get("config") or {}).get("eval") or {}):
        return f"document prefix {run['doc_separator']}, never a scored target"
    return f"document separator {run['doc_separator']}"


def hf_caption(run: dict, records: Optional[list[dict]] = None) -> str:
    """Caption of a `posenc-bench eval` table of a pretrained Hugging Face model."""
    m = run["model"]
    what = m["ref"] + (f"/{m['gguf_file']}" if m.get("gguf_file") else "")
    revision = m.get("file_sha256") or m.get("files_sha256") or m.get("hub_commit") or "?"
    return (
        f"Pretrained {m['class']} {what} (revision {revision}), {m['params']:,} parameters, {m['dtype']}; "
        f"train length {run['train_len']} ({run['train_len_source']}); tokenizer {m['tokenizer']['class']} "
        f"(vocab {m['tokenizer']['vocab_size']:,}, {_prefix(run)}); "
        f"corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), {run['eval_tokens']:,} {_scored(run)} "
        f"({run['eval_bytes']:,} bytes) scored at every length (eval {run['eval_fingerprint']}); {_devices(run, records)}; "
        f"torch {run['versions']['torch']}, transformers {run['versions']['transformers']}; "
        f"{_commits(run, records)}."
    ) + tuning_text(records) + untuned_text(run, records)


def short_caption(run: dict, records: Optional[list[dict]] = None) -> str:
    """The caption facts in two short lines, for figures."""
    if _is_hf(run):
        m = run["model"]
        return (f"{m['ref'].rsplit('/', 1)[-1]}{'/' + m['gguf_file'] if m.get('gguf_file') else ''}, "
                f"{m['params'] / 1e6:.0f}M params, train len {run['train_len']}, tokenizer {m['tokenizer']['class']}\n"
                f"corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), {run['eval_tokens']:,} tokens "
                f"per length; {_every(run, records, 'device', '')}; "
                f"{_every(run, records, 'git_commit', 'commit', short_commit)}")
    cfg = run["config"]
    m, t = cfg["model"], cfg["train"]
    if _is_task(run):
        scored = (f"task {run['corpus']['task']} ({run['corpus']['fingerprint']}), train sizes "
                  f"{cfg['task']['min_size']}-{cfg['task']['train_size']}, {_instances_per_size(run)} test instances "
                  "per size")
    else:
        scored = (f"corpus {run['corpus']['source']} ({run['corpus']['fingerprint']}), {run['eval_tokens']:,} tokens "
                  f"per length{_protocol(cfg)}")
    return (
        f"{_params(run, records, 2)} params ({m['n_layers']}L, d{m['d_model']}, {m['n_heads']}H), "
        f"train len {t['train_len']}, {t['steps']} steps x {t['batch_size']}; seeds "
        f"{','.join(map(str, cfg['seeds']))}\n{scored}; "
        f"{_every(run, records, 'device', '')}; {_every(run, records, 'git_commit', 'commit', short_commit)}"
    )
