"""Bits per byte from per-unit numbers: sum NLL / sum bytes / ln 2."""

import math

import numpy as np
import pytest

from posenc_bench import metrics
from posenc_bench.analysis.stats.intervals import Intervals
from tests.analysis.fake_results import unit_results


def test_bpb_by_hand():
    bpb = metrics.get("bpb")
    assert bpb.formula({"nll": np.array([8.0]), "bytes": np.array([4.0])})[0] == pytest.approx(2 / math.log(2))
    assert bpb.of_units({"size": 2, "nll": [3.0, 5.0], "tokens": [2, 2], "bytes": [1, 3]}) == pytest.approx(2 / math.log(2))
    assert bpb.gate_tolerance is None  # not gated: for one tokenizer it moves with ppl, which is


def test_bpb_in_the_intervals_is_the_text_nll_over_its_bytes():
    data = unit_results()
    r = data["records"][0]
    iv = Intervals(data["records"], draws=10)
    expect = sum(r["units"]["nll"]) / sum(r["units"]["bytes"]) / math.log(2)
    assert iv.interval("bpb", r["encoding"], r["eval_len"]).value == pytest.approx(expect, rel=1e-12)
