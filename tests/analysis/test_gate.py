"""posenc-bench gate: pass when nothing regressed, fail naming the encoding and length when something did,
refuse incomparable or unreadable baselines (exit 2)."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest

from posenc_bench.commands.cli import main
from posenc_bench.bench.config import RunConfig

T = 100


def rec(enc, seed, L, ppl, status="ok", reason=""):
    return {"encoding": enc, "seed": seed, "train_len": T, "eval_len": L, "ratio": L / T, "status": status,
            "reason": reason, "ppl": ppl, "bpb": None, "loss": None, "tokens": 10}


def results(records, seeds=(0,)):
    cfg = RunConfig().to_dict()
    cfg["train"]["train_len"] = T
    cfg["seeds"] = list(seeds)
    run = {"config": cfg, "rows": list(dict.fromkeys(r["encoding"] for r in records)), "eval_lengths": [100, 200],
           "corpus": {"source": "stdlib", "fingerprint": "abc"}, "eval_fingerprint": "def", "device": "cpu",
           "versions": {"torch": "2.13.0"}, "git_commit": "0" * 40, "params": 1000}
    return {"schema_version": 1, "run": run, "records": records}


BASE = [rec("rope", 0, 100, 4.0), rec("rope", 0, 200, 6.0), rec("alibi", 0, 100, 5.0), rec("alibi", 0, 200, 5.0),
        rec("learned", 0, 100, 4.5), rec("learned", 0, 200, None, "n/a", "table has 100 rows")]


def write(path: Path, data) -> str:
    path.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return str(path)


def run_gate(tmp_path, base, cur, *extra):
    b = write(tmp_path / "baseline.json", base)
    c = write(tmp_path / "current.json", cur)
    return main(["gate", "--current", c, "--baseline", b, "--out", str(tmp_path / "gate"), *extra])


def scaled(records, factor, enc=None, L=None):
    out = copy.deepcopy(records)
    for r in out:
        if (enc is None or r["encoding"] == enc) and (L is None or r["eval_len"] == L) and r["ppl"] is not None:
            r["ppl"] *= factor
    return out


def test_unchanged_results_pass_and_write_markdown_and_json(tmp_path, capsys):
    assert run_gate(tmp_path, results(BASE), results(BASE)) == 0
    out = capsys.readouterr().out
    assert "gate: PASS: 7 checks, no regression" in out
    data = json.loads((tmp_path / "gate" / "gate.json").read_text())
    assert data["verdict"] == "pass" and data["exit_code"] == 0
    checks = {(c["encoding"], c["eval_len"], c["metric"]): c for c in data["checks"]}
    assert checks["rope", 200, "ratio"]["baseline"] == 1.5 and checks["rope", 200, "ratio"]["change"] == 0
    assert checks["learned", 200, "-"]["verdict"] == "n/a"  # n/a in both is not a regression
    assert (tmp_path / "gate" / "gate.md").read_text().startswith("gate: PASS")


def test_a_better_baseline_fails_naming_encoding_length_and_metric(tmp_path, capsys):
    base = results(scaled(BASE, 0.9, "rope", 200))  # baseline edited to be 10% better at 2x
    assert run_gate(tmp_path, base, results(BASE)) == 1
    err = capsys.readouterr().err
    assert "gate: FAIL: 2 regression(s)" in err
    assert "rope ppl at 2x (200) +11.11% > allowed +2.00%" in err
    assert "rope ratio at 2x (200) +11.11% > allowed +2.00%" in err
    md = (tmp_path / "gate" / "gate.md").read_text()
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in md.splitlines() if line.startswith("| rope")]
    assert ["rope", "2x (200)", "ratio", "1.3500", "1.5000", "+11.11%", "", "+2.00%", "tolerance", "**REGRESSED**",
            ""] in rows


def test_tolerances_ratio_and_per_encoding(tmp_path, capsys):
    # 1.5% worse everywhere: within the 2% ppl tolerance, and the ratio does not move
    assert run_gate(tmp_path, results(BASE), results(scaled(BASE, 1.015))) == 0
    # 3% worse at 2x only: ppl and ratio both fail
    assert run_gate(tmp_path, results(BASE), results(scaled(BASE, 1.03, "alibi", 200))) == 1
    assert "alibi ratio at 2x (200) +3.00%" in capsys.readouterr().err
    # ... unless alibi is given more room, per encoding
    assert run_gate(tmp_path, results(BASE), results(scaled(BASE, 1.03, "alibi", 200)),
                    "--set", "gate.per_encoding={alibi: {ppl_tol: 0.05, ratio_tol: 0.05}}") == 0
    # ... or globally
    assert run_gate(tmp_path, results(BASE), results(scaled(BASE, 1.03, "alibi", 200)), "--ppl-tol", "0.04",
                    "--ratio-tol", "0.04") == 0
    # better beyond tolerance passes and says so
    assert run_gate(tmp_path, results(BASE), results(scaled(BASE, 0.9, "rope"))) == 0
    assert "2 improved beyond tolerance (rope ppl at 1x (100), rope ppl at 2x (200))" in capsys.readouterr().out


def test_seed_spread_widens_the_tolerance_and_says_so(tmp_path, capsys):
    # three seeds, ppl 4.0 +- 5% at 1x; 6.0 +- 5% at 2x
    base = [rec("rope", s, L, p * f) for s, f in enumerate((0.95, 1.0, 1.05)) for L, p in ((100, 4.0), (200, 6.0))]
    allowed = 3 * 0.05 * (2 / 3) ** 0.5  # 3 sigma of the difference of two 3-seed means: 12.2%
    assert run_gate(tmp_path, results(base, (0, 1, 2)), results(scaled(base, 1.08), (0, 1, 2))) == 0
    out = capsys.readouterr().out
    assert f"+{allowed:.2%} | seed spread" in out and "allow more than the tolerance because of the baseline's seed spread" in out
    assert run_gate(tmp_path, results(base, (0, 1, 2)), results(scaled(base, 1.2), (0, 1, 2))) == 1
    assert f"rope ppl at 1x (100) +20.00% > allowed +{allowed:.2%}" in capsys.readouterr().err


def urec(enc, seed, L, unit_nll, tokens=100):
    """A record with per-unit numbers (units of ``tokens`` targets) and the ppl they give."""
    r = rec(enc, seed, L, math.exp(sum(unit_nll) / (tokens * len(unit_nll))))
    r["units"] = {"size": 200, "nll": list(unit_nll), "tokens": [tokens] * len(unit_nll), "bytes": [tokens] * len(unit_nll)}
    return r


def test_with_per_unit_numbers_a_change_fails_only_beyond_tolerance_and_its_interval(tmp_path, capsys):
    rng = np.random.default_rng(0)
    seeds = (0, 1, 2)
    text = rng.gamma(100, 1.5 / 100 * 100, size=60)  # 60 units of 100 targets, mean NLL 1.5

    def run(shift_1x, shift_2x, seed_spread=0.0):
        return results([urec("rope", s, L, text * (1 + shift) + 100 * seed_spread * (s - 1) * k)
                        for s in seeds for L, shift, k in ((100, shift_1x, 1), (200, shift_2x, -1))], seeds)

    base = run(0.0, 0.1)
    assert run_gate(tmp_path, base, base) == 0  # the same numbers: a zero-width interval, the tolerance decides
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| rope")]
    assert ["rope", "2x (200)", "ratio", "1.1617", "1.1617", "+0.00%", "[+0.00%, +0.00%]", "+2.00%", "tolerance",
            "ok", ""] in rows
    # 4% worse at 2x on every unit: beyond the 2% tolerance and far outside the paired interval: fails
    assert run_gate(tmp_path, base, run(0.0, 0.1 + 0.04 / 1.5)) == 1
    assert "rope ppl at 2x (200)" in capsys.readouterr().err
    # seeds that disagree by a lot: the same 4% (mean over seeds) is within the interval of the change: passes
    noisy_base, noisy_cur = run(0.0, 0.1, 0.08), run(0.0, 0.1 + 0.04 / 1.5, 0.08)
    noisy_cur["records"] = [dict(r, seed=(r["seed"] + 1) % 3) for r in noisy_cur["records"]]  # seeds reshuffled
    assert run_gate(tmp_path, noisy_base, noisy_cur) == 0
    out = capsys.readouterr().out
    assert "interval" in out and "because the interval of the change is wider" in out


def test_missing_new_and_status_changes(tmp_path, capsys):
    cur = [r for r in BASE if r["encoding"] != "alibi"] + [rec("nope", 0, 100, 7.0), rec("nope", 0, 200, 7.5)]
    assert run_gate(tmp_path, results(BASE), results(cur)) == 1
    out, err = capsys.readouterr()
    assert "alibi at all: in the baseline but not in the current run" in err
    assert "| nope       | all" in out and "not in the baseline: not gated" in out
    diverged = [r if r["encoding"] != "rope" else dict(r, status="diverged", ppl=None, reason="diverged at step 9")
                for r in BASE]
    assert run_gate(tmp_path, results(BASE), results(diverged)) == 1
    assert "rope at 1x (100): ok in the baseline, diverged now: diverged at step 9" in capsys.readouterr().err
    fewer = [r for r in BASE if not (r["encoding"] == "rope" and r["eval_len"] == 200)]
    assert run_gate(tmp_path, results(BASE), results(fewer)) == 1
    assert "rope at 2x (200): this length is in the baseline but not in the current run" in capsys.readouterr().err


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["run"]["config"]["model"].update(d_model=64), "model.d_model: baseline 64, current 128"),
    (lambda d: d["run"]["corpus"].update(fingerprint="xyz"), "corpus fingerprint: baseline 'xyz', current 'abc'"),
    (lambda d: d["run"]["config"]["train"].update(steps=10), "train.steps: baseline 10, current 400"),
    (lambda d: d["run"].update(tokenizer="gpt2"), "tokenizer: baseline 'gpt2', current 'bytes'"),
])
def test_incomparable_baseline_is_refused_with_the_field_named(tmp_path, capsys, edit, message):
    base = results(BASE)
    edit(base)
    assert run_gate(tmp_path, base, results(BASE)) == 2
    err = capsys.readouterr().err
    assert message in err and "Regenerate the baseline from the same config with --update-baseline" in err
    assert err.count("\n") == 1


def test_a_rows_own_options_are_part_of_the_comparison(tmp_path, capsys):
    """Per-encoding options live in each row's records (the run's identity leaves them to the rows): a baseline
    whose t5 had other buckets is refused naming the row; another row's options do not matter to rope."""
    def with_options(options):
        data = results([rec("rope", 0, 100, 4.0), rec("t5", 0, 100, 4.2)])
        for r in data["records"]:
            r["config"] = copy.deepcopy(data["run"]["config"])
            r["config"]["model"]["encoding_options"] = options
        return data

    assert run_gate(tmp_path, with_options({"t5": {"num_buckets": 16}}), with_options({})) == 2
    err = capsys.readouterr().err
    assert "t5: encoding_options.t5.num_buckets: baseline 16, current None" in err and "rope:" not in err
    assert run_gate(tmp_path, with_options({"alibi": {"x": 1}}), with_options({})) == 0


