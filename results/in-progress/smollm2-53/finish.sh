#!/bin/bash
# Make results/smollm2-53 from the whole cell (every row at every length in $OUT/results.json), at a clean commit
# of main, in this order: the folder's results.json (copied: the eval wrote it at fbbacc7), its table.md, the
# README blocks (the README holds their markers and the prose, written from what these print) and the figures.
#   OUT=/work/runs/smollm2-53c bash results/in-progress/smollm2-53/finish.sh
# Wall times are left out of the tables (no `cost`): the rows ran on two machines and beside other work, so
# `results/smollm2` (one machine, nothing else running) stays the folder for cost.
set -euo pipefail
OUT=${OUT:-/work/runs/smollm2-53c}; DEST=results/smollm2-53
cd "$(git rev-parse --show-toplevel)"
python - "$OUT/results.json" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1]))
rows, lens = data["run"]["rows"], data["run"]["eval_lengths"]
have = {(r["encoding"], r["eval_len"]) for r in data["records"]}
missing = [(row, L) for row in rows for L in lens if (row, L) not in have]
sys.exit(f"not whole: {len(missing)} of {len(rows) * len(lens)} records missing, first {missing[:3]}" if missing else 0)
EOF
mkdir -p "$DEST"
cp "$OUT/results.json" "$DEST/results.json"
posenc-bench report "$DEST" --out "$DEST/table.md" > /dev/null
YARN="hf:SmolLM2-135M-Instruct.Q4_1+yarn"
[ -f "$DEST/README.md" ] || cp results/in-progress/smollm2-53/README.draft.md "$DEST/README.md"  # the draft, with the markers
posenc-bench report "$DEST" --value ppl,ratio,longppl,key_share --compare "$YARN" --update "$DEST/README.md"
posenc-bench report "$DEST" --findings --update "$DEST/README.md"
posenc-bench report "$DEST" --findings --value longppl --update "$DEST/README.md"
posenc-bench plot "$DEST" --out "$DEST/figures" --formats png
