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
        "precision": "precision",
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

    from posenc_bench.config import load_config
    from posenc_bench.runner import Sweep, remove_outputs

    base = load_config(args.config)
    cfg = load_config(args.config, _overrides(args, base.encodings))
    print("effective config:")
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
    if args.fresh:
        remove_outputs(Path(cfg.out))
    progress = None if args.progress == "auto" else args.progress == "on"
    sweep = Sweep(cfg, show_progress=progress)
    sweep.run()
    print()
    print((Path(cfg.out) / "table.md").read_text().rstrip())
    print(f"\nwrote {cfg.out}/results.json, results.csv, table.md")
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


def cmd_time(args: argparse.Namespace) -> int:
    from posenc_bench.timing import TimingConfig, run_timing, write_outputs

    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
    except ValueError:
        raise PosencError(f"--lengths {args.lengths!r}: give whole numbers of tokens, e.g. 2048,8192") from None
    tc = TimingConfig(device=args.device, lengths=lengths, d_model=args.d_model, head_dim=args.head_dim,
                      dtype=args.dtype, threads=args.threads, min_run_time=args.min_run_time,
                      train_len=args.train_len, application=not args.generation_only,
                      training=not args.generation_only and not args.no_train)
    result = run_timing(tc)
    out = write_outputs(result, args.out)
    from posenc_bench.timing import markdown

    print()
    print(markdown(result).rstrip())
    print(f"\nwrote {out}/timing.json, timing.csv, timing.md")
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
    r.set_defaults(func=cmd_run)

    t = sub.add_parser("time", help="time each encoding's generation and application against the floor and references")
    t.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default cpu)")
    t.add_argument("--lengths", default="2048,5000,8192", help="comma list of sequence lengths")
    t.add_argument("--d-model", type=int, default=512, help="table / attention width (default 512)")
    t.add_argument("--head-dim", type=int, default=128, help="RoPE cache width and attention head size (default 128)")
    t.add_argument("--dtype", default="fp32", help="fp32 | bf16 (attention layers)")
    t.add_argument("--threads", type=int)
    t.add_argument("--train-len", type=int, default=2048, help="length of the model forward+backward (default 2048)")
    t.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement (default 0.2)")
    t.add_argument("--generation-only", action="store_true", help="only the generation part (seconds)")
    t.add_argument("--no-train", action="store_true", help="skip the model forward+backward and the Llama comparison")
    t.add_argument("--out", default="results/timing", help="output folder (timing.json, timing.csv, timing.md)")
    t.set_defaults(func=cmd_time)

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
