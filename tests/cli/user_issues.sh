#!/bin/sh
# usage: user_issues.sh DISTRAIN JPEG_DIR SUBSET_DIR WORKDIR PART
# PART: jpeg_classes | empty_sets | csv_resume | corrupt_test_jpeg | late_write | early_stop_epochs
#       | nothing_trained | callbacks_resume | truncated_test_jpeg | empty_keras_weights
#       | png_named_jpg_predict
# Issue #22's behaviours that need data on disk or two runs:
#   1. JPEG folders: test/ lacking a class keeps the training split's numbering (accuracy stays
#      high); a test class that train/ does not have is refused before any training.
#   3. EarlyStopping's and ReduceLROnPlateau's state survives a kill and a resume.
#   4. --csv-log on a resumed run keeps the epochs before the kill, once each.
#   5. An IDX set with 0 examples is an error naming the file.
#   15. The metrics JSON counts the epochs that ran.
# and messages that named another problem than the real one (each part: the message names the
# file and its real problem, and not the one it used to name).
set -u
distrain=$1
jpeg=$2
subset=$3
work=$4/$5
part=$5
rm -rf "$work"
mkdir -p "$work"
quick="--threads 1 --devices cpu:0 --strategy one_device"

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do printf -- '--- %s\n' "$f"; tail -n 8 "$f"; done
    exit 1
}

# Runs distrain with the remaining arguments in the background (output in $work/$1.log) and
# SIGKILLs it once $work/bk holds the backup of global step $2. It polls every 20 ms: the last
# epoch of a short run can take under 100 ms, after which the finished run deletes its backup.
kill_after_backup() {
    name=$1
    step=$2
    shift 2
    "$distrain" "$@" >"$work/$name.log" 2>&1 &
    pid=$!
    i=0
    while [ ! -f "$work/bk/ckpt-$step.safetensors" ]; do
        i=$((i + 1))
        [ $i -gt 15000 ] && { kill -9 $pid; fail "$name: no backup of step $step after 300 s"; }
        kill -0 $pid 2>/dev/null || fail "$name: exited before the backup of step $step"
        sleep 0.02
    done
    kill -9 $pid
    wait $pid 2>/dev/null
}

# The JPEG folder $work/$1 is refused before epoch 1 (exit 1) with a message matching $2.
expect_refused() {
    # shellcheck disable=SC2086
    "$distrain" $quick --data-format jpeg-folder --data-dir "$work/$1" --epochs 1 \
        >"$work/$1.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "$1: exit $rc, expected 1"
    grep -q "$2" "$work/$1.log" || fail "$1: the message does not match '$2'"
    grep -q "Epoch 1" "$work/$1.log" && fail "$1: it trained first"
}

