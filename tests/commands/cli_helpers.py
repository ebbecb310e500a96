"""What the command tests share: the micro run's flags, and the parser of each command."""

from posenc_bench.commands.cli import main

MICRO = ["--config", "configs/ci.yaml", "--seeds", "1", "--train-len", "32", "--steps", "8", "--eval-tokens", "1024",
         "--progress", "off"]

COMMANDS = ("run", "report", "plot", "gate", "passkey", "needles", "merge", "documents", "eval", "time", "list", "configs")
MINIMAL = {  # the fewest arguments each command's parser accepts
    "run": [], "report": ["r"], "plot": ["r"], "gate": ["--baseline", "b.json"], "passkey": ["--model", "m"], "needles": ["--model", "m"],
    "merge": ["a", "--out", "o"], "documents": ["r"], "eval": ["--model", "m"], "time": [], "list": [], "configs": [],
}


def run(tmp_path, *extra, out="out"):
    """`posenc-bench run` of the micro config into tmp_path/out."""
    return main(["run", *MICRO, "--out", str(tmp_path / out), *extra])


def parsed(command, *extra):
    from posenc_bench.commands.cli import build_parser

    return build_parser().parse_args([command, *MINIMAL[command], *extra])


def subparser(command):
    from posenc_bench.commands.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command]
