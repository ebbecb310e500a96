"""Every bad input a user can type is one line on stderr and exit code 2: no traceback, no argparse usage dump.

THE table of bad inputs tried: a new bad input (a user's report, a case you noticed) goes in ``BAD`` below as
(argv, a fragment of the one line it must print). In argv, ``{tmp}`` is a fresh folder and ``{file}`` an
existing file in it (a path under it cannot be a folder, even for root). Older one-line checks live beside
their commands (tests/commands/test_run.py, test_time.py, test_plot.py, ...); this table grows instead.
"""

import os

import pytest

from posenc_bench.commands.cli import main

RESULTS = "results/default"  # a committed results folder
TINY = ["--config", "ci", "--train-len", "16", "--steps", "2", "--eval-tokens", "64", "--progress", "off"]

BAD = [
    # sizes that must be positive: the config names the key, its range and the value (before torch sees it)
    (["run", "--config", "ci", "--train-len", "-5", "--out", "{tmp}/o"], "run: error: train.train_len must be >= 1, got -5"),
    (["run", "--steps", "0", "--out", "{tmp}/o"], "run: error: train.steps must be >= 1, got 0"),
    (["run", "--config", "ci", "--batch-size", "0", "--out", "{tmp}/o"], "train.batch_size must be >= 1, got 0"),
    (["run", "--config", "ci", "--eval-tokens", "-3", "--out", "{tmp}/o"], "eval.tokens must be >= 1, got -3"),
    (["run", "--config", "ci", "--d-model", "0", "--out", "{tmp}/o"], "model.d_model must be a whole number >= 1, got 0"),
    (["run", "--config", "ci", "--set", "model.mlp_ratio=0", "--out", "{tmp}/o"],
     "model.mlp_ratio must be a whole number >= 1, got 0"),
    (["run", "--seeds", "0", "--out", "{tmp}/o"], "--seeds '0': the count must be at least 1 (one seed by its number: --seeds 0,)"),
    (["run", "--seeds", "x", "--out", "{tmp}/o"], "--seeds 'x': give a count (3 = seeds 0,1,2) or a list (0,5,7)"),
    # a value that begins with '-' reaches its option, and the option's own parser names it
    (["run", "--eval-lens", "-2x", "--out", "{tmp}/o"], "eval length '-2x' gives -256 tokens; an eval length must be at least 1"),
    # names: each error lists the valid ones
    (["run", "--config", "nosuch"], "config 'nosuch' is neither a file nor a built-in config; built-in configs: ci, default"),
    (["run", "--encodings", "nosuch", "--out", "{tmp}/o"], "unknown encoding 'nosuch'; valid encodings: sinusoidal, learned"),
    (["needles", "--model", "m", "--variants", "multikeys"],
     "needles: error: --variants multikeys: not a needle variant; valid: multikey, multivalue, multiquery"),
    (["needles", "--model", "m", "--rope-scaling", "bogus"], "needles: error: --rope-scaling 'bogus' is not a scaling; valid: linear, "),
    (["needles", "--model", "m", "--depths", "0,2"], "needles: error: needle depth 2.0 is outside [0, 1]"),
    (["needles", "--model", "m", "--threshold", "85.6"], "needles: error: --threshold 85.6: a share of needles in (0, 1]"),
    (["needles", "--model", "m", "--threshold", "high"], "needles: error: --threshold 'high': a share (e.g. 0.856) or 1x"),
    # inputs that are not there
    (["report", "nowhere"], "report: error: no results file at 'nowhere'"),
    (["plot", "nowhere"], "plot: error: no results file at 'nowhere'"),
    (["documents", "{tmp}"], "documents: error: no results file at '{tmp}/results.json'"),
    (["documents", "{file}"], "documents: error: '{file}' is not valid JSON (truncated or corrupt?)"),
    (["gate", "--baseline", "nowhere.json", "--current", "nowhere"], "gate: error: baseline 'nowhere.json' not found"),
    (["eval", "--model", "hf:/nonexistent", "--out", "{tmp}/e"],
     "eval: error: --model 'hf:/nonexistent': '/nonexistent' is not a folder, and not a hub name (org/name)"),
    # outputs that cannot be written: the path and the reason
    (["run", "--config", "ci", "--out", "/proc/x"], "output folder '/proc/x' cannot be written: creating it failed ("),
    (["report", RESULTS, "--out", "{file}/out.md"], "report: error: cannot write '{file}/out.md': '{file}' is a file, not a folder"),
    (["report", RESULTS, "--out", "{file}/sub/out.md"], "report: error: cannot write '{file}/sub/out.md': Not a directory"),
    (["gate", "--baseline", f"{RESULTS}/results.json", "--current", RESULTS, "--out", "{file}/gate"],
     "gate: error: cannot write '{file}/gate': Not a directory"),
    (["plot", RESULTS, "--out", "{file}/figures"], "plot: error: cannot write '{file}/figures': Not a directory"),
    # what argparse refuses: its message, as one line naming the command
    (["run", "--bogus"], "posenc-bench run: error: unrecognized arguments: --bogus"),
    (["run", "--progress", "maybe"], "posenc-bench run: error: argument --progress: invalid choice: 'maybe'"),
    (["run", "--steps", "abc"], "posenc-bench run: error: argument --steps: invalid int value: 'abc'"),
    (["run", "--eval-lens"], "posenc-bench run: error: argument --eval-lens: expected one argument"),
    (["report"], "posenc-bench report: error: the following arguments are required: results"),
    (["documents"], "posenc-bench documents: error: the following arguments are required: folders"),
    (["nosuch"], "posenc-bench: error: argument command: invalid choice: 'nosuch'"),
    ([], "posenc-bench: error: the following arguments are required: command"),
]


