"""The ratio to 1x: a row's ppl at a length over the same row's and seed's ppl at its train length.

Each seed's ratio is taken before any mean, so what a seed's training gave every length cancels and only the
extrapolation is left. Lower is better (1: no change); rows compare as a ratio of ratios. Gated at every length
but the train length, where it is 1 by definition.
"""

from __future__ import annotations

from posenc_bench.metrics.registry import Metric, register

RATIO = register(Metric(
    "ratio", kind="ppl", of="ppl",
    title="Perplexity relative to the same model at the train length (1x)",
    gate_tolerance="ratio_tol", at_1x=False,
    plot=("Perplexity relative to the same model at the train length (1x). Bands: the paired {ci} interval "
          "of each row's\nratio to its own 1x, as in the ratio table (the seeds' range where they disagree on "
          "learning)", "ppl / ppl at 1x (1 = no change)",
          "ratio_vs_length"),
))
