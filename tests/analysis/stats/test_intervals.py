"""The intervals: exact identities, the t-interval over seeds, the text bootstrap's coverage with one seed, and
how the width moves with units and seed spread (coverage over seeds: test_coverage.py)."""

import math

import numpy as np
import pytest

from posenc_bench.metrics import MIN_EFFECT
from posenc_bench.analysis.stats.distributions import t_cdf, t_quantile
from posenc_bench.analysis.stats.intervals import CHECKPOINT, METHOD, MIN_SEEDS, Intervals

TOKENS = 1000  # targets per unit in the synthetic data


def _rec(row, seed, L, nll, *, train_len=128, key=None, status="ok"):
    n = len(nll)
    return {"encoding": row, "seed": seed, "eval_len": L, "train_len": train_len, "status": status,
            "cell_key": key or f"{row}-{seed}",
            "units": {"size": 512, "nll": [float(x) for x in nll], "tokens": [TOKENS] * n, "bytes": [TOKENS - 2] * n}}


def _unit_sums(rng, mean, units, shape=()):
    """Unit NLL sums of TOKENS targets each, every target's NLL drawn from an exponential with ``mean``."""
    return rng.gamma(TOKENS, mean, size=(*shape, units))  # a sum of TOKENS exponentials is Gamma(TOKENS, mean)


def test_point_values_are_the_tables_numbers():
    nll = [1500.0, 1700.0, 1600.0]
    iv = Intervals([_rec("a", 0, 128, nll), _rec("a", 0, 256, [2000.0] * 3)])
    ppl = iv.interval("ppl", "a", 128)
    assert ppl.value == pytest.approx(math.exp(4800 / 3000))  # exp(sum NLL / targets), token-weighted
    assert iv.interval("bpb", "a", 128).value == pytest.approx(4800 / math.log(2) / (3 * (TOKENS - 2)))
    assert iv.interval("ratio", "a", 256).value == pytest.approx(math.exp(2) / math.exp(1.6))
    assert iv.interval("ratio", "a", 128).value == 1.0
    assert ppl.lo <= ppl.value <= ppl.hi


def test_a_row_against_itself_or_a_copy_is_exactly_one():
    rng = np.random.default_rng(0)
    sums = _unit_sums(rng, 1.5, 50)
    iv = Intervals([_rec("a", 0, 128, sums, key="m"), _rec("b", 0, 128, sums, key="m")])
    for ref in ("a", "b"):
        c = iv.compare("ppl", "a", ref, 128)
        assert (c.interval.value, c.interval.lo, c.interval.hi) == (1.0, 1.0, 1.0)
        assert c.significant is False


def test_same_results_same_intervals_and_the_level_matters():
    rng = np.random.default_rng(1)
    recs = [_rec("a", 0, 128, _unit_sums(rng, 1.5, 60))]
    first, again = Intervals(recs).interval("ppl", "a", 128), Intervals(recs).interval("ppl", "a", 128)
    assert first == again
    narrow = Intervals(recs, ci=0.5).interval("ppl", "a", 128)
    assert first.lo < narrow.lo < narrow.hi < first.hi
    with pytest.raises(ValueError, match="between 0 and 1"):
        Intervals(recs, ci=95)


