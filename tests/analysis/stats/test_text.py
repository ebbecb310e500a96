"""The text bootstrap: documents as clusters, the same draw for every row, and what a folder cannot resample."""

import numpy as np

from posenc_bench import metrics
from posenc_bench.analysis.stats.text import MIN_DOCUMENTS, draws_of, units_problem


def _recs(nll_a, nll_b, doc=None):
    out = []
    for row, nll in (("a", nll_a), ("b", nll_b)):
        units = {"size": 10, "nll": list(map(float, nll)), "tokens": [10] * len(nll), "bytes": [10] * len(nll)}
        if doc is not None:
            units["doc"] = doc
        out.append({"encoding": row, "seed": 0, "eval_len": 10, "train_len": 10, "status": "ok", "units": units})
    return out


def _draws(recs, draws=500):
    return draws_of(recs, metrics.kind("ppl"), (["a", "b"], [0], [10], {"a": 10, "b": 10}), lambda r: r["encoding"],
                    draws, 0)


def test_units_of_one_document_are_drawn_together():
    """Five documents whose units are identical within each: resampling documents gives the ppl of a mix of
    whole documents only; the bootstrap knows there are 5 clusters. With fewer than MIN_DOCUMENTS documents the
    units are resampled, and the caption says the interval is about this text."""
    doc = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 4, 4]
    nll = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    level = nll[doc]
    d = _draws(_recs(level, level + 1, doc))
    assert MIN_DOCUMENTS == 5 and d.clusters == 5 and d.documents == 5 and d.n_units == 12
    ppl = d.per_seed["ppl"][0, 0, 0]  # (1 + draws,)
    assert ppl[0] == np.exp(level.sum() / 120)
    # every draw is a multiset of 5 whole documents: its mean NLL per target is one of few values
    sizes = np.bincount(doc)
    possible = {round(float(np.exp((c @ (sizes * nll)) / (10 * (c @ sizes)))), 9)
                for c in (np.array(x) for x in np.ndindex(*[6] * 5)) if c.sum() == 5}
    assert {round(float(x), 9) for x in ppl[1:]} <= possible
    assert "by document (5 documents, 12 units of 10 targets)" in d.describe(metrics.kind("ppl"))
    few = _draws(_recs(level[:9], level[:9] + 1, doc[:9]))  # 3 documents
    assert few.clusters == 9 and few.documents == 3 and "its 3 documents (about this text" in few.describe(
        metrics.kind("ppl"))


def test_the_same_draw_for_both_rows_and_units_without_documents():
    rng = np.random.default_rng(0)
    a = rng.gamma(20, 1, 30)
    d = _draws(_recs(a, a * 1.1))
    assert d.clusters == 30 and d.documents is None and "as if independent" in d.describe(metrics.kind("ppl"))
    a_ppl, b_ppl = d.per_seed["ppl"][0, 0, 0], d.per_seed["ppl"][1, 0, 0]  # (1 + draws,) each
    assert np.allclose(np.log(b_ppl), 1.1 * np.log(a_ppl))  # b's NLL is 1.1 a's on every unit: the same draw
    assert a_ppl[1:].std() > 0
    one = _draws(_recs(a, a, [0] * 30))
    assert one.clusters == 30 and one.documents == 1 and "its one document" in one.describe(metrics.kind("ppl"))


def test_records_on_other_documents_cannot_be_paired():
    recs = _recs([1.0, 2.0], [1.0, 2.0], [0, 1])
    recs[1]["units"]["doc"] = [0, 0]
    assert units_problem(recs, metrics.kind("ppl")) == "the records' units are not the same documents"
    assert "predate per-unit numbers" in units_problem([{**r, "units": None} for r in recs], metrics.kind("ppl"))
