"""posenc-bench time: time each encoding's generation and application against the floor and references."""

from __future__ import annotations

import argparse

from posenc_bench.commands.cli import add_device, add_precision
from posenc_bench.errors import PosencError
from posenc_bench.values import TRAIN_PRECISIONS


def add_parser(sub) -> argparse.ArgumentParser:
    t = sub.add_parser("time", help="time each encoding's generation and application against the floor and references")
    add_device(t)
    t.add_argument("--lengths", default="2048,5000,8192", help="comma list of sequence lengths")
    t.add_argument("--d-model", type=int, default=512, help="table / attention width (default 512)")
    t.add_argument("--head-dim", type=int, default=128, help="RoPE cache width and attention head size (default 128)")
    add_precision(t, TRAIN_PRECISIONS, default="fp32", what=" (attention layers)")
    t.add_argument("--threads", type=int)
    t.add_argument("--train-len", type=int, default=2048, help="length of the model forward+backward (default 2048)")
    t.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement (default 0.2)")
    t.add_argument("--generation-only", action="store_true", help="only the generation part (seconds)")
    t.add_argument("--no-train", action="store_true", help="skip the model forward+backward and the Llama comparison")
    t.add_argument("--out", default="runs/timing", help="output folder (timing.json, timing.csv, timing.md; default "
                   "runs/timing: the committed results/timing is written only when --out names it)")
    return t


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.bench.timing.suite import TimingConfig, markdown, run_timing, write_outputs

    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
    except ValueError:
        raise PosencError(f"--lengths {args.lengths!r}: give whole numbers of tokens, e.g. 2048,8192") from None
    tc = TimingConfig(device=args.device, lengths=lengths, d_model=args.d_model, head_dim=args.head_dim,
                      precision=args.precision, threads=args.threads,
                      min_run_time=args.min_run_time, train_len=args.train_len, application=not args.generation_only,
                      training=not args.generation_only and not args.no_train)
    result = run_timing(tc)
    out = write_outputs(result, args.out)
    print()
    print(markdown(result).rstrip())
    print(f"\nwrote {out}/timing.json, timing.csv, timing.md")
    return 0
