#!/usr/bin/env bash
# The acceptance regression gate in this project's CI: the committed micro pair (the files in
# results/baselines/micro/, never a rebuild: the same recipe gives other weights on another CPU)
# against the committed baseline results/baselines/micro.json, pinned with
#   drift regress pin --draft results/baselines/micro/draft --target results/baselines/micro/target \
#       --methods vanilla,drift --out results/baselines/micro.json
# The baseline records the pair by paths relative to itself. Called by .ci/run after the tests.
#
# Exit codes: 0 acceptance held; 1 acceptance fell by more than the tolerance (the paragraph on
# stderr names the pair, both fingerprints and the drop); 2 bad input: the baseline is missing or
# of another version, or the tokenizer or the regression stream changed -> re-pin and commit.
# The check report is written to results/regress/ (not committed).
#
#   scripts/ci-regress.sh [extra `drift regress check` flags, e.g. --tolerance 0.03]
set -euo pipefail
cd "$(dirname "$0")/.."

BASELINE="${DRIFT_REGRESS_BASELINE:-results/baselines/micro.json}"
if [ -x .venv/bin/drift ]; then
    DRIFT=(.venv/bin/drift)
else
    DRIFT=("${PYTHON:-python3}" -m drift_cli)
fi

start=$SECONDS
rc=0
"${DRIFT[@]}" regress check --baseline "$BASELINE" --out results/regress "$@" || rc=$?
echo "drift regress check (micro): exit $rc after $((SECONDS - start)) s" >&2
exit "$rc"
