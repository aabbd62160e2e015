#!/bin/sh
# usage: mw_chief_writes.sh DISTRAIN DIR
# Two local workers with --checkpoint-dir: the chief writes ckpt-01/02, the other worker's
# temporary directory is gone at the end (TF's rule), and both checkpoints are whole files.
set -u
distrain=$1
dir=$2
rm -rf "$dir"
"$distrain" --strategy multi_worker --workers 2 --epochs 2 --steps-per-epoch 10 --quiet \
    --checkpoint-dir "$dir" || { echo "FAIL: distrain exited $?"; exit 1; }
found=$(ls "$dir" | tr '\n' ' ')
if [ "$found" != "ckpt-01.safetensors ckpt-02.safetensors " ]; then
    echo "FAIL: expected only the chief's two checkpoints in $dir, found: $found"; exit 1
fi
echo "ok: $found"
