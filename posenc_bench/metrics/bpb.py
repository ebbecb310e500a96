"""Bits per byte: the NLL of a text's targets in bits over the bytes they encode, comparable across tokenizers.

sum NLL / sum bytes / ln 2 over any multiset of units (each unit's byte count is the text's). Lower is better;
rows compare as a ratio. Not gated: for one tokenizer it moves with ppl, which is.
"""

from __future__ import annotations

import numpy as np

from posenc_bench.metrics.registry import Metric, register

BPB = register(Metric(
    "bpb", kind="ppl",
    title="Bits per byte (lower is better; columns: eval length as a multiple of the train length)",
    units=("nll", "bytes"), formula=lambda s: s["nll"] / s["bytes"] / np.log(2),
))
