"""Each record of a rerun of results/default against the committed one: the relative change of its ppl, largest
first, and the tuned point of the rows with a grid. Run from the repository root:
    python results/in-progress/default-53/compare.py results/in-progress/default-53/results.json"""
import json
import sys

old = {(r["encoding"], r["seed"], r["eval_len"]): r for r in json.load(open("results/default/results.json"))["records"]}
changes, same = [], 0
for r in json.load(open(sys.argv[1]))["records"]:
    p = old.get((r["encoding"], r["seed"], r["eval_len"]))
    if p is None or p.get("ppl") is None or r.get("ppl") is None:
        continue  # learned past its table (n/a in both)
    same += r["ppl"] == p["ppl"]
    changes.append((abs(r["ppl"] / p["ppl"] - 1), r["encoding"], r["seed"], r["eval_len"], p["ppl"], r["ppl"],
                    (r.get("tuning") or {}).get("chosen")))
print(f"{len(changes)} records with a ppl, {same} bit for bit the committed one")
for d, row, seed, L, a, b, chosen in sorted(changes, reverse=True)[:25]:
    print(f"{d:.2e}  {row} seed {seed} at {L}: {a:.4f} -> {b:.4f}" + (f"  tuned {chosen}" if chosen else ""))
