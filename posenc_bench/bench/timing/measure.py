"""How ``posenc-bench time`` measures: the clock, one measurement, variants alternated against a reference,
and a measured ratio put in words.

A measurement is ``torch.utils.benchmark.Timer.blocked_autorange``: warm-up, then blocks of ``per_run`` calls
between two readings of ``timeit.default_timer``; the median and IQR are per call. A block is only as exact as
the clock's step: on some machines (virtual machines on a coarse clock source) that is milliseconds, not the
nanosecond ``time.get_clock_info`` claims, and a median that sits on a multiple of it measures the clock.
"""

from __future__ import annotations

import functools
import timeit
from typing import Callable, Optional

import torch
from torch.utils import benchmark

from posenc_bench.errors import ConfigError

# A block shorter than this many clock steps is rounded by more than a tenth of itself.
CLOCK_STEPS = 10
FUSED = "nope"  # the fused causal path: every x_fused is a time (or peak) over its own


@functools.cache  # once per process and clock
def clock_resolution(clock: Callable[[], float] = timeit.default_timer, tries: int = 5000, changes: int = 3) -> float:
    """The clock's effective resolution: the smallest step between consecutive readings that differ, over at
    least ``tries`` readings and ``changes`` such steps (a coarse clock may not move in ``tries`` readings).
    ``timeit.default_timer`` is the clock the Timer reads."""
    steps: list[float] = []
    last, reads = clock(), 0
    while reads < tries or len(steps) < changes:
        now = clock()
        reads += 1
        if now > last:
            steps.append(now - last)
        last = now
    return min(steps)


def clock_bound(median_s: float, iqr_s: Optional[float], runs: int, resolution_s: float, per_run: int = 1) -> bool:
    """Whether a measurement's number is the clock's rather than the work's: its blocks (``per_run`` calls of
    ``median_s``) last fewer than CLOCK_STEPS steps of ``resolution_s``, or more than one block read exactly
    the same time (IQR 0, which only a clock that rounds every block to the same step gives)."""
    return median_s * per_run < CLOCK_STEPS * resolution_s or (runs > 1 and iqr_s == 0)


def measure(fn: Callable[[], object], min_run_time: float, warmup: int = 0) -> dict:
    """Median and IQR in seconds per call, the number of timed blocks (``runs``), the calls in each
    (``per_run``) and whether the number is the clock's (``clock_bound``). Run with torch's current intra-op
    thread count (the Timer's own default is a single thread); CUDA synchronisation is handled by the Timer.
    ``warmup`` untimed calls first: when variants that take a large fraction of a second alternate, the first
    call after a switch pays for page faults and cold caches that one of only two or three timed runs must
    not carry."""
    for _ in range(warmup):
        fn()
    m = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = m.blocked_autorange(min_run_time=min_run_time)
    timing = {"median_s": m.median, "iqr_s": m.iqr, "runs": len(m.times), "per_run": m.number_per_run}
    return {**timing, "clock_bound": clock_bound(**timing, resolution_s=clock_resolution())}


def alternate_rounds(fns: dict[str, Callable[[], object]], reference: str, *, rounds: int, min_run_time: float,
                     warmup: int = 1) -> tuple[dict[str, list[dict]], dict[str, list[float]]]:
    """Measure every one of ``fns`` in turn, ``rounds`` times (each after ``warmup`` untimed calls), and take
    each round's ratio to ``reference`` measured in the same round: when one call takes most of a second a
    blocked_autorange holds one or two runs, and a shared machine drifts between rounds; a ratio within a
    round carries little of the drift. Returns each name's measurements and its ratios, round by round."""
    if reference not in fns:
        raise ConfigError(f"reference {reference!r} is not one of the timed {', '.join(map(repr, fns))}")
    timings: dict[str, list[dict]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            timings[name].append(measure(fn, min_run_time, warmup))
    ratios = {name: [t["median_s"] / ref["median_s"] for t, ref in zip(ts, timings[reference])]
              for name, ts in timings.items()}
    return timings, ratios


def versus_fused(timings: list[dict], ratios: list[float]) -> tuple[dict, str]:
    """The columns an alternated row adds, and their words for the log: the median of its rounds' ratios to the
    fused path with every round's, and whether any round's number was the clock's."""
    columns = {"clock_bound": any(t["clock_bound"] for t in timings), "x_fused": median(ratios),
               "x_fused_rounds": [round(r, 3) for r in ratios]}
    return columns, f"x{median(ratios):.2f} fused (rounds {', '.join(f'{r:.2f}' for r in ratios)})"


def median(values: list) -> float:
    """The middle value (the upper one of an even count): a median round or ratio is one that was measured."""
    return sorted(values)[len(values) // 2]


def speed_words(ratio: float, reference: str) -> str:
    """``ratio`` = the reference's time / ours, in words: "5.5x faster than textbook" above 1, "36x slower than
    textbook" below (the inverse: a slower row never reads as a fraction of "faster")."""
    words, factor = ("faster", ratio) if ratio >= 1 else ("slower", 1 / ratio)
    return f"{factor:.{1 if factor < 10 else 0}f}x {words} than {reference}"
