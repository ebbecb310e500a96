"""The measuring under `posenc-bench time`: the clock's resolution, when a number is the clock's, alternating
rounds and the ratio in words. Values and properties only; speed lives in benchmarks/."""

import itertools

import pytest
import torch

from posenc_bench.bench.timing.measure import (alternate_rounds, clock_bound, clock_resolution, measure, median,
                                        speed_words)
from posenc_bench.errors import ConfigError


def stepping_clock(step, reads_per_step):
    """A fake clock that moves by ``step`` every ``reads_per_step`` readings, as a coarse clock source does."""
    reads = iter(range(10**9))
    return lambda: (next(reads) // reads_per_step) * step


def test_clock_resolution_is_the_smallest_step_of_a_coarse_clock():
    assert clock_resolution(stepping_clock(0.008, 50_000)) == pytest.approx(0.008)  # moves only after 5000 reads
    assert clock_resolution(stepping_clock(1e-6, 1), tries=100) == pytest.approx(1e-6)
    assert 0 < clock_resolution() < 1e-3  # this machine's perf_counter


@pytest.mark.parametrize("median_ms", [8.0, 16.0, 24.0])
def test_medians_on_an_8ms_clock_with_iqr_0_are_the_clock(median_ms):
    assert clock_bound(median_ms / 1e3, 0.0, runs=5, resolution_s=0.008)


def test_what_is_and_is_not_clock_bound():
    us, ms = 1e-6, 1e-3
    assert not clock_bound(3.217 * ms, 0.1 * ms, runs=40, resolution_s=us)
    assert clock_bound(3.217 * ms, 0.0, runs=40, resolution_s=us)  # many blocks, all the same time: rounded
    assert not clock_bound(80 * ms, 0.0, runs=1, resolution_s=8 * ms)  # one run has IQR 0 anyway; 10 steps
    assert clock_bound(40 * ms, 3 * ms, runs=5, resolution_s=8 * ms)  # 5 clock steps per block
    assert not clock_bound(0.01 * ms, 0.001 * ms, runs=20, resolution_s=us, per_run=1000)  # 10 ms blocks
    assert clock_bound(0.01 * ms, 0.001 * ms, runs=20, resolution_s=8 * ms, per_run=1000)


@pytest.mark.parametrize("threads", [1, 2])
def test_measure_runs_at_the_configured_thread_count(threads):
    # torch.utils.benchmark.Timer runs single-threaded unless told otherwise; the timing table records
    # torch.get_num_threads(), so the measured code must run with exactly that many threads.
    seen = []
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        result = measure(lambda: seen.append(torch.get_num_threads()), 0.01)
    finally:
        torch.set_num_threads(before)
    assert result["runs"] >= 1 and result["per_run"] >= 1 and result["median_s"] > 0
    assert result["clock_bound"] is False  # appending to a list, in blocks long enough for this clock
    assert seen and set(seen) == {threads}


def test_alternate_rounds_measures_in_turn_and_divides_within_each_round():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("ref", "a", "b")}
    timings, ratios = alternate_rounds(fns, "ref", rounds=2, min_run_time=0.001, warmup=1)
    assert list(timings) == list(ratios) == ["ref", "a", "b"]
    assert all(len(ts) == 2 for ts in timings.values()) and ratios["ref"] == [1.0, 1.0]
    for name in ("a", "b"):
        assert ratios[name] == [t["median_s"] / r["median_s"] for t, r in zip(timings[name], timings["ref"])]
    assert [name for name, _ in itertools.groupby(calls)] == ["ref", "a", "b"] * 2  # in turn, round by round
    with pytest.raises(ConfigError, match="reference 'nope' is not one of the timed 'ref', 'a', 'b'"):
        alternate_rounds(fns, "nope", rounds=1, min_run_time=0.001)


def test_median_is_a_measured_value():
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 3.0


@pytest.mark.parametrize("ratio,words", [
    (5.5, "5.5x faster than textbook"),
    (1 / 36, "36x slower than textbook"),  # once printed as "0.0x faster than textbook"
    (0.5, "2.0x slower than textbook"),
    (258.4, "258x faster than textbook"),
    (1.0, "1.0x faster than textbook"),
])
def test_speed_words_never_say_a_fraction_faster(ratio, words):
    assert speed_words(ratio, "textbook") == words
