#!/bin/sh
# Installs the Debian 12 packages libdist needs, and only those that are missing.
#
#   tools/setup-deps.sh           what building and testing need (the default)
#   tools/setup-deps.sh --bench   only the benchmarks' PyTorch reference (python3-torch, OpenBLAS)
#   tools/setup-deps.sh --all     both
#   tools/setup-deps.sh --pjrt    the PJRT plugins --strategy tpu runs on (XLA's CPU plugin and
#                                 libtpu, from PyPI with pinned hashes, into
#                                 ~/.cache/libdist/venv-pjrt or $DIST_PJRT_VENV); prints the
#                                 --pjrt-plugin path to give distrain
#
# Idempotent: run it as often as you like. Needs root only when something is missing.
set -eu

BUILD_PKGS="g++ pkg-config libdnnl-dev check libsubunit-dev libcjson-dev zlib1g-dev
libturbojpeg0-dev libpng-dev libcurl4-openssl-dev libssl-dev dataset-fashion-mnist python3 python3-venv libopenmpi-dev
openmpi-bin clang libomp-dev libhdf5-dev libzip-dev"
BENCH_PKGS="python3-torch libopenblas0-openmp"

usage() {
    echo "usage: $0 [--bench | --all | --pjrt]" >&2
    exit 2
}

wanted=$BUILD_PKGS
case $# in
0) ;;
1)
    case $1 in
    --bench) wanted=$BENCH_PKGS ;;
    --all) wanted="$BUILD_PKGS $BENCH_PKGS" ;;
    --pjrt)
        here=$(cd "$(dirname "$0")" && pwd)
        "$here/../tests/pjrt/venv.sh"
        venv=${DIST_PJRT_VENV:-$HOME/.cache/libdist/venv-pjrt}
        echo "setup-deps: XLA's CPU PJRT plugin: --pjrt-plugin $venv/plugins/pjrt_c_api_cpu_plugin.so"
        exit 0
        ;;
    -h | --help)
        sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) usage ;;
    esac
    ;;
*) usage ;;
esac

installed() {
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=
for p in $wanted; do
    installed "$p" || missing="$missing $p"
done
missing=${missing# }

if [ -z "$missing" ]; then
    echo "setup-deps: all dependencies present"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup-deps: missing packages: $missing; run this script as root to install them" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
# apt's chatter goes to a log that is shown only when something fails.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# shellcheck disable=SC2086 # the package list is meant to split into words
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } \
    >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup-deps: failed to install: $missing" >&2
    exit 1
fi
echo "setup-deps: installed $missing"
