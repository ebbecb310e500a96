"""posenc-bench documents: name the document of every resampling unit in results made before units did."""

from __future__ import annotations

import argparse


def add_parser(sub) -> argparse.ArgumentParser:
    d = sub.add_parser("documents", help="write the document of each resampling unit (units.doc) into results made "
                                         "before units recorded it, from their eval text rebuilt and checked")
    d.add_argument("folders", nargs="+", help="results folders (or their results.json files)")
    d.add_argument("--model", default=None,
                   help="hf:<folder | hub name | file.gguf>: a Hugging Face eval's model (its tokenizer rebuilds the "
                        "text), where the one the eval recorded is not on this machine")
    d.add_argument("--from-metadata", action="store_true",
                   help="derive the documents from the run's eval_documents instead of rebuilding the text (for a "
                        "text that cannot be rebuilt here, e.g. a stdlib corpus of another Python; nothing to check "
                        "them against)")
    return d


def cmd(args: argparse.Namespace) -> int:
    from posenc_bench.bench.eval.documents import backfill

    for folder in args.folders:
        print(backfill(folder, model=args.model, from_metadata=args.from_metadata).line())
    return 0