def test_a_setting_added_after_the_baseline_compares_as_its_default(tmp_path):
    base = results(BASE)
    del base["run"]["config"]["eval"]["protocol"], base["run"]["config"]["eval"]["stride"]
    assert run_gate(tmp_path, base, results(BASE)) == 0
    strided = results(BASE)
    strided["run"]["config"]["eval"].update(protocol="strided", stride=16)
    assert run_gate(tmp_path, base, strided) == 2  # ... but a non-default value is a real difference


def test_missing_or_corrupt_baseline_and_bad_usage_exit_2(tmp_path, capsys):
    c = write(tmp_path / "current.json", results(BASE))
    assert main(["gate", "--current", c, "--baseline", str(tmp_path / "none.json")]) == 2
    assert "baseline '" in capsys.readouterr().err
    truncated = json.dumps(results(BASE))[:200]
    assert run_gate(tmp_path, truncated, results(BASE)) == 2
    assert "is not valid JSON (truncated or corrupt?)" in capsys.readouterr().err
    assert main(["gate", "--baseline", c]) == 2
    assert "give --config (run the sweep now) or --current" in capsys.readouterr().err
    assert run_gate(tmp_path, results(BASE), results(BASE), "--set", "gate.per_encoding={rope: {slack: 1}}") == 2
    assert "unknown config key gate.per_encoding.rope.slack; valid keys: ppl_tol, ratio_tol, sigmas" in capsys.readouterr().err
    assert run_gate(tmp_path, results(BASE), results(BASE), "--ppl-tol", "-0.1") == 2
    assert "gate.ppl_tol must be a number >= 0, got -0.1" in capsys.readouterr().err


