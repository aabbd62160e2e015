#!/bin/sh
# usage: launcher_orphans.sh DISTRAIN WORKDIR multi_worker|parameter_server
# `distrain --workers 2` (with --ps 1 under parameter_server) trains with a --backup-dir; once
# the backup exists the launcher is SIGKILLed. Within 5 s no task of the job may be left
# (each is found by the job's unique --metrics-json path in /proc/*/cmdline), and the backup
# must still be there: an orphan that trained on to the end would have deleted it.
set -u
distrain=$1
dir=$2
mode=$3
rm -rf "$dir" && mkdir -p "$dir"
tag="$dir/orphans-$$-$mode.json" # on every task's command line, nowhere else
# grep -f: the pattern must not be on grep's own command line
printf '%s\n' "$tag" >"$dir/pattern"
job_pids() {
    grep -lsFf "$dir/pattern" /proc/[0-9]*/cmdline | sed 's|/proc/\([0-9]*\)/cmdline|\1|'
}
extra=""
[ "$mode" = parameter_server ] && extra="--ps 1"
# shellcheck disable=SC2086
"$distrain" --strategy "$mode" --workers 2 $extra --threads 1 --epochs 50 \
    --metrics-json "$tag" --backup-dir "$dir/backup" >"$dir/out" 2>"$dir/err" &
launcher=$!
fail() {
    echo "FAIL: $*"
    cat "$dir/err"
    tail -5 "$dir/out"
    for p in $(job_pids); do kill -9 "$p" 2>/dev/null; done
    kill -9 "$launcher" 2>/dev/null
    exit 1
}
# training runs and the backup exists once the chief starts its third epoch
waited=0
until grep -q "Epoch 3/50" "$dir/out" 2>/dev/null && [ -n "$(ls -A "$dir/backup" 2>/dev/null)" ]; do
    sleep 0.1
    waited=$((waited + 1))
    [ $waited -gt 600 ] && fail "the job never reached its third epoch with a backup"
    kill -0 "$launcher" 2>/dev/null || fail "the launcher exited before the third epoch"
done
tasks=$(job_pids | grep -vx "$launcher" | wc -l)
expected=2
[ "$mode" = parameter_server ] && expected=4
[ "$tasks" -eq "$expected" ] || fail "found $tasks tasks of the job, expected $expected"
kill -9 "$launcher"
wait "$launcher" 2>/dev/null
start=$(date +%s)
while [ -n "$(job_pids)" ]; do
    if [ $(($(date +%s) - start)) -ge 5 ]; then
        left=$(job_pids | tr '\n' ' ')
        fail "5 s after the launcher was SIGKILLed its tasks still run: pids $left"
    fi
    sleep 0.1
done
took=$(($(date +%s) - start))
# a finishing orphan would delete the backup at the end of training (50 epochs: seconds here)
sleep 3
[ -n "$(ls -A "$dir/backup" 2>/dev/null)" ] || fail "the backup in $dir/backup was deleted"
echo "ok: the $tasks tasks ended within ${took} s of the launcher's SIGKILL; the backup stays"
