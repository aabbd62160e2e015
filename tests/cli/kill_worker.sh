#!/bin/sh
# usage: kill_worker.sh DISTRAIN WORKDIR
# Two distrain workers on loopback; once training runs, worker 1 is SIGKILLed. Worker 0 must
# exit non-zero within 90 s with a message naming worker/1.
set -u
distrain=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir"
ports=$(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(" ".join(str(x.getsockname()[1]) for x in s))')
set -- $ports
# hand-started workers share a cluster token (the launcher would make one)
DIST_CLUSTER_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(32))')
export DIST_CLUSTER_TOKEN
cluster="{\"worker\":[\"127.0.0.1:$1\",\"127.0.0.1:$2\"]}"
for i in 0 1; do
    TF_CONFIG="{\"cluster\":$cluster,\"task\":{\"type\":\"worker\",\"index\":$i}}" \
        "$distrain" --strategy multi_worker --epochs 50 --threads 1 --collective-timeout 20 \
        >"$dir/out$i" 2>"$dir/err$i" &
    eval "pid$i=\$!"
done
# training has started once the chief prints its first epoch line
waited=0
until grep -q "Epoch 1/50" "$dir/out0" 2>/dev/null; do
    sleep 0.2
    waited=$((waited + 1))
    if [ $waited -gt 300 ]; then
        echo "FAIL: worker 0 never started training"; cat "$dir/err0" "$dir/err1"
        kill -9 "$pid0" "$pid1" 2>/dev/null; exit 1
    fi
done
sleep 1
kill -9 "$pid1"
start=$(date +%s)
# wait for worker 0, at most 90 s
while kill -0 "$pid0" 2>/dev/null; do
    if [ $(( $(date +%s) - start )) -gt 90 ]; then
        echo "FAIL: worker 0 still running 90 s after worker 1 was killed"
        kill -9 "$pid0"; exit 1
    fi
    sleep 0.2
done
wait "$pid0"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" -eq 0 ]; then
    echo "FAIL: worker 0 exited 0 after losing worker 1"; exit 1
fi
if ! grep -q "worker/1" "$dir/err0"; then
    echo "FAIL: worker 0's error does not name worker/1:"; cat "$dir/err0"; exit 1
fi
echo "ok: worker 0 exited $rc after ${took} s: $(cat "$dir/err0")"