def test_update_baseline_writes_atomically_and_shows_the_changes(tmp_path, capsys):
    b = tmp_path / "baseline.json"
    c = write(tmp_path / "current.json", results(scaled(BASE, 1.1, "rope", 200)))
    assert main(["gate", "--current", c, "--baseline", str(b), "--update-baseline"]) == 0  # creates it
    assert json.loads(b.read_text()) == json.loads(Path(c).read_text())
    c2 = write(tmp_path / "current2.json", results(BASE))
    capsys.readouterr()
    assert main(["gate", "--current", c2, "--baseline", str(b), "--update-baseline"]) == 0
    out = capsys.readouterr().out
    assert "changes against the old baseline" in out and "-9.09%" in out
    assert json.loads(b.read_text()) == results(BASE)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["baseline.json", "current.json", "current2.json"]


# ------------------------------------------------------------------ results of another kind


def hf_eval(records, model="tiny-llama"):
    """Results of `posenc-bench eval` of a pretrained Hugging Face model, as bench/eval/pretrained.py writes them:
    no model or training config of ours, the model's own identity, rows named after it."""
    run = {"kind": "eval", "model": {"kind": "hf", "model": model, "ref": f"/models/{model}", "gguf_file": None,
                                     "files_sha256": "0123abcd", "dtype": "float32", "class": "LlamaForCausalLM"},
           "train_len": T, "train_len_source": "max_position_embeddings", "eval_lengths": [100, 200],
           "config": {"data": {"source": "stdlib"}, "rope_scaling": ["yarn"], "seeds": [0],
                      "eval": {"tokens": 40, "lens": None, "split": "all", "unit": 200, "position_buckets": 64}},
           "corpus": {"source": "stdlib", "fingerprint": "abc"}, "eval_fingerprint": "def", "device": "cpu",
           "versions": {"torch": "2.13.0", "transformers": "5.0.0"}, "git_commit": "0" * 40, "params": 1000}
    recs = [dict(r, encoding=f"hf:{model}" + ("+yarn" if r["encoding"] == "alibi" else "")) for r in records
            if r["encoding"] in ("rope", "alibi")]
    run["rows"] = list(dict.fromkeys(r["encoding"] for r in recs))
    return {"schema_version": 1, "run": run, "records": recs}


