"""posenc-bench merge: join the results of run --shard i/n (or of separate runs) into one table."""

from __future__ import annotations

import argparse
import sys



def add_parser(sub) -> argparse.ArgumentParser:
    m = sub.add_parser("merge", help="join the results of run --shard i/n (or of separate runs) into one table")
    m.add_argument("inputs", nargs="+", help="shard folders or results files")
    m.add_argument("--out", required=True, help="folder for the merged results.json, results.csv, table.md")
    m.add_argument("--partial", action="store_true", help="write even when cells are missing (listed on stderr)")
    return m


def cmd(args: argparse.Namespace) -> int:
    from pathlib import Path

    from posenc_bench.analysis.report import write_tables
    from posenc_bench.bench.run.shard import find_inputs, merge_into, missing_cells
    from posenc_bench.tokenizer import file_name

    files = find_inputs(args.inputs)
    out = Path(args.out)
    data, missing, absent = merge_into(files, out, args.partial)
    print(write_tables(out, data).rstrip())
    cells = len({(r["encoding"], r["seed"]) for r in data["records"]})
    print(f"\nmerged {cells} cell(s) from {len(files)} file(s) into {out}/results.json, results.csv, table.md")
    if missing:
        print(f"posenc-bench merge: warning: {missing_cells(missing, absent)}", file=sys.stderr)
    tok = data["run"].get("tokenizer")
    if tok and not (out / file_name(tok["name"])).is_file():
        print(f"posenc-bench merge: warning: no input folder holds the {tok['name']} these results were made with "
              f"({file_name(tok['name'])}, fingerprint {tok['fingerprint']}); copy it into {out} before a run, eval "
              "or gate reads that folder", file=sys.stderr)
    for what in ("git_commit", "device"):
        seen = sorted({m[what] for m in data["run"]["merged_from"]})
        if len(seen) > 1:  # allowed (each record keeps its own), but worth knowing
            print(f"posenc-bench merge: note: the inputs were made with {len(seen)} different {what}s: "
                  f"{', '.join(seen)}", file=sys.stderr)
    return 0
