"""posenc-bench command line: thin wrappers that parse, call the library, print. Errors -> one line, exit 2."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Optional

import yaml

from posenc_bench.errors import PosencError

USAGE_ERROR = 2


def _parse_encodings(value: str, base: list[str]) -> list[str]:
    """'rope,alibi' replaces the list; '-learned' removes from the config's list; 'all' = every registered."""
    from posenc_bench import encodings
    from posenc_bench.config import parse_row

    items = [v.strip() for v in value.split(",") if v.strip()]
    plus = [i for i in items if not i.startswith("-")]
    minus = {i[1:] for i in items if i.startswith("-")}
    chosen: list[str] = []
    for item in plus or base:
        chosen.extend(encodings.available() if item == "all" else [item])
    for item in list(chosen) + sorted(minus):
        parse_row(item)  # unknown names fail here, listing the valid ones
    return [c for c in dict.fromkeys(chosen) if c not in minus and parse_row(c)[0] not in minus]


def _parse_seeds(value: str) -> list[int]:
    try:
        if "," in value:
            return [int(v) for v in value.split(",") if v.strip()]
        n = int(value)
    except ValueError:
        raise PosencError(f"--seeds {value!r}: give a count (3 = seeds 0,1,2) or a list (0,5,7)") from None
    if n < 1:
        raise PosencError(f"--seeds {value!r}: the count must be at least 1")
    return list(range(n))


def _overrides(args: argparse.Namespace, base_encodings: list[str]) -> dict[str, Any]:
    o: dict[str, Any] = {}
    simple = {
        "train_len": "train.train_len", "steps": "train.steps", "batch_size": "train.batch_size", "lr": "train.lr",
        "eval_tokens": "eval.tokens", "window": "window", "device": "device", "out": "out", "threads": "threads",
        "data": "data.source", "d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
        "precision": "precision", "grad_accum": "grad_accum",
    }
    for attr, key in simple.items():
        value = getattr(args, attr, None)
        if value is not None:
            o[key] = value
    if args.eval_lens is not None:
        o["eval.lens"] = [s.strip() for s in args.eval_lens.split(",") if s.strip()]
    if args.encodings is not None:
        o["encodings"] = _parse_encodings(args.encodings, base_encodings)
    if args.seeds is not None:
        o["seeds"] = _parse_seeds(args.seeds)
    for item in args.set or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PosencError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.warmup_steps=50")
        o[key.strip()] = yaml.safe_load(value)
    return o


