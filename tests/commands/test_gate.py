"""`posenc-bench gate`'s flags: tolerances from flags and --set reach the comparison, and --config/--current
exclude each other (the comparison itself is tested in tests/analysis/test_gate.py)."""

import json

from posenc_bench.commands.cli import main

BASELINE = "results/baseline-ci.json"


def test_the_committed_baseline_passes_against_itself_with_the_flags_tolerances(tmp_path, capsys):
    assert main(["gate", "--current", BASELINE, "--baseline", BASELINE, "--out", str(tmp_path), "--ppl-tol", "0.5",
                 "--set", "gate.per_encoding={rope: {ratio_tol: 0.25}}"]) == 0
    result = json.loads((tmp_path / "gate.json").read_text())
    assert result["verdict"] == "pass" and result["tolerance"]["ppl_tol"] == 0.5
    assert result["per_encoding"] == {"rope": {"ratio_tol": 0.25}}
    assert all(c["verdict"] in ("ok", "n/a") for c in result["checks"])
    assert "gate: PASS" in capsys.readouterr().out


def test_config_and_current_exclude_each_other(tmp_path, capsys):
    assert main(["gate", "--baseline", BASELINE, "--out", str(tmp_path)]) == 2
    assert main(["gate", "--config", "ci", "--current", BASELINE, "--baseline", BASELINE]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["posenc-bench gate: error: give --config (run the sweep now) or --current (read a results.json), "
                   "not both or neither"] * 2


def test_the_task_baseline_is_the_tasks_ci_config_and_passes_against_itself(tmp_path, capsys):
    """CI gates `tasks-ci` against this file: a config change without a new baseline fails here, not in CI."""
    from posenc_bench.bench.config import load_config
    from posenc_bench.bench.records import identity

    tasks = "results/baseline-tasks-ci.json"
    data = json.loads(open(tasks).read())
    config = load_config("tasks-ci").to_dict()
    # the sections as the identity rule reads them (a setting that changes no number, e.g. a new one, is not in it)
    baseline, current = identity({"config": data["run"]["config"]}), identity({"config": config})
    for section in ("model", "train", "task", "eval"):
        names = {k for k in baseline.keys() | current.keys() if k.startswith(f"config.{section}.")}
        assert {k: baseline.get(k) for k in names} == {k: current.get(k) for k in names}, section
    for section in ("encodings", "seeds"):  # compared as cells, outside the identity
        assert data["run"]["config"][section] == config[section], section
    assert {r["metric"] for r in data["records"]} == {"accuracy"}
    assert main(["gate", "--current", tasks, "--baseline", tasks, "--out", str(tmp_path)]) == 0
    assert "gate: PASS: 8 checks" in capsys.readouterr().out
