"""How long a sweep will take on this device, said before the time is spent.

Every cell's work is counted in *steps*: training steps of the config's own shape (train.batch_size x
train.train_len tokens, forward and backward). A fine-tuning step and an evaluation are converted to that unit
by their FLOPs (a forward pass is a third of a training step per token; attention grows with the window), so
one number measured on the device, the seconds a training step takes after the first few, prices the whole
sweep. As cells finish, the rate they actually took replaces it. The estimate is measured against the time the
config expects (its ``expected_sweep_s``, measured when it was sized): far beyond that, a note says what brings
the sweep under it. The arithmetic is pure (tested in ``tests/bench/train/test_eta.py``); :class:`Clock` only feeds it
the clock and prints its lines.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from posenc_bench.errors import PosencError

# The first training step warms up (allocations, kernels); the estimate times the steps after it: at least
# one, then until MEASURE_STEPS steps or MEASURE_S seconds, whichever comes first.
MEASURE_STEPS = 3
MEASURE_S = 20.0
FAR_BEYOND = 3.0  # an estimate this many times the config's expected time is "far beyond" it
CPU_LIMIT_S = 3600.0  # on a CPU, a sweep longer than this is said to be long whatever the config promises


def token_flops(model, length: int) -> float:
    """Forward FLOPs per token in a window of ``length`` tokens: 2 per weight (attention and MLP matrices, LM
    head) plus causal attention, q.k and a.v over length / 2 keys on average (2 x length x width a layer)."""
    d, n = model.d_model, model.n_layers
    weights = n * (4 + 2 * model.mlp_ratio) * d * d + d * model.vocab_size
    return 2.0 * weights + 2.0 * n * length * d


@dataclass(frozen=True)
class CellCost:
    """One cell's work in steps (see the module docstring)."""

    row: str
    seed: int
    train: float = 0.0  # the trained model, if this cell is the first to need it
    finetune: float = 0.0  # the -ft row's fine-tuning
    eval: float = 0.0  # scoring every eval length

    @property
    def steps(self) -> float:
        return self.train + self.finetune + self.eval


def step_flops(cfg) -> float:
    """FLOPs of one training step of ``cfg`` (a RunConfig): forward and backward, 3 x the forward."""
    t = cfg.train
    return 3.0 * t.batch_size * t.train_len * token_flops(cfg.model, t.train_len)


def cost_line(cfg, cells: Optional[list] = None) -> str:
    """What a sweep of ``cfg`` costs (its ``cells``, default all of them), in words: models trained, their steps
    and tokens, cells, FLOPs."""
    costs = cell_costs(cfg, cfg.cells() if cells is None else cells)
    trained = sum(1 for c in costs if c.train)
    tuned = sum(1 for c in costs if c.finetune)
    t = cfg.train
    flops = sum(c.steps for c in costs) * step_flops(cfg)
    return (f"{trained} trained model(s) x {t.steps} steps of {t.batch_size} x {t.train_len} tokens"
            + (f", {tuned} fine-tuned" if tuned else "") + f", {len(costs)} cell(s) evaluated: {flops_text(flops)}")


def flops_text(flops: float) -> str:
    """4.26e12 -> '4.3 TFLOP'; 1.2e17 -> '120 PFLOP'."""
    for unit, size in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9)):
        if flops >= size:
            return f"{flops / size:.2g} {unit}" if flops < 10 * size else f"{flops / size:.0f} {unit}"
    return f"{flops:.2g} FLOP"


def cell_costs(cfg, cells: list[tuple], finished: set[tuple] = frozenset()) -> list[CellCost]:
    """The work of ``cells`` ((Row, seed) of ``cfg``, a RunConfig) in steps. ``finished``: (Row, seed) of models
    whose checkpoints are done (a trained row such as ``rope``, or a ``-ft`` row), so not trained again."""
    t, m = cfg.train, cfg.model
    step = step_flops(cfg)
    evals = sum(cfg.eval.tokens * token_flops(m, L) for L in cfg.eval_lengths()) / step
    trained = set(finished)
    out = []
    for row, seed in cells:
        train = 0.0 if (row.trained, seed) in trained else float(t.steps)
        trained.add((row.trained, seed))
        finetune = 0.0
        if row.finetuned and (row, seed) not in trained:
            p = cfg.finetune_plan()
            finetune = p.steps * 3.0 * p.batch_size * p.len * token_flops(m, p.len) / step
            trained.add((row, seed))
        out.append(CellCost(row.name, seed, train, finetune, evals))
    return out