def test_the_units_documents_are_what_the_text_level_resamples():
    """``units["doc"]`` (each unit's document) is no per-record sum but the text's clusters: the same estimate, its
    text part read over the documents (8 documents: 7 degrees of freedom) instead of the units (40: 39); records
    of which only some name documents (a gate's baseline made before units named them) use the documents."""
    rng = np.random.default_rng(2)
    recs = [_rec("a", 0, 128, _unit_sums(rng, 1.5, 40)), _rec("b", 0, 128, _unit_sums(rng, 1.6, 40))]
    with_docs = [{**r, "units": {**r["units"], "doc": [u // 5 for u in range(40)]}} for r in recs]
    by_unit = Intervals(recs).compare("ppl", "b", "a", 128).estimate
    by_doc = Intervals(with_docs).compare("ppl", "b", "a", 128).estimate
    assert by_doc.center == by_unit.center and by_doc.parts[0][1] == 7 and by_unit.parts[0][1] == 39
    mixed = Intervals([with_docs[0], recs[1]])
    assert mixed.draws.documents == 8 and mixed.compare("ppl", "b", "a", 128).estimate == by_doc

def test_coverage_of_ppl_and_of_a_paired_ratio():
    """400 independent data sets of 100 units with a known mean NLL: the 95% intervals hold the true ppl and
    the true ratio in close to 95% of them."""
    rng = np.random.default_rng(2)
    n, units, mu, delta = 400, 100, 1.5, 0.02
    base = _unit_sums(rng, mu, units, (n,))  # (n, units)
    # row b: the same targets, each NLL moved by delta plus per-target noise of sd 0.3 (summed per unit)
    other = base + TOKENS * delta + rng.normal(0, 0.3 * math.sqrt(TOKENS), size=(n, units))
    recs = [_rec(f"a{i}", 0, 128, base[i], key="m") for i in range(n)]
    recs += [_rec(f"b{i}", 0, 128, other[i], key="m") for i in range(n)]
    iv = Intervals(recs)
    ppl = [iv.interval("ppl", f"a{i}", 128) for i in range(n)]
    ratio = [iv.compare("ppl", f"b{i}", f"a{i}", 128).interval for i in range(n)]
    cover_ppl = np.mean([p.lo <= math.exp(mu) <= p.hi for p in ppl])
    cover_ratio = np.mean([r.lo <= math.exp(delta) <= r.hi for r in ratio])
    assert abs(cover_ppl - 0.95) < 0.03, cover_ppl
    assert abs(cover_ratio - 0.95) < 0.03, cover_ratio
    # pairing is what makes the ratio sharp: two rows' own intervals, combined as if independent, are several times
    # wider on the log scale than the paired interval of their ratio
    paired = iv.compare("ppl", "b0", "a0", 128).interval
    a, b = iv.interval("ppl", "a0", 128), iv.interval("ppl", "b0", 128)
    unpaired = math.hypot(math.log(a.hi / a.lo), math.log(b.hi / b.lo))
    assert unpaired > 3 * math.log(paired.hi / paired.lo)


def test_four_times_the_units_halves_the_width():
    rng = np.random.default_rng(3)
    widths = []
    for units in (100, 400):
        w = [(i.hi - i.lo) for k in range(20)
             if (i := Intervals([_rec("a", 0, 128, _unit_sums(rng, 1.5, units))]).interval("ppl", "a", 128))]
        widths.append(np.mean(w))
    assert widths[1] / widths[0] == pytest.approx(0.5, abs=0.08)


def test_seed_spread_widens_the_interval_and_one_seed_is_about_this_checkpoint():
    rng = np.random.default_rng(4)
    sums = _unit_sums(rng, 1.5, 100)

    def run(spread, seeds=3):
        recs = []
        for s in range(seeds):
            shift = TOKENS * spread * (s - 1)  # seed s moves every unit's mean NLL by spread * (s - 1)
            recs += [_rec("a", s, 128, sums + shift), _rec("b", s, 128, sums + shift + TOKENS * 0.05)]
        return Intervals(recs)

    tight, wide = run(0.0).interval("ppl", "a", 128), run(0.05).interval("ppl", "a", 128)
    assert (wide.hi - wide.lo) > 2 * (tight.hi - tight.lo)
    c = run(0.0).compare("ppl", "b", "a", 128)
    assert (c.level, c.seeds, c.significant) == (METHOD, 3, True)
    one_seed = run(0.0, seeds=1)
    c = one_seed.compare("ppl", "b", "a", 128)  # different trained models, one seed
    assert MIN_SEEDS == 2 and c.level == CHECKPOINT and c.seeds == 1
    assert c.interval.lo > 1 and c.significant  # a claim, labelled as about these two checkpoints


def test_the_seed_level_is_a_t_interval_over_per_seed_values_plus_the_text():
    """Per-seed ratios 1.0071, 1.0114, 1.0023 with no text spread (every unit the same ratio): the interval is
    the t-interval of those three values' logs, df 2, exponentiated, as in the worked example of the docs; and
    naming the rows the other way round gives the reciprocal estimate and bounds and the same p-value."""
    recs = []
    for s, r in enumerate([1.0071, 1.0114, 1.0023]):
        base = np.full(20, 1500.0)
        recs += [_rec("a", s, 128, base), _rec("b", s, 128, base + TOKENS * math.log(r))]
    c = Intervals(recs).compare("ppl", "b", "a", 128)
    logs = np.log([1.0071, 1.0114, 1.0023])
    half = t_quantile(0.975, 2) * logs.std(ddof=1) / math.sqrt(3)
    assert c.interval.value == pytest.approx(math.exp(logs.mean()), rel=1e-9)
    assert (c.interval.lo, c.interval.hi) == pytest.approx((math.exp(logs.mean() - half), math.exp(logs.mean() + half)),
                                                           rel=1e-9)
    assert c.interval.lo < 1 < c.interval.hi and not c.significant
    assert c.p == pytest.approx(2 * (1 - t_cdf(logs.mean() / (logs.std(ddof=1) / math.sqrt(3)), 2)), rel=1e-3)
    back = Intervals(recs).compare("ppl", "a", "b", 128)
    assert (back.value, back.interval.lo, back.interval.hi) == pytest.approx(
        (1 / c.value, 1 / c.interval.hi, 1 / c.interval.lo), rel=1e-12) and back.p == pytest.approx(c.p, rel=1e-12)


def test_t_quantiles_and_the_minimum_effect():
    for df, q in [(1, 12.706204736), (2, 4.302652730), (4, 2.776445105), (10, 2.228138852), (30, 2.042272456)]:
        assert t_quantile(0.975, df) == pytest.approx(q, rel=1e-9)
    assert t_quantile(0.975, 1e9) == pytest.approx(1.959963985, rel=1e-9)
    assert t_cdf(t_quantile(0.9, 2.5), 2.5) == pytest.approx(0.9, abs=1e-12)
    with pytest.raises(ValueError, match="0.5 < p < 1"):
        t_quantile(0.3, 2)
    # a consistent difference far below MIN_EFFECT: the interval excludes 1, and still nothing is marked
    rng = np.random.default_rng(8)
    sums = _unit_sums(rng, 1.5, 100)
    iv = Intervals([_rec("a", 0, 128, sums, key="k"), _rec("b", 0, 128, sums * (1 + 4e-9), key="k")])
    c = iv.compare("ppl", "b", "a", 128)
    assert c.interval.excludes(1.0) and not c.significant and MIN_EFFECT == 0.001


def test_a_row_with_fewer_seeds_than_the_folder_is_compared_about_this_checkpoint():
    """A folder can hold rows run with different --seeds: a comparison uses the seeds both rows have, and one
    seed in common makes it about this checkpoint, whatever the other rows have."""
    rng = np.random.default_rng(7)
    sums = _unit_sums(rng, 1.5, 100)
    recs = [_rec(row, s, 128, sums + TOKENS * (0.05 * i + 0.01 * s)) for i, row in enumerate("ab") for s in range(3)]
    recs.append(_rec("c", 0, 128, sums + TOKENS * 0.10))
    iv = Intervals(recs)
    assert [iv.seeds_measured(r, 128) for r in "abc"] == [3, 3, 1] and iv.seeds_measured("zz", 128) == 0
    assert iv.compare("ppl", "b", "a", 128).level == METHOD
    assert [iv.level(r, 128) for r in "abc"] == [METHOD, METHOD, CHECKPOINT]
    for row, ref in (("c", "a"), ("a", "c")):
        assert iv.compare("ppl", row, ref, 128).level == CHECKPOINT
    assert "rows with one seed" in iv.describe() and "t over the 3 training seeds" in iv.describe()
    assert "one seed" not in Intervals([r for r in recs if r["encoding"] != "c"]).describe()


def test_same_model_rows_with_one_seed_are_about_this_checkpoint():
    rng = np.random.default_rng(5)
    sums = _unit_sums(rng, 1.5, 100)
    iv = Intervals([_rec("rope", 0, 512, sums, key="k"), _rec("rope-ntk", 0, 512, sums * 0.98, key="k")])
    c = iv.compare("ppl", "rope-ntk", "rope", 512)
    assert c.level == CHECKPOINT and c.significant and c.interval.hi < 1


def test_missing_numbers_and_old_results():
    rng = np.random.default_rng(6)
    recs = [_rec("a", 0, 128, _unit_sums(rng, 1.5, 40)), _rec("a", 0, 512, [], status="n/a")]
    recs[1]["units"] = None
    iv = Intervals(recs)
    assert iv.interval("ppl", "a", 512) is None and iv.interval("ratio", "a", 512) is None
    assert iv.interval("ppl", "a", 128) is not None
    old = [{k: v for k, v in r.items() if k != "units"} for r in recs]
    iv = Intervals(old)
    assert not iv.available and iv.interval("ppl", "a", 128) is None
    assert "predate per-unit numbers" in iv.describe()


def test_one_unit_gives_no_interval_rather_than_a_zero_width_one():
    """A bootstrap of a single unit always redraws the same text: its interval would be a point, and any
    difference would look real. With one unit there is no interval, and so no significance mark."""
    iv = Intervals([_rec("a", 0, 128, [1500.0]), _rec("b", 0, 128, [1600.0])])
    assert not iv.available and "one resampling unit" in iv.problem
    assert iv.interval("ppl", "a", 128) is None


def test_a_task_runs_accuracy_is_the_share_of_instances_and_rows_compare_by_exact_tests():
    """Exact match per seed is the mean of the instances' 0/1; over seeds no interval is printed (bimodal seeds)
    and rows are compared by the exact sign-flip test of their paired seeds, which at 3 seeds cannot go below
    p = 0.25 (no finding possible); with one seed the row has its exact binomial interval and two rows compare by
    McNemar's exact test on the same instances (this checkpoint)."""
    from tests.analysis.fake_results import arec

    rng = np.random.default_rng(1)
    hard = rng.random(60) < 0.5  # the instances rope gets right; alibi gets those and 12 more
    more = hard.copy()
    more[np.flatnonzero(~hard)[:12]] = True
    recs = [arec("rope", s, 100, hard.astype(int).tolist()) for s in (0, 1, 2)]
    recs += [arec("alibi", s, 100, more.astype(int).tolist()) for s in (0, 1, 2)]
    iv = Intervals(recs)
    assert iv.metric == "accuracy" and iv.windows(100) == 60 and "sign-flip" in iv.describe()
    assert iv.interval("accuracy", "rope", 100) is None  # declined: no interval over few seeds holds for every shape
    assert iv.estimate("accuracy", "rope", 100).value == pytest.approx(hard.mean())
    assert iv.estimate("token_accuracy", "rope", 100).value == pytest.approx((4 * hard.sum() + 2 * (~hard).sum()) / 240)
    c = iv.compare("accuracy", "alibi", "rope", 100)
    assert c.null == 0 and c.value == pytest.approx(12 / 60) and c.level == METHOD
    assert c.p == 0.25 and not c.significant and c.note == "no finding possible at 3 seeds"  # 2 / 2^3
    one_iv = Intervals([r for r in recs if r["seed"] == 0])
    one = one_iv.compare("accuracy", "alibi", "rope", 100)
    assert one.level == CHECKPOINT and one.p == pytest.approx(2 * 0.5 ** 12) and one.significant  # 12 of 12 discordant
    lo, hi = (one_iv.interval("accuracy", "rope", 100).lo, one_iv.interval("accuracy", "rope", 100).hi)
    assert lo < hard.mean() < hi and hi - lo > 0.2  # Clopper-Pearson on 60 instances
    same = Intervals(recs).compare("accuracy", "rope", "rope", 100)
    assert same.value == 0 and same.p == 1 and not same.significant


def test_six_seeds_can_make_a_task_finding_and_the_p_value_is_exact():
    """Six seeds that all point the same way: p = 2 / 2^6 = 0.03125; one seed the other way: p = 0.25 (the
    sign-flip distribution of these differences)."""
    from tests.analysis.fake_results import arec

    ones, zeros = [1] * 40, [0] * 40
    recs = [arec("rope", s, 100, ones) for s in range(6)] + [arec("alibi", s, 100, zeros) for s in range(6)]
    c = Intervals(recs).compare("accuracy", "rope", "alibi", 100)
    assert c.p == pytest.approx(2 / 64) and c.significant and not c.note
    recs[-1] = arec("alibi", 5, 100, [1] * 40 + [])  # alibi's seed 5 learned: a difference of 0 on that seed
    c = Intervals(recs).compare("accuracy", "rope", "alibi", 100)
    assert c.p == pytest.approx(2 / 32)  # 5 seeds that differ, all one way: 2 / 2^5


def test_a_share_keeps_its_interval_within_its_range():
    """One seed that got 36 of 40: its exact (Clopper-Pearson) interval lies within [0, 1] and holds the share;
    a row with every instance right reaches 1 exactly."""
    from tests.analysis.fake_results import arec

    ones, zeros = [1] * 40, [0] * 40
    iv = Intervals([arec("rope", 0, 100, ones[:36] + zeros[:4]), arec("alibi", 0, 100, ones)])
    rope, alibi = iv.interval("accuracy", "rope", 100), iv.interval("accuracy", "alibi", 100)
    assert rope.value == pytest.approx(0.9) and 0.76 < rope.lo < 0.77 and 0.97 < rope.hi < 0.98
    assert alibi.hi == 1.0 and alibi.lo == pytest.approx(0.025 ** (1 / 40), rel=1e-6)
