"""Multi-needle retrieval: correct / needles, a share of its own kind of record (needles.json, not results.json)."""

import numpy as np

from posenc_bench import metrics


def test_retrieval_is_the_share_of_needles_read_back():
    m = metrics.get("retrieval")
    assert m.formula({"correct": np.array([3.0]), "count": np.array([4.0])})[0] == 0.75
    assert m.of_units({"correct": [1, 0, 1, 1]}) == 0.75
    record = {"variant": "multikey", "length": 512, "depth": 0.5, "needles": 4, "correct": 3, "accuracy": 0.75}
    assert metrics.record_value(m, record) == 0.75


def test_retrieval_is_a_share_reported_by_its_own_command_not_in_results_tables():
    m = metrics.get("retrieval")
    assert m.kind == "needles" and m.higher_is_better and m.difference and m.gate_tolerance is None
    assert m.bounds == (0.0, 1.0) and "retrieval" not in metrics.tabled()
    assert not metrics.kind("needles").in_results and metrics.kind("needles").primary == "retrieval"
