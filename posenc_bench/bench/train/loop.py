"""Seeded training loop: AdamW, linear warm-up then cosine decay, gradient clipping, divergence detection.

A step never waits for the device: its loss stays there, in the log interval's small tensor of per-step
losses, and is read once per interval (at each ``log_every``-th step, before a resumable save, at the end).
The curve and the divergence check then go over those values one by one exactly as they did when each step
read its loss (Python float64 sums of the float32 per-step losses; the first diverging step, its reason and
the last finite loss), so the numbers are the same; only the first step's loss is read at once (the threshold).
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from posenc_bench.data import TrainBatches
from posenc_bench.bench.run.dist import rows_of_rank
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.progress import progress_bar
from posenc_bench.files import atomic_write


@dataclass
class TrainOutcome:
    status: str  # "ok" | "diverged"
    steps: int  # optimizer steps taken
    final_loss: Optional[float]  # mean train loss of the last log interval (None if diverged)
    last_finite_loss: Optional[float]
    reason: str = ""
    time_s: float = 0.0
    tokens_per_s: float = 0.0
    curve: list = field(default_factory=list)  # [[step, mean loss over the interval ending there], ...]


def lr_at(step: int, *, lr: float, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up over `warmup` steps, then cosine from lr down to lr * min_ratio at `total`."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def make_optimizer(model: torch.nn.Module, cfg) -> torch.optim.Optimizer:
    """AdamW; weight decay on matrices (embeddings, projections, position tables), none on norms/vectors."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # CUDA: the fused kernel (one launch for all parameters, the same update within float rounding); elsewhere
    # the default implementation, as ever
    on_cuda = any(p.is_cuda for p in decay + no_decay)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), **({"fused": True} if on_cuda else {}))


@dataclass
class _Progress:
    """The numbers of a training so far that a resumed run needs besides weights, optimizer and data order."""

    step: int = 0
    curve: list = field(default_factory=list)
    first_loss: Optional[float] = None
    last_finite: Optional[float] = None
    window_sum: float = 0.0
    window_n: int = 0
    elapsed: float = 0.0
    above: int = 0  # logged windows in a row whose mean loss is above the divergence threshold


@dataclass
class Resume:
    """Where a training saves its state mid-run, how often (every ``every`` steps or ``every_s`` seconds, whichever
    comes first), and the key a saved state must carry to be resumed."""

    path: Optional[Path] = None
    every: int = 0  # steps between saves; 0: not by steps (only the finished model is kept, by the caller)
    key: str = ""
    every_s: float = 0.0  # seconds since the last save (or the start) that bring the next; 0: not by time
    clock: Callable[[], float] = time.monotonic  # a test's fake clock

    def due(self, steps: int, since: float) -> bool:
        """Whether a state is saved after ``steps`` steps, ``since`` seconds after the last save (or the start)."""
        return ((self.every > 0 and steps % self.every == 0) or (self.every_s > 0 and since >= self.every_s))


def _resumed(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: TrainBatches, rt: Runtime,
             resume: Resume) -> Optional[_Progress]:
    """The progress of a saved state with this key, loaded into model, optimizer and batches (None: start)."""
    state = None
    if rt.is_main and resume.path is not None and resume.path.is_file():
        state = torch.load(resume.path, map_location="cpu", weights_only=True)
    if rt.dist is not None:
        state = rt.dist.broadcast(state)  # rank 0's state resumes on every rank
    if state is None or state.get("key") != resume.key:
        return None
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    batches.generator.set_state(state["generator"])
    return _Progress(state["step"], state["curve"], state["first_loss"], state["last_finite"], state["window_sum"],
                     state["window_n"], state["elapsed"], state.get("above", 0))  # a state saved before the count: 0


def _save(resume: Resume, p: _Progress, model: torch.nn.Module, opt: torch.optim.Optimizer, batches: TrainBatches) -> None:
    state = dict(key=resume.key, step=p.step, model=model.state_dict(), optimizer=opt.state_dict(),
                 generator=batches.generator.get_state(), curve=p.curve, first_loss=p.first_loss,
                 last_finite=p.last_finite, window_sum=p.window_sum, window_n=p.window_n, elapsed=p.elapsed,
                 above=p.above)
    atomic_write(resume.path, lambda tmp: torch.save(state, tmp))


