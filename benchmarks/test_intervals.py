"""The cost of a report's intervals: the paired two-level bootstrap of a whole results file.

pytest benchmarks/test_intervals.py --benchmark-only
Full size is the default run's shape with 3 seeds: 17 rows (the default rows and the RoPE scalings) x 3 seeds
x 4 lengths x 129 units, 2000 draws; read it against the floor in the same group, one matrix product of the
same shapes (what the bootstrap cannot go below).
"""

import numpy as np
import pytest

from posenc_bench.analysis.stats.intervals import DRAWS, Intervals


def records(rows, seeds, units):
    rng = np.random.default_rng(0)
    out = []
    for r in range(rows):
        for s in range(seeds):
            for L in (128, 192, 256, 512):
                out.append({"encoding": f"row{r}", "seed": s, "eval_len": L, "train_len": 128, "status": "ok",
                            "cell_key": f"{r}-{s}", "units": {"size": 512, "nll": list(rng.gamma(50, 16.0, units)),
                                                              "tokens": [512] * units, "bytes": [510] * units}})
    return out


@pytest.mark.parametrize("what", ["intervals", "floor: one matmul"])
def test_bootstrap_of_a_results_file(benchmark, fast, what):
    rows, seeds, units = (3, 2, 20) if fast else (17, 3, 129)
    benchmark.group = f"bootstrap {rows} rows x {seeds} seeds x 4 lengths x {units} units, {DRAWS} draws"
    recs = records(rows, seeds, units)
    if what == "intervals":
        iv = benchmark(lambda: Intervals(recs))
        assert iv.interval("ppl", "row0", 512) is not None
    else:
        a, w = np.ones((rows * seeds * 4, units)), np.ones((DRAWS + 1, units))
        assert benchmark(lambda: a @ w.T).shape == (rows * seeds * 4, DRAWS + 1)
