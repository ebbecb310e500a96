"""`report --robustness`: ratio table, Kendall's tau and each claim checked per setting (analysis/robustness.py)."""

import math
import re

import numpy as np
import pytest

from posenc_bench.analysis import robustness
from posenc_bench.analysis.findings import run_findings
from posenc_bench.analysis.runs import load_runs
from posenc_bench.commands.cli import main
from tests.analysis.fake_results import run_meta, urec, write

ROWS = ("a", "b", "c")


def setting(folder, at_4x, seeds=(0, 1, 2), seed_sd=0.002, n=40, by_pos=None):
    """Rows a, b, c with 1x NLL multipliers 1.0, 1.01, 1.02 and the given 4x multipliers (row -> factor of its 1x,
    or a tuple: one per seed),
    each seed's model off by random factors of sd ``seed_sd`` (at 1x, and on its 4x factor); train length 100, eval
    at 100 and 400; ``by_pos``: row -> (1x loss over positions 0-7, over 50-99)."""
    rng = np.random.default_rng(sum(map(ord, folder.name)))  # each setting its own draws, whatever the path
    text = rng.gamma(50, 1.5, size=n)
    recs = []
    for s in seeds:
        for i, row in enumerate(ROWS):
            luck = 1 + rng.normal(0, seed_sd)
            recs.append(urec(row, s, 100, text * (1 + 0.01 * i) * luck, by_pos=(by_pos or {}).get(row)))
            factor = at_4x[row][s] if isinstance(at_4x[row], tuple) else at_4x[row] * (1 + rng.normal(0, seed_sd))
            recs.append(urec(row, s, 400, text * (1 + 0.01 * i) * luck * factor))
    for r in recs:
        r["ratio"] = r["eval_len"] / 100
    return write(folder, {"schema_version": 1, "run": run_meta(list(ROWS), seeds=seeds), "records": recs})


def test_kendall_tau_counts_concordant_pairs_and_names_the_flips():
    a = {"x": 1.0, "y": 2.0, "z": 3.0}
    assert robustness.kendall_tau(a, a) == (1.0, 3, [])
    tau, n, flips = robustness.kendall_tau(a, {"x": 3.0, "y": 2.0, "z": 1.0})
    assert (tau, n) == (-1.0, 3) and sorted(flips) == [("x", "y"), ("x", "z"), ("y", "z")]
    tau, n, flips = robustness.kendall_tau(a, {"x": 2.0, "y": 1.0, "z": 3.0, "w": 0.0})  # w: only in one
    assert tau == pytest.approx(1 / 3) and n == 3 and flips == [("x", "y")]
    tau, _, _ = robustness.kendall_tau(a, {"x": 1.0, "y": 1.0, "z": 3.0})  # a tie: tau-b
    assert tau == pytest.approx(2 / np.sqrt(3 * 2))


