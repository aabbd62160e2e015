#!/bin/sh
# usage: keras_defaults.sh DISTRAIN DIR
# distrain's callbacks default as Keras's: EarlyStopping keeps the last epoch's weights unless
# --restore-best-weights asks for the best epoch's (restore_best_weights=False), and the weights
# saved differ accordingly.
set -u
distrain=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
# at a learning rate of 0.5 val_loss stalls: EarlyStopping stops after epoch 6 of 8, and the best
# epoch (4) is not the last
common="--strategy one_device --devices cpu:0 --threads 1 --epochs 8 --steps-per-epoch 12
        --learning-rate 0.5 --validation-split 0.2 --early-stopping-patience 2"
# shellcheck disable=SC2086
"$distrain" $common --save-weights "$dir/last.st" >"$dir/last.log" 2>&1 || { cat "$dir/last.log"; echo "FAIL: run"; exit 1; }
if grep -q 'Restoring model weights' "$dir/last.log"; then
    echo "FAIL: the best weights were restored without --restore-best-weights"; exit 1
fi
# shellcheck disable=SC2086
"$distrain" $common --restore-best-weights --save-weights "$dir/best.st" >"$dir/best.log" 2>&1 || { cat "$dir/best.log"; echo "FAIL: run with --restore-best-weights"; exit 1; }
grep -q 'Restoring model weights from the end of the best epoch' "$dir/best.log" || {
    cat "$dir/best.log"; echo "FAIL: --restore-best-weights did not restore"; exit 1; }
if cmp -s "$dir/last.st" "$dir/best.st"; then
    echo "FAIL: the restored weights equal the last epoch's (the test needs a best epoch that is not the last)"; exit 1
fi
echo "ok: last-epoch weights by default, the best epoch's with --restore-best-weights"