def seconds_left(costs: list[CellCost], done: int, sec_per_step: float, elapsed_s: float = 0.0) -> float:
    """Seconds the cells after the first ``done`` will take: at the rate the finished cells took
    (``elapsed_s`` over their steps) once they did any work, else at ``sec_per_step``."""
    done_steps = sum(c.steps for c in costs[:done])
    rate = elapsed_s / done_steps if done and done_steps > 0 and elapsed_s > 0 else sec_per_step
    return rate * sum(c.steps for c in costs[done:])


def duration(seconds: float) -> str:
    """45 s, 12 min, 2 h 5 min, 3.2 days: as a person would say it."""
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    if seconds < 3600:
        return f"{round(seconds / 60)} min"
    if seconds < 48 * 3600:
        h, rest = divmod(round(seconds / 60), 60)
        return f"{h} h {rest} min" if rest else f"{h} h"
    return f"{seconds / 86400:.1f} days"


def note_after(stated_s: Optional[float], device_type: str) -> Optional[float]:
    """The estimate past which a sweep gets a note: FAR_BEYOND x the time its config expects (``stated_s``, its
    ``expected_sweep_s``), or an hour on a CPU, whichever is shorter (None: no limit, a GPU run of a config that
    expects no time)."""
    limits = ([FAR_BEYOND * stated_s] if stated_s else []) + ([CPU_LIMIT_S] if device_type == "cpu" else [])
    return min(limits) if limits else None


def _sweep_seconds(cfg, costs: list[CellCost], sec_per_step: float, other) -> Optional[float]:
    """Seconds the cells of ``costs`` (measured at ``sec_per_step`` with ``cfg``) would take with the config
    ``other``: the same models trained and fine-tuned, each step priced by its FLOPs against the measured one;
    None when ``other`` is not a valid sweep (e.g. a fine-tune length no longer beyond its train length)."""
    try:
        step = step_flops(other)
        evals = sum(other.eval.tokens * token_flops(other.model, L) for L in other.eval_lengths()) / step
        p = other.finetune_plan() if any(c.finetune for c in costs) else None
    except PosencError:
        return None
    finetune = 0.0 if p is None else p.steps * 3.0 * p.batch_size * p.len * token_flops(other.model, p.len) / step
    steps = sum((other.train.steps if c.train else 0) + (finetune if c.finetune else 0) + evals for c in costs)
    return sec_per_step * step / step_flops(cfg) * steps


def quicker(cfg, costs: list[CellCost], sec_per_step: float, target_s: float) -> list[str]:
    """What alone brings the cells of ``costs`` under ``target_s`` here, as flags: fewer rows (the first
    rows that fit), a smaller --batch-size, a shorter --train-len (halvings), each priced from the measured
    step by its FLOPs; [] when none of them does (the sweep needs a faster device)."""
    import copy

    out = []
    rows, spent = [], 0.0
    for row in dict.fromkeys(c.row for c in costs):
        spent += sec_per_step * sum(c.steps for c in costs if c.row == row)
        if spent > target_s:
            break
        rows.append(row)
    if rows and len(rows) < len(dict.fromkeys(c.row for c in costs)):
        out.append(f"--encodings {','.join(rows)}")

    def fits(key: str, value: int) -> bool:
        other = copy.deepcopy(cfg)
        setattr(other.train, key, value)
        seconds = _sweep_seconds(cfg, costs, sec_per_step, other)
        return seconds is not None and seconds <= target_s

    t = cfg.train
    batch = next((b for b in range(t.batch_size - 1, 0, -1) if b % cfg.grad_accum == 0 and fits("batch_size", b)), None)
    if batch is not None:
        out.append(f"--batch-size {batch}")
    length = next((n for n in (t.train_len >> k for k in range(1, 8)) if n >= 16 and fits("train_len", n)), None)
    if length is not None:
        out.append(f"--train-len {length}")
    return out


