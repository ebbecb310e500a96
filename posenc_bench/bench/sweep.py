"""The sweep: for every (encoding row, seed) cell, get the row's model, evaluate it at every length, and
write the cell's records. Only the loop over cells lives here:

- the model of a cell comes from :class:`Models`: its checkpoint when one was finished with the cell's key
  (``bench.checkpoint``), else trained (``bench.train``); a ``-ft`` row's model is its trained model
  continued at the fine-tune length (the same training loop with a fine-tuning plan);
- its numbers come from ``bench.evaluate`` (through ``bench/eval/tune.py``, which with ``eval.tune`` first chooses
  a zero-shot row's options on the valid split); its records and the folder's identity from ``bench.records``;
- with ``eval.key_tokens``, the evaluator's key tokens (``bench/eval/key_tokens.py``) come first, before any
  row is scored: its model is got like a cell's, and the key tokens are kept in the folder (``KEY_TOKENS_FILE``).

Finished cells are skipped on a rerun; the results file is rewritten atomically after each cell, under the
folder's lock.
"""

from __future__ import annotations

import contextlib
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterator, Optional

import torch
import yaml

from posenc_bench.bench import checkpoint, work
from posenc_bench.bench.train import eta, plans, probe
from posenc_bench.bench.config import RunConfig, TrainConfig
from posenc_bench.bench.eval import key_tokens
from posenc_bench.bench.eval.tune import Tuner
from posenc_bench.bench.run.dist import Dist
from posenc_bench.bench.keys import Keys, model_key
from posenc_bench.bench.records import (ResultsFolder, ResultsStore, check_deletable, finished, model_record, run_meta,
                                        score, summary_line)
