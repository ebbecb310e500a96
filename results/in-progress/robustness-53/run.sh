#!/bin/bash
# Issue 53's rerun of the three robustness settings (results/in-progress/README.md, "Folders the list above
# missed"): results/robustness/{bpe-4096,large,bpe-4096-large} made again whole at one clean commit with --tune,
# so that rope-yarn's betas are chosen on the valid split as in every other folder; every other row is as
# results/robustness/cells.sh made it (the same configs, seeds 0 and 1, cells in its order). After the headline
# remake (sotu-512-remake/), whose claims these settings check. About 31 core-hours: 15-16 h of both cores.
#   git worktree add $WT $COMMIT; bash run.sh          (rerun it to resume; finished models are skipped)
# At the end of each sitting copy $OUT/<setting>/ (config, BPE and shard files) here and commit; on a new machine
# copy them back first. When all six cells are whole: `posenc-bench merge $OUT/<setting> --out
# results/robustness/<setting>` for each, then `posenc-bench report --robustness` and the READMEs.
set -euo pipefail
COMMIT=81f0288
WT=${WT:-/work/wtrb}; OUT=${OUT:-/work/runs/robustness-53}; PY=${PY:-/work/venv/bin/python}
case "$(git -C "$WT" rev-parse HEAD)" in $COMMIT*) ;; *) echo "$WT is not at $COMMIT" >&2; exit 2;; esac
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$WT
cd "$WT"
for cell in "0 robustness-bpe bpe-4096" "0 robustness-large large" "1 robustness-bpe bpe-4096" \
            "1 robustness-large large" "0 robustness-bpe-large bpe-4096-large" "1 robustness-bpe-large bpe-4096-large"; do
  read -r seed cfg dir <<< "$cell"
  mkdir -p "$OUT/$dir"
  # both BPE settings read one BPE: bpe-4096's, trained by its first cell, copied into bpe-4096-large's folder
  if [ "$dir" = bpe-4096-large ] && [ ! -f "$OUT/$dir/tokenizer-bpe-4096.json" ]; then
    cp "$OUT/bpe-4096/tokenizer-bpe-4096.json" "$OUT/$dir/"
  fi
  pids=()
  for i in 1 2; do
    # the first shard into a new BPE folder trains its tokenizer; the second waits for it (one writer of the file)
    if [ "$i" = 2 ] && [[ $cfg == *bpe* ]]; then
      until [ -f "$OUT/$dir/tokenizer-bpe-4096.json" ]; do
        kill -0 "${pids[0]}" 2> /dev/null || { echo "shard 1 of $dir stopped: see $OUT/$dir-1.log" >&2; exit 1; }
        sleep 10
      done
    fi
    $PY -m posenc_bench run --config "configs/$cfg.yaml" --tune --seeds "$seed," --threads 1 --progress off \
        --shard "$i/2" --out "$OUT/$dir" "$@" >> "$OUT/$dir-$i.log" 2>&1 &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || { echo "a shard failed: see $OUT/$dir-*.log" >&2; exit 1; }; done
done
echo "the three settings are whole: $OUT"
