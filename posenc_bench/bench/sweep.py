"""The sweep: for every (encoding row, seed) cell, train (or reuse the checkpoint), evaluate at every length,
and write records. Finished cells are skipped on a rerun; results files are rewritten atomically after each.
"""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import time
from dataclasses import asdict, replace
from importlib import metadata
from pathlib import Path
from typing import Callable, Optional

import torch
import yaml

from posenc_bench import __version__, encodings
from posenc_bench.bench.config import IDENTITY_KEYS, RunConfig, cell_key, eval_key, finetune_key, parse_row, row_name
from posenc_bench.data import TrainBatches, eval_segments, load_corpus, tokens_fingerprint
from posenc_bench.bench.dist import Dist
from posenc_bench.errors import ConfigError, PosencError, PositionOutOfRange
from posenc_bench.bench.evaluate import evaluate_length, segment_length
from posenc_bench.model.transformer import DecoderLM
from posenc_bench.analysis.report import results_csv, results_markdown
from posenc_bench.bench.records import ResultsStore, atomic_write, atomic_write_text, read_results
from posenc_bench.bench.shard import shard_cells, shard_file, shard_meta, training_unit
from posenc_bench.bench.train import TrainOutcome, train


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device {name!r} requested but CUDA is not available (torch {torch.__version__}, "
                f"built with CUDA {torch.version.cuda}); valid devices here: cpu, auto"
            )
        return torch.device(name)
    if name == "cpu":
        return torch.device("cpu")
    raise ConfigError(f"unknown device {name!r}; valid devices: auto, cpu, cuda, cuda:N")


