"""The metric registry: one registration per metric, and a plugin's metric seen by the report, the gate and
the plots without a line of package code changed."""

import json
import sys
import textwrap

import pytest

from posenc_bench import metrics
from posenc_bench.metrics import registry
from tests.analysis.fake_results import unit_results, write

PLUGIN = '''
"""A metric from outside the package: the mean NLL per target in nats (the log of ppl)."""
from posenc_bench.metrics import Metric, register

register(Metric(
    "nll", kind="ppl", title="Mean NLL per target, nats (lower is better)",
    units=("nll", "tokens"), formula=lambda s: s["nll"] / s["tokens"],
    gate_tolerance="nll_tol", tolerance=0.01,
    compare_title="Mean NLL relative to {ref} (paired)",
    plot=("Mean NLL against eval length. Bands: each row's own {ci} interval", "nats per target", "nll_vs_length"),
))
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """An installed plugin, as pip leaves one: its module and a dist-info naming it in the entry-point group."""
    (tmp_path / "toy_metric_plugin.py").write_text(textwrap.dedent(PLUGIN))
    dist = tmp_path / "toy_metric_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: toy-metric-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(f"[{metrics.ENTRY_POINTS}]\nnll = toy_metric_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry._load.cache_clear()
    yield tmp_path
    metrics.unregister("nll")
    sys.modules.pop("toy_metric_plugin", None)
    registry._load.cache_clear()


def test_the_package_registers_its_metrics_in_table_order():
    assert metrics.names()[:6] == ["ppl", "bpb", "ratio", "accuracy", "token_accuracy", "passkey"]
    assert metrics.names("accuracy") == ["accuracy", "token_accuracy"]
    assert metrics.kind_of([{"metric": "accuracy"}, {"metric": "accuracy"}]).name == "accuracy"
    assert metrics.kind_of([{"encoding": "rope"}]).name == "ppl"  # records from before the field: text


def test_unknown_and_twice_registered_metrics_are_errors_naming_the_valid_ones():
    with pytest.raises(metrics.MetricError, match="unknown metric 'speed'; valid: ppl, bpb, ratio"):
        metrics.get("speed")
    with pytest.raises(metrics.MetricError, match="unknown kind of record 'audio'; valid: ppl, accuracy"):
        metrics.kind("audio")
    with pytest.raises(metrics.MetricError, match="metric 'ppl' is registered twice"):
        metrics.register(metrics.get("ppl"))


def test_a_plugin_metric_is_in_the_report_the_gate_and_the_plots(plugin, tmp_path, capsys):
    from posenc_bench.analysis import gate, plots
    from posenc_bench.analysis.report import render
    from posenc_bench.analysis.runs import load_runs
    from posenc_bench.commands.cli import main

    data = unit_results(seeds=(0, 1, 2))
    folder = write(tmp_path / "run", data)
    assert metrics.get("nll").kind == "ppl" and "nll" in metrics.tabled()

    # the report: its table, with each cell the mean over seeds of each record's NLL per target (log of its ppl)
    text = render(load_runs([folder]), values=["nll"])
    rope = [r for r in data["records"] if r["encoding"] == "rope" and r["eval_len"] == 200]
    mean_nll = sum(sum(r["units"]["nll"]) / sum(r["units"]["tokens"]) for r in rope) / len(rope)
    assert "Mean NLL per target, nats (lower is better)" in text and f"{mean_nll:.2f} [" in text
    assert main(["report", str(folder), "--value", "ppl,nll", "--compare", "alibi"]) == 0
    out = capsys.readouterr().out
    assert "Mean NLL per target" in out and "Mean NLL relative to alibi (paired)" in out
    assert main(["report", str(folder), "--findings", "--value", "nll"]) == 0  # its findings, a family of its own
    assert "every pair of rows at every length, by nll" in capsys.readouterr().out

    # the gate: a check per cell, with the plugin's own tolerance; a 5% rise of every NLL fails it
    worse = json.loads(json.dumps(data))
    for r in worse["records"]:
        r["units"]["nll"] = [x * 1.05 for x in r["units"]["nll"]]
    result = gate.compare(data, worse, {}, gate.Tolerance(0.5, 0.5, 3.0))  # ppl and ratio tolerances too wide to fail
    nll = [c for c in result.checks if c.metric == "nll"]
    assert len(nll) == 8 and all(c.verdict == "REGRESSED" and c.allowed >= 0.01 for c in nll)
    assert {c.metric for c in result.failed} == {"nll"} and "nll at" in result.summary()

    # the plots: a figure of its own
    paths = plots.plot_all(load_runs([folder]), tmp_path / "figures", ["svg"])
    assert tmp_path / "figures" / "nll_vs_length.svg" in paths
    assert "Mean NLL against eval length" in (tmp_path / "figures" / "nll_vs_length.svg").read_text()


def test_without_the_plugin_its_metric_is_unknown():
    assert "nll" not in metrics.names()


def test_a_fresh_process_finds_every_kind_before_anything_asks_for_a_metric():
    """The registry loads on the first question of any kind, so a record can be built in a new process (a
    torchrun rank, the memory probe) before any table asked for a metric."""
    import subprocess

    code = ("from posenc_bench import metrics\n"
            "assert metrics.kinds(in_results=True) == ['ppl', 'accuracy'], metrics.kinds()\n"
            "assert metrics.kinds() == ['ppl', 'accuracy', 'passkey', 'needles']\n")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).returncode == 0


def test_a_broken_plugin_is_one_line_naming_it(plugin, capsys):
    from posenc_bench.commands.cli import main

    folder = write(plugin / "run", unit_results())
    (plugin / "toy_metric_plugin.py").write_text("raise ImportError('no such thing')\n")
    assert main(["report", str(folder), "--value", "nll"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metric plugin 'toy_metric_plugin'" in err and "no such thing" in err