jpeg_classes() {
# 1. test/ without class 3
cp -r "$jpeg" "$work/missing3"
rm -rf "$work/missing3/test/3"
# shellcheck disable=SC2086
"$distrain" $quick --data-format jpeg-folder --data-dir "$work/missing3" --epochs 3 \
    --metrics-json "$work/missing3.json" >"$work/missing3.log" 2>&1 || fail "missing class: run failed"
acc=$(sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p' "$work/missing3.json")
awk "BEGIN { exit !($acc >= 0.7) }" || fail "missing class: test accuracy $acc < 0.7 (labels shifted?)"

# 1. a class folder copied as zz: refused before epoch 1
refused_class() {
    cp -r "$jpeg" "$work/$1"
    cp -r "$work/$1/$2/9" "$work/$1/$2/zz"
    expect_refused "$1" "$3"
}
# a test class that train/ does not have; a train class beyond the model's 10
refused_class extra test test/zz
refused_class extratrain train "has 11 class folders"
}

empty_sets() {
# 5. empty training and test sets
for which in train t10k; do
    d="$work/empty_$which"
    mkdir -p "$d"
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        gzip -dc "$subset/$f.gz" >"$d/$f"
    done
    printf '\000\000\010\003\000\000\000\000\000\000\000\034\000\000\000\034' >"$d/$which-images-idx3-ubyte"
    printf '\000\000\010\001\000\000\000\000' >"$d/$which-labels-idx1-ubyte"
    # shellcheck disable=SC2086
    "$distrain" $quick --data-dir "$d" --epochs 1 >"$work/empty_$which.log" 2>&1
    rc=$?
    [ $rc -eq 1 ] || fail "empty $which set: exit $rc, expected 1"
    grep -q "distrain: .*$d" "$work/empty_$which.log" || fail "empty $which set: the message does not name the data"
    grep -q "no examples" "$work/empty_$which.log" || fail "empty $which set: no 'no examples'"
done

}

csv_resume() {
# 4. --csv-log across a kill and a resume: epochs 0..3, each once
common="$quick --epochs 4 --steps-per-epoch 15 --backup-dir $work/bk --csv-log $work/log.csv"
# shellcheck disable=SC2086
kill_after_backup csv_killed 30 $common
# shellcheck disable=SC2086
"$distrain" $common --metrics-json "$work/csv.json" >"$work/csv_resumed.log" 2>&1 || fail "csv: the resumed run failed"
rows=$(grep -c '^[0-9]' "$work/log.csv")
[ "$rows" -eq 4 ] || fail "csv: $rows epoch rows, expected 4: $(cat "$work/log.csv")"
for e in 0 1 2 3; do
    [ "$(grep -c "^$e," "$work/log.csv")" -eq 1 ] || fail "csv: epoch $e not exactly once"
done
[ "$(grep -c '^epoch' "$work/log.csv")" -eq 1 ] || fail "csv: the header is not there once"
# 15. steps count the whole training, across the resume
grep -q '"steps": 60,' "$work/csv.json" || fail "metrics: steps is not 60 across the resume: $(grep steps "$work/csv.json")"

grep -q '"epochs": 4,' "$work/csv.json" || fail "metrics: epochs is not 4"
}

corrupt_test_jpeg() {
# 6. a corrupt JPEG in test/ is found before training, naming the file
cp -r "$jpeg" "$work/corrupt"
victim=$(ls "$work/corrupt/test/3" | head -n 1)
printf 'not a jpeg' >"$work/corrupt/test/3/$victim"
expect_refused corrupt "^distrain: .*test/3/$victim"
}

# "$@" exits with $2 and prints one line that holds $3 and not $4; the output goes to $work/$1.log.
expect_message() {
    name=$1
    want_rc=$2
    want=$3
    not=$4
    shift 4
    "$@" >"$work/$name.log" 2>&1
    rc=$?
    [ $rc -eq "$want_rc" ] || fail "$name: exit $rc, expected $want_rc"
    grep -qF -- "$want" "$work/$name.log" || fail "$name: the message does not say '$want'"
    grep -qF -- "$not" "$work/$name.log" && fail "$name: the message still says '$not'"
    [ "$(grep -c . "$work/$name.log")" -eq 1 ] || fail "$name: not a one-line message"
}

truncated_test_jpeg() {
# a test JPEG cut inside its header (10 bytes) is called truncated, naming it; it used to "claim
# 0x0 pixels, over the cap"
cp -r "$jpeg" "$work/cut"
victim=$(ls "$work/cut/test/3" | head -n 1)
head -c 10 "$jpeg/test/3/$victim" >"$work/cut/test/3/$victim"
expect_refused cut "test/3/$victim' is truncated or not a valid JPEG"
grep -q "0x0 pixels" "$work/cut.log" && fail "cut: the message still says 0x0 pixels"
}

empty_keras_weights() {
# a 0-byte .weights.h5 is called an empty HDF5 Keras weights file, not too short for safetensors
: >"$work/empty.weights.h5"
# shellcheck disable=SC2086
expect_message empty_weights 1 "'$work/empty.weights.h5' is empty (0 bytes): not an HDF5 Keras weights file" \
    safetensors "$distrain" $quick --epochs 0 --load-weights "$work/empty.weights.h5" --quiet
# and an empty safetensors file is called empty, not "0 bytes is too short"
: >"$work/empty.safetensors"
# shellcheck disable=SC2086
expect_message empty_safetensors 1 "'$work/empty.safetensors' is empty (0 bytes): not a safetensors file" \
    "too short" "$distrain" $quick --epochs 0 --load-weights "$work/empty.safetensors" --quiet
}

png_named_jpg_predict() {
# distrain predict on a .jpg that holds PNG bytes says so, rather than "reading the IDX file"
# shellcheck disable=SC2086
"$distrain" $quick --epochs 0 --save-weights "$work/w.weights.h5" --quiet >"$work/w.log" 2>&1 ||
    fail "saving the initial weights failed"
printf '\211PNG\r\n\032\n\000\000\000\rIHDR\000\000\000\034\000\000\000\034\010\000\000\000\000' \
    >"$work/digit.jpg"
expect_message png_as_jpg 1 "'$work/digit.jpg' holds PNG data; distrain predict reads JPEG and IDX files" \
    "IDX file:" "$distrain" predict --weights "$work/w.weights.h5" --input "$work/digit.jpg" \
    --strategy one_device --devices cpu:0 --threads 1
}

late_write() {
# 6. an output whose folder disappears during the training (--save-weights, then --trace): the
# weights are saved elsewhere, and the message says where
for flag in --save-weights --trace; do
    rm -rf "$work/out" "$work"/distrain-weights-*.safetensors
    mkdir -p "$work/out"
    # emptied here, not by the background job's redirection: the wait below must not see the
    # previous flag's "Epoch 1" before the job has started (CI saw exit 2 from that race)
    : >"$work/late.log"
    # shellcheck disable=SC2086
    (cd "$work" && exec "$distrain" $quick --epochs 3 --steps-per-epoch 20 \
        "$flag" "$work/out/file") >"$work/late.log" 2>&1 &
    pid=$!
    i=0
    until grep -q "Epoch 1" "$work/late.log"; do
        i=$((i + 1))
        [ $i -gt 3000 ] && { kill -9 $pid; fail "late write $flag: no epoch 1 after 300 s"; }
        sleep 0.1
    done
    rm -rf "$work/out"
    wait $pid
    rc=$?
    [ $rc -eq 1 ] || fail "late write $flag: exit $rc, expected 1"
    saved=$(sed -n "s/^distrain: the trained weights are saved in '\(.*\)'$/\1/p" "$work/late.log")
    [ -n "$saved" ] || fail "late write $flag: the message does not say where the weights went"
    [ -s "$saved" ] || fail "late write $flag: '$saved' is not there"
done
}

early_stop_epochs() {
# 15. "epochs" in the metrics JSON counts the epochs that ran: 6 of 8 when early stopping ends
# the run (at a learning rate of 0.5 val_loss stalls near 2.30: epochs 5 and 6 do not improve on
# epoch 4, and patience 2 stops the run)
# shellcheck disable=SC2086
"$distrain" $quick --epochs 8 --steps-per-epoch 12 --learning-rate 0.5 --validation-split 0.2 \
    --early-stopping-patience 2 --metrics-json "$work/early.json" \
    >"$work/early.log" 2>&1 || fail "early stopping run failed"
ran=$(grep -c '^Epoch [0-9]*/8' "$work/early.log")
[ "$ran" -lt 8 ] || fail "early stopping did not stop the run (the check needs it)"
grep -q "\"epochs\": $ran," "$work/early.json" || fail "metrics: epochs is not the $ran that ran: $(grep epochs "$work/early.json")"
}

nothing_trained() {
# 15. a run resumed from a backup already past its last epoch trains nothing: its train metrics
# are null, not 0 (the backup comes from a 3-epoch run killed after epoch 2; the resumed run
# asks for 2)
common="$quick --steps-per-epoch 10 --backup-dir $work/bk"
# shellcheck disable=SC2086
kill_after_backup three 20 $common --epochs 3
# shellcheck disable=SC2086
"$distrain" $common --epochs 2 --metrics-json "$work/none.json" >"$work/none.log" 2>&1 ||
    fail "nothing trained: the resumed run failed"
grep -q '"train_loss": null,' "$work/none.json" || fail "nothing trained: $(grep train_loss "$work/none.json")"
grep -q '"train_accuracy": null,' "$work/none.json" || fail "nothing trained: train_accuracy is not null"
grep -q '"epochs": 2,' "$work/none.json" || fail "nothing trained: epochs is not 2"
}

callbacks_resume() {
# 3. A run with EarlyStopping (restoring the best weights) and ReduceLROnPlateau, SIGKILLed
# after the backup of epoch 2 and started again, ends with the uninterrupted run's weights byte
# for byte, the same best epoch, and the same learning rate in every epoch: the callbacks'
# state (best value, wait, best weights, cooldown) travels in the backup.
steps=12
common="--strategy one_device --devices cpu:0 --threads 1 --epochs 6 --steps-per-epoch $steps
        --learning-rate 0.02 --validation-split 0.2 --early-stopping-patience 2
        --reduce-lr-patience 1"

# shellcheck disable=SC2086
"$distrain" $common --save-weights "$work/reference.safetensors" --csv-log "$work/reference.csv" \
    >"$work/reference.log" 2>&1 || fail "the uninterrupted run failed"

# shellcheck disable=SC2086
kill_after_backup killed $((2 * steps)) $common --backup-dir "$work/bk" \
    --save-weights "$work/resumed.safetensors" --csv-log "$work/resumed.csv"
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
}

case $part in
jpeg_classes | empty_sets | csv_resume | corrupt_test_jpeg | late_write | early_stop_epochs | nothing_trained | callbacks_resume | truncated_test_jpeg | empty_keras_weights | png_named_jpg_predict) $part ;;
*) fail "unknown part '$part'" ;;
esac
echo "ok: $part"
