"""Cheaper plans for a sweep that a CPU cannot finish in its time, said before the first training step.

On a CPU, when the estimate (``eta``, from a probe step timed before training) is far beyond the time the
config expects (``eta.note_after``), the run prints the whole sweep's time and one row's, then plans that keep
the train length, each a command line with its estimate and what it changes about the experiment, then the
GPU config; a shorter train length is named as the different experiment it is. Each plan's config is built
with the project's loader from the run's own config and priced like the run (``eta``: FLOPs against the
measured step). Pure arithmetic and text: ``tests/bench/train/test_plans.py``.
"""

from __future__ import annotations

import copy
import shlex
from dataclasses import dataclass
from typing import Optional

from posenc_bench.bench.train import eta
from posenc_bench.errors import PosencError

# What gets a model off the no-position plateau is training tokens, not updates (results/sotu-512/README.md:
# its absolute encodings left it between steps 700 and 800 of 8 x 512 tokens, about 3M tokens; the default
# config's 1.6M tokens at train length 128 were enough on stdlib). A plan that trains each model on fewer
# tokens than this says so.
PLATEAU_TOKENS = 3_000_000
GPU_CONFIG = "long-2048"  # the GPU-sized config at train length 2048 (configs/long-2048.yaml)
GPU_TIME = "about 20-40 min on one GPU (docs/getting-started.md)"
NARROW_ROWS = ("rope", "alibi")  # the rows a narrower comparison keeps, when the run has them


@dataclass(frozen=True)
class Plan:
    """One cheaper way to run: the flags that change (added to the run's own command line), the config keys
    they set, and what that changes about the experiment."""

    flags: dict
    overrides: dict
    what: str
    folder: str = ""  # a plan that changes the results' identity writes next to a given --out: <out>-<folder>


def command(base: list[str], flags: dict) -> str:
    """``posenc-bench run`` with the run's own flags (``base``: argv after ``run``, each value its own token)
    and ``flags`` replacing any earlier value of the same flag."""
    out, skip = [], False
    for tok in base:
        if skip:
            skip = False
            continue
        name = tok.split("=", 1)[0]
        if name in flags:
            skip = "=" not in tok
            continue
        out.append(tok)
    for flag, value in flags.items():
        out += [flag, str(value)]
    return "posenc-bench run " + shlex.join(out)


def plan_flags(base: list[str], plan: Plan) -> dict:
    """The flags a plan adds to the run's command line ``base``: its own, and its own folder next to a given
    ``--out`` when it changes what the results measure (a folder holds results of one identity)."""
    out = next((base[i + 1] for i, tok in enumerate(base[:-1]) if tok == "--out"), None)
    out = out or next((tok.split("=", 1)[1] for tok in base if tok.startswith("--out=")), None)
    return {**plan.flags, "--out": f"{out.rstrip('/')}-{plan.folder}"} if out and plan.folder else plan.flags


def config_with(cfg, overrides: dict):
    """``cfg`` (a RunConfig) with dotted-key ``overrides``, built and validated by the config loader; None when
    invalid."""
    from posenc_bench.bench.config import build_config

    try:
        return build_config(cfg.to_dict(), overrides)
    except PosencError:
        return None


def sweep_seconds(cfg, other, sec_per_step: float) -> float:
    """Seconds every cell of ``other`` takes here, ``cfg``'s step taking ``sec_per_step`` (priced by FLOPs)."""
    step_s = sec_per_step * eta.step_flops(other) / eta.step_flops(cfg)
    return eta.seconds_left(eta.cell_costs(other, other.cells()), 0, step_s)


def _largest(cfg, sec_per_step: float, target_s: float, key: str, values: list[int]) -> Optional[int]:
    """The largest of ``values`` (ascending; the sweep's time grows with them) for config key ``key`` whose
    sweep fits ``target_s``, found by bisection; the smallest when none fits, None when there are none."""

    def fits(value: int) -> bool:
        other = config_with(cfg, {key: value})
        return other is not None and sweep_seconds(cfg, other, sec_per_step) <= target_s

    lo, hi = 0, len(values)  # values[:lo] fit, values[hi:] do not
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if fits(values[mid]) else (lo, mid)
    return values[lo - 1] if lo else (values[0] if values else None)