def checkpoint_eval(records):
    data = results(records)
    data["run"].update(kind="eval", train_len=T, model={"kind": "checkpoint", "path": "results/r/checkpoints/rope-s0",
                                                        "encoding": "rope", "window": None, "seed": 0})
    return data


ONE_KIND = "the gate compares results of one kind; make a baseline from the same {} --baseline <a new file>"
HF = "an eval of the Hugging Face model tiny-llama (posenc-bench eval)"


@pytest.mark.parametrize("base, cur, message", [
    (results(BASE), hf_eval(BASE), f"the current results are {HF}, the baseline a training run (posenc-bench run): "
     + ONE_KIND.format("eval with --update-baseline --current <that folder>")),
    (hf_eval(BASE), results(BASE), f"the current results are a training run (posenc-bench run), the baseline {HF}: "
     + ONE_KIND.format("config with --update-baseline --config <config>")),
    (hf_eval(BASE), checkpoint_eval(BASE), "the current results are an eval of the checkpoint "
     "results/r/checkpoints/rope-s0 (posenc-bench eval), the baseline " + HF),
])
def test_results_of_another_kind_are_refused_in_one_line_saying_what_each_is(tmp_path, capsys, base, cur, message):
    assert run_gate(tmp_path, base, cur) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"posenc-bench gate: error: {message}") and err.count("\n") == 1
    assert "model.d_model" not in err and "Regenerate" not in err  # no list of fields the other kind lacks


