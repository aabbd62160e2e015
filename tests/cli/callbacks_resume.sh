#!/bin/sh
# usage: callbacks_resume.sh DISTRAIN WORKDIR
# A run with EarlyStopping (restoring the best weights) and ReduceLROnPlateau, SIGKILLed after
# the backup of epoch 2 and started again, ends with the uninterrupted run's weights byte for
# byte, the same best epoch, and the same learning rate in every epoch: the callbacks' state
# (best value, wait, best weights, cooldown) travels in the backup.
set -u
distrain=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
steps=12
common="--strategy one_device --devices cpu:0 --threads 1 --epochs 6 --steps-per-epoch $steps
        --learning-rate 0.02 --validation-split 0.2 --early-stopping-patience 2
        --reduce-lr-patience 1"

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do printf -- '--- %s\n' "$f"; tail -n 12 "$f"; done
    exit 1
}

# shellcheck disable=SC2086
"$distrain" $common --save-weights "$work/reference.safetensors" --csv-log "$work/reference.csv" \
    >"$work/reference.log" 2>&1 || fail "the uninterrupted run failed"

# shellcheck disable=SC2086
"$distrain" $common --backup-dir "$work/bk" --save-weights "$work/resumed.safetensors" \
    --csv-log "$work/resumed.csv" >"$work/killed.log" 2>&1 &
pid=$!
i=0
at=$((2 * steps))
while [ ! -f "$work/bk/ckpt-$at.safetensors" ]; do
    i=$((i + 1))
    [ $i -gt 3000 ] && { kill -9 $pid; fail "no backup of step $at after 300 s"; }
    kill -0 $pid 2>/dev/null || fail "exited before the backup of step $at"
    sleep 0.1
done
kill -9 $pid
wait $pid 2>/dev/null
# shellcheck disable=SC2086
"$distrain" $common --backup-dir "$work/bk" --save-weights "$work/resumed.safetensors" \
    --csv-log "$work/resumed.csv" >"$work/resumed.log" 2>&1 || fail "the resumed run failed"

grep -q "resuming at epoch 3" "$work/resumed.log" || fail "the second run did not resume at epoch 3"
cmp -s "$work/reference.csv" "$work/resumed.csv" ||
    fail "the epochs' metrics or learning rates differ:
$(diff "$work/reference.csv" "$work/resumed.csv")"
best_ref=$(grep -o 'best epoch: [0-9]*' "$work/reference.log")
best_res=$(grep -o 'best epoch: [0-9]*' "$work/resumed.log")
[ "$best_ref" = "$best_res" ] || fail "best epoch '$best_ref' against '$best_res'"
cmp -s "$work/reference.safetensors" "$work/resumed.safetensors" ||
    fail "the final weights differ from the uninterrupted run's"
echo "ok: resumed run matches ($best_ref)"
