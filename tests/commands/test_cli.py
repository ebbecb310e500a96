"""The command line as a whole: one module per command, the same flags spelled the same way, errors as one
line and exit 2, interruptions (Ctrl-C, SIGTERM) that release every lock and say how to resume."""

import subprocess
import sys

import pytest

from posenc_bench.commands.cli import main

from tests.commands.cli_helpers import COMMANDS, MICRO, parsed, subparser


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
    from posenc_bench.values import PRECISIONS, TRAIN_PRECISIONS

    assert tuple(env.DTYPES) == PRECISIONS and set(TRAIN_PRECISIONS) <= set(PRECISIONS)
    for command, valid in (("run", TRAIN_PRECISIONS), ("eval", PRECISIONS), ("time", TRAIN_PRECISIONS)):
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

    for command in ("passkey", "needles", "time", "eval", "run"):
        assert parsed(command).device == "auto", command
        assert "auto" in next(a for a in subparser(command)._actions if a.dest == "device").help
    for command in set(COMMANDS) - {"passkey", "needles", "time", "eval", "run"}:
        assert not hasattr(parsed(command), "device"), command
    # run's auto leaves a config file's device (configs/long-2048.yaml: cuda) alone; a typed --device wins
    assert "device" not in overrides(parsed("run"), [])
    assert overrides(parsed("run", "--device", "auto"), [])["device"] == "auto"
    assert overrides(parsed("run", "--device", "cpu"), [])["device"] == "cpu"


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


def test_building_the_parser_imports_neither_torch_nor_the_library():
    code = ("import sys; from posenc_bench.commands.cli import build_parser; build_parser(); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith(('posenc_bench.bench', "
            "'posenc_bench.hf', 'posenc_bench.encodings', 'posenc_bench.analysis'))))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "[]", res.stdout + res.stderr


def test_version_comes_from_the_package(capsys):
    from posenc_bench import __version__

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"posenc-bench {__version__}\n"
