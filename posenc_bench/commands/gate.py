"""posenc-bench gate: compare a run with a baseline; exit 0 pass, 1 regression, 2 usage error."""

from __future__ import annotations

import argparse
import sys

from posenc_bench.commands.cli import add_progress, parse_set, progress_choice, writing
from posenc_bench.errors import PosencError


def add_parser(sub) -> argparse.ArgumentParser:
    g = sub.add_parser("gate", help="compare a run with a baseline; exit 0 pass, 1 regression, 2 usage error")
    g.add_argument("--config", help="run this config's sweep now, from scratch, into OUT/current")
    g.add_argument("--current", help="...or read an existing results.json (or folder) instead of running")
    g.add_argument("--baseline", required=True, help="baseline results file, e.g. results/baseline-ci.json")
    g.add_argument("--update-baseline", action="store_true",
                   help="write the current results as the new baseline (atomically) and show what changed")
    g.add_argument("--out", default="results/gate", help="where gate.md, gate.json and the current run go")
    g.add_argument("--ppl-tol", type=float, help="allowed relative ppl rise (config gate.ppl_tol, default 0.02)")
    g.add_argument("--ratio-tol", type=float, help="allowed relative rise of ppl(kx)/ppl(1x) (gate.ratio_tol)")
    g.add_argument("--sigmas", type=float, help="standard errors of the baseline seed spread allowed (gate.sigmas)")
    g.add_argument("--acc-tol", type=float, help="a task run: allowed drop of exact match, e.g. 0.05 = 5 points "
                                                  "(gate.acc_tol, default 0.05)")
    g.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="any config key, e.g. gate.per_encoding='{rope: {ratio_tol: 0.05}}'")
    add_progress(g)
    return g


def update_baseline(args: argparse.Namespace, current: dict, current_path: str) -> int:
    """--update-baseline: show the changes against the old baseline (if readable), then replace it; never by
    results of another kind (a training run by an eval, say)."""
    from pathlib import Path

    from posenc_bench.analysis import gate

    old = None
    if Path(args.baseline).exists():
        try:
            old = gate.read_baseline(args.baseline)
        except gate.GateError as e:
            print(f"replacing an unreadable baseline ({e})")
    if old is not None:
        gate.same_kind(old, current, f"--update-baseline keeps {args.baseline}; write the new baseline to another "
                                     "--baseline file (or delete this one first)")
        try:
            result = gate.compare(old, current, {}, gate.Tolerance(0.0, 0.0, 0.0))
            print("changes against the old baseline (zero tolerance):")
            print(gate.markdown(result))
        except gate.GateError as e:
            print(f"the old baseline was not comparable ({e}); replacing it")
    with writing(args.baseline):
        gate.write_baseline(args.baseline, current)
    print(f"wrote baseline {args.baseline} from {current_path}")
    return 0


def cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.analysis import gate
    from posenc_bench.analysis.report import write_tables
    from posenc_bench.bench.config import load_config
    from posenc_bench.bench.records import read_results
    from posenc_bench.bench.run.runtime import Runtime
    from posenc_bench.bench.sweep import Sweep

    if (args.config is None) == (args.current is None):
        raise PosencError("give --config (run the sweep now) or --current (read a results.json), not both or neither")
    overrides = {f"gate.{flag}": getattr(args, flag) for flag in ("ppl_tol", "ratio_tol", "sigmas", "acc_tol")
                 if getattr(args, flag) is not None}
    overrides.update(parse_set(args.set, "gate.ratio_tol=0.05"))
    cfg = load_config(args.config, overrides)
    out = Path(args.out)
    baseline = None if args.update_baseline else gate.read_baseline(args.baseline)  # fail before training
    if args.current:
        current_path = args.current
        current = read_results(args.current)
    else:
        # Always from scratch: reused checkpoints would hide exactly the code change the gate is for.
        cfg.out = str(out / "current")
        rt = Runtime.create(cfg.device, cfg.precision, show_progress=progress_choice(args))
        current = Sweep(cfg, rt).run(fresh=True)
        write_tables(cfg.out, current)  # OUT/current reads like any run's folder
        current_path = str(out / "current" / "results.json")
    if args.update_baseline:
        return update_baseline(args, current, current_path)
    g = cfg.gate
    default = gate.Tolerance(g.ppl_tol, g.ratio_tol, g.sigmas, g.acc_tol)
    per = {row: gate.Tolerance(**{**vars(default), **values}) for row, values in g.per_encoding.items()}
    result = gate.compare(baseline, current, per, default)
    result.baseline, result.current = str(args.baseline), current_path
    with writing(out):
        md, js = gate.write_outputs(out, result, default, g.per_encoding)
    print(gate.markdown(result), end="")
    print(f"wrote {md} and {js}")
    print(result.summary(), file=sys.stderr if result.failed else sys.stdout)
    return result.exit_code
