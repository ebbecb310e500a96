#!/bin/bash
# The headline remake of issues 53, 56 and 57 (results/in-progress/README.md, "The headline remake"): results/sotu-512
# made again at one clean commit with every row at 5 seeds, YaRN and STRING tuned on the valid split (--tune),
# key-token perplexity for every record (the evaluator rope-yarn-ft seed 0, issue 56) and the rows of 2024-25
# (issue 57). One seed a cell, each cell as two shards side by side on the 2 cores, one thread each:
#   git worktree add $WT $COMMIT; SEED=0 bash run.sh      (then SEED=1 .. 4, one cell at a time, over sittings)
# A cell is resumable: rerun the same command and finished models are skipped. At the end of each sitting copy
# $OUT/seed-<s>/results.shard-*.json (and key_tokens.pt) here under seed-<s>/ and commit; on a new machine copy them
# back to $OUT/seed-<s>/ first. The evaluator folder is made once, before the first cell: its key tokens are copied
# into every cell (--set eval.key_tokens.seed=0 makes every cell name the same evaluator model), and its checkpoints
# into cell 0 (rope and rope-yarn-ft seed 0, trained once). When the five cells are whole:
#   posenc-bench merge $OUT/seed-0 $OUT/seed-1 $OUT/seed-2 $OUT/seed-3 $OUT/seed-4 --out results/sotu-512
# Extra arguments go to every `run` (a smoke test of the runner: --steps 4 --eval-tokens 4096, with OUT elsewhere).
set -euo pipefail
COMMIT=81f0288
WT=${WT:-/work/wtre}; OUT=${OUT:-/work/runs/sotu-512-remake}; PY=${PY:-/work/venv/bin/python}
SEED=${SEED:?the seed of this cell, 0-4}
case "$(git -C "$WT" rev-parse HEAD)" in $COMMIT*) ;; *) echo "$WT is not at $COMMIT" >&2; exit 2;; esac
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$WT
# The headline's 11 rows, the zero-shot STRING, the evaluator, and the trained rows of 2024-25 (+ssmax on nope and rope)
ROWS=sinusoidal,learned,t5,rope,alibi,nope,kerple-power,xpos,xpos+bca,rope-yarn,rope-llama3,rope-string,rope-yarn-ft
ROWS=$ROWS,fox,path,stickbreaking,dape-kerple,dape-alibi,fope,rnope-swa,nope+ssmax,rope+ssmax
COMMON=(--config configs/sotu-512.yaml --tune --set eval.key_tokens.evaluator=rope-yarn-ft --set eval.key_tokens.seed=0
        --threads 1 --progress off)
cd "$WT"
mkdir -p "$OUT"
if [ ! -f "$OUT/evaluator/results.json" ]; then  # rope seed 0, fine-tuned with YaRN at 4x, and its key tokens
  $PY -m posenc_bench run "${COMMON[@]}" --encodings rope-yarn-ft --seeds 0, --out "$OUT/evaluator" "$@" \
      > "$OUT/evaluator.log" 2>&1
fi
CELL=$OUT/seed-$SEED
mkdir -p "$CELL"
cp -n "$OUT/evaluator/key_tokens.pt" "$CELL/"
if [ "$SEED" = 0 ] && [ ! -d "$CELL/checkpoints" ]; then cp -r "$OUT/evaluator/checkpoints" "$CELL/"; fi
pids=()
for i in 1 2; do
  $PY -m posenc_bench run "${COMMON[@]}" --encodings "$ROWS" --seeds "$SEED," --shard $i/2 --out "$CELL" "$@" \
      > "$CELL.shard$i.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "a shard failed: see $CELL.shard*.log" >&2; exit 1; }; done
echo "cell $SEED whole: $CELL"
