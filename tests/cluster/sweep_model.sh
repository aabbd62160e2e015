#!/usr/bin/env bash
# The runs that check bench/scaling_model.py's overlap and parameter-server terms (issue #40),
# by hand (root), after the metric reductions were fused into one (docs/scaling.md, section 9):
#   - per-process compute alone (1 process, batch 4-256) and under the same CPU contention
#     (contention.sh): N one_device processes at once at the per-worker batch of each
#     multi_worker run below;
#   - multi_worker over TCP, 4, 8 and 16 workers: without limits, with and without overlap, at
#     global batch 64 and 512 (the model's two CPU constants are fitted on the batch-64 ones: the
#     overlap's buckets double the messages, not the bytes; each is the measured base of the
#     runs with the same workers, batch and overlap), and at 1 Gbit/s with 0.1 and 1 ms, with
#     and without --overlap-gradients (default 256 KiB buckets), at global batch 64 and (1 ms)
#     512;
#   - parameter_server with 1 and 2 ps at 1 Gbit/s and 1 ms (8 and 16 tasks), 0.1 ms (8), and
#     1 ps without limits (8 and 16), with the compute of 8 and 16 processes at batch 64.
# Every configuration runs once per round; rounds interleave them, so the machine's load moves
# every configuration alike (the model takes each label's median over the rounds).
#   tests/cluster/sweep_model.sh BUILD_DIR OUT_DIR ROUNDS [FILTER]
# BUILD_DIR holds distrain and tests/ldc_delay_relay. One JSON line per run in
# OUT_DIR/results.jsonl (run_cluster.sh's fields, contention.sh's for the compute lines).
# FILTER '^contention' runs only the compute lines. PS_EPOCHS=E in the environment runs the
# parameter_server jobs for E epochs (labels ending -eE): with 14 workers, 60 closures are
# mostly each worker's first (its connection, first pull and first run: 14-19 ms a closure
# against 6.6 in 300, measured at load 18), so the steady state needs several epochs.
set -uo pipefail
ps_epochs=${PS_EPOCHS:-1} pe=
[ "$ps_epochs" != 1 ] && pe=-e$ps_epochs
build=$(cd "$1" && pwd) out=$2 rounds=${3:-1} filter=${4:-.}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
results=$(cd "$out" && pwd)/results.jsonl
run() {
    local label=$1; shift
    echo "$label" | grep -qE -- "$filter" || return 0
    "$here/run_cluster.sh" --distrain "$build/distrain" --relay "$build/tests/ldc_delay_relay" \
        --out "$out/$label" --results "$results" --label "$label" --time-limit 240 "$@" >/dev/null
    local rc=$?
    [ $rc = 77 ] && { echo "sweep_model.sh: network namespaces cannot be made here" >&2; exit 77; }
    tail -n 1 "$results" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
print("%-28s step %8s ms  acc %s  hidden %s  ok %s" % (r["label"], r["step_ms"], r["test_accuracy"],
      (r.get("overlap_stats") or {}).get("hidden_pct"), r["as_expected"]))'
}
compute() { # N BATCH: per-process step under N-fold contention: 6 epochs of about 0.8 s each
    # (contention.sh takes the middle 4), at most the subset's batches per epoch
    local n=$1 b=$2 label=contention-n$1-b$2
    echo "$label" | grep -qE -- "$filter" || return 0
    local spe
    spe=$(python3 -c "print(max(20, min(7996 // $b, round(800 / max(1, $n / 2) / (0.07 * $b)))))")
    "$here/contention.sh" "$build/distrain" "$n" "$b" "$spe" 6 "$results" "$label"
}
for ((round = 1; round <= rounds; round++)); do
    echo "== round $round of $rounds ($(date -u +%H:%M:%S) UTC, load $(uptime | sed 's/.*average: //'))"
    for b in 4 8 16 32 64 128 256; do compute 1 $b; done  # alone: the model's compute(b)
    for n in 4 8 16; do
        steps=100; [ $n = 16 ] && steps=60
        s=(--namespaces $n --steps $steps)
        compute $n $((64 / n))
        compute $n $((512 / n))
        run mw-n$n-unlimited "${s[@]}"
        run mw-n$n-unlimited-overlap "${s[@]}" --overlap
        for d in 100 1000; do
            run mw-n$n-1g-${d}us "${s[@]}" --rate 1gbit --delay-us $d
            run mw-n$n-1g-${d}us-overlap "${s[@]}" --rate 1gbit --delay-us $d --overlap
        done
        b=(--namespaces $n --batch-size 512 --epochs 3 --steps 15)
        run mw-n$n-unlimited-b512 "${b[@]}"
        run mw-n$n-unlimited-b512-overlap "${b[@]}" --overlap
        b+=(--rate 1gbit --delay-us 1000)
        run mw-n$n-1g-1000us-b512 "${b[@]}"
        run mw-n$n-1g-1000us-b512-overlap "${b[@]}" --overlap
    done
    for n in 8 16; do
        steps=100; [ $n = 16 ] && steps=60
        compute $n 64  # a closure's batch, under the parameter_server runs' process count
        run ps1-n$n-unlimited$pe --namespaces $n --steps $steps --epochs $ps_epochs \
            --strategy parameter_server --ps 1
        for p in 1 2; do
            run ps$p-n$n-1g-1000us$pe --namespaces $n --steps $steps --epochs $ps_epochs \
                --rate 1gbit --delay-us 1000 --strategy parameter_server --ps $p
        done
    done
    run ps1-n8-1g-100us$pe --namespaces 8 --steps 100 --epochs $ps_epochs --rate 1gbit \
        --delay-us 100 --strategy parameter_server --ps 1
done
