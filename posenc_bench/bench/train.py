"""Seeded training loop: AdamW, linear warm-up then cosine decay, gradient clipping, divergence detection."""

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
from posenc_bench.bench.dist import Dist, rows_of_rank
from posenc_bench.progress import progress_bar
from posenc_bench.bench.records import atomic_write


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
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas))


def train(model: torch.nn.Module, batches: TrainBatches, cfg, *, device: torch.device,
          autocast_dtype: Optional[torch.dtype] = None, show_progress: Optional[bool] = None,
          desc: str = "train", state_path: Optional[Path] = None, save_every: int = 0, state_key: str = "",
          log: Callable[[str], None] = print, dist: Optional[Dist] = None, grad_accum: int = 1) -> TrainOutcome:
    """Train ``model`` for cfg.steps steps of ``batches``. cfg is a TrainConfig.

    With ``state_path`` and ``save_every`` > 0, the full training state (weights, optimizer, data order,
    curve) is saved every ``save_every`` steps, and a run interrupted after such a save continues from it
    when called again with the same ``state_key``: the result is the one an uninterrupted run gives.

    ``batches`` yields the global batch. With ``dist`` (torchrun), every rank draws it and trains on its own
    slice inside DistributedDataParallel; with ``grad_accum`` > 1 each rank's slice is split into that many
    micro-batches whose gradients add up before the step. Either way the loss is the mean over the global
    batch's tokens, as in one process with the whole batch. Only rank 0 reads and writes ``state_path``; it
    sends a resumed state to the other ranks, so the state resumes on any number of processes.
    """
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    first_row, n_rows = rows_of_rank(batches.batch_size, dist, grad_accum)
    micro = n_rows // grad_accum
    is_main = dist is None or dist.is_main
    net = model
    if dist is not None:
        from torch.nn.parallel import DistributedDataParallel

        # every rank built the same seeded model; DDP checks that and all-reduces gradients in backward
        net = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    first_loss = None
    last_finite = None
    window_sum, window_n = 0.0, 0
    curve: list = []
    start, elapsed_before = 0, 0.0
    state = None
    if is_main and state_path is not None and state_path.is_file():
        state = torch.load(state_path, map_location="cpu", weights_only=True)
    if dist is not None:
        state = dist.broadcast(state)
    if state is not None:
        if state.get("key") == state_key:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            batches.generator.set_state(state["generator"])
            start, curve, elapsed_before = state["step"], state["curve"], state["elapsed"]
            first_loss, last_finite = state["first_loss"], state["last_finite"]
            window_sum, window_n = state["window_sum"], state["window_n"]
            if is_main:
                log(f"  {desc}: resuming from step {start} of {cfg.steps}")
    t0 = time.perf_counter() - elapsed_before
    with progress_bar(cfg.steps, desc, show_progress) as bar:
        bar.update(start)
        for step in range(start, cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, lr=cfg.lr, warmup=cfg.warmup_steps, total=cfg.steps, min_ratio=cfg.min_lr_ratio)
            rows = batches.next()[first_row:first_row + n_rows].to(device)  # (B / world, T + 1) of the global batch
            opt.zero_grad(set_to_none=True)
            total = torch.zeros((), device=device)
            for k in range(grad_accum):
                mb = rows[k * micro:(k + 1) * micro]  # (micro, T + 1)
                # DDP all-reduces gradients on the last micro-batch only; the earlier ones just accumulate
                sync = net.no_sync() if dist is not None and k < grad_accum - 1 else contextlib.nullcontext()
                with sync:
                    with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                        logits = net(mb[:, :-1])  # (micro, T, V)
                    # every sequence has T targets: the mean of the micro-batch means is the global token mean
                    loss = F.cross_entropy(logits.float().flatten(0, 1), mb[:, 1:].flatten()) / grad_accum
                    loss.backward()
                total += loss.detach()
            value = (dist.mean(total) if dist is not None else total).item()  # the same on every rank
            if first_loss is None:
                first_loss = value
            if not math.isfinite(value) or value > cfg.divergence_factor * first_loss:
                what = f"loss {value:.4g}" if math.isfinite(value) else f"loss became {value}"
                reason = (f"diverged at step {step}: {what} (first loss {first_loss:.4g}, "
                          f"last finite loss {last_finite if last_finite is None else round(last_finite, 4)})")
                return TrainOutcome("diverged", step, None, last_finite, reason, time.perf_counter() - t0, 0.0, curve)
            last_finite = value
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            window_sum += value
            window_n += 1
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                curve.append([step + 1, round(window_sum / window_n, 5)])
                bar.set_postfix(loss=f"{window_sum / window_n:.3f}")
                window_sum, window_n = 0.0, 0
            if (is_main and state_path is not None and save_every > 0 and (step + 1) % save_every == 0
                    and step + 1 < cfg.steps):
                state = dict(
                    key=state_key, step=step + 1, model=model.state_dict(), optimizer=opt.state_dict(),
                    generator=batches.generator.get_state(), curve=curve, first_loss=first_loss,
                    last_finite=last_finite, window_sum=window_sum, window_n=window_n,
                    elapsed=time.perf_counter() - t0,
                )
                atomic_write(state_path, lambda tmp: torch.save(state, tmp))
            bar.update(1)
    elapsed = time.perf_counter() - t0
    tokens = cfg.steps * cfg.batch_size * cfg.train_len
    return TrainOutcome("ok", cfg.steps, curve[-1][1], last_finite, "", elapsed, tokens / elapsed, curve)
