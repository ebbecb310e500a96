"""posenc-bench passkey: passkey retrieval accuracy by length and depth; the effective context."""

from __future__ import annotations

import argparse

from posenc_bench.commands.cli import LazyChoices, add_device, split_commas
from posenc_bench.errors import PosencError


def add_parser(sub) -> argparse.ArgumentParser:
    pk = sub.add_parser("passkey", help="passkey retrieval accuracy by length and depth; the effective context")
    pk.add_argument("--model", required=True, help="a checkpoint folder (results/x/checkpoints/rope-seed0) or hf:<model>")
    pk.add_argument("--encoding", help="evaluate a checkpoint with an eval-only variant, e.g. rope-yarn on rope")
    pk.add_argument("--rope-scaling", choices=LazyChoices("posenc_bench.hf.rope", "SCALINGS"), metavar="SCALING",
                    help="%(choices)s: a Hugging Face model with this RoPE scaling (factor = length / train length)")
    pk.add_argument("--lengths", default="1,2,4x", help="prompt lengths: absolute or multiples (default 1,2,4x)")
    pk.add_argument("--depths", default="0,0.25,0.5,0.75,1", help="needle depths, 0 = start, 1 = end of the filler")
    pk.add_argument("--trials", type=int, default=5, help="random keys per (length, depth) (default 5)")
    pk.add_argument("--seed", type=int, default=0)
    pk.add_argument("--threshold", type=float, default=1.0, help="accuracy that counts as success (default 1.0)")
    pk.add_argument("--train-len", type=int, help="a Hugging Face model's train length, if not its config's")
    add_device(pk)
    pk.add_argument("--trust-remote-code", action="store_true", help="allow a hub model's own code (off by default)")
    pk.add_argument("--out", help="folder for passkey.json and passkey.md")
    return pk


def prompt_lengths(value: str, train_len: int) -> list[int]:
    """--lengths: absolute or multiples ('1,2,4x': all multiples, as for eval lengths), sorted, deduplicated;
    without the train length that eval lengths always add, unless it was asked for."""
    from posenc_bench.bench.config import parse_eval_lens

    items = split_commas(value)
    if items and items[-1].lower().endswith("x"):
        items = [i if i.lower().endswith("x") else i + "x" for i in items]
    lengths = set()
    for item in items:
        resolved = [L for L in parse_eval_lens([item], train_len) if L != train_len]
        lengths.add(resolved[0] if resolved else train_len)
    return sorted(lengths)


def parse_depths(value: str) -> list[float]:
    """--depths: fractions of the filler (or haystack) before the needle, '0,0.25,0.5,0.75,1'."""
    try:
        return [float(d) for d in split_commas(value)]
    except ValueError:
        raise PosencError(f"--depths {value!r}: give fractions, e.g. 0,0.25,0.5,0.75,1") from None


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.bench.eval import passkey
    from posenc_bench.env import made_where

    lm = passkey.load_lm(args.model, encoding=args.encoding, rope_scaling=args.rope_scaling, device=args.device,
                         trust_remote_code=args.trust_remote_code, train_len=args.train_len)
    lengths = prompt_lengths(args.lengths, lm.train_len)
    depths = parse_depths(args.depths)
    result = passkey.passkey_sweep(lm, lengths, depths, trials=args.trials, seed=args.seed, threshold=args.threshold)
    text = passkey.markdown(result)
    print(text, end="")
    if args.out:
        js, md = passkey.write(result, args.out, {"checkpoint": getattr(lm, "checkpoint_meta", None),
                                                 **made_where(lm.device)})
        print(f"wrote {js} and {md}")
    return 0
