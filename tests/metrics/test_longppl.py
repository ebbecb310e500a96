"""Key-token perplexity (metrics/longppl.py): exp(sum key NLL / key tokens) by hand, the share of key tokens, no
value without key tokens (at 1x, or a unit set with none), intervals from the per-unit fields, and `report --value
longppl` on a results folder that has them."""

import json
import math

import numpy as np
import pytest

from posenc_bench import metrics
from posenc_bench.analysis.stats.intervals import Intervals
from tests.analysis.fake_results import unit_results, write


def test_longppl_is_exp_of_the_key_nll_over_the_key_tokens_by_hand():
    longppl = metrics.get("longppl")
    # three units: 3.0 nats over 2 key tokens, none, 1.5 over 1: exp(4.5 / 3), not the mean of the units' values
    units = {"size": 4, "nll": [9.0, 8.0, 7.0], "tokens": [4, 4, 4], "bytes": [4, 4, 4],
             "key_nll": [3.0, 0.0, 1.5], "key_tokens": [2, 0, 1]}
    assert longppl.of_units(units) == pytest.approx(math.exp(4.5 / 3))
    assert metrics.get("key_share").of_units(units) == pytest.approx(3 / 12)
    sums = {"key_nll": np.array([3.0, 0.0]), "key_tokens": np.array([2.0, 0.0])}
    with np.errstate(invalid="ignore"):
        assert np.isnan(longppl.formula(sums)[1])  # no key tokens: no value
    assert longppl.of_units({"size": 4, "nll": [1.0], "tokens": [4], "bytes": [4]}) is None  # not identified


def test_longppl_is_lower_better_a_ratio_not_at_1x_and_not_gated():
    m = metrics.get("longppl")
    assert (m.kind, m.higher_is_better, m.difference, m.at_1x, m.gate_tolerance) == ("ppl", False, False, False, None)
    share = metrics.get("key_share")
    assert (share.bounds, share.at_1x) == ((0.0, 1.0), False)
    assert "longppl" in metrics.tabled() and "key_share" in metrics.tabled()


def _keyed(data: dict) -> dict:
    """``data`` with key-token fields past 1x: every fourth unit has none, the others two key tokens whose NLL is
    1.2 nats each times the row's NLL scale at that length (so rows differ on key tokens as on all targets)."""
    for r in data["records"]:
        if r["eval_len"] == r["train_len"]:
            continue  # no key tokens at 1x: no fields
        n = len(r["units"]["nll"])
        scale = sum(r["units"]["nll"]) / (1.5 * sum(r["units"]["tokens"]))
        r["units"]["key_tokens"] = [0 if i % 4 == 0 else 2 for i in range(n)]
        r["units"]["key_nll"] = [k * 1.2 * scale for k in r["units"]["key_tokens"]]
        r["key_evaluator"] = "rope"
    return data


def test_intervals_draw_longppl_from_the_key_fields_and_leave_1x_empty():
    data = _keyed(unit_results(seeds=(0, 1, 2)))
    iv = Intervals(data["records"], draws=200)
    for r in data["records"]:
        if r["eval_len"] == 200 and r["seed"] == 0:
            u = r["units"]
            assert metrics.record_value(metrics.get("longppl"), r) == pytest.approx(
                math.exp(sum(u["key_nll"]) / sum(u["key_tokens"])))
    got = iv.interval("longppl", "rope", 200)
    rope = [r["units"] for r in data["records"] if r["encoding"] == "rope" and r["eval_len"] == 200]
    each = [math.exp(sum(u["key_nll"]) / sum(u["key_tokens"])) for u in rope]
    assert got.value == pytest.approx(math.exp(np.mean(np.log(each))), rel=1e-9)  # the geometric mean over seeds
    assert got.lo < got.value < got.hi
    assert iv.interval("longppl", "rope", 100) is None  # 1x: no key tokens
    share = iv.interval("key_share", "alibi", 200)
    assert share.value == pytest.approx(30 * 2 / (40 * 50))  # 30 of 40 units with 2 key tokens of 50 targets
    assert iv.interval("ppl", "rope", 100) is not None  # records without the fields keep every other metric