def warning(total_s: float, stated_s: Optional[float], device_type: str, options: list[str],
            train_len: int = 0) -> Optional[str]:
    """One line when the sweep will take longer than ``note_after`` allows, with ``options`` (``quicker``'s flags
    for that limit): what brings it under, or that it needs a GPU. A shorter --train-len than ``train_len`` is
    named as the different experiment it is."""
    limit = note_after(stated_s, device_type)
    if limit is None or total_s <= limit:
        return None
    if stated_s and total_s > FAR_BEYOND * stated_s:
        head = f"  note: about {duration(total_s)}, far beyond the ~{duration(stated_s)} the config's comment states"
    else:
        head = f"  note: about {duration(total_s)} on this CPU"  # the only other limit
    if not options:
        return (f"{head}; no fewer rows, smaller --batch-size or shorter --train-len brings it under "
                f"{duration(limit)} here: it needs a GPU (--device cuda)")
    options = [f"{o} (a different experiment: extrapolation from {o.split()[1]}, not {train_len})"
               if train_len and o.startswith("--train-len ") else o for o in options]
    return f"{head}; under {duration(limit)} here with any one of: {'; '.join(options)} (or a GPU, --device cuda)"


def estimate_lines(cfg, costs: list[CellCost], sec_per_step: float, device_type: str, note: bool = True) -> list[str]:
    """The first estimate: seconds a step, each model and the sweep; and the note, if any (against the time
    ``cfg`` expects, its ``expected_sweep_s``; not with ``note`` False: the plans said it before training)."""
    total, steps, stated_s = seconds_left(costs, 0, sec_per_step), cfg.train.steps, cfg.expected_sweep_s
    lines = [f"  timing: {sec_per_step:.3g} s a training step on {device_type}: about {duration(sec_per_step * steps)} "
             f"a model ({steps} steps), about {duration(total)} for the sweep ({len(costs)} cells)"]
    limit = note_after(stated_s, device_type)
    if not note:
        return lines
    options = quicker(cfg, costs, sec_per_step, limit) if limit is not None and total > limit else []
    said = warning(total, stated_s, device_type, options, cfg.train.train_len)
    return lines + ([said] if said else [])


class Clock:
    """Times the first training steps of a sweep, prints the estimate once, and the time left after each
    cell. ``step()`` is the training loop's per-step callback; ``cell_done()`` is called after every cell.
    ``costs`` are the cells still to run; ``before`` counts the sweep's cells finished by an earlier run, so that
    a resumed sweep's "cell k/N" counts every finished cell of all N (2 of 6 done before: the next is 3/6)."""

    def __init__(self, cfg, costs: list[CellCost], device_type: str, log: Callable[[str], None],
                 now: Callable[[], float] = time.perf_counter, before: int = 0) -> None:
        self.cfg, self.costs, self.device_type, self.log, self.now = cfg, costs, device_type, log, now
        self.before = before
        self.start = now()
        self.sec_per_step: Optional[float] = None
        self._marks: list[float] = []
        self.done = 0
        self.noted = False  # the plans (bench/train/plans.py) were printed before training: no note again

    def step(self) -> None:
        if self.sec_per_step is not None:
            return
        if self.device_type == "cuda":  # a step no longer waits for the GPU: wait here, while measuring only
            torch.cuda.synchronize()
        self._marks.append(self.now())
        measured = len(self._marks) - 1
        if measured >= MEASURE_STEPS or (measured >= 1 and self._marks[-1] - self._marks[0] >= MEASURE_S):
            self.sec_per_step = (self._marks[-1] - self._marks[0]) / measured
            for line in estimate_lines(self.cfg, self.costs, self.sec_per_step, self.device_type, not self.noted):
                self.log(line)

    def cell_done(self) -> None:
        self.done += 1
        if self.done >= len(self.costs):
            return
        left = seconds_left(self.costs, self.done, self.sec_per_step or 0.0, self.now() - self.start)
        if left > 0:
            self.log(f"  cell {self.before + self.done}/{self.before + len(self.costs)}, about {duration(left)} left")