from posenc_bench.bench.rows import Row
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.bench.run.shard import shard_cells, shard_file, shard_meta, training_unit
from posenc_bench.bench.train.loop import Resume, TrainOutcome, train
from posenc_bench.data import TrainBatches
from posenc_bench.env import device_description, in_words
from posenc_bench.errors import ConfigError
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

    def __init__(self, cfg: RunConfig, work, rt: Runtime, out: Path, keys: Keys) -> None:
        self.cfg, self.work, self.rt, self.out, self.keys = cfg, work, rt, out, keys  # work: bench/work.py
        self.training = False  # inside a training that other ranks take part in
        self.on_step: Optional[Callable[[], None]] = None  # called after each pre-training step (the sweep's clock)

    def batches(self, seed: int):
        return self.work.batches(seed)

    def get(self, row: Row, seed: int) -> tuple[Optional[DecoderLM], dict]:
        """(model, or None for a diverged run; its checkpoint meta) of ``row`` at ``seed``."""
        if row.eval_only:  # the trained model with this row's encoding
            base, meta = self.get(row.trained, seed)
            if base is None:
                return None, meta
            model = checkpoint.build_model(self.cfg, row, seed)
            model.load_state_dict(base.state_dict())
            return model.to(self.rt.device), meta
        model = checkpoint.build_model(self.cfg, row, seed)
        key = self.keys.model(row, seed)
        ckpt = checkpoint.checkpoint_dir(self.out, row, seed)
        reused = self._reuse(ckpt, key, model, row, seed)
        if reused is not None:
            return reused
        if row.finetuned:
            return self._finetune(model, key, ckpt, row, seed)
        plan = Plan(self.cfg.train, self.batches(seed), f"{row} seed {seed}", self.cfg.grad_accum, together=True)
        if self.rt.dist is not None:
            self.rt.dist.broadcast(("train", row.name, seed, key))  # the other ranks join this training
        outcome = self._train(model, key, ckpt, plan)
        meta = self._meta(key, row, seed, outcome=asdict(outcome))
        return self._finish(ckpt, model, outcome, meta, f"trained {outcome.steps} steps")

    def _reuse(self, ckpt: Path, key: str, model: DecoderLM, row: Row, seed: int
               ) -> Optional[tuple[Optional[DecoderLM], dict]]:
        try:
            found = checkpoint.find(ckpt, key)
            if found is None:
                return None
            if not found.finished_ok and found.meta.get("divergence_rule") != self.divergence_rule():
                # called diverged by another rule (before divergence_patience: any one step above the threshold)
                self.rt.log(f"  {row} seed {seed}: its checkpoint was called diverged by another rule "
                            f"({found.meta.get('divergence_rule', 'one step above the threshold')}); training it again")
                return None
            self.rt.log(f"  {row} seed {seed}: reusing checkpoint {ckpt}")
            if not found.finished_ok:
                return None, found.meta
            return found.load_into(model).to(self.rt.device), found.meta
        except checkpoint.CheckpointError as e:
            self.rt.log(f"  {row} seed {seed}: warning: {e}; training it again")
            return None

    def _finetune(self, model: DecoderLM, key: str, ckpt: Path, row: Row, seed: int
                  ) -> tuple[Optional[DecoderLM], dict]:
        """A -ft row: its trained model continued at the fine-tune length with the row's scaling fixed there
        (on this process alone, also under torchrun)."""
        base, base_meta = self.get(row.trained, seed)
        if base is None:
            return None, base_meta
        cfg, p = self.cfg, self.cfg.finetune_plan()
        model.load_state_dict(base.state_dict())
        model.encoding.set_train_length(p.len)
        settings = replace(cfg.train, train_len=p.len, batch_size=p.batch_size, steps=p.steps,
                           warmup_steps=p.warmup_steps, lr=p.lr)
        batches = self.batches(seed).continued(cfg.train.steps, p.len, p.batch_size)
        outcome = self._train(model, key, ckpt, Plan(settings, batches, f"{row} seed {seed} fine-tune"))
        finetune = {**asdict(p), "tokens": p.tokens, "from_cell_key": base_meta["cell_key"],
                    "time_s": round(outcome.time_s, 2), "final_loss": outcome.final_loss, "curve": outcome.curve,
                    "status": outcome.status, "reason": outcome.reason}
        meta = self._meta(key, row, seed, finetune=finetune,
                          outcome=base_meta["outcome"] if outcome.status == "ok" else asdict(outcome))
        return self._finish(ckpt, model, outcome, meta, f"fine-tuned {p.steps} steps x {p.batch_size} x {p.len} tokens")

    def _train(self, model: DecoderLM, key: str, ckpt: Path, plan: Plan) -> TrainOutcome:
        ckpt.mkdir(parents=True, exist_ok=True)
        rt = self.rt if plan.together else replace(self.rt, dist=None)
        self.training = plan.together
        try:
            # the mid-run state: an interrupted run continues from it
            resume = Resume(ckpt / "train_state.pt", self.cfg.save_every, key, self.cfg.save_every_s)
            return train(model, plan.batches, plan.train, rt, resume=resume,
                         desc=plan.desc, grad_accum=plan.grad_accum, on_step=self.on_step if plan.together else None)
        finally:
            self.training = False

    def finished(self, cells: list[tuple[Row, int]]) -> set[tuple[Row, int]]:
        """(row, seed) of the models behind ``cells`` (each row's own model and its trained row's) whose
        checkpoints are finished with their key: a cheap look at each checkpoint's meta, for the time estimate;
        ``get`` verifies them."""
        out = set()
        for row, seed in cells:
            for own in {row.model, row.trained}:
                if checkpoint.cell_key_of(checkpoint.checkpoint_dir(self.out, own, seed)) == self.keys.model(own, seed):
                    out.add((own, seed))
        return out

    def divergence_rule(self) -> dict:
        """What made a run diverged (``train.loop``): recorded in a diverged checkpoint, which a run under another
        rule trains again (the rule is not in the cell key: it changes no finished model)."""
        return {"factor": self.cfg.train.divergence_factor, "patience": self.cfg.train.divergence_patience}

    def _meta(self, key: str, row: Row, seed: int, **fields) -> dict:
        tokenizer = self.work.tokenizer()
        outcome = fields.get("outcome") or {}
        rule = {"divergence_rule": self.divergence_rule()} if outcome.get("status") == "diverged" else {}
        return {"cell_key": key, "encoding": row.encoding, "window": row.window, "seed": seed,
                "config": self.cfg.to_dict(), "corpus_fingerprint": self.work.fingerprint,
                **({"tokenizer": tokenizer} if tokenizer else {}), **rule, **fields}

    def _finish(self, ckpt: Path, model: DecoderLM, outcome: TrainOutcome, meta: dict, what: str
                ) -> tuple[Optional[DecoderLM], dict]:
        label = f"{Row(meta['encoding'], meta['window'])} seed {meta['seed']}"
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
    return {name: checkpoint.build_model(cfg, Row.parse(name), 0).num_parameters() for name in rows}


