"""Perplexity: exp of the token-weighted mean NLL of a text's targets, the headline number of a text run.

A unit's NLL sum over its targets (``bench/eval/evaluate.py``) and the text's token count per unit give the ppl of
any multiset of units exactly: exp(sum NLL / sum tokens). Lower is better; two rows compare as a ratio (the same
targets scored by both). Also registers the kind of record it is read from: text, whose token and byte counts
per unit are the text's (the same in every record) and whose rows also compare by their ratio to 1x.
"""

from __future__ import annotations

import numpy as np

from posenc_bench.metrics.registry import MIN_EFFECT, Kind, Metric, register, register_kind

TEXT = register_kind(Kind("ppl", primary="ppl", to_1x="ratio", tables=("ppl", "ratio", "training", "cost"),
                          shared_units=("tokens", "bytes")))

PPL = register(Metric(
    "ppl", kind="ppl",
    title="Perplexity (lower is better; columns: eval length as a multiple of the train length)",
    units=("nll", "tokens"), formula=lambda s: np.exp(s["nll"] / s["tokens"]),
    gate_tolerance="ppl_tol",
    compare_title=(f"Perplexity relative to {{ref}} at the same length (paired; the geometric mean over seeds); *: a "
                   f"finding after the correction for the table's comparisons, the difference at least {MIN_EFFECT:.1%}"),
    plot=("Perplexity against eval length (same target tokens at every length). Bands: each row's own {ci} "
          "interval, unpaired\n(the seeds' range where they disagree on learning): overlapping bands can still "
          "differ; the paired comparisons are the table's", "perplexity (lower is better)", "ppl_vs_length"),
))
