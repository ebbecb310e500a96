"""Passkey accuracy: the share of passkey trials whose key the model reads back exactly (``bench/eval/passkey.py``).

A passkey record is one (length, depth) of a model with its trials and how many were right; its accuracy is
correct / trials. Higher is better; two models compare as a difference of shares. Not gated: the passkey test
runs on demand (``posenc-bench passkey``), not in a sweep. Registers the kind of record the test writes.
"""

from __future__ import annotations

from posenc_bench.metrics.registry import SHARE, Kind, Metric, register, register_kind

PASSKEY_KIND = register_kind(Kind("passkey", primary="passkey", tables=("passkey",), instances=True,
                                  samples="trials", in_results=False))

PASSKEY = register(Metric(
    "passkey", kind="passkey",
    title="Passkey retrieval: the share of trials whose key is read back exactly (higher is better)",
    higher_is_better=True, difference=True, units=("correct",), formula=lambda s: s["correct"] / s["count"],
    field="accuracy", bounds=SHARE,
))