class Sweep:
    """One `posenc-bench run`. Constructing it checks every input (config, data, eval set) and creates
    nothing; ``open`` then takes the results folder (created, locked, and checked against the identity rule
    before anything is printed or trained) and ``run`` trains and evaluates the cells in order into it."""

    def __init__(self, cfg: RunConfig, rt: Runtime, shard: Optional[tuple[int, int]] = None,
                 command: Optional[list[str]] = None) -> None:
        """``rt.dist``: this is rank 0 of a torchrun job (the other ranks run :func:`train_worker`).
        ``shard``: (i, n) runs shard i of n of the cells into results.shard-<i>-of-<n>.json (see shard.py).
        ``command``: the flags of the ``run`` command line (argv after ``run``), which cheaper plans repeat."""
        self.cfg, self.rt, self.shard, self.command = cfg, rt, shard, command
        self.out = Path(cfg.out)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.work = work.for_run(cfg, self.out)  # text (a BPE kept in the folder, or trained here) or a task
        self.keys = Keys(cfg, self.work.fingerprint)
        self.models = Models(cfg, self.work, rt, self.out, self.keys)
        self.tuner = Tuner(cfg, self.work, rt)  # each length as ever, or with eval.tune chosen on the valid split
        dist = rt.dist
        self.run_meta = run_meta(
            config=cfg.to_dict(), rows=[row.name for row in cfg.rows()], train_len=self.work.train_len,
            eval_lengths=self.work.lengths, device=device_description(rt.device)
            + (f" x{dist.world_size} ({dist.describe()})" if dist else ""),
            **self.work.meta())  # the text (segments, corpus, documents scored) or the task and its test instances
        if shard is not None:
            self.run_meta["shard"] = shard_meta(cfg, *shard)
        self.folder = ResultsFolder(self.out, "results.json" if shard is None else shard_file(*shard))
        self.store: Optional[ResultsStore] = None

    @property
    def training(self) -> bool:
        return self.models.training

    def cells(self) -> list[tuple[Row, int]]:
        cells = self.cfg.cells()
        return cells if self.shard is None else shard_cells(cells, *self.shard)

    def _done(self, row: Row, seed: int) -> list[dict]:
        """The records of a cell finished before with the same keys at every eval length (else []); a cell
        called diverged by another divergence rule is not finished (its model is trained again)."""
        done = self.store.cell(row.name, seed)
        rule = self.models.divergence_rule()
        if any(r["status"] == "diverged" and r.get("divergence_rule") != rule for r in done):
            return []
        return done if finished(done, self.work.lengths, self.keys.cell(row, seed)) else []

    @contextlib.contextmanager
    def open(self, fresh: bool = False, delete_committed: bool = False) -> Iterator["Sweep"]:
        """The results folder, created and locked, its earlier records checked and loaded (``fresh``: what an
        earlier run left deleted first; for a shard, its own file and checkpoints; never a committed folder's
        unless ``delete_committed`` confirms it); says what will run."""
        if fresh:
            check_deletable(self.out, "--fresh", delete_committed)
        with self.folder:
            if fresh:
                remove_outputs(self.out, self.cfg, self.shard)
            self.store = self.folder.open_store(self.run_meta)
            self.work.keep(self.out)  # a BPE, which resume, shards and checkpoint evals load from here
            try:
                self.store.run["params"] = row_params(self.cfg, self.store.run["rows"])  # earlier invocations' rows too
                # the folder's config: this one with the encodings and seeds of every invocation that wrote here
                atomic_write_text(self.out / "config.yaml", yaml.safe_dump(self.store.run["config"], sort_keys=False))
                self.store.save()
                for line in self.summary():
                    self.rt.log(line)
                yield self
            finally:
                self.store = None

    def summary(self) -> list[str]:
        """What this run will do, in a few lines (``run --verbose`` adds the whole config)."""
        cfg, cells = self.cfg, self.cells()
        rows = list(dict.fromkeys(row for row, _ in cells))
        done = sum(1 for c in cells if self._done(*c))
        shard = f", shard {self.shard[0]} of {self.shard[1]}" if self.shard else ""
        lines = [f"posenc-bench run: {len(rows)} row(s) x {len(cfg.seeds)} seed(s){shard}: {len(cells)} cell(s)"
                 + (f", {done} done before" if done else "") + f"; train length {cfg.train.train_len}, eval lengths "
                 + ", ".join(map(str, self.work.lengths)) + f" ({self.run_meta['eval_tokens']:,} {self.work.counted})",
                 f"  {self.work.describe()}; device "
                 f"{in_words(self.run_meta['device'])}; out {self.out} (its config.yaml holds the whole config)",
                 f"  work: {eta.cost_line(cfg, cells)}"]
        if cfg.eval.tune:
            lines.append("  eval.tune: the zero-shot rows' options chosen on the valid split at every length, the test "
                         "split reported at the choice")
        if self.shard is not None and not cells:
            lines.append(f"  shard {self.shard[0]} of {self.shard[1]} has no cells: the sweep has fewer trained models "
                         "than shards")
        return lines

    def run_cell(self, row: Row, seed: int) -> list[dict]:
        done = self._done(row, seed)
        if done:
            self.rt.log(f"  {row} seed {seed}: done before, skipped")
            return done
        model, meta = self.models.get(row, seed)
        keys, config = self.keys.cell(row, seed), self.cfg.to_dict()
        evaluator = {"key_evaluator": self.cfg.eval.key_tokens.evaluator} if self.cfg.eval.key_tokens.evaluator else {}
        records = [score(model_record(self.run_meta, row, seed, L, keys=keys, meta=meta, config=config,
                                      metric=self.work.metric, **evaluator),
                         lambda L=L: self.tuner.evaluate(model, row, seed, L)) for L in self.work.lengths]
        self.store.put_cell(row.name, seed, records)  # saved before it is reported: a row that was logged is on disk
        self.rt.log(summary_line(f"{row} seed {seed}", records))
        return records

    def run(self, fresh: bool = False) -> dict:
        """Every cell (of this shard) into the results folder; returns the results file's contents. Opens the
        folder itself (``open(fresh)``) unless ``open`` already did."""
        if self.store is None:
            with self.open(fresh):
                return self.run()
        cells = self.cells()
        todo = [c for c in cells if not self._done(*c)]
        clock = eta.Clock(self.cfg, eta.cell_costs(self.cfg, todo, self.models.finished(todo)), self.rt.device.type,
                          self.rt.log, before=len(cells) - len(todo))
        self.models.on_step = clock.step
        if self.rt.device.type == "cpu" and todo:  # before the first training step: a probe step, and plans if long
            step_s = probe.step_seconds(self.cfg, todo[0][0].trained, self.rt)
            lines = plans.plan_lines(self.cfg, clock.costs, step_s, "cpu", self.command)
            for line in lines:
                self.rt.log(line)
            clock.noted = bool(lines)  # the measured estimate then gives its time, not the note again
        if todo:
            self.key_tokens()
        for row, seed in cells:
            self.run_cell(row, seed)
            if (row, seed) in todo:
                clock.cell_done()
        if self.rt.dist is not None:
            self.rt.dist.broadcast(("stop",))
        return self.store.as_dict()


    def key_tokens(self) -> None:
        """With ``eval.key_tokens``: the evaluator's key tokens on the eval set every row is then scored on (the
        folder's file, made for the same rule, evaluator model and text; else its model, got as its cell's)."""
        ident = self.keys.key_tokens()
        if ident is None or self.work.evalset.key_tokens:
            return
        ident["eval_fingerprint"] = self.run_meta["eval_fingerprint"]
        evalset, train_len = self.work.evalset, self.work.train_len
        store = key_tokens.KeyTokenFile(self.out / key_tokens.KEY_TOKENS_FILE, ident)
        lengths = [L for L in evalset.lengths if L > train_len]
        if any(L not in store.masks for L in lengths):  # the evaluator's passes: the ones not kept before
            row, seed = self.cfg.row(ident["evaluator"]), ident["seed"]
            model, _ = self.models.get(row, seed)
            if model is None:
                raise ConfigError(f"eval.key_tokens.evaluator {row} (seed {seed}) diverged: name another row")
            self.rt.log(f"  key tokens: the evaluator {row} seed {seed} scores the eval text")
            key_tokens.of_model(self.cfg.eval.key_tokens.rule(), model, evalset, self.rt, train_len, store)
        evalset.key_tokens = {L: store.masks[L] for L in lengths}


