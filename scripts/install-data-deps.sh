#!/bin/sh
# Install the OS packages the default scenario suite extracts text from (Debian/Ubuntu).
# Idempotent and fast when everything is present: apt is only called for missing packages.
# Usage: scripts/install-data-deps.sh [--check]   (--check: list missing packages, exit 1 if any)
set -eu

PACKAGES="fortunes dict-gcide dict-foldoc jargon-text manpages-de manpages-fr manpages-es"
# Always present on Debian: base-files (common-licenses, copyright files), dpkg (changelogs),
# libpython3.X-stdlib (the code scenario).

missing=""
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

if [ -z "$missing" ]; then
    echo "data deps: all present ($PACKAGES)"
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
echo "data deps: installing$missing"
# dictd is what the dict-* packages depend on; its service is not needed (policy-rc.d may deny it)
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
