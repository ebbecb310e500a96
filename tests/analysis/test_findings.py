"""Findings: every claim the intervals support (between rows, against 1x, extrapolation between rows), oriented,
grouped, ordered by effect, and nothing else."""

import math
from itertools import combinations
from pathlib import Path

import numpy as np
import pytest

from tests.analysis.fake_results import unit_results
from posenc_bench import metrics
from posenc_bench.analysis import findings
from posenc_bench.analysis.stats.intervals import CHECKPOINT, METHOD, Intervals
from posenc_bench.analysis.runs import Run, load_runs, row_order

ROOT = Path(__file__).resolve().parents[2]


def _findings(data):
    run = Run("", "", data)
    iv = Intervals(data["records"])
    return findings.run_findings(run, iv), iv


def test_every_listed_claim_is_significant_and_every_significant_one_is_listed():
    fs, iv = _findings(unit_results(seeds=(0, 1, 2)))
    rows, made, listed = ["rope", "rope-ntk", "alibi", "nope"], 0, {"ppl": set(), "ratio": set()}
    for L in (100, 200):
        for i, a in enumerate(rows):
            for b in rows[i + 1:]:
                for value in ("ppl", "ratio") if L == 200 else ("ppl",):  # ratios to 1x: past 1x only
                    c = iv.compare(value, a, b, L)
                    made += 1
                    if c.significant:
                        listed[value].add((a, b, L) if c.interval.value < 1 else (b, a, L))
        made += len(rows) if L == 200 else 0  # each row against its own 1x at 2x
    assert {(f.better, f.worse, f.length) for f in fs.between} == listed["ppl"]
    assert {(f.better, f.worse, f.length) for f in fs.extrapolation} == listed["ratio"]
    assert ("alibi", "rope", 200) in listed["ratio"]  # alibi keeps its 1x (x1.0005 of it), rope does not (x1.3)
    assert fs.made == made
    for f in fs.between:  # written so that the first row is better: its ratio below 1, the interval too
        assert f.comparison.interval.value < 1 and f.comparison.interval.hi < 1 and f.comparison.level == METHOD
    # at 1x rope and rope-ntk are the same model and the same numbers: no claim either way
    assert not any({f.better, f.worse} == {"rope", "rope-ntk"} and f.length == 100 for f in fs.between)
    # against its own 1x: rope x1.3 and nope x1.07 degrade, alibi x0.9995 is below the minimum effect
    from_1x = {f.better: f.comparison.interval.value for f in fs.from_1x}
    assert from_1x["rope"] > 1.2 and "alibi" not in from_1x


def test_the_markdown_groups_by_pair_strongest_first_and_names_the_level():
    fs, _ = _findings(unit_results(seeds=(0, 1, 2)))
    text = findings.markdown([fs], 0.95)
    lines = [line for line in text.splitlines() if line.startswith("- ")]
    n = len(fs.between) + len(fs.from_1x) + len(fs.extrapolation)
    assert text.startswith(f"family: {findings.FAMILY}, {fs.made} comparisons; Benjamini-Hochberg at 5% (false "
                           f"discovery rate): {n} hold") and fs.family.size == fs.made
    assert "every one is method-level (over the training seeds)" in text
    pairs = {}
    for f in fs.between:
        pairs[f.better, f.worse] = max(pairs.get((f.better, f.worse), 0.0), f.effect)
    expected = [f"- {a} < {b}:" for (a, b), _ in sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))]
    assert [line.split(": ")[0] + ":" for line in lines[: len(pairs)]] == expected
    assert expected[0] == "- alibi < nope:"  # nope is 1.5-1.6x the NLL, alibi the lowest row at 2x
    claim = next(f for f in fs.between if (f.better, f.worse, f.length) == ("alibi", "nope", 200))
    i = claim.comparison.interval
    assert f"2x {i.value:.3f} [{i.lo:.3f}, {i.hi:.3f}]" in text
    assert math.isclose(claim.effect, abs(math.log(i.value)))


def test_one_seed_claims_are_about_this_checkpoint():
    fs, _ = _findings(unit_results())
    assert fs.levels == {CHECKPOINT}
    assert "every one is about this checkpoint (one seed), not the method" in findings.markdown([fs], 0.95)