def train_worker(cfg: RunConfig, dist: Dist) -> None:
    """Ranks 1.. of a torchrun job: train what rank 0's Sweep asks for, until it says stop. Never writes.

    Each rank loads the corpus itself and checks that its cell key is rank 0's (same config, same data)."""
    from posenc_bench.errors import ConfigError, PosencError

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    rt = Runtime.create(cfg.device, cfg.precision, dist=dist, show_progress=False, log=lambda line: None)
    own = work.for_run(cfg, cfg.out)  # the same data as rank 0 (its BPE from the folder, or trained alike)
    while True:
        command = dist.broadcast()
        if command[0] == "stop":
            return
        if command[0] == "abort":
            raise PosencError(f"rank {dist.rank}: stopped because rank 0 failed: {command[1]}")
        _, name, seed, key = command
        row = Row.parse(name)
        mine = model_key(cfg, row, seed, own.fingerprint)
        if mine != key:
            raise ConfigError(f"rank {dist.rank}: cell {row} seed {seed} has key {mine} here and {key} on rank 0: "
                              "every process needs the same config and data")
        model = checkpoint.build_model(cfg, row, seed)
        train(model, own.batches(seed), cfg.train, rt,
              resume=Resume(None, cfg.save_every, key), grad_accum=cfg.grad_accum)


RUN_OUTPUTS = ("results.json", "results.csv", "table.md", "config.yaml", "checkpoints",  # what a run writes
               key_tokens.KEY_TOKENS_FILE)


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
    own = {training_unit(*c) for c in cells} | {(row, seed) for row, seed in cells if row.finetuned}
    for row, seed in sorted(own, key=lambda c: (c[0].name, c[1])):
        ckpt = checkpoint.checkpoint_dir(out, row, seed)
        if ckpt.exists():
            shutil.rmtree(ckpt)
