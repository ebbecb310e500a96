"""`posenc-bench eval`: pretrained models (Hugging Face, or our own checkpoints) through the same protocol.

A Hugging Face model (``hf/model.py``) reads the held-out documents of ``data.py``'s corpus through its own
tokenizer (``hf/tokenize.py``, with the bytes behind every token), each document after one prefix token
(``--doc-sep``: by default the model's pretraining document separator), which is context only, never a scored
target; segments, windows, token-weighted ppl and the loss by position are ``evaluate.py``'s, unchanged. Eval
lengths are multiples of its train length. RoPE scalings (rows ``hf:<model>+linear``, ``+dynamic``, ``+yarn``,
``+llama3``) go through ``hf/rope.py``. A model without rotary embeddings gets ``n/a`` for every scaling, and
``n/a`` past its absolute position table.

One of our checkpoints (``bench/checkpoint.py``) is evaluated exactly as ``run`` evaluates it (byte tokens, its
config's lengths, tokens and batch size unless overridden), with ``--rope-scaling X`` as the registered
eval-only variant ``<encoding>-X`` of its trained encoding.

Records, run metadata and the output folder (locked, and refused when it holds results measured another way,
e.g. another checkpoint's) are ``bench/records.py``'s.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

from posenc_bench import metrics
from posenc_bench.bench import checkpoint
from posenc_bench.bench.config import DEFAULT_EVAL_LENS, RunConfig, parse_eval_lens, validate
from posenc_bench.bench.eval.evaluate import (EvalSet, Scoring, documents_per_window,
                                              Targets, evaluate_model, score_windows, segment_length,
                                              unit_documents)
from posenc_bench.bench.eval import tune
from posenc_bench.bench.eval.hf_text import HFText, hf_text, valid_text
from posenc_bench.bench.eval.key_tokens import KEY_TOKENS_FILE, KeyTokenFile, KeyTokenRule, KeyTokens, target_nll
from posenc_bench.bench.eval.progress import PARTIAL, RowProgress
from posenc_bench.bench.eval.scalings import require_hf
from posenc_bench.bench.keys import eval_key, hf_eval_key, with_key_tokens, with_tuning
from posenc_bench.bench.records import (ResultsFolder, ResultsStore, check_deletable, finished, measured, model_record,
                                        new_record, not_measured, run_meta, score, summary_line)
from posenc_bench.bench.rows import Row, rope_row, variant_name
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.data import load_corpus, tokens_fingerprint
from posenc_bench.env import device_description, peak_memory, resolve_device, version_of
from posenc_bench.errors import ConfigError, PosencError
from posenc_bench.files import RUNS, file_hash
from posenc_bench.hf.model import HFModel, ModelSpec, resolve_model
from posenc_bench.hf import attention as hf_attention
from posenc_bench.hf import rope as hf_rope
from posenc_bench.hf.rope import scaled_max_positions, scaling_parameters

DEFAULT_EVAL_TOKENS = 16384
HF_BUCKETS = 64


@dataclass
class EvalOptions:
    """Everything `posenc-bench eval` takes (the CLI flags, one to one)."""

    model: str
    eval_lens: Optional[list] = None  # None: the checkpoint's own config, or 1,1.5,2,4x for a HF model
    rope_scaling: list = field(default_factory=list)
    train_len: Optional[int] = None
    data: Optional[str] = None  # None: the checkpoint's own corpus, or stdlib
    eval_tokens: Optional[int] = None
    out: Optional[str] = None
    device: str = "auto"
    precision: Optional[str] = None  # None: fp32 for a Hugging Face model, a checkpoint's own config
    trust_remote_code: bool = False
    doc_sep: str = "separator"  # the token before each document: hf/tokenize.document_separator's choice
    split: str = "test"  # a Hugging Face model's text: test, valid, train or all (it trained on none of them)
    long_docs: bool = False  # only documents at least as long as a segment, no window crossing a document
    unit: Optional[int] = None  # resampling unit in targets (None: the longest eval length)
    segment_len: Optional[int] = None  # tokens per eval segment (None: evaluate.segment_length of the lengths)
    fresh: bool = False
    delete_committed: bool = False  # --fresh may delete a committed results folder (the second, explicit flag)
    show_progress: Optional[bool] = None
    key_tokens: Optional[KeyTokenRule] = None  # LongPPL's; evaluator "model" (unscaled) or one of rope_scaling
    tune: bool = False  # each zero-shot row's options chosen on the valid split at each length (bench/eval/tune.py)


def _slug(name: str) -> str:
    return re.sub(r"[^\w.-]+", "-", name).strip("-") or "model"


def run_eval(opts: EvalOptions, log: Callable[[str], None] = print) -> tuple[Path, dict]:
    """Evaluate ``opts.model``; returns the output folder and its results (results.json written)."""
    spec = resolve_model(opts.model)
    if spec.kind == "checkpoint":
        return eval_checkpoint(spec, opts, log)
    return eval_hf(spec, opts, log)


def _evaluate_rows(folder: ResultsFolder, run: dict, fresh: bool, evaluate_row: Callable[[ResultsStore, str], None],
                   delete_committed: bool = False) -> dict:
    """This eval's rows (``run["rows"]``, before the folder's earlier rows join them) into the locked,
    identity-checked folder: ``evaluate_row(store, row)`` each."""
    rows = list(run["rows"])
    if fresh:
        check_deletable(folder.path.parent, "--fresh", delete_committed)
    with folder:
        if fresh:
            folder.path.unlink(missing_ok=True)
            for name in (PARTIAL, KEY_TOKENS_FILE):  # an unfinished row's work, the key-token evaluator's passes
                (folder.path.parent / name).unlink(missing_ok=True)
        store = folder.open_store(run)
        store.save()
        for row in rows:
            evaluate_row(store, row)
        return store.as_dict()


# ---- Hugging Face models ----------------------------------------------------------------------------------

def eval_hf(spec: ModelSpec, opts: EvalOptions, log: Callable[[str], None] = print) -> tuple[Path, dict]:
    device = resolve_device(opts.device)
    if opts.train_len is not None and opts.train_len < 1:
        raise ConfigError(f"--train-len must be >= 1, got {opts.train_len}")
    eval_tokens = opts.eval_tokens or DEFAULT_EVAL_TOKENS
    if eval_tokens < 1:
        raise ConfigError(f"--eval-tokens must be >= 1, got {eval_tokens}")
    require_hf(opts.rope_scaling)
    corpus = load_corpus(opts.data or "stdlib")
    t0 = time.perf_counter()
    hf = HFModel(spec, device=device, precision=opts.precision or "fp32", trust_remote_code=opts.trust_remote_code)
    own_len, len_source = hf.own_train_len()
    train_len = opts.train_len or own_len
    if opts.train_len:
        len_source = f"--train-len (the model's own: {own_len} from {len_source})"
    lengths = parse_eval_lens(opts.eval_lens or list(DEFAULT_EVAL_LENS), train_len)
    unit = opts.unit or max(lengths)
    if unit < 1 or unit > max(lengths):
        raise ConfigError(f"--unit {unit}: the resampling unit is 1 .. the longest eval length {max(lengths)} targets")
    S = opts.segment_len or segment_length(lengths)
    if S < max(lengths):
        raise ConfigError(f"--segment-len {S}: a segment holds at least one window of the longest length {max(lengths)}")
    text = hf_text(hf.tokenizer, corpus, S, eval_tokens, split=opts.split, long_docs=opts.long_docs, doc_sep=opts.doc_sep)
    valid = opts.tune and valid_text(hf.tokenizer, corpus, S, eval_tokens, split=opts.split, long_docs=opts.long_docs,
                                     doc_sep=opts.doc_sep) or None  # cut as the scored text is
    model_info = hf.describe()
    row = f"hf:{spec.name}"
    rule = opts.key_tokens and opts.key_tokens.named({"model": row, **{s: f"{row}+{s}" for s in opts.rope_scaling}})
    rule_key = rule.describe(train_len) if rule else None  # the key-token rule: in the config and every eval key
    run = run_meta(
        kind="eval", model=model_info, train_len_source=len_source, rows=[row] + [f"{row}+{s}" for s in opts.rope_scaling],
        train_len=train_len, eval_lengths=lengths, segments=text.segments, corpus=corpus.describe(),
        device=device_description(device), eval_bytes=int(text.token_bytes[:, 1:].sum()), doc_separator=text.separator_how,
        eval_documents=text.documents,  # name -> targets, in scoring order: what units["doc"] counts in
        config={"data": {"source": corpus.source}, "eval": {"tokens": eval_tokens, "lens": opts.eval_lens, "split": opts.split,
                "long_docs": opts.long_docs, "unit": unit, "position_buckets": HF_BUCKETS,
                "doc_sep": opts.doc_sep,  # the rule asked for; the run's doc_separator says what it gave
                **({"tune": True} if opts.tune else {}),
                **({"key_tokens": rule_key} if rule else {})},
                "rope_scaling": list(opts.rope_scaling), "seeds": [0]},
        params=model_info["params"], load_time_s=round(time.perf_counter() - t0, 2),
        versions={p: version_of(p) for p in ("tokenizers", "gguf", "accelerate")})
    run["eval_tokens"] = int(text.target_mask[:, 1:].sum())  # the segments' targets, less the separators among them
    key = hf_eval_key({k: model_info.get(k) for k in ("ref", "gguf_file", "dtype", "file_sha256", "files_sha256", "hub_commit")},
                      train_len=train_len, lengths=lengths, corpus=corpus.fingerprint,
                      eval_fingerprint=run["eval_fingerprint"], doc_sep=text.separator, buckets=HF_BUCKETS, unit=unit)
    key = with_key_tokens(key, rule_key)
    out = Path(opts.out or f"{RUNS}/eval-{_slug(spec.name)}")
    log(f"posenc-bench eval: {row} ({model_info['class']}, {model_info['params']:,} parameters, {model_info['dtype']}), "
        f"train length {train_len} from {len_source}; lengths {lengths}; {run['eval_tokens']:,} target tokens "
        f"({run['eval_bytes']:,} bytes, {len(text.documents)} documents) each; device {run['device']}; out {out}")
    rows = _HFRows(hf, run, text, key, valid, opts.show_progress, log)
    if rule:  # found by the evaluator row's passes, kept in the folder pass by pass (--fresh: deleted below)
        store = KeyTokenFile(out / KEY_TOKENS_FILE, {"eval_key": key}, read=not opts.fresh)
        rows.keys = KeyTokens(rule, train_len, rows.evaluator_nll, text.target_mask, store)
    data = _evaluate_rows(ResultsFolder(out), run, opts.fresh, rows.evaluate, opts.delete_committed)
    return out, data


def fix_encoding(hf: HFModel, scaling: str, train_len: int, length: int, point: Optional[dict] = None):
    """Our encoding of the zero-shot fix ``scaling`` on ``hf``'s heads at ``length`` (at its tuning grid's
    ``point``: ``Encoding.tuned_row``; None: its defaults), for its attention to use."""
    row = Row("rope").variant(scaling)
    name, options = row.cls.tuned_row(point) if point else (row.encoding, {})
    encoding = hf_attention.build_encoding(name, hf.config, hf.rotary, train_len, **options)
    encoding.set_eval_length(length)
    return encoding


class _HFRows:
    """The rows of one Hugging Face model: the model itself, then each zero-shot row of it: a frequency
    scaling through transformers' own rope_parameters (``hf/rope.py``), or one of our rows of the trained rope
    model with its attention rerouted through our encoding (``hf/attention.py``). With ``valid`` (``--tune``), a
    row with a grid at a length (``Row.grid``) is scored there at the point chosen on ``valid``."""

    def __init__(self, hf: HFModel, run: dict, text: HFText, key: str, valid: Optional[HFText],
                 show_progress: Optional[bool], log: Callable[[str], None]) -> None:
        self.hf, self.run, self.text, self.valid, self.show_progress, self.log = hf, run, text, valid, show_progress, log
        self.base = run["rows"][0]
        self.unscaled: dict[int, dict] = {}  # length -> the unscaled row's result (reused where a row is the identity)
        self.scaling_of = {self.base: None, **{f"{self.base}+{s}": s for s in run["config"]["rope_scaling"]}}
        self.scoring = {L: Scoring(L, HF_BUCKETS, max(run["eval_lengths"]), unit=run["config"]["eval"]["unit"])
                        for L in run["eval_lengths"]}
        self.keys: Optional[KeyTokens] = None  # LongPPL's key tokens, where asked for: ``evaluator_nll``'s
        self.grids = {row: self._grids(s) for row, s in self.scaling_of.items()}  # row -> {length: grid}
        self.valid_meta = valid and {"split": tune.SPLIT, "targets": int(valid.target_mask[:, 1:].sum()),
                                     "fingerprint": tokens_fingerprint(valid.segments), "documents": valid.documents}
        self.key = {row: with_tuning(key, grids, self.valid_meta) for row, grids in self.grids.items()}

    def _grids(self, scaling: Optional[str]) -> dict[str, list[dict]]:
        """{length: grid} of zero-shot row ``scaling`` with ``--tune`` (none unscaled, untuned or gridless)."""
        if self.valid is None or scaling is None or (row := rope_row(scaling)) is None:
            return {}
        found = {str(L): row.grid(self.run["train_len"], L, {}) for L in self.run["eval_lengths"]}
        return {L: grid for L, grid in found.items() if grid}

    def evaluate(self, store: ResultsStore, row: str) -> None:
        scaling, lengths = self.scaling_of[row], self.run["eval_lengths"]
        records = store.cell(row, 0)
        if finished(records, lengths, {"eval_key": self.key[row]}):
            self.log(f"  {row}: done before, skipped")
        else:
            self.progress = RowProgress(store.path.parent, row, self.key[row])  # an interrupted row's work
            if kept := self.progress.lengths():
                self.log(f"  {row}: resuming: eval lengths {', '.join(map(str, kept))} done before")
            todo = [L for L in sorted(lengths) if L not in kept]  # shortest first: peak RSS grows
            self.key_at = {L: self.keys.at(L) for L in todo} if self.keys else {}  # evaluator passes: none scaled
            for L in todo:
                self.progress.keep_record(L, self._record(row, scaling, L))
            records = [self.progress.record(L) for L in sorted(lengths)]
            store.put_cell(row, 0, records)  # saved before it is reported: a row that was logged is on disk
            self.progress.drop()
            self.log(summary_line(row, records))
        if scaling is None:  # what a scaled row reuses where it computes the same
            self.unscaled.update({r["eval_len"]: r for r in records if r["status"] == "ok"})

    def _record(self, row: str, scaling: Optional[str], L: int) -> dict:
        hf, info = self.hf, self.run["model"]
        rec = new_record(self.run, row, 0, L, base_encoding=self.base, scaling=scaling, rope_parameters=None,
                         eval_key=self.key[row], doc_separator=self.text.separator_how,
                         documents_per_window=documents_per_window(self.text.doc_index, L),
                         model={k: info.get(k) for k in ("ref", "gguf_file", "file_sha256", "files_sha256", "hub_commit", "dtype")},
                         **({"key_evaluator": self.keys.rule.evaluator} if self.keys else {}))  # chose the key tokens
        limit = hf.position_limit()
        if scaling is not None and hf.rope_problem():
            return not_measured(rec, "n/a", hf.rope_problem())
        if limit is not None and L > limit:
            return not_measured(rec, "n/a", f"{info['class']} has an absolute position table of {limit} positions "
                                            f"(max_position_embeddings): no position {limit} or later")
        try:
            res = self._tuned(rec, row, scaling, L) if str(L) in self.grids[row] else self._measure(rec, scaling, L)
        except PosencError as e:
            return not_measured(rec, "n/a", str(e))
        return measured(rec, res)

    def _tuned(self, rec: dict, row: str, scaling: str, L: int) -> dict:
        """``tune.Tuner.evaluate``'s steps 2-5 on this model: each point on the valid text, the scored text at the
        best (ppl, the lowest; the earliest on a tie)."""
        grid, metric = self.grids[row][str(L)], metrics.get("ppl")
        values = []
        for point in grid:
            known, value = self.progress.valid(L, point)  # scored before an interruption
            if not known:
                try:
                    value = metrics.record_value(metric, self._measure({}, scaling, L, point, self.valid))
                except PosencError:
                    value = None  # cannot run there: never chosen
                self.progress.keep_valid(L, point, value)
            values.append(value)
        chosen = tune.choose_point(values, metric, grid, f"{row} at {L}")
        res = self._measure(rec, scaling, L, grid[chosen])
        return {**res, "tuning": tune.tuning_record(self.valid_meta, metric, grid, values, chosen)}

    def _measure(self, rec: dict, scaling: Optional[str], L: int, point: Optional[dict] = None,
                 text: Optional[HFText] = None) -> dict:
        """The numbers of row ``scaling`` (at grid point ``point``: its default None) on ``text`` (the scored one)."""
        if scaling is None or scaling in hf_rope.SCALINGS:
            return self._frequency_scaled(rec, scaling, L, point, text or self.text)
        return self._rerouted(rec, scaling, L, point, text or self.text)

    def _score(self, L: int, text: HFText, **kwargs) -> dict:
        key = self.key_at.get(L) if text is self.text else None  # key tokens: of the scored text only
        with peak_memory(self.hf.device) as memory:
            res = score_windows(lambda x, y: self.hf.nll(x, y, **kwargs), text.segments, L, self.scoring[L],
                                show_progress=self.show_progress, device=self.hf.device,
                                targets=Targets(text.token_bytes, text.target_mask, key))
        res["units"]["doc"] = unit_documents(text.target_docs, res["units"]["size"])  # as our models' units
        return {**res, **memory}

    def _same_as_base(self, rec: dict, L: int, text: HFText) -> Optional[dict]:
        """The unscaled row's numbers at ``L`` where this row computes what it computes (None: score it)."""
        if text is not self.text or L not in self.unscaled:
            return None
        rec["same_as"] = self.base
        return {**self.unscaled[L], "eval_time_s": 0.0, "peak_memory_bytes": None, "peak_memory_kind": None}

    def _parameters(self, scaling: Optional[str], L: int, point: Optional[dict] = None) -> tuple[Optional[dict], int]:
        """(rope_parameters of frequency scaling ``scaling`` at length ``L``, at grid point ``point`` (its own
        rope_parameters: YaRN's beta_fast and beta_slow), None unscaled; positions allowed)."""
        T = self.run["train_len"]
        factor = max(1.0, L / T)
        params = None if scaling is None else scaling_parameters(self.hf.rope_parameters(), scaling, factor, T)
        return (params if point is None else {**params, **point}), scaled_max_positions(scaling or "", factor, T)

    def _frequency_scaled(self, rec: dict, scaling: Optional[str], L: int, point: Optional[dict], text: HFText) -> dict:
        params, positions = self._parameters(scaling, L, point)
        rec["rope_parameters"] = params
        with self.hf.scaled(params, positions):
            if scaling is not None and self.hf.scaling_is_identity(L) and (same := self._same_as_base(rec, L, text)):
                return same  # bit-identical frequencies
            return self._score(L, text)

    def _rerouted(self, rec: dict, scaling: str, L: int, point: Optional[dict], text: HFText) -> dict:
        encoding = fix_encoding(self.hf, scaling, self.run["train_len"], L, point)
        rec["rerouted"] = hf_attention.describe(encoding)
        if hf_attention.is_plain_rope(encoding, L) and (same := self._same_as_base(rec, L, text)):
            return same
        with hf_attention.rerouted(self.hf.model, self.hf.rotary):
            return self._score(L, text, posenc=hf_attention.Rerouted(encoding))

    def evaluator_nll(self, length: int, stride: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """``key_tokens.target_nll`` of the key-token evaluator's row, scaled for ``length`` as when scored there
        (at its defaults, never a point ``--tune`` chose)."""
        scaling = self.scaling_of[self.keys.rule.evaluator]
        ours = scaling is not None and scaling not in hf_rope.SCALINGS  # a row rerouted through our encoding
        kwargs = {"posenc": hf_attention.Rerouted(fix_encoding(self.hf, scaling, self.run["train_len"], length))} if ours else {}
        with (hf_attention.rerouted(self.hf.model, self.hf.rotary) if ours else
              self.hf.scaled(*self._parameters(scaling, length))):
            return target_nll(lambda x, y: self.hf.nll(x, y, **kwargs), self.text.segments, length, stride,
                              batch_tokens=length, device=self.hf.device)


# ---- our own checkpoints ----------------------------------------------------------------------------------

def _checkpoint_config(ckpt: checkpoint.Checkpoint, opts: EvalOptions) -> RunConfig:
    """The checkpoint's run config with this eval's overrides, validated."""
    cfg = ckpt.config
    if cfg.task.name:
        raise ConfigError(f"checkpoint {ckpt.path} was trained on the task {cfg.task.name!r}; `eval` scores text: "
                          "rerun its config with `posenc-bench run` to score the task")
    hf_only = [flag for flag, on in (("--long-docs", opts.long_docs), ("--unit", opts.unit is not None),
                                     ("--segment-len", opts.segment_len is not None),
                                     ("--doc-sep", opts.doc_sep != EvalOptions.doc_sep),
                                     ("--key-tokens", opts.key_tokens is not None), ("--tune", opts.tune)) if on]
    if hf_only:
        raise ConfigError(f"{hf_only[0]} applies to Hugging Face models; a checkpoint is evaluated with its config's "
                          f"units (set eval.* in its config instead)")
    if opts.split.startswith("all"):
        raise ConfigError(f"--split {opts.split}: a checkpoint of ours trained on its corpus's train split, and 'all' would score "
                          "that text with the rest; valid splits for a checkpoint: test, valid, train")
    if opts.precision not in (None, cfg.precision):
        raise ConfigError(f"--precision {opts.precision}: this checkpoint was trained and is evaluated at "
                          f"{cfg.precision} (its config's precision)")
    if opts.train_len is not None and opts.train_len != cfg.train.train_len:
        raise ConfigError(f"--train-len {opts.train_len}: this checkpoint was trained at {cfg.train.train_len} tokens")
    if opts.eval_lens is not None:
        cfg.eval.lens = list(opts.eval_lens)
    if opts.eval_tokens is not None:
        cfg.eval.tokens = opts.eval_tokens
    if opts.data is not None:
        cfg.data.source = opts.data
    cfg.eval.split = opts.split  # valid: what choices made by looking at numbers are made on
    cfg.eval.tune, cfg.eval.key_tokens.evaluator = False, ""  # rows at their options, no key tokens: `run`'s
    cfg.seeds = [ckpt.meta["seed"]]  # the one model evaluated (its run's config lists every seed of the run)
    cfg.device = opts.device
    validate(cfg)
    return cfg


def _variant_rows(trained: Row, scalings: list[str]) -> list[tuple[Row, str]]:
    """(row, reason it cannot be evaluated or ""): the checkpoint's own row, then its zero-shot row of each
    scaling (a row of the registered encoding's name with the reason when no such encoding evaluates it)."""
    rows = [(trained, "")]
    for s in scalings:
        try:
            rows.append((trained.variant(s), ""))
        except ConfigError as e:
            rows.append((Row(variant_name(trained.encoding, s), trained.window), str(e)))
    return rows


def eval_checkpoint(spec: ModelSpec, opts: EvalOptions, log: Callable[[str], None] = print) -> tuple[Path, dict]:
    """A checkpoint written by `posenc-bench run`, evaluated exactly as `run` evaluates it."""
    ckpt = checkpoint.read(spec.ref)
    meta, path = ckpt.meta, ckpt.path
    trained, window, seed = meta["encoding"], meta["window"], meta["seed"]
    cfg = _checkpoint_config(ckpt, opts)
    rt = Runtime.create(cfg.device, cfg.precision, show_progress=opts.show_progress, log=log)
    corpus = ckpt.corpus(cfg)
    if corpus.fingerprint != meta.get("corpus_fingerprint"):
        log(f"  note: corpus {cfg.data.source!r} ({corpus.fingerprint}) is not the one this model was trained on "
            f"({meta.get('corpus_fingerprint')})")
    evalset = EvalSet.for_run(cfg, corpus)
    rows = _variant_rows(ckpt.row, opts.rope_scaling)
    run = run_meta(
        kind="eval", model={"kind": "checkpoint", "path": str(path), "encoding": trained, "window": window, "seed": seed,
                            "cell_key": meta.get("cell_key"), "weights_sha256": file_hash([path / checkpoint.WEIGHTS])},
        config=cfg.to_dict(), rows=[row.name for row, _ in rows], train_len=cfg.train.train_len,
        eval_lengths=evalset.lengths, segments=evalset.segments, corpus=corpus.describe(),
        params=checkpoint.build_model(cfg, ckpt.row, seed).num_parameters(),
        device=device_description(rt.device), **evalset.meta())  # the documents scored, and the targets of each
    split = "" if cfg.eval.split == "test" else f"-{cfg.eval.split}"
    out = Path(opts.out or f"{RUNS}/eval-{_slug(path.parent.parent.name + '-' + path.name)}{split}")
    log(f"posenc-bench eval: checkpoint {path} ({ckpt.row}, seed {seed}); lengths {evalset.lengths}; "
        f"{run['eval_tokens']:,} target tokens each of the {cfg.eval.split} split; device {run['device']}; out {out}")
    config = cfg.to_dict()
    by_name = {row.name: (row, reason) for row, reason in rows}

    def evaluate_row(store: ResultsStore, name: str) -> None:
        row, reason = by_name[name]
        model = None if reason else checkpoint.load_model(path, row.encoding, rt.device)[0]
        keys = {"cell_key": meta.get("cell_key"), "eval_key": eval_key(cfg, ckpt.row if reason else row)}
        records = []
        for L in evalset.lengths:
            rec = model_record(run, row, seed, L, keys=keys, meta=meta, config=config, checkpoint=str(path))
            if reason:
                rec["base_encoding"] = f"{trained}-?"
                records.append(not_measured(rec, "n/a", reason))
            else:
                records.append(score(rec, lambda L=L: evaluate_model(model, evalset, L, rt)))
        store.put_cell(name, seed, records)  # saved, then reported
        log(summary_line(name, records))

    return out, _evaluate_rows(ResultsFolder(out), run, opts.fresh, evaluate_row, opts.delete_committed)
