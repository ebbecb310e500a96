"""posenc-bench plot: figures from results folders."""

from __future__ import annotations

import argparse

from posenc_bench.commands.cli import split_commas, writing


def add_parser(sub) -> argparse.ArgumentParser:
    pl = sub.add_parser("plot", help="figures from results folders: ppl vs length, loss by position, encodings")
    pl.add_argument("results", nargs="+", help="results folder(s) or results.json file(s)")
    pl.add_argument("--out", default="runs/figures", help="output folder (default: runs/figures, which git ignores)")
    pl.add_argument("--formats", default="png,svg", help="comma list of png, svg (default: png,svg)")
    pl.add_argument("--rows", help="rows to draw, as run --encodings: rope,alibi | -learned (remove) | all (default)")
    pl.add_argument("--robustness", action="store_true",
                    help="the results are settings of the same rows (see report --robustness): draw each row's ratio "
                         "to 1x at the longest length per setting, robustness.png/svg, and nothing else")
    return pl


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.analysis import plots, robustness
    from posenc_bench.analysis.runs import load_runs

    from pathlib import Path

    runs = load_runs(args.results)
    with writing(args.out):
        if args.robustness:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            paths = robustness.plot(runs, Path(args.out), split_commas(args.formats))
        else:
            paths = plots.plot_all(runs, args.out, split_commas(args.formats), rows=args.rows)
    for path in paths:
        print(f"wrote {path}")
    return 0
