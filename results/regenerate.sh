#!/usr/bin/env bash
# Rebuild every generated block, table and figure of the committed results from their results.json files alone
# (what `tests/analysis/test_report.py` checks), after a change to the analysis. Writes only generated text:
# tables (table.md), the README blocks between <!-- posenc-bench ... --> markers, and the figures.
#   bash results/regenerate.sh            # tables and blocks (seconds)
#   FIGURES=1 bash results/regenerate.sh  # and the figures (a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
text="default full sotu-512 sotu-512-full smollm2 robustness/bpe-4096 robustness/large robustness/bpe-4096-large"
tasks="copy reverse needle addition addition-hints copy-full"
for f in $text; do posenc-bench report results/$f --out results/$f/table.md; done
for t in $tasks; do posenc-bench report results/tasks/$t --out results/tasks/$t/table.md; done
posenc-bench report results/sotu-512 --value ppl,ratio --update README.md
posenc-bench report results/default --update docs/results.md
posenc-bench report results/sotu-512 --update docs/results.md
posenc-bench report results/full --value ppl,ratio --update docs/results.md
for f in sotu-512 sotu-512-full; do posenc-bench report results/$f --value ppl,ratio --update results/$f/README.md; done
posenc-bench report results/smollm2 --value ppl,ratio,cost --compare "hf:SmolLM2-135M-Instruct.Q4_1+yarn" \
  --update results/smollm2/README.md
for f in default full smollm2 sotu-512 sotu-512-full; do
  posenc-bench report results/$f --findings --update results/$f/README.md; done
for t in $tasks; do
  values=accuracy; [ "$t" = needle ] && values=accuracy,depths
  posenc-bench report results/tasks/$t --value $values --update results/tasks/README.md
  posenc-bench report results/tasks/$t --findings --update results/tasks/README.md
done
posenc-bench report results/sotu-512 results/robustness/bpe-4096 results/robustness/large \
  results/robustness/bpe-4096-large --robustness --claims results/sotu-512 --update results/robustness/README.md
if [ "${FIGURES:-0}" = 1 ]; then
  posenc-bench plot results/default --out docs/figures --formats png
  posenc-bench plot results/sotu-512 --out docs/figures/sotu-512 --formats png
  for f in full smollm2 sotu-512-full; do posenc-bench plot results/$f --out results/$f/figures --formats png; done
  for t in $tasks; do posenc-bench plot results/tasks/$t --out results/tasks/$t/figures --formats png; done
  posenc-bench plot results/sotu-512 results/robustness/bpe-4096 results/robustness/large \
    results/robustness/bpe-4096-large --robustness --out results/robustness --formats png,svg
fi