def _loss_and_grads(net: torch.nn.Module, rows: torch.Tensor, grad_accum: int, rt: Runtime,
                    mask: Optional[torch.Tensor] = None, scored: int = 0) -> torch.Tensor:
    """Forward and backward over this rank's rows in ``grad_accum`` micro-batches; the global batch's mean
    loss (the same on every rank), a float32 0-d tensor on the device (not read: no host sync). With ``mask``
    (a task's answer places, (rows, T)) only those targets count, and the loss is their sum over the
    ``scored`` targets of the global batch."""
    micro = rows.shape[0] // grad_accum
    total = torch.zeros((), device=rt.device)
    ranks = rt.dist.world_size if rt.dist is not None else 1  # DDP averages gradients over the ranks
    for k in range(grad_accum):
        mb = rows[k * micro:(k + 1) * micro]  # (micro, T + 1)
        # DDP all-reduces gradients on the last micro-batch only; the earlier ones just accumulate
        sync = net.no_sync() if rt.dist is not None and k < grad_accum - 1 else contextlib.nullcontext()
        with sync:
            with rt.autocast_context():
                logits = net(mb[:, :-1])  # (micro, T, V)
            if mask is None:  # every sequence has T targets: the mean of the micro-batch means is the token mean
                loss = F.cross_entropy(logits.float().flatten(0, 1), mb[:, 1:].flatten()) / grad_accum
            else:
                m = mask[k * micro:(k + 1) * micro]  # (micro, T)
                loss = F.cross_entropy(logits.float()[m], mb[:, 1:][m], reduction="sum") * ranks / scored
            loss.backward()
        total += loss.detach()
    return rt.dist.mean(total) if rt.dist is not None else total


def _to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (on the CPU) on ``device``; to a GPU through pinned memory, asynchronously: a plain copy from
    pageable memory waits for the device (a host sync every step)."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


class _Losses:
    """The per-step losses of the steps not yet read, kept on the device (float32, one slot per step of a log
    interval) and read all at once by ``take``: the one host sync of an interval."""

    def __init__(self, size: int, device: torch.device, first_step: int) -> None:
        self.values = torch.zeros(size, device=device)  # (size,) float32
        self.first_step, self.n = first_step, 0

    def add(self, value: torch.Tensor) -> None:
        self.values[self.n] = value  # a device-side copy
        self.n += 1

    def take(self) -> list[tuple[int, float]]:
        """(step, loss) of every step added since the last take, in order; empties the slots."""
        out = list(enumerate(self.values[:self.n].tolist(), start=self.first_step))
        self.first_step, self.n = self.first_step + self.n, 0
        return out


def _fold(p: _Progress, losses: list[tuple[int, float]]) -> Optional[tuple[int, str]]:
    """Each step's loss into the progress, in step order, as each step once did on its own: (step, reason) of
    the first step whose loss is not finite (the losses after it are not folded), else None."""
    for step, value in losses:
        if not math.isfinite(value):
            return step, (f"diverged at step {step}: loss became {value} (first loss {p.first_loss:.4g}, "
                          f"last finite loss {p.last_finite if p.last_finite is None else round(p.last_finite, 4)})")
        p.last_finite = value
        p.window_sum += value
        p.window_n += 1
    return None


def _judge_window(p: _Progress, step: int, cfg, last: bool) -> Optional[tuple[int, str]]:
    """At a log step (``step`` steps done): (step, reason) when the window's mean loss is the ``patience``-th in
    a row above ``factor`` x the first loss, or above it at the end of training (the run failed); else None.
    A spike that training recovers from within a window or two is not a divergence."""
    mean, threshold = p.window_sum / p.window_n, cfg.divergence_factor * p.first_loss
    p.above = p.above + 1 if mean > threshold else 0
    if p.above >= cfg.divergence_patience or (last and p.above):
        windows = f"{p.above} logged windows in a row" if p.above > 1 else "the last logged window"
        return step, (f"diverged at step {step}: mean loss {mean:.4g} over {windows} above {cfg.divergence_factor:g}"
                      f" x the first loss {p.first_loss:.4g} (last finite loss {round(p.last_finite, 4)})")
    return None


@contextlib.contextmanager
def _compiled(model: torch.nn.Module, cfg):
    """With cfg.compile, the model's blocks run compiled (``torch.compile``) while it trains; as before after."""
    if not cfg.compile:
        yield
        return
    model.compile_blocks(True)
    try:
        yield
    finally:
        model.compile_blocks(False)


