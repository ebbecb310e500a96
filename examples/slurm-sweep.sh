#!/bin/bash
# A posenc-bench sweep as a SLURM job array: array task i runs shard i of N into one shared folder, each on
# one node with 8 GPUs (DDP through torchrun); a last job, run after all of them, merges the shards.
# configs/long-2048.yaml x 3 seeds is 18 trained models (rope-linear is evaluated on rope's): 18 shards,
# one model each (with fewer shards, shards differ by at most one model).
#
#   sbatch examples/slurm-sweep.sh                                         # the 18 shards
#   sbatch --dependency=afterok:<array job id> --wrap \
#       "posenc-bench merge results/sweep --out results/sweep-all"        # the table, when all are done
#
# A failed or preempted task is resubmitted with the same index (sbatch --array=5 ...): it skips its finished
# cells and continues an interrupted training from its last save (save_every steps). `merge` lists any cell
# still missing and refuses to write the table until all are there (or --partial).
#SBATCH --job-name=posenc-sweep
#SBATCH --array=1-18
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=12:00:00
#SBATCH --output=logs/%x-%A_%a.out
set -euo pipefail

CONFIG=${CONFIG:-configs/long-2048.yaml}
OUT=${OUT:-results/sweep}          # on a filesystem every node sees
SHARDS=18                          # = the --array range; not SLURM_ARRAY_TASK_COUNT, which a resubmit changes

# --shard is 1-based, like --array=1-18 above. Every shard must get the same config and flags (the
# assignment of cells to shards depends only on the set of encodings x seeds; merge checks the configs).
torchrun --standalone --nproc-per-node "${SLURM_GPUS_ON_NODE:-8}" -m posenc_bench run \
    --config "$CONFIG" --seeds 3 --progress off \
    --shard "${SLURM_ARRAY_TASK_ID}/${SHARDS}" --out "$OUT"
