#!/bin/sh
# usage: jpeg_validation_split.sh DISTRAIN JPEG_DIR WORKDIR
# --validation-split on a JPEG folder: its files are listed class by class, so the last fraction
# held out only the last classes (val_accuracy 0.0 against test accuracy 0.76 on the 4,000-image
# fixture). Shuffled with the seed first, as Keras's image_dataset_from_directory does, the
# held-out part holds every class: after 3 epochs val_accuracy is within 0.05 of the test
# accuracy.
set -u
distrain=$1
jpeg=$2
dir=$3
rm -rf "$dir" && mkdir -p "$dir" || exit 1
"$distrain" --quiet --data-format jpeg-folder --data-dir "$jpeg" --epochs 3 --validation-split 0.2 \
    --csv-log "$dir/log.csv" --metrics-json "$dir/metrics.json" --strategy one_device \
    --devices cpu:0 --threads 1 || { echo "FAIL: distrain exited $?"; exit 1; }
# epoch,accuracy,learning_rate,loss,val_accuracy,val_loss
val=$(tail -n 1 "$dir/log.csv" | cut -d, -f5)
test_acc=$(sed -n 's/.*"test_accuracy": \([0-9.]*\).*/\1/p' "$dir/metrics.json")
if ! awk -v v="$val" -v t="$test_acc" 'BEGIN { d = t - v; if (d < 0) d = -d; exit !(t >= 0.8 && d <= 0.05) }'; then
    cat "$dir/log.csv"
    echo "FAIL: val_accuracy $val, test accuracy $test_acc: expected within 0.05 (test >= 0.8)"
    exit 1
fi
echo "ok: val_accuracy $val, test accuracy $test_acc"