def train(model: torch.nn.Module, batches: TrainBatches, cfg, rt: Runtime, *, resume: Resume = Resume(),
          desc: str = "train", grad_accum: int = 1, on_step: Optional[Callable[[], None]] = None) -> TrainOutcome:
    """Train ``model`` for cfg.steps steps of ``batches``. cfg is a TrainConfig.

    With ``resume.path``, the full training state (weights, optimizer, data order, curve) is saved every
    ``resume.every`` steps and every ``resume.every_s`` seconds (whichever comes first; 0: not by that), and a
    run interrupted after such a save continues from it when called again with the same ``resume.key``: the
    result is the one an uninterrupted run gives.

    ``batches`` yields the global batch. With ``rt.dist`` (torchrun), every rank draws it and trains on its own
    slice inside DistributedDataParallel; with ``grad_accum`` > 1 each rank's slice is split into that many
    micro-batches whose gradients add up before the step. Either way the loss is the mean over the global
    batch's tokens, as in one process with the whole batch. Only rank 0 reads and writes ``resume.path``; it
    sends a resumed state to the other ranks, so the state resumes on any number of processes.

    ``on_step`` is called after every step (the sweep's :class:`~posenc_bench.bench.train.eta.Clock` times them).
    """
    device, dist = rt.device, rt.dist
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    first_row, n_rows = rows_of_rank(batches.batch_size, dist, grad_accum)
    net = model
    if dist is not None:
        from torch.nn.parallel import DistributedDataParallel

        # every rank built the same seeded model; DDP checks that and all-reduces gradients in backward
        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    p = _resumed(model, opt, batches, rt, resume) or _Progress()
    if p.step and rt.is_main:
        rt.log(f"  {desc}: resuming from step {p.step} of {cfg.steps}")
    t0 = time.perf_counter() - p.elapsed
    last_save = resume.clock()
    losses = _Losses(min(cfg.log_every, cfg.steps), device, p.step)
    diverged: Optional[tuple[int, str]] = None  # the first diverging step, found when its loss was read
    with progress_bar(cfg.steps, desc, rt.show_progress) as bar, _compiled(model, cfg):
        bar.update(p.step)
        for step in range(p.step, cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, lr=cfg.lr, warmup=cfg.warmup_steps, total=cfg.steps, min_ratio=cfg.min_lr_ratio)
            batch = batches.next()  # (B, T + 1) tokens, or a task's (tokens, answer mask (B, T))
            tokens, mask = batch if isinstance(batch, tuple) else (batch, None)
            rows = _to_device(tokens[first_row:first_row + n_rows], device)  # (B / world, T + 1) of the global batch
            opt.zero_grad(set_to_none=True)
            mine = None if mask is None else _to_device(mask[first_row:first_row + n_rows], device)  # (B / world, T)
            value = _loss_and_grads(net, rows, grad_accum, rt, mine, 0 if mask is None else int(mask.sum()))
            if p.first_loss is None:
                p.first_loss = value.item()  # the threshold of the divergence check: read once
            losses.add(value)
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                diverged = diverged or _fold(p, losses.take())
                diverged = diverged or _judge_window(p, step + 1, cfg, last=step + 1 == cfg.steps)
                if diverged is not None:  # every rank reads the same losses here, so all stop at this step
                    return TrainOutcome("diverged", diverged[0], None, p.last_finite, diverged[1],
                                        time.perf_counter() - t0, 0.0, p.curve)
                p.curve.append([step + 1, round(p.window_sum / p.window_n, 5)])
                bar.set_postfix(loss=f"{p.window_sum / p.window_n:.3f}")
                p.window_sum, p.window_n = 0.0, 0
            now = resume.clock()
            if rt.is_main and resume.path is not None and step + 1 < cfg.steps and resume.due(step + 1, now - last_save):
                # the saved progress holds every step's loss so far; a state past a diverged step is not saved
                # (the run stops at the next log step, as every rank finds that step there)
                diverged = diverged or _fold(p, losses.take())
                if diverged is None:
                    p.step, p.elapsed = step + 1, time.perf_counter() - t0
                    _save(resume, p, model, opt, batches)  # the same state as ever: a resume file of any version reads
                last_save = now
            bar.update(1)
            if on_step is not None:
                on_step()
    elapsed = time.perf_counter() - t0
    tokens = cfg.steps * cfg.batch_size * cfg.train_len
    return TrainOutcome("ok", cfg.steps, p.curve[-1][1], p.last_finite, "", elapsed, tokens / elapsed, p.curve)
