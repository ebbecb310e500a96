#!/bin/bash
# Issue 57's task folders (results/in-progress/README.md, "Issue 57's results"): each committed task folder of
# results/tasks made again whole at one clean commit with the trained rows of 2024-25 beside its own rows (and
# STRING beside the zero-shot fixes where the folder has them), at its 10 seeds, as results/tasks/README.md makes
# them: seeds 0-4 and 5-9 as two queues of one thread side by side, then merged.
#   git worktree add $WT $COMMIT; TASK=copy bash run.sh       (then needle, reverse, addition, addition-hints)
# Resumable: rerun it and finished models are skipped. At the end of each sitting copy $OUT/$TASK-0/ and
# $OUT/$TASK-5/ (their results.json) here under $TASK-0/, $TASK-5/ and commit; on a new machine copy them back
# first. When both queues of a task are whole: posenc-bench merge $OUT/$TASK-0 $OUT/$TASK-5 --out
# results/tasks/$TASK, then results/regenerate.sh and the README (results/tasks/README.md says how).
# Extra arguments go to every `run` (a smoke test of the runner: --steps 4, with OUT elsewhere).
set -euo pipefail
COMMIT=81f0288
WT=${WT:-/work/wtts}; OUT=${OUT:-/work/runs/tasks-57}; PY=${PY:-/work/venv/bin/python}
TASK=${TASK:?copy, needle, reverse, addition or addition-hints}
case "$(git -C "$WT" rev-parse HEAD)" in $COMMIT*) ;; *) echo "$WT is not at $COMMIT" >&2; exit 2;; esac
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$WT
cd "$WT"
CONFIG=configs/tasks-$TASK.yaml
test -f "$CONFIG" || { echo "no $CONFIG: TASK is copy, needle, reverse, addition or addition-hints" >&2; exit 2; }
# the folder's own rows (its config's), the trained rows of 2024-25, and STRING where the folder has zero-shot fixes
OWN=$($PY -c "import sys, yaml; print(','.join(yaml.safe_load(open(sys.argv[1]))['encodings']))" "$CONFIG")
NEW=fox,path,stickbreaking,dape-kerple,dape-alibi,fope,rnope-swa,nope+ssmax,rope+ssmax
case ",$OWN," in *,rope-rerope,*) NEW=$NEW,rope-string;; esac
mkdir -p "$OUT"
pids=()
for q in 0,1,2,3,4 5,6,7,8,9; do
  $PY -m posenc_bench run --config "$CONFIG" --encodings "$OWN,$NEW" --seeds "$q" --threads 1 --progress off \
      --out "$OUT/$TASK-${q:0:1}" "$@" > "$OUT/$TASK-${q:0:1}.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || { echo "a queue failed: see $OUT/$TASK-*.log" >&2; exit 1; }; done
echo "$TASK whole: posenc-bench merge $OUT/$TASK-0 $OUT/$TASK-5 --out results/tasks/$TASK"
