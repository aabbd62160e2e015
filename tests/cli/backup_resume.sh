#!/bin/sh
# usage: backup_resume.sh DISTRAIN WORKDIR [STRATEGY]
# distrain --backup-dir, SIGKILLed during epoch 3 of 5 and started again with the same command,
# ends with the same weights, byte for byte, as an uninterrupted run. Then the same with the
# newest backup bit-flipped before the restart: it is refused with a message and the previous
# backup is used, with the same final weights. Then with backups every 30 steps, killed inside
# epoch 3, resuming inside it.
set -u
distrain=$1
work=$2
strategy=${3:-mirrored} # over cpu:0,cpu:1
rm -rf "$work"
mkdir -p "$work"
steps=40
common="--epochs 5 --steps-per-epoch $steps --strategy $strategy --devices cpu:0,cpu:1 --threads 1"

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do printf -- '--- %s\n' "$f"; tail -n 5 "$f"; done
    exit 1
}

# shellcheck disable=SC2086
"$distrain" $common --save-weights "$work/reference.safetensors" >"$work/reference.log" 2>&1 ||
    fail "the uninterrupted run failed"

# Starts a run in the background and SIGKILLs it once the backup of global step $2 exists
# (default: the end of epoch 2); further arguments go to distrain.
run_and_kill() {
    name=$1
    at=${2:-$((2 * steps))}
    if [ $# -ge 2 ]; then shift 2; else shift $#; fi
    # shellcheck disable=SC2086
    "$distrain" $common "$@" --backup-dir "$work/$name.backup" \
        --save-weights "$work/$name.safetensors" >"$work/$name.killed.log" 2>&1 &
    pid=$!
    i=0
    while [ ! -f "$work/$name.backup/ckpt-$at.safetensors" ]; do
        i=$((i + 1))
        [ $i -gt 6000 ] && { kill -9 $pid; fail "$name: no backup of step $at after 300 s"; }
        kill -0 $pid 2>/dev/null || fail "$name: exited before the backup of step $at"
        sleep 0.05
    done
    kill -9 $pid
    wait $pid 2>/dev/null
    [ -f "$work/$name.safetensors" ] && fail "$name: the run finished before it was killed"
    return 0
}

# The global steps of a run's backups, newest first. On a loaded machine the kill may land a
# backup or two after the one waited for: the expectations below follow what is on disk.
backups() {
    find "$work/$1.backup" -maxdepth 1 -name 'ckpt-*.safetensors' |
        sed -n 's/.*ckpt-\([0-9]*\)\.safetensors$/\1/p' | sort -rn
}

# The restart of run $1 resumed right after the backup of global step $2.
expect_resume() {
    e=$(($2 / steps + 1))
    k=$(($2 % steps))
    grep -q "BackupAndRestore: resuming at epoch $e, step $k" "$work/$1.restart.log" ||
        fail "$1: the restart did not resume at epoch $e, step $k (after the backup of step $2)"
}

restart() {
    name=$1
    shift
    # shellcheck disable=SC2086
    "$distrain" $common "$@" --backup-dir "$work/$name.backup" \
        --save-weights "$work/$name.safetensors" >"$work/$name.restart.log" 2>&1 ||
        fail "$name: the restarted run failed"
    cmp "$work/reference.safetensors" "$work/$name.safetensors" ||
        fail "$name: final weights differ from the uninterrupted run's"
    [ -d "$work/$name.backup" ] && fail "$name: the backup directory was not removed at the end"
    return 0
}

run_and_kill plain
last=$(backups plain | head -n 1)
restart plain
expect_resume plain "$last"
grep -q "Epoch 1/5" "$work/plain.restart.log" && fail "plain: the restart ran epoch 1 again"

run_and_kill corrupt
last=$(backups corrupt | head -n 1)
previous=$(backups corrupt | sed -n 2p)
[ -n "$previous" ] || fail "corrupt: no backup before the newest one"
newest="$work/corrupt.backup/ckpt-$last.safetensors"
size=$(wc -c <"$newest")
# flip one bit of the last data byte
byte=$(dd if="$newest" bs=1 skip=$((size - 1)) count=1 2>/dev/null | od -An -tu1 | tr -d ' ')
printf "$(printf '\\%03o' $((byte ^ 1)))" |
    dd of="$newest" bs=1 seek=$((size - 1)) count=1 conv=notrunc 2>/dev/null
restart corrupt
grep -q "skipping checkpoint: .*ckpt-$last.safetensors" "$work/corrupt.restart.log" ||
    fail "corrupt: the damaged backup was not refused with a message"
expect_resume corrupt "$previous" # the backup before the damaged one
# Backups every 30 steps: killed after step 90 (epoch 3, step 10), the restart continues inside
# the epoch with the data iterator where it was.
# (A kill that lands late, on the backup at an epoch's end, is tried again: that case must be
# inside an epoch.)
for attempt in 1 2 3; do
    rm -rf "$work/midepoch.backup"
    run_and_kill midepoch 90 --backup-freq 30
    last=$(backups midepoch | head -n 1)
    [ $((last % steps)) -ne 0 ] && break
    [ "$attempt" -eq 3 ] && fail "midepoch: three kills landed on an epoch's end (newest backup $last)"
done
restart midepoch --backup-freq 30
expect_resume midepoch "$last"

echo "OK: resumed runs end with the uninterrupted run's weights"
