"""A training step timed before the first one: a throwaway model of the run's shape trains a step on random
tokens of the config's batch after one that warms up. The whole batch, not a few rows scaled up: on a CPU a
step of 2 x 2048 tokens timed at a third of a 32 x 2048 step's per-row time (memory traffic grows faster than
the rows). Torch's random state is left as it was, so the sweep trains the same models with or without it."""

from __future__ import annotations

import time
from dataclasses import replace

import torch

from posenc_bench.bench import checkpoint
from posenc_bench.bench.run.runtime import Runtime
from posenc_bench.bench.train.loop import _loss_and_grads, make_optimizer

PROBE_STEPS = 1  # timed steps, after one that warms up


def step_seconds(cfg, row, rt: Runtime) -> float:
    """Seconds one training step of ``cfg`` (a RunConfig) takes on ``rt``'s device, timed on ``row``'s model."""
    t = cfg.train
    local = replace(rt, dist=None)
    with torch.random.fork_rng(devices=[]):
        model = checkpoint.build_model(cfg, row, 0).to(rt.device).train()
        opt = make_optimizer(model, t)
        tokens = torch.randint(cfg.model.vocab_size, (t.batch_size, t.train_len + 1), device=rt.device)
        marks = []
        for _ in range(1 + PROBE_STEPS):
            opt.zero_grad(set_to_none=True)
            _loss_and_grads(model, tokens, cfg.grad_accum, local)
            opt.step()
            if rt.device.type == "cuda":  # the step reads nothing back: wait for it before reading the clock
                torch.cuda.synchronize(rt.device)
            marks.append(time.perf_counter())
    return (marks[-1] - marks[0]) / PROBE_STEPS
