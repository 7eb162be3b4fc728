#!/usr/bin/env bash
# The results suite behind the README table: every method on the test streams of the small zoo,
# greedy and at temperature 0.8, per scenario. Runs land in results/ (not committed); the table is
# printed by benchmarks/results_table.py.
#
#   benchmarks/suite.sh [SCENARIO...]          (default: indist code law jargon temporal)
#   TEMPS="0 0.8" MAX_PROMPTS=20 MAX_PROMPTS_SAMPLED=10 JOBS=2 benchmarks/suite.sh
# Greedy runs use every method and the indist control; sampled runs (the model-free comparison)
# leave out osd and the control to save time.
set -euo pipefail
cd "$(dirname "$0")/.."
DRIFT=${DRIFT:-.venv/bin/drift}
OUT=${OUT:-results}
TEMPS=${TEMPS:-"0 0.8"}
JOBS=${JOBS:-1}
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(indist code law jargon temporal)

run_one() {
    local scenario=$1 temp=$2 extra=(--methods all --max-prompts "${MAX_PROMPTS:-20}")
    if [ "$temp" != "0" ]; then
        extra=(--methods vanilla,drift,offline,pld,suffix --max-prompts "${MAX_PROMPTS_SAMPLED:-10}" --no-control)
    fi
    "$DRIFT" bench --scenario "$scenario" --zoo small --temperature "$temp" --out "$OUT" \
        "${extra[@]}" --json > "$OUT/.suite-$scenario-$temp.json" 2> "$OUT/.suite-$scenario-$temp.log" \
        && echo "done $scenario T=$temp" || echo "FAILED $scenario T=$temp (see $OUT/.suite-$scenario-$temp.log)"
}
export -f run_one
export DRIFT OUT MAX_PROMPTS MAX_PROMPTS_SAMPLED
mkdir -p "$OUT"
# offline drafts are built (and cached) before the parallel runs so two runs never build one twice
for s in "${SCENARIOS[@]}"; do
    .venv/bin/python -c "from drift_cli.zoo import ensure_offline_draft; ensure_offline_draft('small', '$s', 'fkl')"
done
for s in "${SCENARIOS[@]}"; do for t in $TEMPS; do echo "$s $t"; done; done \
    | xargs -P "$JOBS" -L 1 bash -c 'run_one "$0" "$1"'
.venv/bin/python benchmarks/results_table.py "$OUT"/*/*/run.json
