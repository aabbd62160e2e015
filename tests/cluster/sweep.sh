#!/usr/bin/env bash
# The namespace sweep of issue #40, by hand (root): 4, 8 and 16 tasks; multi_worker over TCP
# without limits, at 1 Gbit/s with 0, 0.1, 1 and 5 ms, at 10 Gbit/s with 0 and 1 ms, over TLS at
# 1 Gbit/s 1 ms; parameter_server (1 ps; 2 ps from 8 tasks) at 1 Gbit/s with 0 and 1 ms; a
# killed and a stopped worker at 16, a killed ps worker at 8; the accuracy of 2, 4, 8 and 16
# workers at the same global batch (64, 2 epochs of the built-in subset). Global batch 64
# throughout, --threads 1 per process.
#   tests/cluster/sweep.sh BUILD_DIR OUT_DIR [FILTER]
# FILTER (a grep -E pattern over the run labels) picks a part. One JSON line per run in
# OUT_DIR/results.jsonl (run_cluster.sh's fields); bench/scaling_model.py --check reads it.
set -uo pipefail
# The path itself first (run_cluster.sh --probe): direct, rate-limited, and through the relay.
build=$(cd "$1" && pwd) out=$2 filter=${3:-.}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
results=$(cd "$out" && pwd)/results.jsonl
run() {
    local label=$1; shift
    echo "$label" | grep -qE -- "$filter" || return 0
    echo "== $label"
    "$here/run_cluster.sh" --distrain "$build/distrain" --relay "$build/tests/ldc_delay_relay" \
        --out "$out/$label" --results "$results" --label "$label" --time-limit 240 "$@" >/dev/null
    local rc=$?
    [ $rc = 77 ] && { echo "sweep.sh: network namespaces cannot be made here" >&2; exit 77; }
    tail -n 1 "$results" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("   step %s ms, %s B/step, acc %s, exits %s, as expected: %s %s" % (r["step_ms"],
      r["tx_bytes_per_step"], r["test_accuracy"], list(r["exit_codes"].values()),
      r["as_expected"], r["errors"][:1] if r["fault"] != "none" else ""))'
}
probe() {
    local label=$1; shift
    echo "$label" | grep -qE -- "$filter" || return 0
    echo "== $label"
    "$here/run_cluster.sh" --probe --namespaces 2 --out "$out/$label" --results "$results" \
        --relay "$build/tests/ldc_delay_relay" --label "$label" --time-limit 120 "$@" | sed 's/^/   /'
}
probe probe-direct
probe probe-direct-1g --rate 1gbit
probe probe-direct-10g --rate 10gbit
probe probe-relay-1us --delay-us 1
probe probe-relay-1000us --delay-us 1000
for n in 4 8 16; do
    steps=100; [ $n = 16 ] && steps=60
    s=(--namespaces $n --steps $steps)
    run mw-tcp-n$n-unlimited "${s[@]}"
    for d in 0 100 1000 5000; do run mw-tcp-n$n-1g-${d}us "${s[@]}" --rate 1gbit --delay-us $d; done
    for d in 0 1000; do run mw-tcp-n$n-10g-${d}us "${s[@]}" --rate 10gbit --delay-us $d; done
    run mw-tls-n$n-1g-1000us "${s[@]}" --rate 1gbit --delay-us 1000 --transport tls
    for d in 0 1000; do
        run ps1-n$n-1g-${d}us "${s[@]}" --rate 1gbit --delay-us $d --strategy parameter_server --ps 1
    done
    [ $n -ge 8 ] && run ps2-n$n-1g-1000us "${s[@]}" --rate 1gbit --delay-us 1000 \
        --strategy parameter_server --ps 2
done
run fault-mw-kill-n16 --namespaces 16 --rate 1gbit --delay-us 1000 --epochs 50 --steps 125 \
    --fault kill --fault-after 3 --collective-timeout 5
run fault-mw-stop-n16 --namespaces 16 --rate 1gbit --delay-us 1000 --epochs 50 --steps 125 \
    --fault stop --fault-after 3 --collective-timeout 5
run fault-ps-kill-n8 --namespaces 8 --rate 1gbit --delay-us 1000 --epochs 5 --steps 125 \
    --strategy parameter_server --ps 1 --fault kill --fault-after 1
for n in 2 4 8 16; do run acc-mw-n$n --namespaces $n --epochs 2 --steps 125; done
