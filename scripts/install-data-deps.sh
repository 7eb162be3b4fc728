#!/bin/sh
# Install the OS packages the default scenario suite extracts text from (Debian/Ubuntu).
# Idempotent and fast when everything is present: apt is only called for missing packages.
# Usage: scripts/install-data-deps.sh [--check]   (--check: list missing packages, exit 1 if any)
# Quiet: it prints one line, "all present" or the packages it installed; apt's and dpkg's own
# output goes to a log, DRIFT_DATA_DEPS_LOG (default .venv/data-deps.log beside this script's
# repository, else $TMPDIR/drift-bench-data-deps.log), named in that line and in any failure's.
# Two set-ups at once (two clones, CI beside a working tree): the second waits for the first
# (a lock of this script's own), then finds the packages present. apt's own lock, held by some
# other apt or dpkg, is waited for up to DRIFT_APT_LOCK_WAIT seconds (default 600), then this
# fails with one line.
set -eu

PACKAGES="fortunes dict-gcide dict-foldoc jargon-text manpages-de manpages-fr manpages-es"
# Always present on Debian: base-files (common-licenses, copyright files), dpkg (changelogs),
# libpython3.X-stdlib (the code scenario).
LOCK_WAIT="${DRIFT_APT_LOCK_WAIT:-600}"
SCRIPT_LOCK="${TMPDIR:-/tmp}/drift-bench-data-deps.lock"
REPO="$(cd "$(dirname "$0")/.." && pwd)"
if [ -n "${DRIFT_DATA_DEPS_LOG:-}" ]; then
    LOG="$DRIFT_DATA_DEPS_LOG"
elif [ -d "$REPO/.venv" ]; then
    LOG="$REPO/.venv/data-deps.log"
else
    LOG="${TMPDIR:-/tmp}/drift-bench-data-deps.log"
fi

find_missing() {
    missing=""
    for p in $PACKAGES; do
        if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
            missing="$missing $p"
        fi
    done
}

find_missing
if [ -z "$missing" ]; then
    echo "data deps: all present"
    exit 0
fi
if [ "${1:-}" = "--check" ]; then
    echo "data deps: missing:$missing"
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "data deps: missing:$missing; no apt-get here: install them with your package manager" >&2
    exit 1
fi
SUDO=""
if [ "$(id -u)" != "0" ]; then
    SUDO="sudo"
fi
busy() {
    echo "data deps: apt is busy (its lock is held by another apt or dpkg) after waiting ${LOCK_WAIT}s;" \
         "run the set-up again when that one is done (DRIFT_APT_LOCK_WAIT=SECONDS waits longer)" >&2
    exit 1
}

# one install of ours at a time: a second set-up waits here, then finds the packages present
if command -v flock >/dev/null 2>&1; then
    exec 9>>"$SCRIPT_LOCK"
    flock -w "$LOCK_WAIT" 9 || busy
    find_missing
    if [ -z "$missing" ]; then
        echo "data deps: all present, installed by a set-up that ran at the same time"
        exit 0
    fi
fi

# apt-get, waiting for apt's lock up to the deadline (DPkg::Lock::Timeout where apt knows it,
# and a retry here for the package lists' lock, which older apts do not wait for)
deadline=$(( $(date +%s) + LOCK_WAIT ))
apt_get() {
    while :; do
        err="$(mktemp)"
        echo "\$ apt-get $*" >>"$LOG"
        if DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout="$LOCK_WAIT" "$@" >>"$LOG" 2>"$err"; then
            cat "$err" >>"$LOG"
            rm -f "$err"
            return 0
        fi
        cat "$err" >>"$LOG"
        if ! grep -q "Could not get lock\|Unable to acquire the dpkg frontend lock\|Unable to lock" "$err"; then
            last="$(grep -v '^[[:space:]]*$' "$err" | tail -n 1)"
            rm -f "$err"
            echo "data deps: apt-get $1 failed${last:+ ($last)}; its output is in $LOG" >&2
            exit 1
        fi
        rm -f "$err"
        [ "$(date +%s)" -lt "$deadline" ] || busy
        sleep 2   # the lock's holder is another process: poll until the deadline
    done
}

mkdir -p "$(dirname "$LOG")"
echo "--- $(date -u '+%Y-%m-%d %H:%M:%S UTC') installing$missing" >>"$LOG"
# dictd is what the dict-* packages depend on; its service is not needed (policy-rc.d may deny it)
apt_get update -qq
apt_get install -y -qq --no-install-recommends $missing
echo "data deps: installed$missing (apt's output: $LOG)"
