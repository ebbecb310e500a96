"""The sweep: for every (encoding row, seed) cell, get the row's model, evaluate it at every length, and
write the cell's records. Only the loop over cells lives here:

- the model of a cell comes from :class:`Models`: its checkpoint when one was finished with the cell's key
  (``bench.checkpoint``), else trained (``bench.train``); a ``-ft`` row's model is its trained model
  continued at the fine-tune length (the same training loop with a fine-tuning plan);
- its numbers come from ``bench.evaluate``; its records and the folder's identity from ``bench.records``.

Finished cells are skipped on a rerun; the results file is rewritten atomically after each cell, under the
folder's lock.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Optional

import torch
import yaml

from posenc_bench import encodings
from posenc_bench.bench import checkpoint, eta
from posenc_bench.bench.config import RunConfig, TrainConfig, load_run_corpus, parse_row, row_name
from posenc_bench.bench.dist import Dist
from posenc_bench.bench.evaluate import EvalSet, evaluate_model
from posenc_bench.bench.keys import cell_key, eval_key, row_cell_key
from posenc_bench.bench.records import (ResultsFolder, ResultsStore, measured, new_record, not_measured,
                                        require_writable, run_meta, summary_line)
from posenc_bench.bench.runtime import Runtime
from posenc_bench.bench.shard import shard_cells, shard_file, shard_meta, training_unit
from posenc_bench.bench.train import Resume, TrainOutcome, train
from posenc_bench.data import Corpus, TrainBatches
from posenc_bench.env import device_description
from posenc_bench.errors import PositionOutOfRange
from posenc_bench.files import atomic_write_text
from posenc_bench.model.transformer import DecoderLM


@dataclass
class Plan:
    """One training of a checkpoint: its settings, its batches, and the model it starts from."""

    train: TrainConfig
    batches: TrainBatches
    desc: str
    grad_accum: int = 1
    together: bool = False  # the other torchrun ranks take part (pre-training; fine-tuning runs on rank 0 alone)


class Models:
    """The trained model of every cell of one run, each from its checkpoint or trained once."""

    def __init__(self, cfg: RunConfig, corpus: Corpus, rt: Runtime, out: Path) -> None:
        self.cfg, self.corpus, self.rt, self.out = cfg, corpus, rt, out
        self._train_stream: Optional[torch.Tensor] = None
        self.training = False  # inside a training that other ranks take part in
        self.on_step: Optional[Callable[[], None]] = None  # called after each pre-training step (the sweep's clock)

    def key(self, name: str, window: Optional[int], seed: int) -> str:
        return row_cell_key(self.cfg, name, window, seed, self.corpus.fingerprint)

    def batches(self, seed: int) -> TrainBatches:
        if self._train_stream is None:
            self._train_stream = self.corpus.stream("train")
        return TrainBatches(self._train_stream, self.cfg.train.train_len, self.cfg.train.batch_size, seed)

    def get(self, name: str, window: Optional[int], seed: int) -> tuple[Optional[DecoderLM], dict]:
        """(model, or None for a diverged run; its checkpoint meta) of the row ``name``."""
        cls = encodings.get_class(name)
        if cls.trained_as and not cls.finetuned:  # eval-only variant: the trained model with its encoding
            base, meta = self.get(cls.trained_as, window, seed)
            if base is None:
                return None, meta
            model = checkpoint.build_model(self.cfg, name, window, seed)
            model.load_state_dict(base.state_dict())
            return model.to(self.rt.device), meta
        model = checkpoint.build_model(self.cfg, name, window, seed)
        key = self.key(name, window, seed)
        ckpt = checkpoint.checkpoint_dir(self.out, name, window, seed)
        reused = self._reuse(ckpt, key, model, row_name(name, window), seed)
        if reused is not None:
            return reused
        if cls.finetuned:
            return self._finetune(model, key, ckpt, cls.trained_as, window, seed)
        label = f"{row_name(name, window)} seed {seed}"
        plan = Plan(self.cfg.train, self.batches(seed), label, self.cfg.grad_accum, together=True)
        if self.rt.dist is not None:
            self.rt.dist.broadcast(("train", name, window, seed, key))  # the other ranks join this training
        outcome = self._train(model, key, ckpt, plan)
        meta = self._meta(key, name, window, seed, outcome=asdict(outcome))
        return self._finish(ckpt, model, outcome, meta, f"trained {outcome.steps} steps")

    def _reuse(self, ckpt: Path, key: str, model: DecoderLM, row: str, seed: int
               ) -> Optional[tuple[Optional[DecoderLM], dict]]:
        try:
            found = checkpoint.find(ckpt, key)
            if found is None:
                return None
            self.rt.log(f"  {row} seed {seed}: reusing checkpoint {ckpt}")
            if not found.finished_ok:
                return None, found.meta
            return found.load_into(model).to(self.rt.device), found.meta
        except checkpoint.CheckpointError as e:
            self.rt.log(f"  {row} seed {seed}: warning: {e}; training it again")
            return None

    def _finetune(self, model: DecoderLM, key: str, ckpt: Path, trained_as: str, window: Optional[int],
                  seed: int) -> tuple[Optional[DecoderLM], dict]:
        """A -ft row: its trained model continued at the fine-tune length with the row's scaling fixed there
        (on this process alone, also under torchrun)."""
        base, base_meta = self.get(trained_as, window, seed)
        if base is None:
            return None, base_meta
        cfg, p = self.cfg, self.cfg.finetune_plan()
        model.load_state_dict(base.state_dict())
        model.encoding.set_train_length(p.len)
        settings = replace(cfg.train, train_len=p.len, batch_size=p.batch_size, steps=p.steps,
                           warmup_steps=p.warmup_steps, lr=p.lr)
        batches = self.batches(seed).continued(cfg.train.steps, p.len, p.batch_size)
        outcome = self._train(model, key, ckpt, Plan(settings, batches, f"{model_row(model)} seed {seed} fine-tune"))
        finetune = {**asdict(p), "tokens": p.tokens, "from_cell_key": base_meta["cell_key"],
                    "time_s": round(outcome.time_s, 2), "final_loss": outcome.final_loss, "curve": outcome.curve,
                    "status": outcome.status, "reason": outcome.reason}
        meta = self._meta(key, model.encoding.name, window, seed, finetune=finetune,
                          outcome=base_meta["outcome"] if outcome.status == "ok" else asdict(outcome))
        return self._finish(ckpt, model, outcome, meta, f"fine-tuned {p.steps} steps x {p.batch_size} x {p.len} tokens")

    def _train(self, model: DecoderLM, key: str, ckpt: Path, plan: Plan) -> TrainOutcome:
        ckpt.mkdir(parents=True, exist_ok=True)
        rt = self.rt if plan.together else replace(self.rt, dist=None)
        self.training = plan.together
        try:
            # the mid-run state: an interrupted run continues from it
            return train(model, plan.batches, plan.train, rt, resume=Resume(ckpt / "train_state.pt", self.cfg.save_every, key),
                         desc=plan.desc, grad_accum=plan.grad_accum, on_step=self.on_step if plan.together else None)
        finally:
            self.training = False

    def finished(self, cells: list[tuple[str, int]]) -> set[tuple[str, int]]:
        """(row, seed) of the models behind ``cells`` whose checkpoints are finished with their key (a cheap
        look at each checkpoint's meta, for the time estimate; ``get`` verifies them)."""
        out = set()
        for row, seed in cells:
            name, window = parse_row(row)
            cls = encodings.get_class(name)
            for own in {name if cls.finetuned else (cls.trained_as or name), cls.trained_as or name}:
                if checkpoint.cell_key_of(checkpoint.checkpoint_dir(self.out, own, window, seed)) == self.key(own, window, seed):
                    out.add((row_name(own, window), seed))
        return out

    def _meta(self, key: str, name: str, window: Optional[int], seed: int, **fields) -> dict:
        return {"cell_key": key, "encoding": name, "window": window, "seed": seed, "config": self.cfg.to_dict(),
                "corpus_fingerprint": self.corpus.fingerprint, **fields}

    def _finish(self, ckpt: Path, model: DecoderLM, outcome: TrainOutcome, meta: dict, what: str
                ) -> tuple[Optional[DecoderLM], dict]:
        label = f"{row_name(meta['encoding'], meta['window'])} seed {meta['seed']}"
        ok = outcome.status == "ok"
        checkpoint.save(ckpt, model if ok else None, meta)
        (ckpt / "train_state.pt").unlink(missing_ok=True)
        if ok:
            self.rt.log(f"  {label}: {what} in {outcome.time_s:.0f}s, final train loss {outcome.final_loss:.3f}")
            return model, meta
        self.rt.log(f"  {label}: {outcome.reason}")
        return None, meta


def row_params(cfg: RunConfig, rows: list[str]) -> dict[str, int]:
    """The parameter count of each row's model (learned and T5 add their own to the shared core)."""
    return {row: sum(p.numel() for p in checkpoint.build_model(cfg, *parse_row(row), 0).parameters()) for row in rows}


def check_train_split(cfg: RunConfig, corpus: Corpus) -> None:
    """DataError now, before any work, when the train split cannot fill one training (or fine-tuning) window."""
    from posenc_bench.errors import DataError

    docs = corpus.splits["train"]
    tokens = sum(len(text) + 1 for _, text in docs)  # BOS + bytes per document: the length of the stream
    needs = [cfg.train.train_len]
    if any(encodings.get_class(parse_row(r)[0]).finetuned for r in cfg.rows()):
        needs.append(cfg.finetune_plan().len)
    if not docs or tokens < max(needs) + 2:
        raise DataError(f"corpus {corpus.source!r}: its train split has {tokens} tokens ({len(docs)} documents), "
                        f"fewer than {max(needs) + 2} (train length + 2); give a larger --data or a shorter length")


def model_row(model: DecoderLM) -> str:
    return row_name(model.encoding.name, model.window)


class Sweep:
    """One `posenc-bench run`: data and metadata prepared (and every input checked) at construction, then
    ``run`` trains and evaluates the cells in order into the locked results folder."""

    def __init__(self, cfg: RunConfig, rt: Runtime, shard: Optional[tuple[int, int]] = None,
                 stated_s: Optional[float] = None) -> None:
        """``rt.dist``: this is rank 0 of a torchrun job (the other ranks run :func:`train_worker`).
        ``shard``: (i, n) runs shard i of n of the cells into results.shard-<i>-of-<n>.json (see shard.py).
        ``stated_s``: the time the config's comment promises (``eta.stated_seconds``), for the estimate's warning."""
        self.cfg, self.rt, self.shard, self.stated_s = cfg, rt, shard, stated_s
        self.out = Path(cfg.out)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        require_writable(self.out)
        self.corpus = load_run_corpus(cfg)
        self.evalset = EvalSet.for_run(cfg, self.corpus)
        check_train_split(cfg, self.corpus)
        self.models = Models(cfg, self.corpus, rt, self.out)
        dist = rt.dist
        self.run_meta = run_meta(
            config=cfg.to_dict(), rows=cfg.rows(), train_len=cfg.train.train_len, eval_lengths=self.evalset.lengths,
            segments=self.evalset.segments, corpus=self.corpus.describe(),
            device=device_description(rt.device) + (f" x{dist.world_size} ({dist.describe()})" if dist else ""))
        if shard is not None:
            self.run_meta["shard"] = shard_meta(cfg, *shard)
        self.folder = ResultsFolder(self.out, "results.json" if shard is None else shard_file(*shard))
        self.store: Optional[ResultsStore] = None

    @property
    def training(self) -> bool:
        return self.models.training

    def cells(self) -> list[tuple[str, int]]:
        cells = self.cfg.cells()
        return cells if self.shard is None else shard_cells(cells, *self.shard)

    def _keys(self, row: str, seed: int) -> dict:
        name, window = parse_row(row)
        return {"cell_key": self.models.key(name, window, seed), "eval_key": eval_key(self.cfg, name)}

    def _done(self, row: str, seed: int) -> list[dict]:
        """The records of a cell finished before with the same keys at every eval length (else [])."""
        done, keys = self.store.cell(row, seed), self._keys(row, seed)
        if done and {r["eval_len"] for r in done} >= set(self.evalset.lengths) and all(
                (r["cell_key"], r["eval_key"]) == (keys["cell_key"], keys["eval_key"]) for r in done):
            return done
        return []

    def run_cell(self, row: str, seed: int) -> list[dict]:
        name, window = parse_row(row)
        keys = self._keys(row, seed)
        done = self._done(row, seed)
        if done:
            self.rt.log(f"  {row} seed {seed}: done before, skipped")
            return done
        model, meta = self.models.get(name, window, seed)
        records = [self._record(row, name, window, seed, L, keys, meta, model) for L in self.evalset.lengths]
        self.store.put_cell(row, seed, records)  # saved before it is reported: a row that was logged is on disk
        self.rt.log(summary_line(f"{row} seed {seed}", records))
        return records

    def _record(self, row: str, name: str, window: Optional[int], seed: int, L: int, keys: dict, meta: dict,
                model: Optional[DecoderLM]) -> dict:
        cfg, outcome = self.cfg, meta["outcome"]
        rec = new_record(
            self.run_meta, row, seed, L, base_encoding=name, window=window,
            train_time_s=round(outcome["time_s"], 2), train_tokens_per_s=round(outcome["tokens_per_s"], 1),
            train_final_loss=outcome["final_loss"], train_curve=outcome["curve"], **keys, config=cfg.to_dict(), protocol=cfg.eval.protocol, stride=min(cfg.eval.stride, L) if cfg.eval.stride else None)
        if meta.get("finetune"):
            rec["finetune"] = {k: v for k, v in meta["finetune"].items() if k != "curve"}
        if model is None:
            return not_measured(rec, "diverged", outcome["reason"], last_finite_loss=outcome["last_finite_loss"])
        try:
            return measured(rec, evaluate_model(model, self.evalset, L, self.rt))
        except PositionOutOfRange as e:
            return not_measured(rec, "n/a", str(e))

    def run(self, fresh: bool = False) -> dict:
        """Every cell (of this shard), under the folder's lock; returns the results file's contents.
        ``fresh``: first delete what an earlier run left (for a shard: its own file and checkpoints)."""
        with self.folder:
            if fresh:
                remove_outputs(self.out, self.cfg, self.shard)
            self.store = self.folder.open_store(self.run_meta)
            self.store.run["params"] = row_params(self.cfg, self.store.run["rows"])  # earlier invocations' rows too
            # the folder's config: this one with the encodings and seeds of every invocation that wrote here
            atomic_write_text(self.out / "config.yaml", yaml.safe_dump(self.store.run["config"], sort_keys=False))
            self.store.save()
            cells = self.cells()
            self.rt.log(f"posenc-bench run: {len(cells)} cell(s)"
                        + (f" (shard {self.shard[0]} of {self.shard[1]})" if self.shard else "")
                        + f", eval lengths {self.evalset.lengths}, {self.run_meta['eval_tokens']:,} target tokens "
                        f"each, device {self.run_meta['device']}, out {self.out}")
            if self.shard is not None and not cells:
                self.rt.log(f"  shard {self.shard[0]} of {self.shard[1]} has no cells: the sweep has fewer trained "
                            "models than shards")
            todo = [c for c in cells if not self._done(*c)]
            clock = eta.Clock(eta.cell_costs(self.cfg, todo, self.models.finished(todo)), self.cfg.train.steps,
                              self.stated_s, self.rt.device.type, self.rt.log)
            self.models.on_step = clock.step
            for row, seed in cells:
                self.run_cell(row, seed)
                if (row, seed) in todo:
                    clock.cell_done()
            if self.rt.dist is not None:
                self.rt.dist.broadcast(("stop",))
            return self.store.as_dict()


def train_worker(cfg: RunConfig, dist: Dist) -> None:
    """Ranks 1.. of a torchrun job: train what rank 0's Sweep asks for, until it says stop. Never writes.

    Each rank loads the corpus itself and checks that its cell key is rank 0's (same config, same data)."""
    from posenc_bench.errors import ConfigError, PosencError

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rt = Runtime.create(cfg.device, cfg.precision, dist=dist, show_progress=False, log=lambda line: None)
    corpus = load_run_corpus(cfg)
    stream = corpus.stream("train")
    while True:
        command = dist.broadcast()
        if command[0] == "stop":
            return
        if command[0] == "abort":
            raise PosencError(f"rank {dist.rank}: stopped because rank 0 failed: {command[1]}")
        _, name, window, seed, key = command
        mine = cell_key(cfg, name, window, seed, corpus.fingerprint)
        if mine != key:
            raise ConfigError(f"rank {dist.rank}: cell {row_name(name, window)} seed {seed} has key {mine} here and "
                              f"{key} on rank 0: every process needs the same config and data")
        model = checkpoint.build_model(cfg, name, window, seed)
        train(model, TrainBatches(stream, cfg.train.train_len, cfg.train.batch_size, seed), cfg.train, rt,
              resume=Resume(None, cfg.save_every, key), grad_accum=cfg.grad_accum)


RUN_OUTPUTS = ("results.json", "results.csv", "table.md", "config.yaml", "checkpoints")  # what a run writes


def remove_outputs(out: Path, cfg: Optional[RunConfig] = None, shard: Optional[tuple[int, int]] = None) -> None:
    """Delete what runs wrote in a results folder (``run --fresh``): results files, tables, config and
    checkpoints, never anything else a user keeps there (a README, figures); for a shard, only its results file
    and its cells' checkpoints (the folder is shared with the other shards)."""
    if shard is None:  # the lock of the run that is starting stays
        for entry in out.iterdir() if out.exists() else []:
            if entry.name in RUN_OUTPUTS or (entry.name.startswith("results.shard-") and entry.suffix == ".json"):
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
        return
    (out / shard_file(*shard)).unlink(missing_ok=True)
    cells = shard_cells(cfg.cells(), *shard)
    finetuned = {(r, s) for r, s in cells if encodings.get_class(parse_row(r)[0]).finetuned}  # own checkpoints too
    for row, seed in sorted({training_unit(*c) for c in cells} | finetuned):
        name, window = parse_row(row)
        ckpt = checkpoint.checkpoint_dir(out, name, window, seed)
        if ckpt.exists():
            shutil.rmtree(ckpt)
