"""End-to-end: `posenc-bench run` on a micro config, resume, n/a cells, bad input."""

import json
import subprocess
import sys

import pytest

from posenc_bench.commands.cli import main

MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
         "--progress", "off"]


def run(tmp_path, *extra, out="out"):
    return main(["run", *MICRO, "--out", str(tmp_path / out), *extra])


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    assert main(["run", *MICRO, "--out", str(tmp / "out"), "--encodings", ROWS]) == 0
    return tmp / "out"


ROWS = "rope,rope-linear,learned,alibi,nope+sw16"


def test_results_schema_and_files(finished):
    data = json.loads((finished / "results.json").read_text())
    recs = data["records"]
    assert {(r["encoding"], r["eval_len"]) for r in recs} == {
        (e, L) for e in ("rope", "rope-linear", "learned", "alibi", "nope+sw16") for L in (32, 48, 64, 128)
    }
    windowed = [r for r in recs if r["encoding"] == "nope+sw16"]
    assert all(r["window"] == 16 and r["base_encoding"] == "nope" and r["status"] == "ok" for r in windowed)
    required = {"encoding", "seed", "train_len", "eval_len", "ratio", "ppl", "bpb", "loss", "tokens", "status",
                "reason", "train_time_s", "eval_time_s", "config", "corpus_fingerprint", "eval_fingerprint",
                "versions", "device", "git_commit", "loss_by_position"}
    ok = [r for r in recs if r["status"] == "ok"]
    assert all(required <= set(r) for r in ok)
    tokens = {r["tokens"] for r in ok}
    assert len(tokens) == 1  # the same target tokens at every length
    assert data["run"]["eval_lengths"] == [32, 48, 64, 128]
    assert (finished / "results.csv").read_text().startswith("encoding,seed,")
    table = (finished / "table.md").read_text()
    assert "| rope-linear |" in table.replace("  ", "") or "rope-linear" in table
    assert "1.5x (48)" in table
    assert list(finished.glob("**/*.tmp")) == []
    # rope-linear reused rope's checkpoint: identical numbers at the train length
    at1 = {r["encoding"]: r["ppl"] for r in ok if r["eval_len"] == 32}
    assert at1["rope"] == at1["rope-linear"]
    assert not (finished / "checkpoints" / "rope-linear-seed0").exists()


def test_learned_past_its_table_is_na_with_reason(finished):
    recs = json.loads((finished / "results.json").read_text())["records"]
    learned = {r["eval_len"]: r for r in recs if r["encoding"] == "learned"}
    assert learned[32]["status"] == "ok"
    for L in (48, 64, 128):
        assert learned[L]["status"] == "n/a" and "32 rows" in learned[L]["reason"] and learned[L]["ppl"] is None
    assert "n/a [1]" in (finished / "table.md").read_text()


def test_rerun_resumes_without_redoing_finished_cells(finished, capsys):
    before = (finished / "results.json").read_text()
    assert main(["run", *MICRO, "--out", str(finished), "--encodings", ROWS]) == 0
    out = capsys.readouterr().out
    assert out.count("done before, skipped") == 5
    after = json.loads((finished / "results.json").read_text())
    assert [r["ppl"] for r in after["records"]] == [r["ppl"] for r in json.loads(before)["records"]]


def test_interrupted_sweep_resumes_and_reuses_checkpoints(tmp_path, capsys, monkeypatch):
    import posenc_bench.bench.sweep as runner

    calls = []
    real = runner.Sweep.run_cell

    def flaky(self, row, seed):
        if row == "nope":
            raise KeyboardInterrupt
        calls.append(row)
        return real(self, row, seed)

    monkeypatch.setattr(runner.Sweep, "run_cell", flaky)
    assert run(tmp_path, "--encodings", "alibi,nope,t5") == 130  # interrupted at the second cell
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {r["encoding"] for r in data["records"]} == {"alibi"}
    monkeypatch.setattr(runner.Sweep, "run_cell", real)
    capsys.readouterr()
    assert run(tmp_path, "--encodings", "alibi,nope,t5") == 0
    out = capsys.readouterr().out
    assert "alibi seed 0: done before, skipped" in out
    assert "nope seed 0: trained" in out and "t5 seed 0: trained" in out


