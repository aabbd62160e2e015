#!/usr/bin/env bash
# Per-process compute under the namespace runs' CPU contention (issue #40's scaling model):
# N distrain processes at once, each --strategy one_device --threads 1 at batch B, no network.
# A namespace run of N workers at global batch N x B time-shares the machine's cores the same
# way, so each process's step time here is the compute part of that run's step (forward,
# backward, Adam, input pipeline), inflated by the sharing, measured rather than assumed.
#   tests/cluster/contention.sh DISTRAIN N B STEPS EPOCHS RESULTS [LABEL]
# Appends one JSON line to RESULTS: {"contention": true, "processes": N, "batch": B,
# "step_ms_each": [...], "step_ms": median, "spread_s": last start - first start}.
# The processes are started together, but each loads its data and builds its model first, and
# under contention that takes a varying time: the first and last epochs of a process overlap
# fewer busy neighbours. So a process's step time is B / the images/s of its middle epochs
# (all but its first and last; their median), which distrain prints per epoch: use EPOCHS >= 4.
set -uo pipefail
distrain=$1 n=$2 batch=$3 steps=$4 epochs=$5 results=$6 label=${7:-contention-n$2-b$3}
dir=$(mktemp -d /tmp/ldc-contention.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
pids=()
for ((i = 0; i < n; i++)); do
    date +%s.%N >"$dir/start$i"
    timeout 300 "$distrain" --strategy one_device --threads 1 --epochs "$epochs" \
        --steps-per-epoch "$steps" --batch-size "$batch" --seed $((42 + i)) \
        --metrics-json "$dir/m$i.json" >"$dir/log$i" 2>&1 &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
[ $rc = 0 ] || { echo "contention.sh: a process failed:" >&2; tail -n 3 "$dir"/log* >&2; exit 1; }
python3 - "$dir" "$n" "$batch" "$results" "$label" "$(uptime | sed 's/.*average: //')" <<'PY'
import json, os, re, statistics, sys
d, n, batch, results, label, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
each, starts = [], []
for i in range(n):
    m = json.load(open(os.path.join(d, "m%d.json" % i)))
    rates = [float(g) for g in re.findall(r"- ([0-9.]+) images/s", open(os.path.join(d, "log%d" % i)).read())]
    mid = rates[1:-1] or rates
    each.append(round(1000 * batch / statistics.median(mid), 3))
    starts.append(float(open(os.path.join(d, "start%d" % i)).read()))
r = {"label": label, "contention": True, "processes": n, "batch": batch, "steps": m["steps"],
     "epochs": len(rates),
     "step_ms_each": each, "step_ms": statistics.median(each),
     "spread_s": round(max(starts) - min(starts), 3), "load_after": load}
open(results, "a").write(json.dumps(r) + "\n")
print("%s: %d processes at batch %d: median %.3f ms per step (%s)" % (label, n, batch, r["step_ms"], each))
PY
