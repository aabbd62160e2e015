#!/bin/sh
# Creates (once) the venv with the PJRT plugins the pjrt tests load, and links each plugin's
# shared library into $VENV/plugins/ under a fixed name (tests/cmake/pjrt.cmake points the
# tests there):
#   plugins/pjrt_c_api_cpu_plugin.so   from lammps-jax-pjrt-cpu
#   plugins/libtpu.so                  from libtpu
# Idempotent: a venv whose stamp names the lock file's hash is reused as it is.
# Location: ${DIST_PJRT_VENV:-$HOME/.cache/libdist/venv-pjrt}. Needs PyPI the first time;
# without it this script fails loudly (and the tests that need the plugins fail with it).
set -eu

LOCK="$(cd "$(dirname "$0")" && pwd)/requirements.lock"
VENV="${DIST_PJRT_VENV:-$HOME/.cache/libdist/venv-pjrt}"
STAMP="$VENV/.libdist-stamp"
WANT="lock $(sha256sum "$LOCK" | cut -d' ' -f1)"

# One builder at a time (ctest -j, several build trees).
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock -w 1800 9 || { echo "venv.sh: timed out waiting for $VENV.lock" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -e "$VENV/plugins/libtpu.so" ] &&
    [ -e "$VENV/plugins/pjrt_c_api_cpu_plugin.so" ]; then
    echo "venv.sh: reusing $VENV (requirements.lock ${WANT#lock })"
    exit 0
fi

start=$(date +%s)
echo "venv.sh: creating $VENV from $LOCK"
rm -rf "$VENV"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --require-hashes \
    --no-deps -r "$LOCK" || {
    echo "venv.sh: FAILED to pip-install $LOCK into $VENV (is PyPI reachable?)" >&2
    exit 1
}
# find_spec locates a package without importing it (libtpu's __init__ has side effects).
pkg_dir() {
    "$VENV/bin/python" -c "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('$1').origin))"
}
mkdir -p "$VENV/plugins"
cpu="$(pkg_dir lammps_jax_pjrt_cpu)/pjrt_c_api_cpu_plugin.so"
tpu="$(pkg_dir libtpu)/libtpu.so"
for f in "$cpu" "$tpu"; do
    [ -f "$f" ] || { echo "venv.sh: $f is missing from the installed wheel" >&2; exit 1; }
done
ln -sf "$cpu" "$VENV/plugins/pjrt_c_api_cpu_plugin.so"
ln -sf "$tpu" "$VENV/plugins/libtpu.so"
echo "$WANT" > "$STAMP"
echo "venv.sh: done in $(( $(date +%s) - start )) s: $(ls "$VENV/plugins" | tr '\n' ' ')"
