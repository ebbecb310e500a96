"""results.json: the one schema that tables, plots and gates read. Written atomically.

File layout::

    {"schema_version": 1, "run": {config, corpus, eval fingerprint, versions, device, git commit, ...},
     "records": [ {encoding, seed, train_len, eval_len, ratio, status, reason, ppl, bpb, loss, tokens, ...} ]}

One record per (encoding row, seed, eval length). ``status`` is "ok", "n/a" (the encoding cannot run at that
length; ``reason`` says why) or "diverged" (training blew up; ``reason`` has the step and last finite loss).

This module is the one home of:

- the record (``new_record``, ``measured``) and the run metadata (``run_meta``) that ``run`` and ``eval`` write;
- THE identity rule (``differences``): which results were measured the same way and so may share a results
  folder (resume, ``eval``), a merge, or a gate comparison. Results that were not measured on the same text,
  with the same model, training, evaluation and precision differ in a named field;
- the results folder (``ResultsFolder``): one writer at a time (a file lock), checked against the rule.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from posenc_bench.errors import PosencError
from posenc_bench.files import atomic_write_json, atomic_write_text

SCHEMA_VERSION = 1
STATUSES = ("ok", "n/a", "diverged")


class ResultsError(PosencError):
    pass


def read_results(path: Path | str) -> dict:
    """Load and check a results.json (or a folder holding one)."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    if not path.is_file():
        raise ResultsError(f"no results file at {str(path)!r}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ResultsError(f"{str(path)!r} is not valid JSON (truncated or corrupt?): {e}") from None
    if not isinstance(data, dict) or "records" not in data or "run" not in data:
        raise ResultsError(f"{str(path)!r} is not a posenc-bench results file (no 'run' and 'records')")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ResultsError(f"{str(path)!r} has schema_version {data.get('schema_version')!r}; this version reads {SCHEMA_VERSION}")
    return data


class ResultsStore:
    """The records of one output folder; replaces a cell's records and rewrites the file atomically."""

    def __init__(self, path: Path | str, run: dict, records: Iterable[dict] = ()) -> None:
        self.path = Path(path)
        self.run = run
        self.records = list(records)

    def cell(self, encoding: str, seed: int) -> list[dict]:
        return [r for r in self.records if r["encoding"] == encoding and r["seed"] == seed]

    def put_cell(self, encoding: str, seed: int, records: list[dict]) -> None:
        self.records = [r for r in self.records if not (r["encoding"] == encoding and r["seed"] == seed)]
        self.records.extend(records)
        self.save()

    def as_dict(self) -> dict:
        return {"schema_version": SCHEMA_VERSION, "run": self.run, "records": self.records}

    def save(self) -> None:
        atomic_write_json(self.path, self.as_dict())


# ---- the record ----------------------------------------------------------------------------------------

MEASURED = ("ppl", "bpb", "loss", "tokens", "bytes", "loss_by_position", "units", "eval_time_s", "peak_memory_bytes",
            "peak_memory_kind")


def new_record(run: dict, row: str, seed: int, eval_len: int, **fields: Any) -> dict:
    """The record of one (row, seed, eval length), not yet measured: what it is, then the row's own
    ``fields`` (keys, training figures, ...), then where it was measured (from the run's metadata)."""
    train_len = run["train_len"]
    rec = {"encoding": row, "base_encoding": fields.pop("base_encoding", row), "window": fields.pop("window", None),
           "seed": seed, "train_len": train_len, "eval_len": eval_len, "ratio": eval_len / train_len,
           "status": "ok", "reason": "", "ppl": None, "bpb": None, "loss": None, "tokens": None}
    rec.update(fields)
    rec.update(corpus_fingerprint=run["corpus"]["fingerprint"], eval_fingerprint=run["eval_fingerprint"],
               git_commit=run["git_commit"], device=run["device"], versions=run["versions"])
    return rec


def measured(rec: dict, result: dict) -> dict:
    """``rec`` with the numbers of one evaluation (``bench.evaluate``'s result)."""
    rec.update({k: result[k] for k in MEASURED if k in result})
    return rec


def not_measured(rec: dict, status: str, reason: str, **fields: Any) -> dict:
    """``rec`` marked n/a or diverged, with the reason."""
    rec.update(status=status, reason=reason, **fields)
    return rec


def run_meta(*, rows: list[str], train_len: int, eval_lengths: list[int], segments, corpus: dict, device: str,
             **extra: Any) -> dict:
    """The metadata of one run or eval: ``extra`` (kind, config, model, ...) and where and on what text."""
    from posenc_bench.data import tokens_fingerprint
    from posenc_bench.env import git_commit, versions

    S = segments.shape[1] - 1
    meta = {**extra, "rows": rows, "train_len": train_len, "eval_lengths": eval_lengths, "segment_len": S,
            "eval_tokens": int(segments.shape[0] * S), "eval_fingerprint": tokens_fingerprint(segments),
            "corpus": corpus, "device": device, "git_commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    meta["versions"] = {**versions(), **meta.get("versions", {})}
    return meta


def summary_line(row: str, records: list[dict]) -> str:
    return f"  {row}: ppl " + ", ".join(
        f"{r['eval_len']}: {r['ppl']:.3f}" if r["status"] == "ok" else f"{r['eval_len']}: {r['status']}" for r in records
    )


# ---- the identity rule ---------------------------------------------------------------------------------

# Settings that change no number (how the work is cut, where it goes) or are compared another way (eval.lens
# as the eval lengths, the rows and seeds as cells, per-encoding options in each row's cell and eval keys).
NOT_IDENTITY = (
    "config.out", "config.device", "config.threads", "config.max_mask_bytes", "config.save_every",
    "config.eval.batch_tokens", "config.eval.lens", "config.encodings", "config.seeds", "config.gate",
    "config.train.log_every", "config.plugins", "config.grad_accum", "config.rope_scaling", "model.path",
    # per row (``row_settings``): a cell's own encoding options, and the fine-tuning of the -ft rows
    "config.model.encoding_options", "config.finetune",
)
_EVALUATED_MODEL = ("kind", "ref", "gguf_file", "dtype", "file_sha256", "files_sha256", "hub_commit",
                    "encoding", "window", "seed", "cell_key", "weights_sha256")


def _leaves(value: Any, prefix: str) -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_leaves(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def identity(run: dict) -> dict[str, Any]:
    """What must be equal for two results to be comparable, as flat named fields: the kind, the model that
    was evaluated (an ``eval``'s model), the config's model, training, data, evaluation and precision
    settings, the text (corpus and eval-token fingerprints), the eval lengths and the tokenizer."""
    out = _leaves(run.get("config", {}), "config")
    model = run.get("model")
    if isinstance(model, dict):
        out.update(_leaves({k: model.get(k) for k in _EVALUATED_MODEL if k in model}, "model"))
    out["kind"] = run.get("kind", "run")
    out["train length"] = run.get("train_len", run.get("config", {}).get("train", {}).get("train_len"))
    out["corpus fingerprint"] = run.get("corpus", {}).get("fingerprint")
    out["eval fingerprint"] = run.get("eval_fingerprint")
    out["eval lengths"] = run.get("eval_lengths")
    out["tokenizer"] = run.get("tokenizer", "bytes")
    return {k: v for k, v in out.items() if not any(k == i or k.startswith(i + ".") for i in NOT_IDENTITY)}


def row_settings(rec: dict) -> dict[str, Any]:
    """The settings of one row that its cell and eval keys hold beyond the run's identity: its encoding's own
    options (and those of the trained encoding it evaluates), and the fine-tuning of a -ft row."""
    from posenc_bench import encodings
    from posenc_bench.errors import UnknownEncodingError

    cfg = rec.get("config") or {}
    options = (cfg.get("model") or {}).get("encoding_options") or {}
    name = rec.get("base_encoding") or rec["encoding"]
    try:
        cls = encodings.get_class(name)
    except UnknownEncodingError:  # a plugin's encoding that is not imported here: its own options only
        return _leaves({"encoding_options": {name: options.get(name)}}, "")
    out = {"encoding_options": {n: options.get(n) for n in dict.fromkeys([cls.trained_as or name, name])}}
    if cls.finetuned:
        out["finetune"] = cfg.get("finetune")
    return _leaves(out, "")


def differences(a_run: dict, b_run: dict, a_records: Iterable[dict] = (), b_records: Iterable[dict] = ()
                ) -> list[tuple[str, Any, Any]]:
    """(field, value in a, value in b) for every identity field where two results differ; none: comparable.

    A config setting absent from one side (added to the config after those results were made) compares as
    its default, which is what that run used. Field names drop the ``config.`` prefix (``train.lr``). With the
    records, the rows both hold are compared too, field ``<row>: <setting>`` (``t5: encoding_options...``)."""
    from posenc_bench.bench.config import RunConfig

    defaults = _leaves(RunConfig().to_dict(), "config")
    a, b = identity(a_run), identity(b_run)
    diffs = []
    for key in list(a) + [k for k in b if k not in a]:
        av, bv = a.get(key, defaults.get(key, "(absent)")), b.get(key, defaults.get(key, "(absent)"))
        if av != bv:
            diffs.append((key.removeprefix("config."), av, bv))
    a_rows = {r["encoding"]: r for r in a_records}
    for row, rec in {r["encoding"]: r for r in b_records}.items():
        if row in a_rows:
            sa, sb = row_settings(a_rows[row]), row_settings(rec)
            diffs += [(f"{row}: {k}", sa.get(k), sb.get(k)) for k in dict.fromkeys([*sa, *sb]) if sa.get(k) != sb.get(k)]
    return diffs


class IncomparableError(ResultsError):
    """Results measured another way than the ones they would join (the first differing field named)."""


# ---- the results folder --------------------------------------------------------------------------------

class ResultsFolder:
    """A results file and its lock: one writer at a time, and only results of the same identity.

    ``with ResultsFolder(out, name, run) as store:`` takes the folder's lock for ``name`` (shards each lock
    their own file, so they write one folder side by side) or stops at once with one line naming the process
    that holds it, then opens the store: the records already there, after checking that they were measured
    as ``run`` will be (else IncomparableError naming the first differing field, with both values).
    """

    def __init__(self, out: Path | str, name: str = "results.json") -> None:
        self.out = Path(out)
        self.path = self.out / name
        self._lock_path = self.out / f".{name}.lock"
        self._owner = self.out / f".{name}.owner"
        self._lock = None

    def __enter__(self) -> "ResultsFolder":
        from filelock import FileLock, Timeout

        self.out.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(self._lock_path)
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            try:
                owner = self._owner.read_text().strip()
            except OSError:
                owner = "another process"
            raise ResultsError(f"{self.out} is being written by {owner}; wait for it to finish, or use another "
                               "--out") from None
        atomic_write_text(self._owner, f"pid {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        return self

    def __exit__(self, *exc: Any) -> None:
        self._owner.unlink(missing_ok=True)
        self._lock.release()

    def open_store(self, run: dict, merge_runs: bool = True) -> "ResultsStore":
        """The store for ``run``: empty, or the file's records if they are comparable with ``run``."""
        if not self.path.exists():
            return ResultsStore(self.path, run)
        old = read_results(self.path)
        diffs = differences(old["run"], run)
        if diffs:
            field, was, now = diffs[0]
            what = ("was evaluated at other lengths or on other tokens" if field in ("eval lengths", "eval fingerprint")
                    else f"holds results made with a different {field.split('.')[0]!r} config")
            raise IncomparableError(f"{self.path} {what} ({field}: {was!r} there, {now!r} now); use another --out, "
                                    "or --fresh to start over")
        if merge_runs:
            merge_run_lists(old["run"], run)
        return ResultsStore(self.path, run, old["records"])


def merge_run_lists(old: dict, new: dict) -> None:
    """Keep the rows (and encodings, seeds) of earlier invocations in ``new``, in their order, then the new
    ones; an invocation that names every earlier row sets the order itself."""
    def ordered(before: list, now: list) -> list:
        first, then = (now, before) if set(before) <= set(now) else (before, now)
        return list(dict.fromkeys(first + then))

    new["rows"] = ordered(old.get("rows", []), new["rows"])
    if "config" in new and "encodings" in new["config"] and "encodings" in old.get("config", {}):
        new["config"]["encodings"] = ordered(old["config"]["encodings"], new["config"]["encodings"])
        new["config"]["seeds"] = sorted(set(old["config"]["seeds"]) | set(new["config"]["seeds"]))


def require_writable(out: Path | str) -> None:
    """ResultsError unless ``out`` is, or can be made, a writable folder (checked before any work, creating
    nothing: a run that then fails on its input leaves no folder behind)."""
    out = Path(out)
    probe = out
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir() or not os.access(probe, os.W_OK | os.X_OK):
        why = "is not a folder" if not probe.is_dir() else "is not writable"
        raise ResultsError(f"output folder {str(out)!r} cannot be written: {str(probe)!r} {why}")
