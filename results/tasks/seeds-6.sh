#!/usr/bin/env bash
# More seeds for every row of the task folders: a task finding needs at least 6 seeds, since the exact sign-flip
# test over n paired seeds cannot go below p = 2 / 2^n (0.25 at 3 seeds, 0.0625 at 5, 0.031 at 6, 0.002 at 10).
# Each call runs one batch of seeds (SEEDS, default 3,4,5) into runs/tasks-<batch>/<task>, two queues of one
# thread each, resumable: a rerun skips finished cells and resumes a model from its last save. The committed
# folders' 10 seeds were made this way, all at one commit (05d6ef8), in three batches, then merged:
#   SEEDS=0,1,2 bash results/tasks/seeds-6.sh A & SEEDS=0,1,2 bash results/tasks/seeds-6.sh B; wait
#   SEEDS=3,4,5 bash results/tasks/seeds-6.sh A & SEEDS=3,4,5 bash results/tasks/seeds-6.sh B; wait
#   SEEDS=6,7,8,9 bash results/tasks/seeds-6.sh A & SEEDS=6,7,8,9 bash results/tasks/seeds-6.sh B; wait
#   for t in copy reverse needle addition addition-hints; do
#     posenc-bench merge runs/tasks-3/$t runs/tasks-6/$t runs/tasks-10/$t --out results/tasks/$t; done
set -euo pipefail
SEEDS=${SEEDS:-3,4,5}
batch=$(( $(echo "$SEEDS" | tr ',' '\n' | tail -n 1) + 1 ))  # 3,4,5 -> tasks-6; 6,7,8,9 -> tasks-10
case "${1:?queue A or B}" in
  A) tasks="needle reverse addition" ;;
  B) tasks="copy addition-hints" ;;
  *) echo "queue A or B, got $1" >&2; exit 2 ;;
esac
for task in $tasks; do
  posenc-bench run --config tasks-$task --seeds "$SEEDS" --threads 1 --progress off --out "${OUT:-runs}/tasks-$batch/$task"
done
