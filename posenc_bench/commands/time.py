"""posenc-bench time: time each encoding's generation and application against the floor and references."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from posenc_bench.commands.cli import add_device, add_precision
from posenc_bench.errors import PosencError
from posenc_bench.values import TRAIN_PRECISIONS


def add_parser(sub) -> argparse.ArgumentParser:
    t = sub.add_parser("time", help="time each encoding's generation and application against the floor and references")
    add_device(t)
    t.add_argument("--lengths", default="2048,5000,8192", help="comma list of sequence lengths")
    t.add_argument("--d-model", type=int, default=512, help="table / attention width (default 512)")
    t.add_argument("--head-dim", type=int, default=128, help="RoPE cache width and attention head size (default 128)")
    add_precision(t, TRAIN_PRECISIONS, default="fp32", what=" (attention layers; autocast of the training steps and "
                  "the eval forwards)")
    t.add_argument("--threads", type=int)
    t.add_argument("--train-len", type=int, default=2048, help="length of the model forward+backward (default 2048)")
    t.add_argument("--train-tokens", type=int, default=4096,
                   help="tokens a forward+backward (batch = train-tokens // train-len; default 4096)")
    t.add_argument("--min-run-time", type=float, default=0.2, help="seconds per measurement (default 0.2)")
    t.add_argument("--train-min-run-time", type=float, default=1.0,
                   help="seconds per forward+backward measurement (at least --min-run-time; default 1.0)")
    t.add_argument("--encodings", help="comma list of the trained encodings to time (default: every one; nope, the "
                   "fused reference, always; rope's zero-shot fixes with rope)")
    t.add_argument("--skip", default="", help="comma list of parts to leave out: generation, attention, memory, "
                   "bias-memory, training, llama")
    t.add_argument("--eval-len", type=int, default=0,
                   help="the bias encodings' eval peak memory at this length (default 4 x --train-len)")
    t.add_argument("--eval-batch", type=int, default=1, help="... and this batch (default 1)")
    t.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s at --precision for MFU (default: "
                   "the data-sheet figure of a known GPU; the CPU has no MFU)")
    t.add_argument("--generation-only", action="store_true", help="only the generation part (seconds)")
    t.add_argument("--no-train", action="store_true", help="skip the model forward+backward and the Llama comparison")
    t.add_argument("--out", default="runs/timing", help="output folder (timing.json, timing.csv, timing.md; default "
                   "runs/timing: the committed results/timing is written only when --out names it)")
    return t


def _names(value) -> list:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.bench.timing.suite import (PARTIAL, TimingConfig, keep_partial, markdown, run_timing,
                                                 write_outputs)

    try:
        lengths = [int(v) for v in args.lengths.split(",") if v.strip()]
    except ValueError:
        raise PosencError(f"--lengths {args.lengths!r}: give whole numbers of tokens, e.g. 2048,8192") from None
    tc = TimingConfig(device=args.device, lengths=lengths, d_model=args.d_model, head_dim=args.head_dim,
                      precision=args.precision, threads=args.threads, min_run_time=args.min_run_time,
                      train_len=args.train_len, train_tokens=args.train_tokens, train_min_run_time=args.train_min_run_time,
                      application=not args.generation_only, training=not args.generation_only and not args.no_train,
                      encodings=_names(args.encodings) or None, skip=_names(args.skip), eval_len=args.eval_len,
                      eval_batch=args.eval_batch, peak_tflops=args.peak_tflops)
    try:
        result = run_timing(tc, keep=keep_partial(args.out))
    except BaseException:  # the parts measured before a failure or ^C stay in the partial file: say where
        if (Path(args.out) / PARTIAL).exists():
            print(f"the parts measured before the stop are in {Path(args.out) / PARTIAL}",
                  file=sys.stderr)
        raise
    out = write_outputs(result, args.out)
    print()
    print(markdown(result).rstrip())
    print(f"\nwrote {out}/timing.json, timing.csv, timing.md")
    return 0