def test_update_baseline_keeps_a_readable_baseline_of_another_kind(tmp_path, capsys):
    b = write(tmp_path / "baseline.json", results(BASE))
    c = write(tmp_path / "current.json", hf_eval(BASE))
    assert main(["gate", "--current", c, "--baseline", b, "--update-baseline"]) == 2
    err = capsys.readouterr().err
    assert err == (f"posenc-bench gate: error: the current results are {HF}, the baseline a training run (posenc-bench "
                   f"run): --update-baseline keeps {b}; write the new baseline to another --baseline file (or delete "
                   "this one first)\n")
    assert json.loads(Path(b).read_text()) == results(BASE)  # untouched
    write(tmp_path / "baseline.json", json.dumps(results(BASE))[:200])  # unreadable: nothing to keep
    assert main(["gate", "--current", c, "--baseline", b, "--update-baseline"]) == 0
    assert "replacing an unreadable baseline" in capsys.readouterr().out
    assert json.loads(Path(b).read_text()) == hf_eval(BASE)


def test_evals_of_one_pretrained_model_are_gated_like_runs(tmp_path, capsys):
    assert run_gate(tmp_path, hf_eval(BASE), hf_eval(BASE)) == 0
    assert "gate: PASS: 6 checks, no regression" in capsys.readouterr().out
    assert run_gate(tmp_path, hf_eval(BASE), hf_eval(scaled(BASE, 1.1, "rope", 200))) == 1
    err = capsys.readouterr().err
    assert "hf:tiny-llama ppl at 2x (200) +10.00% > allowed +2.00%" in err
    assert "hf:tiny-llama ratio at 2x (200) +10.00% > allowed +2.00%" in err
    b = write(tmp_path / "baseline.json", hf_eval(BASE))
    c = write(tmp_path / "current.json", hf_eval(scaled(BASE, 1.1, "rope", 200)))
    assert main(["gate", "--current", c, "--baseline", b, "--update-baseline"]) == 0
    assert "+10.00%" in capsys.readouterr().out and json.loads(Path(b).read_text()) == json.loads(Path(c).read_text())
    # another model is the same kind of results, measured another way: refused with the fields named
    assert run_gate(tmp_path, hf_eval(BASE, "tiny-gpt2"), hf_eval(BASE)) == 2
    assert "model.ref: baseline '/models/tiny-gpt2', current '/models/tiny-llama'" in capsys.readouterr().err


TINY = ["--set", "encodings=[rope,alibi]", "--set", "train.train_len=32", "--set", "train.steps=40",
        "--set", "seeds=[0]", "--set", "train.warmup_steps=4", "--set", "eval.tokens=1024", "--progress", "off"]


def test_gate_runs_the_sweep_from_scratch_and_the_same_code_gives_the_same_numbers(tmp_path, capsys):
    base = str(tmp_path / "baseline.json")
    args = ["gate", "--config", "configs/ci.yaml", "--baseline", base, "--out", str(tmp_path / "g"), *TINY]
    assert main([*args, "--update-baseline"]) == 0
    assert main(args) == 0
    data = json.loads((tmp_path / "g" / "gate.json").read_text())
    assert data["verdict"] == "pass" and len(data["checks"]) == 14
    assert all(c["change"] == 0 for c in data["checks"])  # exactly, not approximately


