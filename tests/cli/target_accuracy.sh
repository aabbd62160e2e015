#!/bin/sh
# usage: target_accuracy.sh DISTRAIN DIR
# distrain --target-accuracy A evaluates the test split after every epoch and stops after the
# first epoch whose test accuracy is >= A:
#  - A = 0.5 is reached after epoch 1 (60 steps of Adam give ~0.85): one epoch runs of 4, the
#    epoch's test accuracy is the one the final evaluation prints (the same weights), and the
#    metrics JSON says reached at epoch 1;
#  - A = 1 is not reached: every epoch of --epochs runs and evaluates, and the run says so.
set -u
distrain=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() { printf 'FAIL: %s\n--- output:\n%s\n' "$1" "$out"; exit 1; }
common="--strategy one_device --devices cpu:0 --threads 1"

out=$("$distrain" $common --epochs 4 --steps-per-epoch 60 --target-accuracy 0.5 --metrics-json "$dir/reached.json" 2>&1) ||
    fail "distrain exited $? with --target-accuracy 0.5"
printf '%s\n' "$out" | grep -q "^Epoch 1: test accuracy .*reached, stopping" ||
    fail "no 'Epoch 1: test accuracy ... reached, stopping' line"
printf '%s\n' "$out" | grep -q "^Epoch 2/4" && fail "epoch 2 ran after the target was reached"
epoch_acc=$(printf '%s\n' "$out" | sed -n 's/^Epoch 1: test accuracy \([0-9.]*\).*/\1/p')
final_acc=$(printf '%s\n' "$out" | sed -n 's/^Test loss: .* test accuracy: \([0-9.]*\).*/\1/p')
[ -n "$epoch_acc" ] && [ "$epoch_acc" = "$final_acc" ] ||
    fail "epoch 1's test accuracy '$epoch_acc' differs from the final evaluation's '$final_acc'"
grep -q '"epochs": 1,' "$dir/reached.json" || fail "metrics JSON: epochs is not 1: $(cat "$dir/reached.json")"
grep -q '"target_accuracy": {"target": 0.5, "reached": true, "epoch": 1, "epochs_evaluated": 1}' \
    "$dir/reached.json" || fail "metrics JSON: target_accuracy wrong: $(cat "$dir/reached.json")"

out=$("$distrain" $common --epochs 2 --steps-per-epoch 3 --target-accuracy 1 \
    --metrics-json "$dir/missed.json" 2>&1) || fail "distrain exited $? with --target-accuracy 1"
[ "$(printf '%s\n' "$out" | grep -c '^Epoch [12]: test accuracy')" -eq 2 ] ||
    fail "expected a test accuracy line after each of the 2 epochs"
printf '%s\n' "$out" | grep -q "reached, stopping" && fail "an accuracy of 1 was reported reached"
printf '%s\n' "$out" | grep -qF "Target accuracy 1 not reached in 2 epochs" ||
    fail "no 'Target accuracy 1 not reached in 2 epochs' line"
grep -q '"epochs": 2,' "$dir/missed.json" || fail "metrics JSON: epochs is not 2"
grep -q '"reached": false, "epoch": 0, "epochs_evaluated": 2' "$dir/missed.json" ||
    fail "metrics JSON: target_accuracy wrong: $(cat "$dir/missed.json")"
echo "ok: stopped after epoch 1 at test accuracy $epoch_acc (target 0.5); target 1 not reached in 2 epochs"
