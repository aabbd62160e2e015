#!/bin/sh
# usage: cross_restore.sh DISTRAIN PLUGIN WORKDIR
# A BackupAndRestore backup written under --strategy tpu resumes under mirrored, and one written
# under mirrored resumes under tpu: each run is SIGKILLed once its epoch-1 backup exists, then
# restarted under the other strategy with the same --backup-dir. The restart must say where it
# resumes, skip epoch 1, finish, and end with a loss within 2% of an uninterrupted mirrored run
# (the two engines round differently, so not bit for bit).
set -u
distrain=$1
plugin=$2
work=$3
rm -rf "$work"
mkdir -p "$work"
steps=30
common="--epochs 3 --steps-per-epoch $steps --seed 7"
tpu="--strategy tpu --pjrt-plugin $plugin --tpu-cores 2"
mirrored="--strategy mirrored --devices cpu:0,cpu:1 --threads 1"

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do printf -- '--- %s\n' "$f"; tail -n 8 "$f"; done
    exit 1
}

# final training loss of a log ("... - loss: 0.1234 - ...", last epoch line)
final_loss() {
    sed -n 's/.* - loss: \([0-9.]*\) .*/\1/p' "$1" | tail -n 1
}

# shellcheck disable=SC2086
"$distrain" $common $mirrored >"$work/reference.log" 2>&1 || fail "the uninterrupted run failed"
ref=$(final_loss "$work/reference.log")

# $1 name, $2 first strategy's flags, $3 second strategy's flags
cross() {
    # shellcheck disable=SC2086
    "$distrain" $common $2 --backup-dir "$work/$1.backup" >"$work/$1.killed.log" 2>&1 &
    pid=$!
    i=0
    while [ ! -f "$work/$1.backup/ckpt-$steps.safetensors" ]; do
        i=$((i + 1))
        [ $i -gt 6000 ] && { kill -9 $pid; fail "$1: no backup of epoch 1 after 300 s"; }
        kill -0 $pid 2>/dev/null || fail "$1: exited before the backup of epoch 1"
        sleep 0.05
    done
    kill -9 $pid
    wait $pid 2>/dev/null
    # shellcheck disable=SC2086
    "$distrain" $common $3 --backup-dir "$work/$1.backup" >"$work/$1.restart.log" 2>&1 ||
        fail "$1: the restart failed"
    grep -q "BackupAndRestore: resuming at epoch [23]" "$work/$1.restart.log" ||
        fail "$1: the restart did not resume from the backup"
    grep -q "Epoch 1/3" "$work/$1.restart.log" && fail "$1: the restart ran epoch 1 again"
    got=$(final_loss "$work/$1.restart.log")
    awk -v a="$got" -v b="$ref" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 0.02 * b) }' ||
        fail "$1: final loss $got, the uninterrupted run's $ref"
    printf '%s: resumed, final loss %s (uninterrupted mirrored: %s)\n' "$1" "$got" "$ref"
}

cross tpu_to_mirrored "$tpu" "$mirrored"
cross mirrored_to_tpu "$mirrored" "$tpu"
echo "PASS"
