"""results.json: the one schema that tables, plots and gates read. Written atomically.

File layout::

    {"schema_version": 1, "run": {config, corpus, eval fingerprint, versions, device, git commit, ...},
     "records": [ {encoding, seed, train_len, eval_len, ratio, metric, status, reason, ppl, bpb, loss, ...} ]}

One record per (encoding row, seed, eval length). ``metric`` names what its numbers measure (``ppl``: the
perplexity protocol of ``bench/eval/evaluate.py``; records written before the field existed are ppl records).
``status`` is "ok", "n/a" (the encoding cannot run at that length; ``reason`` says why) or "diverged"
(training blew up; ``reason`` has the step and last finite loss).

This module is the one home of:

- the record: ``new_record`` (any model), ``model_record`` (one of our trained models: its keys and training
  figures), ``passkey_record`` and ``needle_record`` (the retrieval tests' own records, not in results.json),
  ``score`` (its numbers, or n/a where the encoding cannot run), ``finished`` (whether a cell's records are
  whole), and the run metadata (``run_meta``) that ``run``, ``eval`` and ``merge`` write;
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
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

from posenc_bench import metrics
from posenc_bench.errors import PosencError, PositionOutOfRange
from posenc_bench.files import atomic_write_json, atomic_write_text

if TYPE_CHECKING:
    from posenc_bench.bench.rows import Row

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
            "peak_memory_kind", "accuracy", "token_accuracy", "instances", "by_depth",
            "tuning")  # eval.tune's choice on the valid split (bench/eval/tune.py); absent: the defaults, untuned


def new_record(run: dict, row: str, seed: int, eval_len: int, *, metric: str = "ppl", **fields: Any) -> dict:
    """The record of one (row, seed, eval length), not yet measured: what it is, then the row's own
    ``fields`` (keys, training figures, ...), then where it was measured (from the run's metadata)."""
    if metric not in metrics.kinds(in_results=True):
        raise ValueError(f"unknown metric {metric!r}; valid: {', '.join(metrics.kinds(in_results=True))}")
    train_len = run["train_len"]
    rec = {"encoding": row, "base_encoding": fields.pop("base_encoding", row), "window": fields.pop("window", None),
           "seed": seed, "train_len": train_len, "eval_len": eval_len, "ratio": eval_len / train_len, "metric": metric,
           "status": "ok", "reason": "", "ppl": None, "bpb": None, "loss": None, "tokens": None,
           **({"accuracy": None, "token_accuracy": None} if metric == "accuracy" else {})}
    rec.update(fields)
    rec.update(corpus_fingerprint=run["corpus"]["fingerprint"], eval_fingerprint=run["eval_fingerprint"],
               git_commit=run["git_commit"], device=run["device"], versions=run["versions"])
    return rec


def model_record(run: dict, row: "Row", seed: int, eval_len: int, *, keys: dict, meta: dict, config: dict,
                 **fields: Any) -> dict:
    """The record of one of our models (``run`` and checkpoint ``eval``): the row, its keys (``Keys.cell``),
    the training figures and fine-tuning of its checkpoint ``meta``, its ``config`` (``RunConfig.to_dict``)
    with its protocol and stride, and its encoding's eval-time options where they make its numbers
    (``eval_options``: ``+rand``'s random eval positions and their seed); n/a or diverged fields are filled in
    by ``score``."""
    from posenc_bench.bench.keys import row_eval_options

    outcome, evaluation = meta.get("outcome") or {}, config["eval"]
    stride = evaluation.get("stride") or 0
    rec = new_record(
        run, row.name, seed, eval_len, base_encoding=row.encoding, window=row.window,
        train_time_s=_rounded(outcome.get("time_s"), 2), train_tokens_per_s=_rounded(outcome.get("tokens_per_s"), 1),
        train_final_loss=outcome.get("final_loss"), train_curve=outcome.get("curve"), **keys, config=config,
        protocol=evaluation.get("protocol", "nonoverlapping"), stride=min(stride, eval_len) if stride else None,
        **fields)
    if meta.get("finetune"):
        rec["finetune"] = {k: v for k, v in meta["finetune"].items() if k != "curve"}
    evaluated = row_eval_options((config.get("model") or {}).get("encoding_options") or {}, row)
    if evaluated:  # how the row was evaluated where its encoding has a choice (+rand's random eval positions)
        rec["eval_options"] = evaluated
    if outcome.get("status") == "diverged":  # with the rule that called it so (none: before divergence_patience)
        return not_measured(rec, "diverged", outcome["reason"], last_finite_loss=outcome.get("last_finite_loss"),
                            **({"divergence_rule": meta["divergence_rule"]} if "divergence_rule" in meta else {}))
    return rec


def passkey_record(length: int, train_len: int, depth: float) -> dict:
    """The record of one passkey (length, depth) of ``bench/eval/passkey.py``, not yet measured (its passkey.json
    fields, in their order): ``measured_passkey`` fills in the trials, ``not_measured`` marks it n/a."""
    return {"length": length, "ratio": length / train_len, "depth": depth, "status": "ok", "reason": "",
            "trials": 0, "correct": 0, "accuracy": None}


def measured_passkey(rec: dict, keys: list[str], correct: int) -> dict:
    """``rec`` with the keys tried at its (length, depth) and how many the model retrieved."""
    rec.update(trials=len(keys), correct=correct, accuracy=correct / len(keys), keys=keys)
    return rec


def needle_record(variant: str, length: int, train_len: int, depth: float) -> dict:
    """The record of one multi-needle (variant, length, depth) of ``bench/eval/needles.py``, not yet measured
    (its needles.json fields, in their order): ``measured_needles`` fills in the needles, ``not_measured``
    marks it n/a."""
    return {"variant": variant, "length": length, "ratio": length / train_len, "depth": depth, "status": "ok",
            "reason": "", "needles": 0, "correct": 0, "accuracy": None}


def measured_needles(rec: dict, tried: list[dict]) -> dict:
    """``rec`` with the needles asked at its (variant, length, depth), one per haystack (trial, key, value, the
    index of its first token, whether it was retrieved), and the share retrieved."""
    correct = sum(t["right"] for t in tried)
    rec.update(needles=len(tried), correct=correct, accuracy=correct / len(tried) if tried else None, tried=tried)
    return rec


def _rounded(x: Optional[float], digits: int) -> Optional[float]:
    return None if x is None else round(x, digits)


def measured(rec: dict, result: dict) -> dict:
    """``rec`` with the numbers of one evaluation (``bench.evaluate``'s result)."""
    rec.update({k: result[k] for k in MEASURED if k in result})
    return rec


def not_measured(rec: dict, status: str, reason: str, **fields: Any) -> dict:
    """``rec`` marked n/a or diverged, with the reason."""
    rec.update(status=status, reason=reason, **fields)
    return rec


def score(rec: dict, evaluate: Callable[[], dict]) -> dict:
    """``rec`` measured by ``evaluate()``, or n/a with the reason where the encoding cannot run at its length
    (``PositionOutOfRange``). A record already n/a or diverged stays as it is."""
    if rec["status"] != "ok":
        return rec
    try:
        return measured(rec, evaluate())
    except PositionOutOfRange as e:
        return not_measured(rec, "n/a", str(e))


def finished(records: list[dict], lengths: Iterable[int], keys: Optional[dict] = None) -> bool:
    """Whether a cell's ``records`` are whole: one at every eval length of ``lengths``, each made with ``keys``
    (e.g. ``{"cell_key": ..., "eval_key": ...}``; None: any). A cell that is not is evaluated again."""
    return (bool(records) and {r["eval_len"] for r in records} >= set(lengths)
            and all(r.get(k) == v for r in records for k, v in (keys or {}).items()))


def run_meta(*, rows: list[str], train_len: int, eval_lengths: list[int], corpus: dict, device: str, segments=None,
             **extra: Any) -> dict:
    """The metadata of one run or eval: ``extra`` (kind, config, model, ...) and where and on what text."""
    from posenc_bench.data import tokens_fingerprint
    from posenc_bench.env import git_commit, versions

    text = {}
    if segments is not None:  # text: the eval segments; a task run gives its eval_fingerprint and eval_tokens
        S = segments.shape[1] - 1
        text = {"segment_len": S, "eval_tokens": int(segments.shape[0] * S),
                "eval_fingerprint": tokens_fingerprint(segments, (extra.get("tokenizer") or {}).get("fingerprint"))}
    meta = {**extra, "rows": rows, "train_len": train_len, "eval_lengths": eval_lengths, **text,
            "corpus": corpus, "device": device, "git_commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    meta["versions"] = {**versions(), **meta.get("versions", {})}
    return meta


def summary_line(row: str, records: list[dict]) -> str:
    """One line of a cell's numbers: ppl at each length, or a task's exact match (its kind's primary metric)."""
    value = metrics.kind_of(records).primary
    return f"  {row}: {value} " + ", ".join(
        f"{r['eval_len']}: {r[value]:.3f}" if r["status"] == "ok" else f"{r['eval_len']}: {r['status']}" for r in records
    )


# ---- the identity rule ---------------------------------------------------------------------------------

# Settings that change no number (how the work is cut, where it goes) or are compared another way (eval.lens
# as the eval lengths, the rows and seeds as cells, per-encoding options in each row's cell and eval keys).
NOT_IDENTITY = (
    "config.out", "config.device", "config.threads", "config.max_mask_bytes", "config.save_every",
    "config.save_every_s",  # with save_every: when a mid-run state is saved changes no number
    "config.eval.batch_tokens", "config.eval.lens", "config.encodings", "config.seeds", "config.gate",
    "config.train.log_every", "config.plugins", "config.grad_accum", "config.rope_scaling", "model.path",
    "config.expected_sweep_s",
    "config.train.compile", "config.model.vocab_multiple",  # the same model within float rounding, run another way
    # when a run is called diverged changes no finished model; a diverged cell records its rule and is trained
    # again by a run under another one (``bench/sweep``)
    "config.train.divergence_patience",
    # per row (``row_settings``): a cell's own encoding options, the fine-tuning of the -ft rows, and whether
    # eval.tune chose a zero-shot row's options (a record's ``tuning``; rows without a grid are untouched by it)
    "config.model.encoding_options", "config.finetune", "config.eval.tune",
    # key tokens (LongPPL): in every record's eval key while on, so a run that turns them on re-evaluates the
    # rows it runs on the models the folder holds, and rows it does not run keep their records (no LongPPL)
    "config.eval.key_tokens",
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
    options (and those of the trained encoding it evaluates), the fine-tuning of a -ft row, the eval-time
    options it was evaluated with (a record's ``eval_options``) and the split its options were tuned on."""
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
    if rec.get("eval_options"):  # e.g. +rand evaluated at random positions (absent: at 0 .. L-1, as before)
        out["eval_options"] = rec["eval_options"]
    if rec.get("tuning"):  # its options chosen on the valid split (absent: the defaults, untuned)
        out["tuned_on"] = rec["tuning"]["split"]
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


class CommittedResultsError(ResultsError):
    """A flag would delete a results folder that git tracks (committed results)."""


def check_deletable(out: Path | str, flag: str, confirmed: bool = False) -> None:
    """Refuse ``flag`` (``--fresh``) on a committed results folder (git tracks files in it) unless the user
    ``confirmed`` it with the second flag made for that (``--delete-committed``). The message names another
    folder, never the destructive flag: committed results are deleted only by a user who read the docs."""
    from posenc_bench.env import git_tracked

    if not confirmed and git_tracked(Path(out)):
        raise CommittedResultsError(f"{flag} would delete {out}, a committed results folder (git tracks its "
                                    "files): write this run to another folder with --out")


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
        self._created = False

    def __enter__(self) -> "ResultsFolder":
        """Create the folder, take its lock, say who holds it. The check of whether ``out`` can be written is
        the attempt itself: any OSError on the way is one ResultsError line naming the folder and the cause."""
        from filelock import FileLock, Timeout

        if self.out.exists() and not self.out.is_dir():
            raise ResultsError(f"output folder {str(self.out)!r} cannot be written: it is a file, not a folder")
        self._created = not self.out.exists()
        step = "creating it"
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            step = "taking its lock"
            self._lock = FileLock(self._lock_path)
            self._lock.acquire(timeout=0)
            step = "writing its lock's owner"
            atomic_write_text(self._owner, f"pid {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        except Timeout:
            try:
                owner = self._owner.read_text().strip()
            except OSError:
                owner = "another process"
            raise ResultsError(f"{self.out} is being written by {owner}; wait for it to finish, or use another "
                               "--out") from None
        except OSError as e:
            self._release(failed=True)
            raise ResultsError(f"output folder {str(self.out)!r} cannot be written: {step} failed "
                               f"({e.strerror or type(e).__name__})") from None
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        self._owner.unlink(missing_ok=True)
        self._release(failed=exc_type is not None)

    def _release(self, failed: bool) -> None:
        """Release the lock; a folder this run created and left empty when it failed is removed again."""
        if self._lock is not None and self._lock.is_locked:
            self._lock.release()
        if failed and self._created and self.out.is_dir():
            left = [p for p in self.out.iterdir() if p not in (self._lock_path, self._owner)]
            if not left:
                self._lock_path.unlink(missing_ok=True)
                self.out.rmdir()

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
            raise IncomparableError(f"{self.path} {what} ({field}: {was!r} there, {now!r} now); write this run to "
                                    "another folder with --out (the results there stay as they are)")
        if merge_runs:
            merge_run_lists(old["run"], run)
        run["started"] = old["run"].get("started", run.get("started"))  # when the folder's first run began
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