def one_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and "usage:" not in out + err, err
    assert err.count("\n") == 1 and err.startswith("posenc-bench"), err
    return err.rstrip("\n")


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(argv) or "(nothing)" for argv, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    (tmp_path / "file.txt").write_text("a file, not a folder")
    fill = {"{tmp}": str(tmp_path), "{file}": str(tmp_path / "file.txt")}

    def filled(text: str) -> str:
        for key, value in fill.items():
            text = text.replace(key, value)
        return text

    assert main([filled(a) for a in argv]) == 2
    assert filled(message) in one_line(capsys)


@pytest.mark.parametrize("argv", [["report", RESULTS, "--out", "{ro}/table.md"],
                                  ["plot", RESULTS, "--out", "{ro}/figures"],
                                  ["gate", "--baseline", f"{RESULTS}/results.json", "--current", RESULTS,
                                   "--out", "{ro}/gate"]])
def test_an_out_in_a_read_only_folder_names_the_path_and_the_reason(argv, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        if os.access(ro, os.W_OK):
            pytest.skip("root writes into a read-only folder (the {file} cases above fail for root too)")
        assert main([a.replace("{ro}", str(ro)) for a in argv]) == 2
        err = one_line(capsys)
        assert f"cannot write '{ro}/" in err and "Permission denied" in err
    finally:
        ro.chmod(0o700)


def test_an_os_error_the_command_did_not_name_is_still_one_line(monkeypatch, capsys):
    """The CLI's net under ``writing``: an OSError from any command is one line naming the path, and exit 2."""
    from posenc_bench.commands import list as list_command

    def cmd(args):
        raise PermissionError(13, "Permission denied", "/somewhere/out.md")

    monkeypatch.setattr(list_command, "cmd", cmd)
    assert main(["list"]) == 2
    assert one_line(capsys) == "posenc-bench list: error: cannot read or write '/somewhere/out.md': Permission denied"


@pytest.mark.parametrize("argv,value", [(["run", "--eval-lens", "-2x"], ("eval_lens", "-2x")),
                                        (["run", "--encodings", "-learned"], ("encodings", "-learned")),
                                        (["plot", "r", "--rows", "-rope"], ("rows", "-rope")),
                                        (["run", "--train-len", "-5"], ("train_len", -5))])
def test_a_value_that_begins_with_a_dash_reaches_its_option(argv, value):
    from posenc_bench.commands.cli import build_parser, values_not_options

    parser = build_parser()
    args = parser.parse_args(values_not_options(parser, argv))
    assert getattr(args, value[0]) == value[1]


def test_an_option_after_an_option_is_still_an_option():
    """Only a value that is none of the command's options is rewritten: `--out --fresh` still lacks its value,
    `--out --fre` (an abbreviation) too, and nothing after `--` is touched."""
    from posenc_bench.commands.cli import build_parser, values_not_options

    parser = build_parser()
    for argv in (["run", "--out", "--fresh"], ["run", "--out", "--fre"], ["run", "--fresh", "-x"],
                 ["report", "r", "--", "--out", "-x"], ["--version"]):
        assert values_not_options(parser, argv) == argv
    assert values_not_options(parser, ["run", "--out", "-o", "--eval-lens", "-1x"]) == ["run", "--out=-o", "--eval-lens=-1x"]


def test_run_encodings_minus_a_row_runs_the_others(tmp_path, capsys):
    """`--encodings -learned` (spaced, as a user types it): the config's rows but learned."""
    import json

    from posenc_bench.bench.config import load_config

    argv = ["run", *TINY, "--seeds", "1", "--encodings", "-learned", "--out", str(tmp_path / "o"), "--eval-lens", "1x"]
    assert main(argv) == 0, capsys.readouterr().err
    rows = {r["encoding"] for r in json.loads((tmp_path / "o" / "results.json").read_text())["records"]}
    assert rows == set(load_config("ci").encodings) - {"learned"}


def test_help_is_argparses_own(capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", "--help"])
    assert e.value.code == 0 and capsys.readouterr().out.startswith("usage: posenc-bench run [-h]")
