"""Multi-needle retrieval: the share of needles whose value the model reads back exactly (``bench/eval/needles.py``).

A needle record is one (variant, length, depth) of a model (RULER's niah_multikey_1, niah_multivalue,
niah_multiquery; Hsieh et al. 2024, arXiv:2404.06654) with the needles asked there, one per haystack, and how
many were retrieved; its accuracy is correct / needles. Higher is better; two rows compare as a difference of
shares. Not gated: the test runs on demand (``posenc-bench needles``), not in a sweep. Registers the kind of
record the test writes (needles.json, not results.json).
"""

from __future__ import annotations

from posenc_bench.metrics.registry import SHARE, Kind, Metric, register, register_kind

NEEDLES_KIND = register_kind(Kind("needles", primary="retrieval", tables=("retrieval",), instances=True,
                                  samples="needles", in_results=False))

RETRIEVAL = register(Metric(
    "retrieval", kind="needles",
    title="Multi-needle retrieval: the share of needles whose value is read back exactly (higher is better)",
    higher_is_better=True, difference=True, units=("correct",), formula=lambda s: s["correct"] / s["count"],
    field="accuracy", bounds=SHARE,
))