def test_report_value_longppl_prints_a_table_with_intervals(tmp_path, capsys):
    from posenc_bench.commands.cli import main

    folder = write(tmp_path / "run", _keyed(unit_results(seeds=(0, 1, 2))))
    assert main(["report", str(folder), "--value", "longppl,key_share"]) == 0
    out = capsys.readouterr().out
    assert "Key-token perplexity, LongPPL" in out and "Share of the targets that are key tokens" in out
    assert "[" in out.split("Key-token perplexity")[1]  # intervals in its cells
    assert main(["report", str(folder), "--value", "longppl", "--compare", "alibi"]) == 0
    assert "LongPPL relative to alibi" in capsys.readouterr().out
    plain = write(tmp_path / "plain", unit_results())  # a folder without key tokens: the table says so, no error
    assert main(["report", str(plain), "--value", "ppl,longppl"]) == 0
    json.dumps(capsys.readouterr().out)


def test_a_length_with_no_key_tokens_is_na_with_its_reason_not_nan(tmp_path, capsys):
    """At a length where the evaluator found no key token in the text (a short text: SmolLM2 had 8 of 32,768 at
    1.5x), no row has a LongPPL there: the cell says n/a and why, never "nan"; the share of key tokens is 0."""
    from posenc_bench.commands.cli import main

    data = _keyed(unit_results(seeds=(0, 1, 2)))
    for r in data["records"]:
        if r["eval_len"] == 200:
            r["units"]["key_tokens"] = [0] * len(r["units"]["key_tokens"])
            r["units"]["key_nll"] = [0.0] * len(r["units"]["key_nll"])
    r200 = next(r for r in data["records"] if r["eval_len"] == 200)
    assert metrics.record_value(metrics.get("longppl"), r200) is None
    assert metrics.record_value(metrics.get("key_share"), r200) == 0.0  # the share is 0, a value
    assert Intervals(data["records"], draws=50).interval("longppl", "rope", 200) is None
    folder = write(tmp_path / "run", data)
    assert main(["report", str(folder), "--value", "longppl,key_share"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out.lower()
    longppl = out.split("Key-token perplexity")[1].split("Share of the targets")[0]
    rope = next(line for line in longppl.splitlines() if line.startswith("| rope "))
    assert rope.split("|")[-2].strip().startswith("n/a [")  # 2x (200): no value, a footnote saying why
    assert metrics.get("longppl").no_value in longppl
    share = out.split("Share of the targets")[1]
    every = next(line for line in share.splitlines() if line.startswith("| every row "))
    assert every.split("|")[-2].strip() == "0.0000 (every seed)"  # 0 on every seed and draw: no log-scale interval


def test_key_tokens_in_one_unit_give_no_interval_and_no_finding(tmp_path, capsys):
    """SmolLM2 at 1.5x: its 8 key tokens lie in one of the 4 units. Every draw of the text that holds any gives
    the same LongPPL, a spread of 0, which is no interval: the estimate declines one and no comparison is a
    finding, however far apart the rows are. With two units holding them, the text's degrees of freedom are 1."""
    from posenc_bench.analysis.stats.intervals import ONE_CLUSTER
    from posenc_bench.commands.cli import main

    data = _keyed(unit_results(seeds=(0,)))
    for r in data["records"]:
        if r["eval_len"] == 200:
            n = len(r["units"]["key_tokens"])
            r["units"]["key_tokens"] = [8 if i == 5 else 0 for i in range(n)]
            r["units"]["key_nll"] = [k * (0.5 if r["encoding"] == "rope" else 3.0) for k in r["units"]["key_tokens"]]
    iv = Intervals(data["records"], draws=200)
    e = iv.estimate("longppl", "rope", 200)
    assert e.value == pytest.approx(math.exp(0.5)) and e.declined == ONE_CLUSTER.format(weight="key tokens")
    assert iv.interval("longppl", "rope", 200) is None
    assert iv.compare("longppl", "nope", "rope", 200).p == 1.0  # exp(2.5) apart, and no finding
    assert iv.compare("ppl", "nope", "rope", 200).p < 0.05  # the other metrics keep their 40 units
    for r in data["records"]:
        if r["eval_len"] == 200:
            r["units"]["key_tokens"][9] = 8
            r["units"]["key_nll"][9] = r["units"]["key_nll"][5]
    two = Intervals(data["records"], draws=200).estimate("longppl", "rope", 200)
    assert not two.declined and [df for _, df in two.parts] == [1]
    for r in data["records"]:  # back to one unit: the table says why its cells have no interval
        if r["eval_len"] == 200:
            r["units"]["key_tokens"][9], r["units"]["key_nll"][9] = 0, 0.0
    folder = write(tmp_path / "run", data)
    assert main(["report", str(folder), "--value", "longppl"]) == 0
    out = capsys.readouterr().out
    rope = next(line for line in out.splitlines() if line.startswith("| rope "))
    mark = rope.split("|")[-2].split()[-1]
    assert mark.startswith("[") and f"{mark} {ONE_CLUSTER.format(weight='key tokens')}" in out
    assert main(["report", str(folder), "--value", "longppl", "--compare", "rope"]) == 0
    compared = capsys.readouterr().out.split("LongPPL relative to rope")[1]
    nope = next(line for line in compared.splitlines() if line.startswith("| nope "))
    assert nope.split("|")[-2].split()[-1] == mark and f"{mark} {ONE_CLUSTER.format(weight='key tokens')}" in compared
    assert next(line for line in compared.splitlines() if line.startswith("| rope ")).split("|")[-2].strip() == "1.000"


def test_findings_by_longppl_compare_rows_past_1x_in_their_own_family(tmp_path, capsys):
    """`report --findings --value longppl`: the claims between rows by LongPPL, past 1x only, corrected as a family
    of their own (no claims about 1x: LongPPL has none); its README block is `findings-longppl`. key_share is the
    same for every row: no findings and no best marks by it, and its table shows four decimals."""
    from posenc_bench.analysis import report
    from posenc_bench.analysis.findings import run_findings
    from posenc_bench.analysis.runs import load_runs
    from posenc_bench.commands.cli import main

    folder = write(tmp_path / "run", _keyed(unit_results(seeds=(0, 1, 2))))
    assert main(["report", str(folder), "--findings", "--value", "longppl"]) == 0
    out = capsys.readouterr().out
    assert "family: every pair of rows at every length past 1x, by longppl, 6 comparisons" in out
    assert "Between rows: A / B of longppl at a length" in out and "Against its own 1x" not in out
    run = load_runs([folder])[0]
    found = run_findings(run, Intervals(run.data["records"]), "longppl")
    assert found.made == 6 and {f.length for f in found.between} <= {200} and not found.from_1x
    nope = [f for f in found.between if "nope" in (f.better, f.worse)]
    assert nope and all(f.worse == "nope" for f in nope)  # nope's key NLL scales with its 1.6x NLL
    assert main(["report", str(folder), "--findings", "--value", "ppl"]) == 0
    assert capsys.readouterr().out == report.render_findings([run])  # the primary: the plain findings
    for bad, why in (("key_share", "valid: ppl, bpb, longppl\n"), ("ppl,longppl", "give one --value")):
        assert main(["report", str(folder), "--findings", "--value", bad]) == 2
        assert why in capsys.readouterr().err
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- posenc-bench findings-longppl: {folder} -->\n<!-- /posenc-bench findings-longppl -->\n")
    assert main(["report", str(folder), "--findings", "--value", "longppl", "--update", str(readme)]) == 0
    assert "by longppl, 6 comparisons" in readme.read_text()
    capsys.readouterr()
    assert main(["report", str(folder), "--value", "key_share"]) == 0
    share = capsys.readouterr().out.split("Share of the targets")[1]
    assert "bold" not in share and "≈" not in share and "| 0.0300 [" in share  # 60 of 2000 targets at 2x
    body = [line for line in share.splitlines() if line.startswith("| ") and "encoding" not in line]
    assert [line.split("|")[1].strip() for line in body] == ["every row"]  # the same for every row: one row


def test_a_share_of_key_tokens_that_differs_between_rows_shows_every_row():
    """key_share is the evaluator's, so one row shows it for all; records whose shares differ (key tokens of
    two evaluators mixed in one folder) keep a row each, so the table never hides the disagreement."""
    from posenc_bench.analysis.runs import Run, run_intervals
    from posenc_bench.analysis.tables import EVERY_ROW, build_table

    data = _keyed(unit_results(seeds=(0,)))
    runs = [Run("", "", data)]
    assert build_table(runs, "key_share", intervals=run_intervals(runs)).rows == [EVERY_ROW]
    for r in data["records"]:
        if r["encoding"] == "nope" and r["eval_len"] == 200:
            r["units"]["key_tokens"] = [k + 1 for k in r["units"]["key_tokens"]]
    runs = [Run("", "", data)]
    table = build_table(runs, "key_share", intervals=run_intervals(runs))
    assert table.rows == ["rope", "rope-ntk", "alibi", "nope"] and table.cells["nope", 1].mean > table.cells["rope", 1].mean
