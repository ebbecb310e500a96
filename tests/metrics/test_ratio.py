"""The ratio to 1x: each seed's ppl over the same row's and seed's ppl at the train length, before any mean."""

import numpy as np
import pytest

from posenc_bench import metrics
from posenc_bench.analysis.stats.intervals import Intervals, seed_values
from tests.analysis.fake_results import unit_results


def test_the_ratio_divides_each_seeds_ppl_by_its_own_1x():
    data = unit_results(seeds=(0, 1, 2))
    iv = Intervals(data["records"], draws=10)
    ppl = {(r["encoding"], r["seed"], r["eval_len"]): r["ppl"] for r in data["records"]}
    got = seed_values(iv, "ratio", "rope", 200)
    assert got == pytest.approx([ppl["rope", s, 200] / ppl["rope", s, 100] for s in (0, 1, 2)], rel=1e-12)
    assert seed_values(iv, "ratio", "rope", 100) == pytest.approx([1.0, 1.0, 1.0])


def test_the_ratio_is_not_gated_at_1x_and_is_of_ppl():
    ratio = metrics.get("ratio")
    assert ratio.of == "ppl" and ratio.record_field is None and not ratio.at_1x and ratio.gate_tolerance == "ratio_tol"
    assert ratio.compare(np.array(2.0), np.array(4.0)) == 0.5
