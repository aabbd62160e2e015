#!/bin/sh
# usage: mw_outputs.sh DISTRAIN WORKDIR [outputs|share_host|mismatch]
# Two workers started by hand on this host, each in its own directory.
# outputs: every output flag given as a relative path: the chief writes them all (a valid trace
# JSON among them); the other worker writes only its own trace, named by its task
# (t.json.worker-1), and no folder.
# share_host: without --threads, the two workers divide the cores and the header says so.
# mismatch: worker 1 has another --learning-rate: both refuse before training (exit 2), naming
# the setting and both values.
set -u
distrain=$1
work=$2
mode=${3:-outputs}
rm -rf "$work"
mkdir -p "$work/w0" "$work/w1"
# hand-started workers share a cluster token (the README's multi_worker section)
DIST_CLUSTER_TOKEN=mw-outputs-test-token-0123456789
export DIST_CLUSTER_TOKEN

fail() {
    printf 'FAIL: %s\n' "$1"
    for f in "$work"/*.log; do printf -- '--- %s\n' "$f"; tail -n 8 "$f"; done
    exit 1
}

ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
set -- $ports
cluster="{\"worker\": [\"localhost:$1\", \"localhost:$2\"]}"
outputs="--threads 1 --trace t.json --csv-log l.csv --checkpoint-dir ck --backup-dir bk
         --logdir logs --save-weights w.st --metrics-json m.json"
[ "$mode" = share_host ] && outputs=""
[ "$mode" = mismatch ] && outputs="--threads 1"
for i in 0 1; do
    extra=""
    [ "$mode" = mismatch ] && [ $i -eq 1 ] && extra="--learning-rate 0.002"
    # shellcheck disable=SC2086
    (cd "$work/w$i" && TF_CONFIG="{\"cluster\": $cluster, \"task\": {\"type\": \"worker\", \"index\": $i}}" \
        exec "$distrain" --strategy multi_worker --epochs 2 --steps-per-epoch 4 \
        --connect-timeout 60 $outputs $extra) >"$work/worker$i.log" 2>&1 &
    eval "pid$i=\$!"
done
if [ "$mode" = mismatch ]; then
    # shellcheck disable=SC2154
    wait "$pid0"
    rc0=$?
    # shellcheck disable=SC2154
    wait "$pid1"
    rc1=$?
    [ $rc0 -eq 2 ] && [ $rc1 -eq 2 ] || fail "exit codes $rc0 and $rc1, expected 2 and 2"
    want="distrain: --learning-rate differs between workers: the optimizer's default on worker 0, 0.002 on worker 1"
    for i in 0 1; do
        grep -qF "$want" "$work/worker$i.log" || fail "worker $i does not name the setting and both values"
        grep -q "Epoch 1" "$work/worker$i.log" && fail "worker $i trained first"
    done
    echo "ok: $want"
    exit 0
fi
# shellcheck disable=SC2154
wait "$pid0" || fail "the chief failed"
# shellcheck disable=SC2154
wait "$pid1" || fail "worker 1 failed"

if [ "$mode" = share_host ]; then
    cores=$(nproc)
    want=$((cores / 2)); [ $want -lt 1 ] && want=1
    grep -q "Threads: 2 workers share this host's $cores cores: $want thread(s) per replica" \
        "$work/worker0.log" || fail "the header does not say that 2 workers share the cores"
    echo "ok: $(grep Threads: "$work/worker0.log")"
    exit 0
fi
for f in t.json l.csv w.st m.json; do
    [ -s "$work/w0/$f" ] || fail "the chief did not write $f"
done
[ -d "$work/w0/ck" ] || fail "the chief did not write ck/"
python3 -m json.tool "$work/w0/t.json" >/dev/null || fail "the chief's trace is not valid JSON"
found=$(cd "$work/w1" && ls -A | tr '\n' ' ')
[ "$found" = "t.json.worker-1 " ] || fail "worker 1 wrote '$found', expected only t.json.worker-1"
python3 -m json.tool "$work/w1/t.json.worker-1" >/dev/null || fail "worker 1's trace is not valid JSON"
echo "ok: worker 1 wrote only $found"