def test_each_claim_holds_reverses_or_is_not_shown_in_each_setting(tmp_path):
    head = setting(tmp_path / "head", {"a": 1.10, "b": 1.30, "c": 1.60})
    same = setting(tmp_path / "same", {"a": 1.12, "b": 1.28, "c": 1.70})
    flipped = setting(tmp_path / "flipped", {"a": 1.60, "b": 1.30, "c": 1.10})
    noisy = setting(tmp_path / "noisy", {"a": (1.10, 1.10), "b": (1.15, 1.15), "c": (1.30, 1.02)}, seeds=(0, 1))
    runs = load_runs([head, same, flipped, noisy])
    settings = [robustness.Setting.of(r, 0.95) for r in runs]
    found = run_findings(runs[0], settings[0].iv)
    claim = next(f for f in found.extrapolation if (f.better, f.worse, f.length) == ("a", "c", 400))
    assert robustness.check(settings[1], claim, "extrapolation").status == robustness.HOLDS
    assert robustness.check(settings[2], claim, "extrapolation").status == robustness.REVERSED
    check = robustness.check(settings[3], claim, "extrapolation")
    assert check.status == robustness.SAME_WAY and check.got.lo < 1 < check.got.hi  # two seeds that disagree: not shown
    assert (check.seeds_agree, check.seeds, check.every_seed) == (1, 2, False)  # seed 1: a 1.10 against c 1.02
    assert robustness.check(settings[1], claim, "extrapolation").every_seed  # three seeds, each a < c
    text = robustness.markdown(runs)
    assert "| a | 1.16 [" in text and "| c | 2.4" in text  # ppl ratios: exp(0.1 x loss 1.5), exp(0.6 x 1.5)
    a_bpb = next(ln for ln in text.splitlines() if ln.startswith("| a | ") and "->" in ln)
    head_1x, head_4x = map(float, a_bpb.split(" | ")[1].split(" -> "))  # about 1.5 nats a byte: 2.16 bits
    assert a_bpb.count(" -> ") == 4 and 2.0 < head_1x < 2.3 and head_4x - head_1x == pytest.approx(
        0.15 / math.log(2), abs=0.01)  # 4x: NLL x 1.10, 0.15 nats a byte more
    assert "- head vs same: tau 1.00 over 3 rows; flips: none" in text
    assert "- head vs flipped: tau -1.00 over 3 rows" in text and "a < c in head, not in flipped" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("| a < c (ratio to 1x)"))
    assert line.endswith("| no |") and "| holds 0." in line and "| reversed 2." in line and "| same way, not shown 0.9" in line
    assert "claims hold in every setting" in text
    assert "reversed in at least one: " in text and "a < c (ratio to 1x) (in flipped)" in text
    with_noisy = robustness.markdown([runs[0], runs[3]])  # its mean points a's way, one of its two seeds does not
    assert next(ln for ln in with_noisy.splitlines() if ln.startswith("| a < c (ratio to 1x)")).endswith("| same way |")
    only_two = robustness.markdown(runs[:2])
    assert "| a < c (ratio to 1x)" in only_two and all(
        ln.endswith("| yes |") for ln in only_two.splitlines() if ln.startswith("| a < c"))


def test_a_row_flagged_by_the_plateau_check_in_one_setting_is_marked_there_only(tmp_path):
    head = setting(tmp_path / "head", {"a": 1.10, "b": 1.30, "c": 1.60}, by_pos={r: (2.0, 1.8) for r in ROWS})
    bpe = setting(tmp_path / "bpe", {"a": 1.10, "b": 1.30, "c": 1.60},
                  by_pos={"a": (2.0, 1.8), "b": (2.0, 1.97), "c": (2.0, 1.9)})
    text = robustness.markdown(load_runs([head, bpe]))
    ratio = {ln.split(" |")[0]: ln for ln in text.splitlines() if ln.startswith("| ") and "[" in ln}
    assert ratio["| b"].endswith(f"] {robustness.PLATEAU_MARK} |") and ratio["| b"].count(robustness.PLATEAU_MARK) == 1
    assert robustness.PLATEAU_MARK not in ratio["| a"] + ratio["| c"]
    assert "| head (positions 0-7 vs 50-99) | bpe (positions 0-7 vs 50-99) |" in text
    assert f"| b | 0.200 | 0.030 {robustness.PLATEAU_MARK} |" in text and "| c | 0.200 | 0.100 |" in text
    assert "| (bucket scatter) | n/a | n/a |" in text  # one bucket in the second half: no spread
    assert "Flagged: bpe: b." in text
    assert "No row is flagged in any setting." in robustness.markdown(load_runs([head, head]))


