#!/bin/sh
# Creates (once) the Python venv with the references the conformance tests compare against:
# TensorFlow (and its TensorBoard), tf-keras (Keras 2, the rules the seed documents describe)
# and safetensors.
# Idempotent: a venv whose stamp names the pinned version is reused as it is.
# Location: ${DIST_VENV:-$HOME/.cache/libdist/venv-tf}. Needs PyPI the first time; without it
# this script fails loudly (the conformance fixture then fails, on purpose).
set -eu

TF_PIN="tensorflow-cpu==2.20.0 tf-keras==2.20.1 safetensors==0.8.0"
VENV="${DIST_VENV:-$HOME/.cache/libdist/venv-tf}"
STAMP="$VENV/.libdist-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$TF_PIN" ] && [ -x "$VENV/bin/python" ]; then
    echo "venv.sh: reusing $VENV ($TF_PIN)"
    exit 0
fi

start=$(date +%s)
echo "venv.sh: creating $VENV with $TF_PIN"
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
/usr/bin/python3 -m venv "$VENV"
# shellcheck disable=SC2086 # the pins are separate words
"$VENV/bin/python" -m pip install --disable-pip-version-check --quiet $TF_PIN || {
    echo "venv.sh: FAILED to pip-install $TF_PIN into $VENV (is PyPI reachable?)" >&2
    exit 1
}
"$VENV/bin/python" -c "import tensorflow as tf, tf_keras, safetensors, tensorboard; print('venv.sh: tensorflow', tf.__version__, 'tf_keras', tf_keras.__version__, 'safetensors', safetensors.__version__)"
echo "$TF_PIN" > "$STAMP"
echo "venv.sh: done in $(( $(date +%s) - start )) s"