def test_a_folder_without_differences_says_none():
    rng = np.random.default_rng(0)
    text = rng.gamma(50, 1.5, size=40)
    data = unit_results()
    for r in data["records"]:  # every row the same numbers at every length: nothing to claim
        r["units"]["nll"] = list(map(float, text))
    fs, _ = _findings(data)
    out = findings.markdown([fs], 0.95)
    assert fs.between == [] and fs.from_1x == [] and fs.extrapolation == [] and out.count("- none") == 3
    assert out.startswith(f"family: {findings.FAMILY}, {fs.made} comparisons") and ": 0 hold" in out


def test_a_task_runs_findings_are_differences_of_exact_match_with_the_more_accurate_row_first():
    from tests.analysis.fake_results import arec, task_results

    a = [1] * 30 + [0] * 10
    b = [1] * 20 + [0] * 20
    data = task_results([arec("rope", 0, 100, b), arec("alibi", 0, 100, a), arec("rope", 0, 200, b),
                         arec("alibi", 0, 200, b)], seeds=(0,))
    run = Run("", "r", data)
    fs = findings.run_findings(run, Intervals(data["records"]))
    assert fs.metric == "accuracy" and fs.made == 2 and not fs.from_1x and not fs.extrapolation
    (f,) = fs.between
    assert (f.better, f.worse, f.length) == ("alibi", "rope", 100) and f.comparison.interval.value == 0.25
    text = findings.markdown([fs], 0.95)
    assert "A - B of exact match" in text and "- alibi > rope: 1x 0.250 (p 0.002, 1 seed)" in text and "Against its own 1x" not in text


COMMITTED = sorted(str(p.parent.relative_to(ROOT)) for p in (ROOT / "results").rglob("results.json")
                   if "step-probe" not in str(p) and "timing" not in str(p))


@pytest.mark.parametrize("folder", COMMITTED)
def test_every_committed_folder_finds_the_same_whichever_row_is_named_first(folder):
    """B / A is the reciprocal of A / B, bounds and p-value included (a share's difference its negative), and the
    findings are the same set with the rows listed in the opposite order; no bound of a positive value is negative."""
    run = load_runs([ROOT / folder])[0]
    iv = Intervals(run.data["records"], draws=400)
    value = iv.kind.primary
    for length in iv.lengths:
        for a, b in combinations(iv.rows, 2):
            ab, ba = iv.compare(value, a, b, length), iv.compare(value, b, a, length)
            if ab is None:
                continue
            assert ba.p == pytest.approx(ab.p, rel=1e-9, abs=1e-12)
            if metrics.get(value).difference:
                assert ba.value == pytest.approx(-ab.value, abs=1e-12)
            elif math.isfinite(ab.interval.lo):
                assert (ba.value, ba.interval.lo, ba.interval.hi) == pytest.approx(
                    (1 / ab.value, 1 / ab.interval.hi, 1 / ab.interval.lo), rel=1e-9)
                assert ab.interval.lo > 0 and ba.interval.lo > 0
    forward = findings.run_findings(run, iv)
    flipped = Run(run.label, run.path, {**run.data, "run": {**run.data["run"], "rows": row_order(run.data)[::-1]}})
    backward = findings.run_findings(flipped, iv)
    key = lambda fs: sorted((f.better, f.worse, f.length, round(f.comparison.value, 12))  # noqa: E731
                            for f in fs.between + fs.from_1x + fs.extrapolation)
    assert key(forward) == key(backward) and forward.made == backward.made


def test_a_task_runs_findings_are_by_exact_match_only(tmp_path, capsys):
    """`--findings --value` picks another metric of a text run (longppl: tests/metrics/test_longppl.py); a task
    run's findings compare exact match, so another of its metrics is refused, naming the one it takes."""
    from posenc_bench.commands.cli import main
    from tests.analysis.fake_results import arec, task_results, write

    folder = write(tmp_path / "run", task_results([arec(e, s, L, [1, 0] * 20) for e in ("rope", "alibi")
                                                   for s in (0, 1) for L in (100, 200)]))
    assert main(["report", str(folder), "--findings", "--value", "token_accuracy"]) == 2
    assert "'token_accuracy' is not one; valid: accuracy" in capsys.readouterr().err
    assert main(["report", str(folder), "--findings", "--value", "accuracy"]) == 0
    assert "Between rows: A - B of exact match at a size" in capsys.readouterr().out