def test_report_robustness_command_and_its_refusals(tmp_path, capsys):
    head = setting(tmp_path / "head", {"a": 1.10, "b": 1.30, "c": 1.60})
    other = setting(tmp_path / "other", {"a": 1.12, "b": 1.28, "c": 1.70})
    assert main(["report", str(head), str(other), "--robustness", "--claims", str(head)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Settings:\n") and "Kendall's tau-b" in out and f"claims from {head}" in out
    assert main(["report", str(head), "--robustness"]) == 2
    assert "give two or more results folders" in capsys.readouterr().err
    assert main(["report", str(head), str(other), "--claims", str(head)]) == 2
    assert "--claims goes with --robustness" in capsys.readouterr().err
    readme = tmp_path / "README.md"
    key = f"{head.as_posix()} {other.as_posix()}"
    readme.write_text(f"<!-- posenc-bench robustness: {key} -->\n<!-- /posenc-bench robustness -->\n")
    assert main(["report", str(head), str(other), "--robustness", "--update", str(readme)]) == 0
    assert "Kendall's tau-b" in readme.read_text()


def test_plot_robustness_draws_one_marker_per_row_and_setting(tmp_path, capsys):
    head = setting(tmp_path / "head", {"a": 1.10, "b": 1.30, "c": 1.60})
    other = setting(tmp_path / "other", {"a": 1.12, "b": 1.28, "c": 1.70})
    assert main(["plot", str(head), str(other), "--robustness", "--out", str(tmp_path / "fig"), "--formats", "svg"]) == 0
    svg = (tmp_path / "fig" / "robustness.svg").read_text()
    assert "head (4x)" in svg and "other (4x)" in svg and capsys.readouterr().out.startswith("wrote ")
    assert "hollow" not in svg and "x: each seed's own ratio" in svg
    for name in ("head", "other"):  # beside each interval, one x per seed (3 here)
        for row in ROWS:
            group = re.search(rf'<g id="seeds {name} {row}">(.*?)</g>', svg, re.S)
            assert group and group.group(1).count("<use ") == 3
    one = setting(tmp_path / "one", {"a": 1.10, "b": 1.30, "c": 1.60}, seeds=(0,))
    assert main(["plot", str(one), str(one), "--robustness", "--out", str(tmp_path / "fig1"), "--formats", "svg"]) == 0
    svg = (tmp_path / "fig1" / "robustness.svg").read_text()
    assert 'id="seeds ' not in svg and "each seed" not in svg  # one seed: the marker is the seed
    flat = setting(tmp_path / "flat", {"a": 1.10, "b": 1.30, "c": 1.60}, by_pos={"a": (2.0, 1.8), "b": (2.0, 1.99)})
    assert main(["plot", str(head), str(flat), "--robustness", "--out", str(tmp_path / "fig3"), "--formats", "svg"]) == 0
    svg = (tmp_path / "fig3" / "robustness.svg").read_text()
    assert "hollow: a row the plateau check flags in that setting" in svg and "flat (4x)" in svg
    assert main(["plot", str(head), "--robustness", "--out", str(tmp_path / "fig2")]) == 2
    assert "two or more settings" in capsys.readouterr().err


def test_a_setting_with_one_seed_speaks_for_its_checkpoint_and_no_claim_holds_everywhere_on_it(tmp_path):
    head = setting(tmp_path / "head", {"a": 1.10, "b": 1.30, "c": 1.60})
    one = setting(tmp_path / "one", {"a": 1.12, "b": 1.28, "c": 1.70}, seeds=(0,))
    runs = load_runs([head, one])
    settings = [robustness.Setting.of(r, 0.95) for r in runs]
    claim = next(f for f in run_findings(runs[0], settings[0].iv).extrapolation
                 if (f.better, f.worse, f.length) == ("a", "c", 400))
    check = robustness.check(settings[1], claim, "extrapolation")
    assert check.status == robustness.HOLDS and check.cell().startswith("holds (this checkpoint) 0.")
    text = robustness.markdown(runs)
    line = next(ln for ln in text.splitlines() if ln.startswith("| a < c (ratio to 1x)"))
    assert "| holds 0." in line and "| holds (this checkpoint) 0." in line and line.endswith("| same way, every seed |")
    count = re.search(r"(\d+) of (\d+) claims hold in every setting; (\d+) more point the claim's way in every "
                      r"setting .*?, (\d+) of them at every seed of every setting", text)
    claims = [ln for ln in text.splitlines() if ln.startswith("| ") and ln.endswith((" yes |", " same way |",
                                                                                     " every seed |", " no |"))]
    assert count and int(count[1]) == 0 and int(count[2]) == len(claims)  # one seed: nothing holds everywhere
    assert int(count[3]) == sum(ln.endswith((" same way |", " every seed |")) for ln in claims) > 0
    assert int(count[4]) == sum(ln.endswith(" same way, every seed |") for ln in claims) > 0
    row_a = next(ln for ln in text.splitlines() if ln.startswith("| a | "))
    assert row_a.count("(this checkpoint)") == 1  # the one-seed setting's ratio, not the three-seed one's
    flipped = setting(tmp_path / "flip1", {"a": 1.60, "b": 1.30, "c": 1.10}, seeds=(0,))
    assert "a < c (ratio to 1x) (in flip1 for this checkpoint)" in robustness.markdown(load_runs([head, flipped]))
