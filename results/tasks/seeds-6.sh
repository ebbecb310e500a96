#!/usr/bin/env bash
# Seeds 3, 4 and 5 of every row of the task folders (issue: task-track findings need at least 6 seeds, since an
# exact sign test over n paired seeds cannot go below p = 2 / 2^n: 0.25 at 3 seeds, 0.031 at 6).
# Two queues of one thread each, resumable: a rerun skips finished cells and resumes a model from its last save.
# Each queue's folders are merged into results/tasks/<task> once all three seeds of the task are in.
#   bash results/tasks/seeds-6.sh A   # needle, reverse, addition
#   bash results/tasks/seeds-6.sh B   # copy, addition-hints
set -euo pipefail
case "${1:?queue A or B}" in
  A) tasks="needle reverse addition" ;;
  B) tasks="copy addition-hints" ;;
  *) echo "queue A or B, got $1" >&2; exit 2 ;;
esac
for task in $tasks; do
  posenc-bench run --config tasks-$task --seeds 3,4,5 --threads 1 --progress off --out runs/tasks-6/$task
done