def cheaper_plans(cfg, sec_per_step: float, target_s: float) -> list[Plan]:
    """Plans that keep ``cfg``'s train length, each one change: fewer rows, fewer steps, a smaller batch (the
    largest that fits ``target_s``, else the smallest), a smaller model, one seed."""
    t, m, plans = cfg.train, cfg.model, []
    names = [row.name for row in cfg.rows()]
    keep = [r for r in NARROW_ROWS if r in names] if all(r in names for r in NARROW_ROWS) else names[:2]
    if len(names) > len(keep):
        plans.append(Plan({"--encodings": ",".join(keep)}, {"encodings": keep},
                          f"the comparison narrows to {' and '.join(keep)} ({len(keep)} of {len(names)} rows)"))
    steps = _largest(cfg, sec_per_step, target_s, "train.steps", list(range(1, t.steps)))
    if steps:
        plans.append(Plan({"--steps": steps}, {"train.steps": steps},
                          f"each model is less trained: {steps} steps instead of {t.steps}", f"steps{steps}"))
    batches = [b for b in range(1, t.batch_size) if b % cfg.grad_accum == 0]
    batch = _largest(cfg, sec_per_step, target_s, "train.batch_size", batches)
    if batch:
        plans.append(Plan({"--batch-size": batch}, {"train.batch_size": batch},
                          f"fewer tokens a step ({batch} x {t.train_len} instead of {t.batch_size} x {t.train_len}): "
                          "noisier updates, less text seen", f"batch{batch}"))
    d, n = m.d_model // 2, max(1, m.n_layers // 2)
    if d % m.n_heads == 0 and (d // m.n_heads) % 2 == 0 and (d, n) != (m.d_model, m.n_layers):
        plans.append(Plan({"--d-model": d, "--n-layers": n}, {"model.d_model": d, "model.n_layers": n},
                          f"less capacity: width {d} x {n} layers instead of {m.d_model} x {m.n_layers}", f"d{d}x{n}"))
    if len(cfg.seeds) > 1:
        plans.append(Plan({"--seeds": 1}, {"seeds": [0]},
                          f"one seed instead of {len(cfg.seeds)}: no seed-level interval, only the text's"))
    return plans


def plateau_warning(other) -> Optional[str]:
    """A warning when a model of ``other`` trains on fewer tokens than PLATEAU_TOKENS."""
    tokens = other.train.steps * other.train.batch_size * other.train.train_len
    if tokens >= PLATEAU_TOKENS:
        return None
    return (f"warning: {tokens / 1e6:.2g}M training tokens a model, under the ~3M that models needed to leave the "
            "no-position plateau (results/sotu-512): its rows may all look alike")


def gpu_line() -> str:
    """The GPU config in one line, from the config itself."""
    from posenc_bench.bench.config import load_config

    g = load_config(GPU_CONFIG)
    t, m = g.train, g.model
    return (f"  on a machine with a GPU: posenc-bench run --config {GPU_CONFIG} ({len(g.rows())} rows, train length "
            f"{t.train_len}, eval to {max(g.eval_lengths())}, width {m.d_model} x {m.n_layers} layers, {t.steps} steps of "
            f"{t.batch_size} x {t.train_len} tokens, {g.precision}; {GPU_TIME})")


def row_seconds(costs: list, sec_per_step: float) -> float:
    """Seconds one row takes a seed: its trained model (the first cell that trains one) and its evaluations."""
    trained = [c for c in costs if c.train] or costs
    return sec_per_step * trained[0].steps


def plan_lines(cfg, costs: list, sec_per_step: float, device_type: str, base: Optional[list[str]]) -> list[str]:
    """What the run prints before its first training step: [] unless on a CPU the sweep (``costs``, measured at
    ``sec_per_step``) is beyond ``eta.note_after``; else its time, one row's, the cheaper plans (each on the run's
    own command line ``base``, argv after ``run``), the GPU config and what a shorter train length is."""
    total, stated = eta.seconds_left(costs, 0, sec_per_step), cfg.expected_sweep_s
    limit = eta.note_after(stated, device_type)
    if device_type != "cpu" or limit is None or total <= limit:
        return []
    base, t, seeds = list(base or []), cfg.train, len(cfg.seeds)
    against = f"far beyond the ~{eta.duration(stated)} the config states" if stated else f"beyond {eta.duration(limit)}"
    row = row_seconds(costs, sec_per_step)
    lines = [f"  plan: {sec_per_step:.3g} s a training step on this CPU (timed before training): about "
             f"{eta.duration(total)} for the sweep ({len(costs)} cells), {against}",
             f"  one row (a model of {t.steps} steps and its evaluations): about {eta.duration(row)} a seed, "
             f"{eta.duration(row * seeds)} for its {seeds} seed(s)",
             f"  cheaper plans that keep train length {t.train_len}, one change each (steps and batch: the most that "
             f"fit {eta.duration(limit)}):"]
    for plan in cheaper_plans(cfg, sec_per_step, limit):
        other = config_with(cfg, plan.overrides)
        if other is None:
            continue
        warn = plateau_warning(other)
        lines += [f"    about {eta.duration(sweep_seconds(cfg, other, sec_per_step))}: {command(base, plan_flags(base, plan))}",
                  f"      {plan.what}" + (f"; {warn}" if warn else "")]
    lines.append(gpu_line())
    shorter = _shorter(cfg, sec_per_step, limit)
    if shorter is not None:
        length, seconds = shorter
        lines.append(f"  a shorter train length (--train-len {length}, about {eta.duration(seconds)}) is a different "
                     f"experiment: it measures extrapolation from {length}, not {t.train_len}")
    return lines


def _shorter(cfg, sec_per_step: float, target_s: float) -> Optional[tuple[int, float]]:
    """The longest halving of the train length whose sweep fits ``target_s``, with its seconds."""
    for k in range(1, 8):
        length = cfg.train.train_len >> k
        if length < 16:
            break
        other = copy.deepcopy(cfg)
        other.train.train_len = length
        try:
            seconds = sweep_seconds(cfg, other, sec_per_step)
        except PosencError:
            continue
        if seconds <= target_s:
            return length, seconds
    return None