def cmd_run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench import dist as distributed
    from posenc_bench.config import load_config
    from posenc_bench.report import results_markdown
    from posenc_bench.runner import Sweep, remove_outputs, train_worker
    from posenc_bench.shard import parse_shard, shard_file

    shard = parse_shard(args.shard) if args.shard is not None else None
    base = load_config(args.config)
    cfg = load_config(args.config, _overrides(args, base.encodings))
    dist = distributed.from_env(cfg.device)  # None unless started by torchrun with more than one process
    try:
        distributed.rows_of_rank(cfg.train.batch_size, dist, cfg.grad_accum)  # the batch splits: fail before any work
        if dist is not None and not dist.is_main:
            train_worker(cfg, dist)  # trains with rank 0, never writes
            return 0
        print("effective config:")
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
        if args.fresh:
            remove_outputs(Path(cfg.out), cfg, shard)
        progress = None if args.progress == "auto" else args.progress == "on"
        sweep = None
        try:
            sweep = Sweep(cfg, show_progress=progress, dist=dist, shard=shard)
            data = sweep.run()
        except PosencError as e:
            if dist is not None and not (sweep is not None and sweep.training):
                dist.broadcast(("abort", str(e)))  # the other ranks wait for a command: end them cleanly
            raise
    finally:
        if dist is not None:
            dist.close()
    print()
    print(results_markdown(data).rstrip())
    if shard is not None:
        print(f"\nwrote {cfg.out}/{shard_file(*shard)}; when every shard is done: posenc-bench merge {cfg.out} --out <folder>")
    else:
        print(f"\nwrote {cfg.out}/results.json, results.csv, table.md")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.report import results_csv, results_markdown
    from posenc_bench.results import atomic_write_json, atomic_write_text
    from posenc_bench.shard import find_inputs, merge_results

    files = find_inputs(args.inputs)
    out = Path(args.out)
    data, missing, absent = merge_results(files, out)
    gap = f"{len(missing)} cell(s) missing: {', '.join(missing)}" + (f" (no {', '.join(absent)})" if absent else "")
    if missing and not args.partial:
        raise PosencError(f"{gap}; run them, or merge with --partial")
    atomic_write_json(out / "results.json", data)
    atomic_write_text(out / "results.csv", results_csv(data))
    atomic_write_text(out / "table.md", results_markdown(data))
    atomic_write_text(out / "config.yaml", yaml.safe_dump(data["run"]["config"], sort_keys=False))
    print(results_markdown(data).rstrip())
    cells = len({(r["encoding"], r["seed"]) for r in data["records"]})
    print(f"\nmerged {cells} cell(s) from {len(files)} file(s) into {out}/results.json, results.csv, table.md")
    if missing:
        print(f"posenc-bench merge: warning: {gap}", file=sys.stderr)
    for what in ("git_commit", "device"):
        seen = sorted({m[what] for m in data["run"]["merged_from"]})
        if len(seen) > 1:  # allowed (each record keeps its own), but worth knowing
            print(f"posenc-bench merge: note: the inputs were made with {len(seen)} different {what}s: "
                  f"{', '.join(seen)}", file=sys.stderr)
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from posenc_bench import encodings

    names = encodings.available()
    window_row = "<name>+sw<W>"
    width = max(map(len, names + [window_row]))
    for name in names:
        cls = encodings.get_class(name)
        extra = f" [evaluates the trained {cls.trained_as!r} model]" if cls.trained_as else ""
        print(f"{name:<{width}}  {cls.summary}{extra}")
    print(f"{window_row:<{width}}  any of the above with sliding-window attention over the last W tokens")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="posenc-bench", description="Benchmark length extrapolation of positional encodings.")
    sub = p.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="train every selected encoding, evaluate at every length, write the table")
    r.add_argument("--config", help="YAML config (default: built-in defaults = configs/default.yaml)")
    r.add_argument("--encodings", help="comma list: rope,alibi | -learned (remove) | all | rope+sw64")
    r.add_argument("--train-len", type=int)
    r.add_argument("--eval-lens", help="absolute lengths (4096) or multiples (1,1.5,2,4x); train length always added")
    r.add_argument("--seeds", help="number of seeds (3 -> 0,1,2) or a list (0,5)")
    r.add_argument("--steps", type=int)
    r.add_argument("--batch-size", type=int)
    r.add_argument("--lr", type=float)
    r.add_argument("--window", type=int, help="sliding-window attention over the last W tokens, for every encoding")
    r.add_argument("--d-model", type=int)
    r.add_argument("--n-layers", type=int)
    r.add_argument("--n-heads", type=int)
    r.add_argument("--eval-tokens", type=int, help="target tokens scored at every eval length")
    r.add_argument("--data", help="stdlib | shakespeare | a path or glob | hf:<dataset>[:<config>]")
    r.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    r.add_argument("--precision", help="fp32 | bf16")
    r.add_argument("--threads", type=int)
    r.add_argument("--out", help="output folder (results.json, results.csv, table.md, checkpoints/)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key, e.g. train.warmup_steps=50")
    r.add_argument("--fresh", action="store_true", help="delete the output folder first instead of resuming")
    r.add_argument("--progress", choices=("auto", "on", "off"), default="auto")
    r.add_argument("--shard", metavar="I/N", help="run shard I of N of the (encoding, seed) cells (1-based); "
                   "writes results.shard-I-of-N.json; join with merge")
    r.add_argument("--grad-accum", type=int, help="micro-batches per step and process (the global batch stays "
                   "--batch-size)")
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("merge", help="join the results of run --shard i/n (or of separate runs) into one table")
    m.add_argument("inputs", nargs="+", help="shard folders or results files")
    m.add_argument("--out", required=True, help="folder for the merged results.json, results.csv, table.md")
    m.add_argument("--partial", action="store_true", help="write even when cells are missing (listed on stderr)")
    m.set_defaults(func=cmd_merge)

    ls = sub.add_parser("list", help="registered encodings, one line each")
    ls.set_defaults(func=cmd_list)
    return p


def main(argv: Optional[list[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # argparse itself exits 2 on a usage error
    try:
        return args.func(args)
    except PosencError as e:
        print(f"posenc-bench {args.command}: error: {e}", file=sys.stderr)
        return USAGE_ERROR
    except KeyboardInterrupt:
        print(f"posenc-bench {args.command}: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