@pytest.mark.slow
def test_gate_catches_a_rope_cache_that_wraps_at_the_train_length(tmp_path, capsys, monkeypatch):
    """The CI config's RoPE model, trained twice; the second time with RoPE broken on purpose as a cache
    that wraps around at the train length would be: training (positions below 64) is untouched, every
    position past it is wrong. The gate must fail at every length past 1x and nowhere else."""
    base = str(tmp_path / "baseline.json")
    args = ["gate", "--config", "configs/ci.yaml", "--baseline", base, "--out", str(tmp_path / "g"),
            "--set", "encodings=[rope]", "--set", "seeds=[0]", "--progress", "off"]
    assert main([*args, "--update-baseline"]) == 0
    from posenc_bench.encodings.rope import RoPE

    real = RoPE.rotate
    monkeypatch.setattr(RoPE, "rotate", lambda self, q, k, pos: real(self, q, k, pos % self.train_len))
    capsys.readouterr()
    assert main(args) == 1
    err = capsys.readouterr().err
    for length in ("1.5x (96)", "2x (128)", "4x (256)"):
        assert f"rope ppl at {length}" in err and f"rope ratio at {length}" in err
    assert "at 1x" not in err


def test_the_action_calls_the_gate_with_flags_that_exist_and_the_workflows_use_its_inputs():
    import shlex

    import yaml

    from posenc_bench.commands.cli import build_parser

    root = Path(__file__).resolve().parents[2]
    action = yaml.safe_load((root / "action.yml").read_text())
    steps = action["runs"]["steps"]
    script = next(s["run"] for s in steps if "posenc-bench gate" in s.get("run", ""))
    line = next(x for x in script.splitlines() if x.strip().startswith("posenc-bench gate"))
    line = line.replace('"${extra[@]}"', "--set plugins=[mypkg.plugin] --set encodings=[rope]").replace("$ARGS", "")
    values = {"$CONFIG": "ci", "$BASELINE": "base.json", "$OUT": "posenc-gate"}
    for var, value in values.items():
        line = line.replace(f'"{var}"', value)
    args = build_parser().parse_args(shlex.split(line)[1:])  # exits (SystemExit) on an unknown flag
    assert args.command == "gate" and args.config == "ci" and args.progress == "off"
    uploaded = next(s for s in steps if s.get("uses", "").startswith("actions/upload-artifact"))
    assert "${{ inputs.out }}/gate.md" in uploaded["with"]["path"] and uploaded["if"] == "always()"
    assert steps[-1]["run"].rstrip().endswith('exit "${CODE:-2}"')  # the gate's exit code passes through
    for workflow in (root / "examples" / "github-actions-gate.yml", root / ".github" / "workflows" / "posenc-gate.yml"):
        (step,) = [s for s in yaml.safe_load(workflow.read_text())["jobs"]["gate"]["steps"]
                   if "posenc-bench" in s.get("uses", "") or s.get("uses") == "./"]
        assert set(step["with"]) <= set(action["inputs"]), workflow.name
        assert "baseline" in step["with"]

def test_a_task_run_is_gated_on_the_drop_of_exact_match(tmp_path, capsys):
    """Exact match per size: a drop beyond gate.acc_tol (5 points) that the paired interval also excludes fails;
    the same numbers pass."""
    from tests.analysis.fake_results import arec, task_results

    good = [1] * 36 + [0] * 4  # 90% of 40 instances
    worse = [1] * 28 + [0] * 12  # 70%: the same instances, 8 more wrong
    base = task_results([arec(e, s, L, good) for e in ("rope", "alibi") for s in (0, 1) for L in (100, 200)])
    assert run_gate(tmp_path, base, base) == 0
    out = capsys.readouterr().out
    assert "| rope       | 1x (100) | accuracy" in out and "gate: PASS: 4 checks" in out
    cur = copy.deepcopy(base)
    for r in cur["records"]:
        if r["encoding"] == "rope" and r["eval_len"] == 200:
            r.update(arec("rope", r["seed"], 200, worse))
    assert run_gate(tmp_path, base, cur) == 1
    err = capsys.readouterr().err
    assert "rope accuracy at 2x (200) down 0.200 > allowed" in err and "1 regression(s) in 4 checks" in err
    assert run_gate(tmp_path, base, cur, "--acc-tol", "0.25") == 0  # a wider tolerance lets it through
