#!/bin/bash
# Issue 53's rerun of results/default (results/in-progress/README.md, "Folders the list above missed"): the folder's
# own command (results/default/README.md) with --tune, so that rope-yarn's betas are chosen on the valid split at
# each length; every other row is untouched by the tuning (bit for bit the committed records on an AMD EPYC with
# the AVX2 pins; within the pinned Xeon's rounding elsewhere, which the new README must say). About 36 min of both
# cores as two shards (the committed run's 35 min 42 s) plus rope-yarn's valid passes. Resumable: rerun it.
#   git worktree add $WT <a clean commit of main>; WT=... bash run.sh; then write results/default from $OUT
set -euo pipefail
WT=${WT:?a clean worktree of main}; OUT=${OUT:-/work/runs/default-53}; PY=${PY:-/work/venv/bin/python}
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 PYTHONPATH=$WT
ROWS=sinusoidal,learned,t5,rope,rope-linear,rope-ntk,rope-dynamic,rope-yarn,rope-llama3,rope-ft,rope-linear-ft,rope-ntk-ft,rope-dynamic-ft,rope-yarn-ft,rope-llama3-ft,alibi,nope
cd "$WT"; mkdir -p "$(dirname "$OUT")"
pids=()
for i in 1 2; do
  $PY -m posenc_bench run --config configs/default.yaml --encodings $ROWS --seeds 3 --threads 1 --tune \
      --shard $i/2 --out "$OUT" --progress off > "$OUT.shard$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "a shard failed: see $OUT.shard*.log" >&2; exit 1; }; done
$PY -m posenc_bench merge "$OUT" --out "$OUT"
