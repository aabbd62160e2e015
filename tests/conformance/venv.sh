#!/bin/sh
# Creates (once) the Python venv with the references the conformance tests compare against:
# TensorFlow (and its TensorBoard), tf-keras (Keras 2, the rules the seed documents describe)
# and safetensors.
# Idempotent: a venv whose stamp names the lock file's hash is reused as it is.
# Location: ${DIST_VENV:-$HOME/.cache/libdist/venv-tf}. Needs PyPI the first time; without it
# this script fails loudly (the conformance fixture then fails, on purpose).
set -eu

# Every package, TensorFlow's dependencies included, is pinned with its hashes in
# requirements.lock beside this script: pip refuses any other bytes (--require-hashes).
LOCK="$(cd "$(dirname "$0")" && pwd)/requirements.lock"
VENV="${DIST_VENV:-$HOME/.cache/libdist/venv-tf}"
STAMP="$VENV/.libdist-stamp"
WANT="lock $(sha256sum "$LOCK" | cut -d' ' -f1)"

# One builder at a time: concurrent test runs (ctest -j, several build trees) wait here
# instead of deleting each other's half-made venv.
mkdir -p "$(dirname "$VENV")"
exec 9>"$VENV.lock"
flock -w 1800 9 || { echo "venv.sh: timed out waiting for $VENV.lock" >&2; exit 1; }

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
    echo "venv.sh: reusing $VENV (requirements.lock ${WANT#lock })"
    exit 0
fi

start=$(date +%s)
echo "venv.sh: creating $VENV from $LOCK"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
/usr/bin/python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet --require-hashes \
    --no-deps -r "$LOCK" || {
    echo "venv.sh: FAILED to pip-install $LOCK into $VENV (is PyPI reachable?)" >&2
    exit 1
}
"$VENV/bin/python" -c "import tensorflow as tf, tf_keras, safetensors, tensorboard; print('venv.sh: tensorflow', tf.__version__, 'tf_keras', tf_keras.__version__, 'safetensors', safetensors.__version__)"
echo "$WANT" > "$STAMP"
echo "venv.sh: done in $(( $(date +%s) - start )) s"
