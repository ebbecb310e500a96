"""posenc-bench report: comparison table from results folders (Markdown, CSV, LaTeX, HTML, JSON)."""

from __future__ import annotations

import argparse

from posenc_bench.commands.cli import writing
from posenc_bench.errors import PosencError

# --format values; "markdown" is another name for md (the library's formats are posenc_bench.analysis.report.FORMATS)
FORMAT_ALIASES = {"markdown": "md"}
FORMATS = ("md", "markdown", "csv", "latex", "html", "json")


def add_parser(sub) -> argparse.ArgumentParser:
    rp = sub.add_parser("report", help="comparison table from results folders (Markdown, CSV, LaTeX, HTML, JSON)")
    rp.add_argument("results", nargs="+", help="results folder(s) or results.json file(s); several go side by side")
    rp.add_argument("--format", choices=FORMATS,
                    help="md (or markdown) | csv | latex | html | json; default: from the --out suffix "
                         "(.md .csv .tex .html .json), else md")
    rp.add_argument("--value", default="ppl,ratio,training,cost",  # analysis.report.DEFAULT_VALUES
                    help="tables, in order: a metric (ppl, bpb, ratio: ppl / ppl at 1x, accuracy, token_accuracy, "
                         "or a plugin's: posenc_bench/metrics) or a context table: training, cost (eval time and "
                         "peak memory, where measured), depths (the needle task) (default: ppl,ratio,training,cost; "
                         "a task run's: accuracy,token_accuracy,training,depths)")
    rp.add_argument("--digits", type=int, default=2, help="decimals in table cells (default 2)")
    rp.add_argument("--no-best", action="store_true", help="do not bold the best value in each column")
    rp.add_argument("--ci", type=float, default=0.95, metavar="LEVEL",
                    help="level of the intervals and of the correction for the number of comparisons, between 0 "
                         "and 1 (default 0.95): on the log scale, t over the training seeds with the text's document "
                         "bootstrap, or with one seed the text's alone (this checkpoint)")
    rp.add_argument("--compare", metavar="ROW",
                    help="add every row's ppl relative to ROW (e.g. rope) at the same length, with its paired "
                         "interval; * where the interval excludes 1 by at least 0.1%%; on a task run, exact match "
                         "(and the answer-token share, each after its own table) minus ROW's, * where the "
                         "interval excludes 0 by at least 1 point")
    rp.add_argument("--findings", action="store_true",
                    help="instead of tables, list every claim the intervals support (row A vs row B at a length, "
                         "and each row against its own 1x), with its ratio, interval and level (method, or this "
                         "checkpoint with one seed); with --update, the block '<!-- posenc-bench findings: RESULTS "
                         "-->'; with one --value (e.g. longppl), the claims between rows by that metric, block "
                         "'findings-VALUE'")
    rp.add_argument("--robustness", action="store_true",
                    help="the results are settings of the same rows (tokenizer, model size, ...): each row's ratio "
                         "to 1x per setting, Kendall's tau between the settings' rankings at the longest length, "
                         "and whether each claim holds in every setting; with --update, the block "
                         "'<!-- posenc-bench robustness: RESULTS -->'")
    rp.add_argument("--claims", metavar="RESULTS",
                    help="with --robustness: the results folder whose findings are checked (default: the first "
                         "setting), e.g. the headline's")
    rp.add_argument("--out", help="write to this file (atomically) instead of printing")
    rp.add_argument("--update", metavar="FILE",
                    help="rewrite the block between '<!-- posenc-bench table: RESULTS -->' and "
                         "'<!-- /posenc-bench table -->' in FILE (e.g. README.md)")
    return rp


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.analysis import report
    from posenc_bench.analysis.runs import load_runs
    from posenc_bench.files import atomic_write_text

    runs = load_runs(args.results)
    fmt = report.format_for(args.out, FORMAT_ALIASES.get(args.format, args.format))
    if args.claims and not args.robustness:
        raise PosencError("--claims goes with --robustness (the folder whose findings each setting is checked for)")
    if args.findings and args.robustness:
        raise PosencError("--findings and --robustness are two reports: give one")
    if (args.update or args.findings or args.robustness) and fmt != "md":
        what = "--findings" if args.findings else "--robustness" if args.robustness else "--update"
        raise PosencError(f"{what} writes Markdown; drop --format {fmt}" + ("" if args.findings else " (or write it with --out)"))
    if not 0 < args.ci < 1:
        raise PosencError(f"--ci {args.ci:g}: the level must be between 0 and 1 (e.g. 0.95, 0.9)")
    value = None  # --findings: the metric compared, where --value names another than the primary (findings-VALUE)
    if args.findings and tuple(names := report.parse_values(args.value)) != report.DEFAULT_VALUES:
        if len(names) > 1:
            raise PosencError(f"--findings compares rows by one metric: give one --value, not {','.join(names)}")
        value = None if names[0] == report.runs_kind(runs).primary else names[0]
    if args.findings:
        text = report.render_findings(runs, ci=args.ci, by=value)
    elif args.robustness:
        claims = load_runs([args.claims])[0] if args.claims else None
        text = report.render_robustness(runs, claims, ci=args.ci)
    else:
        text = report.render(runs, fmt=fmt, values=args.value, digits=args.digits, mark_best=not args.no_best,
                             ci=args.ci, compare=args.compare)
    if args.update:
        key = report.marker_key(args.results)
        kind = (f"findings-{value}" if value else "findings") if args.findings else (
            "robustness" if args.robustness else "table")
        changed = report.update_file(args.update, key, text, kind)
        print(f"{'updated' if changed else 'already up to date'}: {args.update} ({kind} block {key})")
    if args.out:
        with writing(args.out):
            atomic_write_text(args.out, text)
        print(f"wrote {args.out}")
    if not args.update and not args.out:
        print(text, end="")
    return 0
