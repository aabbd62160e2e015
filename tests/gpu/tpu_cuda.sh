#!/usr/bin/env bash
# The tpu strategy on a GPU: JAX's CUDA PJRT plugin (PyPI jax-cuda13-pjrt,
# jax_plugins/xla_cuda13/xla_cuda_plugin.so) compiles and runs the traced step.
#
#   tests/gpu/tpu_cuda.sh PLUGIN [BUILD]
#
# PLUGIN: the plugin's .so (its wheel is 129 MB: install it where the GPU machine can reach it;
# the NVIDIA libraries it loads, from the nvidia-* wheels or /usr/local/cuda, must be on
# LD_LIBRARY_PATH). Steps: 20 steps of the seed CNN on one GPU through the plugin against the
# oneDNN engine's mirrored strategy with one replica (losses within 1e-4; SGD weights within
# 1e-4), then distrain --strategy tpu for 5 epochs (test accuracy >= 0.96). A missing plugin or
# GPU fails: it is not a skip. Exit 0 when everything passed.
set -u -o pipefail
plugin=${1:?usage: tpu_cuda.sh PLUGIN [BUILD]}
build=${2:-build}
cd "$(dirname "$0")/../.." || exit 2
[[ -f $plugin ]] || { echo "tpu_cuda: no plugin at $plugin" >&2; exit 1; }
nvidia-smi -L >/dev/null 2>&1 || { echo "tpu_cuda: no GPU (nvidia-smi -L failed)" >&2; exit 1; }
fail=0
"$build/tests/tpu_vs_mirrored" "$plugin" 1 20 1e-4 sgd || fail=1
"$build/tests/tpu_vs_mirrored" "$plugin" 1 20 1e-4 adam || fail=1
out=$(mktemp -d)
"$build/distrain" --strategy tpu --pjrt-plugin "$plugin" --tpu-cores 1 --epochs 5 \
    --metrics-json "$out/tpu_gpu.json" || fail=1
python3 - "$out/tpu_gpu.json" <<'PY' || fail=1
import json, sys
m = json.load(open(sys.argv[1]))
print("tpu on the CUDA plugin: test accuracy", m["test_accuracy"], "images/s", m["train_images_per_sec"])
sys.exit(0 if m["test_accuracy"] >= 0.96 else 1)
PY
exit $fail
