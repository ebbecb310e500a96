#!/bin/bash
# results/default's fairness probes (sinusoidal's scale, the shared learning rate, the training budget) measured
# again on the valid split, where choices made by looking at numbers belong (docs/protocol.md, "Which split").
# The earlier probes were scored on test at 6ff6b7b. Config `default`, seed 0, one thread, the AVX2 pins that
# made results/default's records, a clean worktree at $COMMIT. Each probe is one run folder under $OUT; finished
# models are skipped, so a rerun resumes. The README beside this file tabulates them.
set -euo pipefail
COMMIT=b8ba9be
WT=${WT:-/work/wtfp}; OUT=${OUT:-/work/runs/fairness-valid}; PY=${PY:-/work/venv/bin/python}
case "$(git -C "$WT" rev-parse HEAD)" in $COMMIT*) ;; *) echo "$WT is not at $COMMIT" >&2; exit 2;; esac
test -z "$(git -C "$WT" status --porcelain)" || { echo "$WT is not clean" >&2; exit 2; }
export ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2  # the AVX2 kernels
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONPATH=$WT
COMMON=(--config default --seeds 0, --threads 1 --progress off --set eval.split=valid)
cd "$WT"
mkdir -p "$OUT"
EXTRA=("$@")  # extra arguments go to every run (a smoke test: --steps 2 --eval-tokens 2048, with OUT elsewhere)
probe() {  # probe NAME ARGS...: one run folder; a finished run is skipped by `run` itself
  local name=$1; shift
  echo "$(date -u +%H:%M) $name" >&2
  $PY -m posenc_bench run "${COMMON[@]}" "$@" "${EXTRA[@]}" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
}
D=128  # the default model's width
LITERAL='model.encoding_options={sinusoidal: {token_scale: 0, pe_scale: 1}}'
for lr in 3e-3 1e-3 6e-3; do  # the shared learning rate: the headline rows, sinusoidal at the default and literally
  probe lr-$lr --encodings rope,alibi,learned,t5,sinusoidal,nope --lr $lr
  probe lr-$lr-literal --encodings sinusoidal --lr $lr --set "$LITERAL"
done
# sinusoidal's scale at lr 3e-3: the other two variants of the table (the default and the literal are above)
probe scale-xtransformers --encodings sinusoidal --set "model.encoding_options={sinusoidal: {pe_scale: $(python3 -c "print($D ** -0.5)")}}"
probe scale-rms --encodings sinusoidal --set "model.encoding_options={sinusoidal: {pe_scale: $(python3 -c "print(0.02 * 2 ** 0.5)")}}"
# the training budget: four times the steps
probe budget-1600 --encodings rope,t5 --steps 1600 --set train.warmup_steps=160
echo "all probes whole: $OUT" >&2
