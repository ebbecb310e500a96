"""Passkey accuracy: correct / trials, a share of its own kind of record (not a results-file table)."""

import numpy as np

from posenc_bench import metrics


def test_passkey_accuracy_is_correct_over_trials():
    pk = metrics.get("passkey")
    assert pk.formula({"correct": np.array([3.0]), "count": np.array([5.0])})[0] == 0.6
    assert pk.of_units({"correct": [1, 1, 0, 1, 0]}) == 0.6
    assert metrics.record_value(pk, {"length": 64, "depth": 0.5, "trials": 5, "correct": 3, "accuracy": 0.6}) == 0.6


def test_passkey_is_a_share_reported_by_its_own_command_not_in_results_tables():
    pk = metrics.get("passkey")
    assert pk.higher_is_better and pk.difference and pk.gate_tolerance is None
    assert "passkey" in metrics.names() and "passkey" not in metrics.tabled()
    assert not metrics.kind("passkey").in_results
