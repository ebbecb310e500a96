"""Seeded training loop: AdamW, linear warm-up then cosine decay, gradient clipping, divergence detection."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F

from posenc_bench.data import TrainBatches
from posenc_bench.progress import progress_bar


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
          desc: str = "train") -> TrainOutcome:
    """Train ``model`` for cfg.steps steps of ``batches``. cfg is a TrainConfig."""
    model.to(device).train()
    opt = make_optimizer(model, cfg)
    first_loss = None
    last_finite = None
    window_sum, window_n = 0.0, 0
    curve: list = []
    t0 = time.perf_counter()
    step = 0
    with progress_bar(cfg.steps, desc, show_progress) as bar:
        for step in range(cfg.steps):
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
            bar.update(1)
    elapsed = time.perf_counter() - t0
    tokens = cfg.steps * cfg.batch_size * cfg.train_len
    return TrainOutcome("ok", cfg.steps, curve[-1][1], last_finite, "", elapsed, tokens / elapsed, curve)