def test_same_config_twice_gives_the_same_numbers(tmp_path):
    assert run(tmp_path, "--encodings", "t5", out="a") == 0
    assert run(tmp_path, "--encodings", "t5", out="b") == 0
    a = json.loads((tmp_path / "a" / "results.json").read_text())["records"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["ppl"] for r in a] == [r["ppl"] for r in b]


def test_diverged_run_is_recorded_and_the_sweep_goes_on(tmp_path):
    assert run(tmp_path, "--encodings", "rope,rope-linear,alibi", "--lr", "80", "--set", "train.grad_clip=1e9",
               "--set", "train.warmup_steps=1") == 0
    recs = json.loads((tmp_path / "out" / "results.json").read_text())["records"]
    statuses = {r["encoding"]: r["status"] for r in recs}
    assert statuses["rope"] == "diverged" and statuses["rope-linear"] == "diverged"
    div = [r for r in recs if r["status"] == "diverged"]
    assert all("diverged at step" in r["reason"] for r in div)
    assert "diverged" in (tmp_path / "out" / "table.md").read_text()


@pytest.mark.parametrize("args,message", [
    (["--steps", "9"], "different 'train' config"),
    (["--precision", "bf16"], "different 'precision' config"),
    (["--eval-lens", "1,2x"], "evaluated at other lengths"),
])
def test_other_config_in_same_folder_is_refused(finished, capsys, args, message):
    assert main(["run", *MICRO, "--out", str(finished), "--encodings", "rope", *args]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--encodings", "rope,rotary"], "unknown encoding 'rotary'; valid encodings: sinusoidal, learned"),
    (["--set", "model.width=3"], "unknown config key model.width; valid keys of model: d_model"),
    (["--d-model", "36", "--encodings", "rope"], "needs an even head dimension"),
    (["--n-heads", "5"], "n_heads=5 does not divide model.d_model=64"),
    (["--eval-lens", "0"], "must be at least 1"),
    (["--data", "/no/such/dir/*.txt"], "'/no/such/dir/*.txt' is not a readable file"),
    (["--device", "cuda"] , "CUDA is not available"),
    (["--seeds", "zero"], "--seeds 'zero'"),
])
def test_bad_input_is_one_clear_line_and_exit_2(tmp_path, capsys, args, message):
    import torch

    if "cuda" in args and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert run(tmp_path, *args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_list_and_console_script_exit_codes():
    res = subprocess.run([sys.executable, "-m", "posenc_bench", "list"], capture_output=True, text=True)
    assert res.returncode == 0
    names = [line.split()[0] for line in res.stdout.splitlines()]
    assert names[:4] == ["sinusoidal", "learned", "rope", "rope-partial"] and names[-3:] == ["fire+rand", "<name>+sw<W>", "<name>+sink<S>+sw<W>"]
    assert "rope-yarn" in names and "rope-linear-ft" in names and "cope" in names
    lines = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "relative bias" in lines["fire"] and "arXiv:2310.04418" in lines["fire"]  # family and paper
    bad = subprocess.run([sys.executable, "-m", "posenc_bench", "run", "--encodings", "xpos2"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown encoding 'xpos2'" in bad.stderr


def test_fresh_starts_over_in_the_same_folder(tmp_path, capsys):
    assert run(tmp_path, "--encodings", "nope") == 0
    assert run(tmp_path, "--encodings", "nope", "--steps", "9") == 2
    (tmp_path / "out" / "README.md").write_text("notes on this run")  # a user's file in the folder
    assert run(tmp_path, "--encodings", "nope", "--steps", "9", "--fresh") == 0
    assert (tmp_path / "out" / "README.md").read_text() == "notes on this run"  # --fresh removes only run outputs
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["run"]["config"]["train"]["steps"] == 9
    assert {r["config"]["train"]["steps"] for r in data["records"]} == {9}


def test_seeds_give_mean_and_spread_and_the_saved_config_reproduces_the_run(tmp_path, capsys):
    from posenc_bench.bench.config import load_config

    assert run(tmp_path, "--encodings", "alibi", "--seeds", "2", "--progress", "auto") == 0
    captured = capsys.readouterr()
    assert captured.err == ""  # no progress bars when stderr is not a terminal
    assert "effective config:" in captured.out and "| alibi" in captured.out  # config and table printed
    out = tmp_path / "out"
    recs = json.loads((out / "results.json").read_text())["records"]
    assert sorted({r["seed"] for r in recs}) == [0, 1]
    assert "±" in (out / "table.md").read_text()
    saved = load_config(str(out / "config.yaml"))
    assert saved.to_dict() == json.loads((out / "results.json").read_text())["run"]["config"]
    assert saved.seeds == [0, 1] and saved.train.steps == 8 and saved.encodings == ["alibi"]


def test_interrupted_training_continues_from_its_last_save(tmp_path, capsys, monkeypatch):
    from posenc_bench import data

    real_next, calls = data.TrainBatches.next, []

    def next_or_interrupt(self):
        calls.append(1)
        if len(calls) == 7:  # step 6 of 8; the run saved its state after step 4
            raise KeyboardInterrupt
        return real_next(self)

    monkeypatch.setattr(data.TrainBatches, "next", next_or_interrupt)
    assert run(tmp_path, "--encodings", "rope", "--set", "save_every=4", out="a") == 130
    assert (tmp_path / "a" / "checkpoints" / "rope-seed0" / "train_state.pt").is_file()
    monkeypatch.setattr(data.TrainBatches, "next", real_next)
    capsys.readouterr()
    assert run(tmp_path, "--encodings", "rope", "--set", "save_every=4", out="a") == 0
    assert "rope seed 0: resuming from step 4 of 8" in capsys.readouterr().out
    assert not (tmp_path / "a" / "checkpoints" / "rope-seed0" / "train_state.pt").exists()
    assert run(tmp_path, "--encodings", "rope", out="b") == 0  # uninterrupted, same config otherwise
    a = json.loads((tmp_path / "a" / "results.json").read_text())["records"]
    b = json.loads((tmp_path / "b" / "results.json").read_text())["records"]
    assert [r["ppl"] for r in a] == [r["ppl"] for r in b]
    assert a[0]["train_curve"] == b[0]["train_curve"]


@pytest.mark.parametrize("value,expected", [
    ("rope,alibi,-learned", ["rope", "alibi"]),
    ("-learned,-rope-linear", ["sinusoidal", "t5", "rope", "alibi", "nope"]),
    ("all,-nope,-rope-ft", ["sinusoidal", "learned", "rope", "rope-partial", "xpos", "xpos+bca", "rope-linear",
                            "rope-ntk", "rope-dynamic", "rope-yarn", "rope-llama3", "rope-linear-ft", "rope-ntk-ft",
                            "rope-dynamic-ft", "rope-yarn-ft", "rope-llama3-ft", "rope-rerope", "rope-leaky",
                            "rope-selfextend", "t5", "alibi", "kerple",
                            "kerple-power", "fire", "cope", "sinusoidal+rand", "learned+rand", "rope+rand",
                            "rope-partial+rand", "xpos+rand", "alibi+rand", "kerple+rand", "kerple-power+rand",
                            "fire+rand"]),
    ("xpos+bca,learned+rand+sw8", ["xpos+bca", "learned+rand+sw8"]),
    ("rope+sw16,alibi", ["rope+sw16", "alibi"]),
])
def test_encodings_flag(value, expected):
    from posenc_bench.commands.run import parse_encodings
    from posenc_bench.bench.config import RunConfig

    assert parse_encodings(value, RunConfig().encodings) == expected


def test_corrupt_results_file_is_a_clear_error(tmp_path, capsys):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "results.json").write_text('{"schema_version": 1, "run": {')
    assert run(tmp_path, "--encodings", "nope") == 2
    assert "truncated or corrupt" in capsys.readouterr().err
    assert (tmp_path / "out" / "results.json").read_text() == '{"schema_version": 1, "run": {'  # left as it was


def test_strided_protocol_is_recorded_and_captioned(tmp_path, capsys):
    assert run(tmp_path, "--encodings", "rope", "--protocol", "strided", "--stride", "8") == 0
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert {(r["eval_len"], r["protocol"], r["stride"]) for r in data["records"]} == {
        (32, "strided", 8), (48, "strided", 8), (64, "strided", 8), (128, "strided", 8)}
    assert "strided protocol: each window scores its last 8 targets" in (tmp_path / "out" / "table.md").read_text()
    assert run(tmp_path, "--encodings", "rope", "--stride", "8", out="bad") == 2
    assert "the strided protocol needs a stride >= 1 token" in capsys.readouterr().err


# ---- the command modules: one per command, the same flags spelled the same way ---------------------------

COMMANDS = ("run", "report", "plot", "gate", "passkey", "merge", "eval", "time", "list", "configs")
MINIMAL = {  # the fewest arguments each command's parser accepts
    "run": [], "report": ["r"], "plot": ["r"], "gate": ["--baseline", "b.json"], "passkey": ["--model", "m"],
    "merge": ["a", "--out", "o"], "eval": ["--model", "m"], "time": [], "list": [], "configs": [],
}


def parsed(command, *extra):
    from posenc_bench.commands.cli import build_parser

    return build_parser().parse_args([command, *MINIMAL[command], *extra])


def subparser(command):
    from posenc_bench.commands.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command]


def test_one_module_per_command_and_nothing_outside_commands_imports_them():
    import importlib
    import re
    from pathlib import Path

    from posenc_bench.commands import cli

    assert cli.COMMANDS == COMMANDS
    for name in COMMANDS:
        module = importlib.import_module(f"posenc_bench.commands.{name}")
        assert callable(module.add_parser) and callable(module.cmd)
        assert parsed(name).func is module.cmd and parsed(name).command == name
    package = Path(cli.__file__).resolve().parents[1]
    importers = [str(p.relative_to(package)) for p in package.rglob("*.py")
                 if "commands" not in p.relative_to(package).parts[:1]
                 and re.search(r"posenc_bench\.commands|from posenc_bench import commands", p.read_text())]
    assert importers == ["__main__.py"]  # python -m posenc_bench: the entry point only


def test_precision_is_one_flag_with_the_env_vocabulary():
    from posenc_bench import env
    from posenc_bench.bench import timing
    from posenc_bench.commands import cli, run, time

    assert cli.PRECISIONS == tuple(env.PRECISIONS)
    assert time.PRECISIONS == timing.PRECISIONS and set(run.PRECISIONS) <= set(env.PRECISIONS)
    for command, valid in (("run", run.PRECISIONS), ("eval", cli.PRECISIONS), ("time", time.PRECISIONS)):
        flags = {o: a for a in subparser(command)._actions for o in a.option_strings}
        assert "--precision" in flags and "--dtype" not in flags, command
        assert flags["--precision"].help.startswith(" | ".join(valid)), (command, flags["--precision"].help)
    for command in set(COMMANDS) - {"run", "eval", "time"}:
        flags = {o for a in subparser(command)._actions for o in a.option_strings}
        assert not flags & {"--precision", "--dtype"}, command
    assert parsed("time").precision == "fp32"
    assert parsed("eval").precision is None and parsed("run").precision is None  # the model's / the config's


def test_device_default_is_auto_in_every_command_with_a_device():
    from posenc_bench.commands.run import overrides

    for command in ("passkey", "time", "eval", "run"):
        assert parsed(command).device == "auto", command
        assert "auto" in next(a for a in subparser(command)._actions if a.dest == "device").help
    for command in set(COMMANDS) - {"passkey", "time", "eval", "run"}:
        assert not hasattr(parsed(command), "device"), command
    # run's auto leaves a config file's device (configs/long-2048.yaml: cuda) alone; a typed --device wins
    assert "device" not in overrides(parsed("run"), [])
    assert overrides(parsed("run", "--device", "auto"), [])["device"] == "auto"
    assert overrides(parsed("run", "--device", "cpu"), [])["device"] == "cpu"


def test_report_format_markdown_is_md(tmp_path, capsys):
    from posenc_bench.analysis import report

    folder = "results/default"  # committed
    assert main(["report", folder, "--format", "md"]) == 0
    md = capsys.readouterr().out
    assert main(["report", folder, "--format", "markdown"]) == 0
    assert capsys.readouterr().out == md == report.render(report.load_runs([folder]), fmt="md")
    assert main(["report", folder, "--format", "markdown", "--out", str(tmp_path / "t.txt")]) == 0
    assert (tmp_path / "t.txt").read_text() == md
    readme = tmp_path / "README.md"
    readme.write_text(f"<!-- posenc-bench table: {folder} -->\n<!-- /posenc-bench table -->\n")
    assert main(["report", folder, "--format", "markdown", "--update", str(readme)]) == 0  # --update takes it too
    assert report.read_block(readme.read_text(), folder) == md


def test_eval_precision_fp8_is_one_line_naming_the_valid_ones(tmp_path, capsys):
    # checked before the model is looked for: this folder does not exist either
    assert main(["eval", "--model", "hf:/no/such/folder", "--precision", "fp8", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err == "posenc-bench eval: error: precision 'fp8' is not supported here; valid: fp32, bf16, fp16\n"
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command, argv, example", [
    ("run", MICRO, "train.warmup_steps=50"),
    ("gate", ["--current", "nowhere", "--baseline", "b.json"], "gate.ratio_tol=0.05"),
])
def test_set_needs_key_equals_value_in_run_and_gate(tmp_path, capsys, command, argv, example):
    assert main([command, *argv, "--out", str(tmp_path / "o"), "--set", "oops"]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc-bench {command}: error: --set 'oops': expected KEY=VALUE, e.g. --set {example}\n"


def test_set_values_are_yaml_and_the_last_wins():
    from posenc_bench.commands.cli import parse_set

    assert parse_set(["a.b=1", "c= [1, 2]", "a.b=x"], "k=v") == {"a.b": "x", "c": [1, 2]}
    assert parse_set(None, "k=v") == {}


def test_passkey_rope_scalings_are_the_hf_table():
    from posenc_bench.hf.rope import SCALINGS

    action = next(a for a in subparser("passkey")._actions if a.dest == "rope_scaling")
    assert tuple(action.choices) == tuple(SCALINGS)


def test_building_the_parser_imports_neither_torch_nor_the_library():
    code = ("import sys; from posenc_bench.commands.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('posenc_bench.bench', "
            "'posenc_bench.hf', 'posenc_bench.encodings', 'posenc_bench.analysis'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_records_carry_units_and_the_table_flags_models_on_the_plateau(finished):
    """Every measured record keeps its per-unit sums (units of the longest eval length, the same for every row
    and length), and an 8-step model that has not learned to use context is flagged in table.md."""
    data = json.loads((finished / "results.json").read_text())
    ok = [r for r in data["records"] if r["status"] == "ok"]
    S = data["run"]["segment_len"]
    for r in ok:
        u = r["units"]
        assert u["size"] == 128 and len(u["nll"]) == data["run"]["eval_tokens"] // S * -(-S // 128)
        assert sum(u["tokens"]) == r["tokens"] and sum(u["bytes"]) == r["bytes"]
        assert sum(u["nll"]) == pytest.approx(r["loss"] * r["tokens"], rel=1e-9)
    assert len({tuple(r["units"]["tokens"]) for r in ok}) == 1
    table = (finished / "table.md").read_text()
    assert "uses only local context" in table and "Intervals: 95%, paired bootstrap over" in table


def test_version_comes_from_the_package(capsys):
    from posenc_bench import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"posenc-bench {__version__}\n"


def test_configs_lists_every_built_in_config_with_purpose_and_cost(capsys):
    from posenc_bench.bench.config import builtin_configs

    assert main(["configs"]) == 0
    out = capsys.readouterr().out
    for name in builtin_configs():
        assert f"\n{name} " in f"\n{out}"
    assert "Small sweep for tests and the CI regression gate" in out
    assert "cost: 6 trained model(s) x 400 steps of 32 x 128 tokens" in out and "its comment states ~10 min" in out


def test_run_with_an_unknown_config_name_lists_the_built_in_ones(capsys):
    assert main(["run", "--config", "defualt"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "built-in configs: ci, default, full, long-2048" in err
