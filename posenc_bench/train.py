"""Seeded training loop: AdamW, linear warm-up then cosine decay, gradient clipping, divergence detection."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from posenc_bench.data import TrainBatches
from posenc_bench.progress import progress_bar
from posenc_bench.results import atomic_write


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
          log: Callable[[str], None] = print) -> TrainOutcome:
    """Train ``model`` for cfg.steps steps of ``batches``. cfg is a TrainConfig.

    With ``state_path`` and ``save_every`` > 0, the full training state (weights, optimizer, data order,
    curve) is saved every ``save_every`` steps, and a run interrupted after such a save continues from it
    when called again with the same ``state_key``: the result is the one an uninterrupted run gives.
    """
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    first_loss = None
    last_finite = None
    window_sum, window_n = 0.0, 0
    curve: list = []
    start, elapsed_before = 0, 0.0
    if state_path is not None and state_path.is_file():
        state = torch.load(state_path, map_location=device, weights_only=True)
        if state.get("key") == state_key:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
            batches.generator.set_state(state["generator"])
            start, curve, elapsed_before = state["step"], state["curve"], state["elapsed"]
            first_loss, last_finite = state["first_loss"], state["last_finite"]
            window_sum, window_n = state["window_sum"], state["window_n"]
            log(f"  {desc}: resuming from step {start} of {cfg.steps}")
    t0 = time.perf_counter() - elapsed_before
    with progress_bar(cfg.steps, desc, show_progress) as bar:
        bar.update(start)
        for step in range(start, cfg.steps):
            for group in opt.param_groups:
                group["lr"] = lr_at(step, lr=cfg.lr, warmup=cfg.warmup_steps, total=cfg.steps, min_ratio=cfg.min_lr_ratio)
            batch = batches.next().to(device)  # (B, T + 1)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(batch[:, :-1])  # (B, T, V)
            loss = F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            value = loss.item()
            if first_loss is None:
                first_loss = value
            if not math.isfinite(value) or value > cfg.divergence_factor * first_loss:
                what = f"loss {value:.4g}" if math.isfinite(value) else f"loss became {value}"
                reason = (f"diverged at step {step}: {what} (first loss {first_loss:.4g}, "
                          f"last finite loss {last_finite if last_finite is None else round(last_finite, 4)})")
                return TrainOutcome("diverged", step, None, last_finite, reason, time.perf_counter() - t0, 0.0, curve)
            last_finite = value
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            window_sum += value
            window_n += 1
            if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                curve.append([step + 1, round(window_sum / window_n, 5)])
                bar.set_postfix(loss=f"{window_sum / window_n:.3f}")
                window_sum, window_n = 0.0, 0
            if state_path is not None and save_every > 0 and (step + 1) % save_every == 0 and step + 1 < cfg.steps:
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
