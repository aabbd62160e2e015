#!/usr/bin/env bash
# Per-process compute under the namespace runs' CPU contention (issue #40's scaling model):
# N distrain processes at once, each --strategy one_device --threads 1 at batch B, no network.
# A namespace run of N workers at global batch N x B time-shares the machine's cores the same
# way, so each process's step time here is the compute part of that run's step (forward,
# backward, Adam, input pipeline), inflated by the sharing, measured rather than assumed.
#   tests/cluster/contention.sh DISTRAIN N B STEPS EPOCHS RESULTS [LABEL]
# Appends one JSON line to RESULTS: {"contention": true, "processes": N, "batch": B,
# "step_ms_each": [...], "step_ms": median, "wall_ms_each": [...], "wall_ms": median,
# "spread_s": last start - first start}.
# The processes are started together, but each loads its data and builds its model first, and
# under contention that takes a varying time: the first and last epochs of a process overlap
# fewer busy neighbours, so only its middle epochs (all but its first and last) count: use
# EPOCHS >= 4. step_ms is the time inside a step (B / the images/s distrain prints per epoch);
# wall_ms is a step's period (the time between the ends of consecutive middle epochs over their
# steps), which also holds the waits for the input pipeline: with more processes than cores a
# process often loses its core there, and step_ms falls below what the sharing allows.
set -uo pipefail
distrain=$1 n=$2 batch=$3 steps=$4 epochs=$5 results=$6 label=${7:-contention-n$2-b$3}
dir=$(mktemp -d /tmp/ldc-contention.XXXXXX) || exit 1
trap 'rm -rf "$dir"' EXIT
pids=()
for ((i = 0; i < n; i++)); do
    date +%s.%N >"$dir/start$i"
    # each output line stamped with the time it came: the epochs' wall periods
    timeout 300 "$distrain" --strategy one_device --threads 1 --epochs "$epochs" \
        --steps-per-epoch "$steps" --batch-size "$batch" --seed $((42 + i)) \
        --metrics-json "$dir/m$i.json" 2>&1 |
        while IFS= read -r l; do echo "$(date +%s.%N) $l"; done >"$dir/log$i" &
    pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for ((i = 0; i < n; i++)); do [ -s "$dir/m$i.json" ] || rc=1; done
[ $rc = 0 ] || { echo "contention.sh: a process failed:" >&2; tail -n 3 "$dir"/log* >&2; exit 1; }
python3 - "$dir" "$n" "$batch" "$results" "$label" "$(uptime | sed 's/.*average: //')" <<'PY'
import json, os, re, statistics, sys
d, n, batch, results, label, load = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6]
each, wall, starts = [], [], []
for i in range(n):
    m = json.load(open(os.path.join(d, "m%d.json" % i)))
    log = open(os.path.join(d, "log%d" % i)).read()
    rates = [float(g) for g in re.findall(r"- ([0-9.]+) images/s", log)]
    mid = rates[1:-1] or rates
    each.append(round(1000 * batch / statistics.median(mid), 3))
    # the wall period: the time between the ends of consecutive middle epochs (their progress
    # lines' stamps), over the epoch's steps
    ends = [float(t) for t, l in (x.split(" ", 1) for x in log.splitlines() if " " in x)
            if "images/s" in l]
    steps_per_epoch = m["steps"] / len(ends)  # what ran (distrain caps it at the data's)
    per = [1000 * (b - a) / steps_per_epoch for a, b in zip(ends[:-2], ends[1:-1])]
    if not per:
        per = [1000 * m["train_wall_seconds"] / m["steps"]]
    wall.append(round(statistics.median(per), 3))
    starts.append(float(open(os.path.join(d, "start%d" % i)).read()))
r = {"label": label, "contention": True, "processes": n, "batch": batch, "steps": m["steps"],
     "epochs": len(rates),
     "step_ms_each": each, "step_ms": statistics.median(each),
     "wall_ms_each": wall, "wall_ms": statistics.median(wall),
     "spread_s": round(max(starts) - min(starts), 3), "load_after": load}
open(results, "a").write(json.dumps(r) + "\n")
print("%s: %d processes at batch %d: median %.3f ms inside a step, %.3f ms a step's period (%s)"
      % (label, n, batch, r["step_ms"], r["wall_ms"], wall))
PY