def git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return "unknown"
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return sha.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    out = {"python": platform.python_version(), "posenc_bench": __version__, "torch": torch.__version__}
    for pkg in ("transformers", "numpy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def device_description(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return f"cpu:{platform.processor() or platform.machine()} ({torch.get_num_threads()} threads)"


def _checkpoint_dir(out: Path, trained_as: str, window: Optional[int], seed: int) -> Path:
    return out / "checkpoints" / f"{row_name(trained_as, window)}-seed{seed}"


def load_checkpoint(path: Path, key: str) -> Optional[tuple[dict, Optional[Path]]]:
    """(meta, weights file or None for a diverged run) if ``path`` holds a finished run with this key."""
    meta_path = path / "config.json"
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except json.JSONDecodeError:
        return None
    if meta.get("cell_key") != key:
        return None
    if meta["outcome"]["status"] != "ok":
        return meta, None
    weights = path / "model.safetensors"
    if not weights.is_file():
        return None
    return meta, weights


def save_checkpoint(path: Path, model: Optional[torch.nn.Module], meta: dict) -> None:
    from safetensors.torch import save_model

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").unlink(missing_ok=True)  # never leave old meta beside new weights
    if model is not None:
        atomic_write(path / "model.safetensors", lambda tmp: save_model(model, tmp))  # handles tied weights
    atomic_write_text(path / "config.json", json.dumps(meta, indent=1) + "\n")


def evaluate_model(model: DecoderLM, segments: torch.Tensor, length: int, cfg: RunConfig, *, bucket_span: int,
                   device: torch.device, autocast: Optional[torch.dtype], show_progress: Optional[bool]) -> dict:
    """One eval length of a run's protocol for one of our models (``cfg.eval``: batch, buckets, protocol);
    raises PositionOutOfRange where the encoding cannot run at this length."""
    model.encoding.set_eval_length(length)
    model.eval()
    with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
        return evaluate_length(model, segments, length, batch_tokens=cfg.eval.batch_tokens,
                               buckets=cfg.eval.position_buckets, bucket_span=bucket_span, device=device,
                               show_progress=show_progress, stride=cfg.eval.stride or None)


def evaluate_into(rec: dict, model: DecoderLM, segments: torch.Tensor, length: int, cfg: RunConfig, **kw) -> dict:
    """``rec`` with the numbers of ``evaluate_model`` at this length, or marked n/a with the reason."""
    try:
        res = evaluate_model(model, segments, length, cfg, **kw)
    except PositionOutOfRange as e:
        rec.update(status="n/a", reason=str(e))
        return rec
    rec.update({k: res[k] for k in ("ppl", "bpb", "loss", "tokens", "bytes", "loss_by_position", "eval_time_s")})
    return rec


class Sweep:
    """One `posenc-bench run`: data and metadata prepared once, then cells trained and evaluated in order."""

    def __init__(self, cfg: RunConfig, *, log: Callable[[str], None] = print, show_progress: Optional[bool] = None,
                 dist: Optional[Dist] = None, shard: Optional[tuple[int, int]] = None):
        """``dist``: this is rank 0 of a torchrun job (the other ranks run :func:`train_worker`).
        ``shard``: (i, n) runs shard i of n of the cells into results.shard-<i>-of-<n>.json (see shard.py)."""
        self.cfg = cfg
        self.log = log
        self.show_progress = show_progress
        self.out = Path(cfg.out)
        self.dist = dist
        self.shard = shard
        self.training = False  # inside a training that other ranks take part in
        self.results_name = "results.json" if shard is None else shard_file(*shard)
        self.device = dist.device if dist is not None else resolve_device(cfg.device)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.autocast = {"fp32": None, "bf16": torch.bfloat16}[cfg.precision]
        self.lengths = cfg.eval_lengths()
        self.corpus = load_corpus(cfg.data.source, valid_fraction=cfg.data.valid_fraction,
                                  test_fraction=cfg.data.test_fraction, text_field=cfg.data.text_field)
        self.segment_len = segment_length(self.lengths)
        self.segments = eval_segments(self.corpus.stream(cfg.eval.split), self.segment_len, cfg.eval.tokens)
        self._train_stream: Optional[torch.Tensor] = None
        self.run_meta = {
            "config": cfg.to_dict(),
            "rows": cfg.rows(),
            "eval_lengths": self.lengths,
            "segment_len": self.segment_len,
            "eval_tokens": int(self.segments.shape[0] * self.segment_len),
            "eval_fingerprint": tokens_fingerprint(self.segments),
            "corpus": self.corpus.describe(),
            "params": sum(p.numel() for p in DecoderLM(cfg.model, "nope", cfg.train.train_len).parameters()),
            "versions": versions(),
            "device": device_description(self.device) + (f" x{dist.world_size} ({dist.describe()})" if dist else ""),
            "git_commit": git_commit(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        if shard is not None:
            self.run_meta["shard"] = shard_meta(cfg, *shard)
        self.store = self._open_store()

    # ---- results folder ------------------------------------------------------------------------------
    def _open_store(self) -> ResultsStore:
        path = self.out / self.results_name
        if not path.exists():
            return ResultsStore(path, self.run_meta)
        old = read_results(path)
        old_cfg, new_cfg = old["run"]["config"], self.run_meta["config"]
        for key in IDENTITY_KEYS:
            if old_cfg.get(key) != new_cfg.get(key):
                raise ConfigError(
                    f"{path} holds results made with a different {key!r} config "
                    f"({old_cfg.get(key)!r} there, {new_cfg.get(key)!r} now); use another --out, or --fresh to start over"
                )
        if (old["run"]["eval_fingerprint"], old["run"]["eval_lengths"]) != (
            self.run_meta["eval_fingerprint"], self.run_meta["eval_lengths"]
        ):
            raise ConfigError(
                f"{path} was evaluated at other lengths or on other tokens (lengths {old['run']['eval_lengths']}, "
                f"eval fingerprint {old['run']['eval_fingerprint']}; now {self.run_meta['eval_lengths']}, "
                f"{self.run_meta['eval_fingerprint']}); "
                "use another --out, or --fresh to start over"
            )
        # Keep the rows of earlier invocations in the table, in their order, then the new ones; an invocation
        # that names every earlier row sets the order itself.
        old_rows, new_rows = old["run"].get("rows", []), self.run_meta["rows"]
        first, then = (new_rows, old_rows) if set(old_rows) <= set(new_rows) else (old_rows, new_rows)
        self.run_meta["rows"] = list(dict.fromkeys(first + then))
        old_enc, new_enc = old_cfg["encodings"], new_cfg["encodings"]
        first, then = (new_enc, old_enc) if set(old_enc) <= set(new_enc) else (old_enc, new_enc)
        self.run_meta["config"]["encodings"] = list(dict.fromkeys(first + then))
        self.run_meta["config"]["seeds"] = sorted(set(old_cfg["seeds"]) | set(new_cfg["seeds"]))
        return ResultsStore(path, self.run_meta, old["records"])

    def _train_batches(self, seed: int) -> TrainBatches:
        if self._train_stream is None:
            self._train_stream = self.corpus.stream("train")
        return TrainBatches(self._train_stream, self.cfg.train.train_len, self.cfg.train.batch_size, seed)

    # ---- one cell ------------------------------------------------------------------------------------
    def _cell_key(self, name: str, window: Optional[int], seed: int) -> str:
        cls = encodings.get_class(name)
        key = cell_key(self.cfg, cls.trained_as or name, window, seed, self.corpus.fingerprint)
        return finetune_key(key, self.cfg, name) if cls.finetuned else key

    def _reuse(self, ckpt: Path, key: str, model: DecoderLM, label: str, what: str
               ) -> Optional[tuple[Optional[DecoderLM], dict]]:
        """(model with the checkpoint's weights, or None for a diverged run; meta) if ``ckpt`` holds a
        finished run with this key, else None."""
        found = load_checkpoint(ckpt, key)
        if found is None:
            return None
        meta, weights = found
        self.log(f"  {label}: reusing {what} {ckpt}")
        if weights is None:
            return None, meta
        from safetensors.torch import load_model

        load_model(model, str(weights))  # strict: every tensor must fit
        return model.to(self.device), meta

    def finetuned_model(self, name: str, window: Optional[int], seed: int) -> tuple[Optional[DecoderLM], dict]:
        """A -ft row's model: its trained_as checkpoint trained further at the fine-tune length with the row's
        scaling fixed there (on this process alone, also under torchrun), cached in its own checkpoint."""
        cfg = self.cfg
        cls = encodings.get_class(name)
        plan = cfg.finetune_plan()
        key = self._cell_key(name, window, seed)
        ckpt = _checkpoint_dir(self.out, name, window, seed)
        model = DecoderLM(cfg.model, name, cfg.train.train_len, window=window, seed=seed,
                          max_mask_bytes=cfg.max_mask_bytes)
        reused = self._reuse(ckpt, key, model, f"{row_name(name, window)} seed {seed}", "fine-tuned checkpoint")
        if reused is not None:
            if reused[0] is not None:
                reused[0].encoding.set_train_length(plan.len)
            return reused
        base, base_meta = self.trained_model(cls.trained_as, window, seed)
        if base is None:
            return None, base_meta
        model.load_state_dict(base.state_dict())
        model.encoding.set_train_length(plan.len)
        label = f"{row_name(name, window)} seed {seed}"
        batches = self._train_batches(seed).continued(cfg.train.steps, plan.len, plan.batch_size)
        ft_cfg = replace(cfg.train, train_len=plan.len, batch_size=plan.batch_size, steps=plan.steps,
                         warmup_steps=plan.warmup_steps, lr=plan.lr)
        ckpt.mkdir(parents=True, exist_ok=True)
        state_path = ckpt / "train_state.pt"
        outcome = train(model, batches, ft_cfg, device=self.device, autocast_dtype=self.autocast,
                        show_progress=self.show_progress, desc=f"{label} fine-tune", state_path=state_path,
                        save_every=cfg.save_every, state_key=key, log=self.log)
        finetune = {**asdict(plan), "tokens": plan.tokens, "from_cell_key": base_meta["cell_key"],
                    "time_s": round(outcome.time_s, 2), "final_loss": outcome.final_loss, "curve": outcome.curve,
                    "status": outcome.status, "reason": outcome.reason}
        meta = {"cell_key": key, "encoding": name, "window": window, "seed": seed, "config": cfg.to_dict(),
                "corpus_fingerprint": self.corpus.fingerprint, "finetune": finetune,
                "outcome": base_meta["outcome"] if outcome.status == "ok" else asdict(outcome)}
        save_checkpoint(ckpt, model if outcome.status == "ok" else None, meta)
        state_path.unlink(missing_ok=True)
        if outcome.status == "ok":
            self.log(f"  {label}: fine-tuned {plan.steps} steps x {plan.batch_size} x {plan.len} tokens in "
                     f"{outcome.time_s:.0f}s, final train loss {outcome.final_loss:.3f}")
            return model, meta
        self.log(f"  {label}: fine-tuning {outcome.reason}")
        return None, meta

    def trained_model(self, name: str, window: Optional[int], seed: int) -> tuple[Optional[DecoderLM], dict]:
        """The trained model of a cell (reused from its checkpoint when finished before) and its meta."""
        cfg = self.cfg
        if encodings.get_class(name).finetuned:
            return self.finetuned_model(name, window, seed)
        trained_as = encodings.get_class(name).trained_as or name
        key = self._cell_key(name, window, seed)
        ckpt = _checkpoint_dir(self.out, trained_as, window, seed)
        model = DecoderLM(cfg.model, name, cfg.train.train_len, window=window, seed=seed,
                          max_mask_bytes=cfg.max_mask_bytes)
        reused = self._reuse(ckpt, key, model, f"{row_name(trained_as, window)} seed {seed}", "checkpoint")
        if reused is not None:
            return reused
        if trained_as != name:  # eval-only variant: train the encoding it is evaluated on top of
            base, meta = self.trained_model(trained_as, window, seed)
            if base is not None:
                model.load_state_dict(base.state_dict())
                return model.to(self.device), meta
            return None, meta
        label = f"{row_name(name, window)} seed {seed}"
        ckpt.mkdir(parents=True, exist_ok=True)
        state_path = ckpt / "train_state.pt"  # mid-run state: an interrupted run continues from it
        if self.dist is not None:
            self.dist.broadcast(("train", name, window, seed, key))  # the other ranks join this training
        self.training = True
        outcome: TrainOutcome = train(model, self._train_batches(seed), cfg.train, device=self.device,
                                      autocast_dtype=self.autocast, show_progress=self.show_progress, desc=label,
                                      state_path=state_path, save_every=cfg.save_every, state_key=key, log=self.log,
                                      dist=self.dist, grad_accum=cfg.grad_accum)
        self.training = False
        meta = {"cell_key": key, "encoding": trained_as, "window": window, "seed": seed,
                "config": cfg.to_dict(), "corpus_fingerprint": self.corpus.fingerprint, "outcome": asdict(outcome)}
        save_checkpoint(ckpt, model if outcome.status == "ok" else None, meta)
        state_path.unlink(missing_ok=True)
        if outcome.status == "ok":
            self.log(f"  {label}: trained {outcome.steps} steps in {outcome.time_s:.0f}s, final train loss {outcome.final_loss:.3f}")
            return model, meta
        self.log(f"  {label}: {outcome.reason}")
        return None, meta

    def run_cell(self, row: str, seed: int) -> list[dict]:
        cfg = self.cfg
        name, window = parse_row(row)
        key = self._cell_key(name, window, seed)
        ekey = eval_key(cfg)
        done = self.store.cell(row, seed)
        if done and {r["eval_len"] for r in done} >= set(self.lengths) and all(
            r["cell_key"] == key and r["eval_key"] == ekey for r in done
        ):
            self.log(f"  {row} seed {seed}: done before, skipped")
            return done
        model, meta = self.trained_model(name, window, seed)
        outcome = meta["outcome"]
        records = []
        for L in self.lengths:
            rec = {
                "encoding": row, "base_encoding": name, "window": window, "seed": seed,
                "train_len": cfg.train.train_len, "eval_len": L, "ratio": L / cfg.train.train_len,
                "status": "ok", "reason": "", "ppl": None, "bpb": None, "loss": None, "tokens": None,
                "train_time_s": round(outcome["time_s"], 2), "train_tokens_per_s": round(outcome["tokens_per_s"], 1),
                "train_final_loss": outcome["final_loss"], "train_curve": outcome["curve"],
                "cell_key": key, "eval_key": ekey, "corpus_fingerprint": self.corpus.fingerprint,
                "eval_fingerprint": self.run_meta["eval_fingerprint"], "git_commit": self.run_meta["git_commit"],
                "device": self.run_meta["device"], "versions": self.run_meta["versions"], "config": cfg.to_dict(),
            }
            rec["protocol"] = cfg.eval.protocol
            rec["stride"] = min(cfg.eval.stride, L) if cfg.eval.stride else None
            if meta.get("finetune"):
                rec["finetune"] = {k: v for k, v in meta["finetune"].items() if k != "curve"}
            if model is None:
                rec.update(status="diverged", reason=outcome["reason"], last_finite_loss=outcome["last_finite_loss"])
                records.append(rec)
                continue
            records.append(evaluate_into(rec, model, self.segments, L, cfg, bucket_span=max(self.lengths),
                                         device=self.device, autocast=self.autocast,
                                         show_progress=self.show_progress))
        shown = ", ".join(
            f"{r['eval_len']}: {r['ppl']:.3f}" if r["status"] == "ok" else f"{r['eval_len']}: {r['status']}" for r in records
        )
        self.log(f"  {row} seed {seed}: ppl {shown}")
        self.store.put_cell(row, seed, records)
        return records

    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "config.yaml", yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
        self.store.save()
        cells = self.cfg.cells()
        if self.shard is not None:
            cells = shard_cells(cells, *self.shard)
        self.log(f"posenc-bench run: {len(cells)} cell(s)"
                 + (f" (shard {self.shard[0]} of {self.shard[1]})" if self.shard else "")
                 + f", eval lengths {self.lengths}, {self.run_meta['eval_tokens']:,} target tokens each, "
                 f"device {self.run_meta['device']}, out {self.out}")
        if self.shard is not None and not cells:
            self.log(f"  shard {self.shard[0]} of {self.shard[1]} has no cells: the sweep has fewer trained models "
                     "than shards")
        for row, seed in cells:
            self.run_cell(row, seed)
        if self.dist is not None:
            self.dist.broadcast(("stop",))
        data = self.store.as_dict()
        if self.shard is not None:  # one table for all shards: posenc-bench merge
            return data
        atomic_write_text(self.out / "results.csv", results_csv(data))
        atomic_write_text(self.out / "table.md", results_markdown(data))
        return data


def train_worker(cfg: RunConfig, dist: Dist) -> None:
    """Ranks 1.. of a torchrun job: train what rank 0's Sweep asks for, until it says stop. Never writes.

    Each rank loads the corpus itself and checks that its cell key is rank 0's (same config, same data)."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    autocast = {"fp32": None, "bf16": torch.bfloat16}[cfg.precision]
    corpus = load_corpus(cfg.data.source, valid_fraction=cfg.data.valid_fraction,
                         test_fraction=cfg.data.test_fraction, text_field=cfg.data.text_field)
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
        model = DecoderLM(cfg.model, name, cfg.train.train_len, window=window, seed=seed,
                          max_mask_bytes=cfg.max_mask_bytes)
        train(model, TrainBatches(stream, cfg.train.train_len, cfg.train.batch_size, seed), cfg.train,
              device=dist.device, autocast_dtype=autocast, show_progress=False, save_every=cfg.save_every,
              state_key=key, log=lambda line: None, dist=dist, grad_accum=cfg.grad_accum)


def remove_outputs(out: Path, cfg: Optional[RunConfig] = None, shard: Optional[tuple[int, int]] = None) -> None:
    """Delete a results folder (``run --fresh``); for a shard, only its results file and its cells' checkpoints
    (the folder is shared with the other shards)."""
    if shard is None:
        if out.exists():
            shutil.rmtree(out)
        return
    (out / shard_file(*shard)).unlink(missing_ok=True)
    cells = shard_cells(cfg.cells(), *shard)
    finetuned = {(r, s) for r, s in cells if encodings.get_class(parse_row(r)[0]).finetuned}  # own checkpoints too
    for row, seed in sorted({training_unit(*c) for c in cells} | finetuned):
        name, window = parse_row(row)
        ckpt = _checkpoint_dir(out, name, window, seed)
        if ckpt.exists():
            shutil.rmtree(ckpt)
