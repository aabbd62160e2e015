#!/usr/bin/env python3
"""Step-time model of libdist's data-parallel training: compute + exposed communication
(docs/scaling.md explains every term and its source).

    bench/scaling_model.py --layers bench/scaling/layers.json \\
        --compute bench/scaling/compute.json --probe bench/scaling/sweep-*.jsonl \\
        --check bench/scaling/sweep-*.jsonl --extrapolate

Inputs, all measured on the machine the model is for (bench/RESULTS.md, "Namespace cluster"):
  --layers   bench_layers --json: per-layer forward/backward microseconds of the seed CNN on
             one thread, by batch size, and the parameters per layer.
  --compute  {"cores": C, "step_ms": {"4": t, "8": t, ...}}: distrain --strategy one_device
             --threads 1 step time (train_seconds / steps) by batch size: forward, backward,
             Adam and the input pipeline of one process.
  --probe    run_cluster.sh --probe lines: round trip of 64 bytes and bulk rate between two
             namespaces, direct, through tbf and through ldc_delay_relay (means over files).
  --check    run_cluster.sh result lines (tests/cluster/sweep.sh): predicted against measured
             step time for every run without a fault (means over files).
  --extrapolate  64 and 1,000 workers on 10 and 100 Gbit/s.

The all-reduce costs follow src/collective/net_allreduce.c's algorithms and its auto choice;
a step of distrain's multi_worker makes one gradient all-reduce of 4 x params bytes and three
scalar all-reduces (the loss, correct and count sums of fit.c's run_step), each its own
collective. No communication overlaps the backward pass today: the gradients are reduced as
one buffer after it (bytes_per_pack only cuts that buffer into consecutive packs). The model
also gives what bucketed overlap (issue #40) would hide, from the layers' backward times.
"""
import argparse
import json
import math
import sys

# net_allreduce.c's auto choice.
LATENCY_BOUND_BYTES = 32 * 1024
LATENCY_BOUND_BYTES_2 = 256 * 1024
DOUBLING_MIN_WORLD = 8
SCATTER_PIECE = 4 << 20  # scatter-gather sends a 4 MiB piece at a time
METRIC_REDUCES = 3       # fit.c run_step: loss share, correct, count


def auto_algorithm(nbytes, world):
    if nbytes > (LATENCY_BOUND_BYTES_2 if world == 2 else LATENCY_BOUND_BYTES):
        return "scatter"
    return "doubling" if world >= DOUBLING_MIN_WORLD else "direct"


def allreduce(algo, nbytes, world, net):
    """(seconds on the critical path, one-way trips, messages sent per rank, bytes sent per
    rank) of one all-reduce of nbytes per rank. net: alpha (one-way latency, s), rate (bytes/s
    of a worker's link each way; inf: unlimited), msg (software seconds per message and side),
    byte_cpu (seconds of CPU per byte sent and received, on the worker's own core)."""
    n = world
    if n == 1:
        return 0.0, 0, 0, 0
    if algo == "direct":
        trips, msgs, sent = 1, n - 1, (n - 1) * nbytes
    elif algo == "doubling":
        trips = math.ceil(math.log2(n))
        msgs, sent = trips, (n - 1) * nbytes
    elif algo == "scatter":
        pieces = max(1, math.ceil(nbytes / n / SCATTER_PIECE))
        trips, msgs, sent = 2 * pieces, 2 * (n - 1) * pieces, 2 * (n - 1) * nbytes / n
    elif algo == "ring":
        trips, msgs, sent = 2 * (n - 1), 2 * (n - 1), 2 * (n - 1) * nbytes / n
    else:
        raise ValueError("unknown algorithm %r" % algo)
    wire = sent / net["rate"] if net["rate"] != math.inf else 0.0
    cpu = msgs * net["msg"] + 2 * sent * net["byte_cpu"]
    return trips * net["alpha"] + wire + cpu, trips, msgs, sent


def layer_table(layers, batch):
    """[(name, params, backward seconds)] in the order the backward pass finishes them (last
    layer first), at the nearest measured batch size (linear in batch between points)."""
    out = []
    for L in layers["layers"]:
        pts = sorted((int(b), v["backward_us"]) for b, v in L["batches"].items())
        out.append((L["name"], L["params"], interp(pts, batch) * 1e-6))
    return list(reversed(out))


def interp(pts, x):
    if x <= pts[0][0]:
        return pts[0][1] * x / pts[0][0]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = pts[-2], pts[-1]
    return y1 + (y1 - y0) * (x - x1) / (x1 - x0)


def compute_s(compute, batch):
    pts = sorted((int(b), t * 1e-3) for b, t in compute["step_ms"].items())
    return interp(pts, batch)


def mw_step(world, batch, layers, compute, net, algo="auto", overlap_bytes=0):
    """multi_worker step seconds on a cluster where every worker has its own core(s).
    overlap_bytes > 0: bucketed all-reduce of about that many bytes per bucket on a
    communication thread as the layers' gradients become ready (issue #40's design), instead of
    today's one buffer after the backward pass. Returns a dict of the terms."""
    params = layers["params"]
    nbytes = 4 * params
    a = auto_algorithm(nbytes, world) if algo == "auto" else algo
    t_ar, trips, msgs, sent = allreduce(a, nbytes, world, net)
    small = auto_algorithm(4, world)
    t_small = METRIC_REDUCES * allreduce(small, 4, world, net)[0]
    t_c = compute_s(compute, batch)
    exposed = t_ar
    if overlap_bytes and world > 1:
        # Buckets close in reverse layer order once they hold overlap_bytes (a layer is never
        # split); the communication thread reduces them one after another.
        seq = layer_table(layers, batch)
        t_bwd = sum(b for _, _, b in seq)
        buckets, cur, t = [], 0, 0.0
        for name, p, b in seq:
            t += b
            cur += 4 * p
            if cur >= overlap_bytes:
                buckets.append((t, cur))
                cur = 0
        if cur:
            buckets.append((t, cur))
        end = 0.0
        for ready, nb in buckets:
            ab = auto_algorithm(nb, world) if algo == "auto" else algo
            end = max(end, ready) + allreduce(ab, nb, world, net)[0]
        exposed = max(0.0, end - t_bwd)
    return {"algorithm": a, "compute": t_c, "allreduce": t_ar, "exposed": exposed,
            "metrics": t_small, "step": t_c + exposed + t_small, "trips": trips,
            "messages": msgs, "bytes_sent": sent}


def ps_step(workers, ps, batch, layers, compute, net, ps_apply_s, even=False):
    """parameter_server: seconds per closure (the chief's step time: closures run on every
    worker at once). A worker's closure pulls every variable and pushes its gradients (one
    request per ps each way), the largest ps carries its share of both on its link, and applies
    each push (Adam, ps_apply_s for the whole model). Round-robin placement in creation order:
    with 2 ps the dense kernel (102,400 of 121,930 parameters) lands on ps/0."""
    share = 1.0 / ps if even else ps_share(layers, ps)
    nbytes = 4 * layers["params"]
    rtt = 2 * net["alpha"]
    wire = nbytes / net["rate"] if net["rate"] != math.inf else 0.0
    cpu = 2 * ps * net["msg"] + 2 * nbytes * net["byte_cpu"]
    t_worker = compute_s(compute, batch) + 2 * (rtt + wire) + cpu + rtt  # + the chief's dispatch
    t_ps = share * (2 * wire + ps_apply_s)  # the busiest ps's link and optimizer, per closure
    return {"worker_closure": t_worker, "ps_bound": t_ps,
            "step": max(t_worker / workers, t_ps)}


def ps_share(layers, ps):
    """The busiest ps task's share of the bytes: variables (kernel, bias of each layer in
    creation order) placed round-robin."""
    load = [0] * ps
    i = 0
    for L in layers["layers"]:
        units = L.get("units") or 0
        for p in (L["params"] - units, units):
            load[i % ps] += p
            i += 1
    return max(load) / layers["params"]


# ---- this machine: every process shares its cores -------------------------------------------

def machine_mw(run, layers, compute, m):
    """Predicted step seconds of a namespace run (run_cluster.sh) on this machine: the cores
    run every worker's compute and every byte's and message's CPU work (and the relay's copies)
    one after another, divided over the cores; the latency trips and the links' serialization
    add on top (the workers wait on them with the cores idle)."""
    n, batch = run["namespaces"], run["batch_size"] / run["namespaces"]
    nbytes = 4 * layers["params"]
    a = auto_algorithm(nbytes, n)
    relay = run["delay_us"] > 0
    alpha = m["alpha0"] + (run["delay_us"] * 1e-6 + m["relay_alpha"] if relay else 0.0)
    rate = rate_bytes(run["rate"]) * m["tbf_efficiency"]
    _, trips, msgs, sent = allreduce(a, nbytes, n, {"alpha": 0, "rate": math.inf, "msg": 0,
                                                    "byte_cpu": 0})
    small = auto_algorithm(4, n)
    _, strips, smsgs, _ = allreduce(small, 4, n, {"alpha": 0, "rate": math.inf, "msg": 0,
                                                  "byte_cpu": 0})
    total_bytes = n * sent
    total_msgs = n * (msgs + METRIC_REDUCES * smsgs)
    # the workers' bytes (encrypted under TLS: x tls_factor), and the relay's copies of them
    byte_cpu = m["byte_cpu"] * ((m["tls_factor"] if run["transport"] == "tls" else 1.0)
                                + (m["relay_copy"] if relay else 0.0))
    cpu = (n * compute_s(compute, batch) + total_msgs * m["msg"] + total_bytes * byte_cpu)
    cores = m["cores"]
    t_cpu = cpu / min(cores, n)
    t_lat = (trips + METRIC_REDUCES * strips) * alpha
    t_wire = sent / rate if rate != math.inf else 0.0
    return t_cpu + t_lat + t_wire, {"cpu": t_cpu, "latency": t_lat, "wire": t_wire}


def machine_ps(run, layers, compute, m):
    n, ps = run["namespaces"], run["ps"]
    workers = n - 1 - ps
    batch = run["batch_size"]
    relay = run["delay_us"] > 0
    alpha = m["alpha0"] + (run["delay_us"] * 1e-6 + m["relay_alpha"] if relay else 0.0)
    rate = rate_bytes(run["rate"]) * m["tbf_efficiency"]
    nbytes = 4 * layers["params"]
    byte_cpu = m["byte_cpu"] * ((m["tls_factor"] if run["transport"] == "tls" else 1.0)
                                + (m["relay_copy"] if relay else 0.0))
    # CPU per closure on the machine: the worker's compute, the pull and push bytes, the ps's
    # Adam update.
    cpu = compute_s(compute, batch) + 2 * nbytes * byte_cpu + m["ps_apply"] + 4 * m["msg"]
    t_cpu = cpu / min(m["cores"], workers + ps)
    wire = nbytes / rate if rate != math.inf else 0.0
    # A worker's closure: dispatch + pull + compute + push, one after another.
    t_worker = 3 * 2 * alpha + 2 * wire + cpu
    t_ps = ps_share(layers, ps) * 2 * wire
    return max(t_cpu, t_worker / workers, t_ps), {"cpu": t_cpu, "worker": t_worker, "ps": t_ps}


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs)


def rate_bytes(r):
    if r in (None, "none"):
        return math.inf
    if r.endswith("gbit"):
        return float(r[:-4]) * 1e9 / 8
    if r.endswith("mbit"):
        return float(r[:-4]) * 1e6 / 8
    raise ValueError("rate %r" % r)


def calibrate(runs, layers, compute, m):
    """Fits the machine's CPU seconds per byte (byte_cpu) and per message (msg) by least
    squares on the runs without limits and without the relay (unlimited, delay 0), where
    step = (N x compute + messages x msg + bytes x byte_cpu) / cores + trips x alpha0. Every
    other run is then predicted, not fitted."""
    rows = []
    for r in runs:
        if r.get("fault") != "none" or r["strategy"] != "multi_worker" or not r.get("step_ms"):
            continue
        if r["rate"] != "none" or r["delay_us"] != 0 or r["transport"] != "tcp":
            continue
        if r["label"].startswith("acc-"):
            continue
        n = r["namespaces"]
        nbytes = 4 * layers["params"]
        _, trips, msgs, sent = allreduce(auto_algorithm(nbytes, n), nbytes, n,
                                         {"alpha": 0, "rate": math.inf, "msg": 0, "byte_cpu": 0})
        _, strips, smsgs, _ = allreduce(auto_algorithm(4, n), 4, n,
                                        {"alpha": 0, "rate": math.inf, "msg": 0, "byte_cpu": 0})
        cores = min(m["cores"], n)
        y = r["step_ms"] * 1e-3 - n * compute_s(compute, run_batch(r)) / cores \
            - (trips + METRIC_REDUCES * strips) * m["alpha0"]
        rows.append((n * (msgs + METRIC_REDUCES * smsgs) / cores, n * sent / cores, y))
    if len(rows) < 2:
        raise SystemExit("scaling_model.py: --check needs at least two multi_worker runs "
                         "without rate limit and delay (the sweep's mw-tcp-nN-unlimited)")
    # 2x2 normal equations, both coefficients kept >= 0.
    sxx = sum(a * a for a, _, _ in rows); syy = sum(b * b for _, b, _ in rows)
    sxy = sum(a * b for a, b, _ in rows)
    sxz = sum(a * z for a, _, z in rows); syz = sum(b * z for _, b, z in rows)
    det = sxx * syy - sxy * sxy
    msg = (sxz * syy - syz * sxy) / det if det else 0.0
    byte = (sxx * syz - sxy * sxz) / det if det else 0.0
    if msg < 0:
        msg, byte = 0.0, max(0.0, syz / syy)
    if byte < 0:
        byte, msg = 0.0, max(0.0, sxz / sxx)
    m["msg"], m["byte_cpu"] = msg, byte
    return m


def run_batch(r):
    return r["batch_size"] / r["namespaces"] if r["strategy"] == "multi_worker" else r["batch_size"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--compute", required=True)
    ap.add_argument("--probe", nargs="+", metavar="RESULTS",
                    help="files holding run_cluster.sh --probe lines (other lines are skipped)")
    ap.add_argument("--check", nargs="+", metavar="RESULTS",
                    help="run_cluster.sh result files: each label's step time is the mean over "
                         "the files (the last line of a label in each file)")
    ap.add_argument("--extrapolate", action="store_true")
    ap.add_argument("--ps-apply-ms", type=float, default=0.68,
                    help="a ps task's Adam update of the whole model (bench_ps: 1,480 per s)")
    ap.add_argument("--ext-msg-us", type=float, default=3.5,
                    help="extrapolation: software time per message and side, us (bench_allreduce "
                         "P=2, 8 B direct exchange: 3.6 us per round on this CPU, one process "
                         "per core; the namespace fit, 16 processes on 2 cores, is not a host's)")
    ap.add_argument("--ext-byte-ns", type=float, default=0.2,
                    help="extrapolation: CPU per byte and side, ns (bench_allreduce P=2 ring, "
                         "4 MB: 1,725 us for 4 MB sent and received)")
    ap.add_argument("--bucket-kib", type=int, default=64,
                    help="extrapolation: bucket size of the modelled overlap, KiB")
    ap.add_argument("--tls-factor", type=float, default=2.4,
                    help="TLS's time per byte against plain TCP's (bench_allreduce, 2 processes, "
                         "1-64 MB: 2.2-2.6x; README.md)")
    a = ap.parse_args()
    layers = json.load(open(a.layers))
    # the units (bias length) per layer, for the ps placement
    for L in layers["layers"]:
        L.setdefault("units", {"conv2d": 32, "conv2d_1": 64, "dense": 64, "dense_1": 10}
                     .get(L["name"], 0))
    compute = json.load(open(a.compute))
    m = {"cores": compute.get("cores", 2), "alpha0": 30e-6, "relay_alpha": 0.0,
         "relay_copy": 1.0, "msg": 0.0, "byte_cpu": 0.0, "ps_apply": a.ps_apply_ms * 1e-3,
         "tls_factor": a.tls_factor, "tbf_efficiency": 1.0}
    if a.probe:
        probes = [r for path in a.probe for r in map(json.loads, filter(str.strip, open(path)))
                  if r.get("probe")]
        direct = [p for p in probes if p["delay_us"] == 0 and p["rate"] == "none"
                  and "relay" not in p["label"]]
        relayed = sorted((p for p in probes if "relay" in p["label"] and p["rate"] == "none"),
                         key=lambda p: p["delay_us"])
        limited = [p for p in probes if p["delay_us"] == 0 and p["rate"] == "1gbit"]
        # several probe files (sweeps): the mean of each kind
        if direct:
            m["alpha0"] = mean(p["rtt_median_us"] for p in direct) * 0.5e-6
        if limited:
            # what one TCP flow gets through tbf at 1 Gbit/s (0.9: headers, the bucket's pace)
            m["tbf_efficiency"] = min(1.0, mean(p["bulk_gbit_per_s"] for p in limited))
        if relayed:
            # the relay's own part of a one-way trip beyond its configured delay, from the
            # probes with the longest delay (the path every delayed chunk takes: the timerfd)
            d = relayed[-1]["delay_us"]
            rtt = mean(p["rtt_median_us"] for p in relayed if p["delay_us"] == d)
            m["relay_alpha"] = max(0.0, (rtt * 0.5 - d) * 1e-6 - m["alpha0"])
    print("# machine: %d cores; one-way latency %.1f us direct, the relay adds %.1f us; tbf "
          "passes %.0f%% of its rate to one flow; TLS x%.1f CPU per byte"
          % (m["cores"], m["alpha0"] * 1e6, m["relay_alpha"] * 1e6,
             100 * m["tbf_efficiency"], m["tls_factor"]))
    if a.check:
        # a label run again in one file (a fixed script, a rerun) counts once: its last line;
        # across files, a label's step time is the mean of the files' good runs
        per_label = {}
        for path in a.check:
            last = {}
            for l in open(path):
                if l.strip():
                    r = json.loads(l)
                    last.pop(r["label"], None)
                    last[r["label"]] = r
            for label, r in last.items():
                if r.get("as_expected") and r.get("step_ms"):
                    per_label.setdefault(label, []).append(r)
        runs = []
        for label, rs in per_label.items():
            r = dict(rs[0])
            r["step_ms_each"] = [x["step_ms"] for x in rs]
            r["step_ms"] = sum(r["step_ms_each"]) / len(rs)
            runs.append(r)
        calibrate(runs, layers, compute, m)
        print("# fitted on the unlimited runs: %.2f us CPU per message, %.3f ns CPU per byte"
              % (m["msg"] * 1e6, m["byte_cpu"] * 1e9))
        print()
        print("| run | tasks | transport | rate | delay | measured ms (each run) | mean | "
              "predicted ms | error |")
        print("|---|---:|---|---|---:|---:|---:|---:|---:|")
        errs = []
        for r in runs:
            if r.get("probe") or r.get("fault") != "none" or not r.get("step_ms"):
                continue
            if not r.get("as_expected"):
                continue  # a task failed: its step time is not a cluster's
            if r["label"].startswith("acc-"):
                continue
            if r["strategy"] == "multi_worker":
                pred, _ = machine_mw(r, layers, compute, m)
            else:
                pred, _ = machine_ps(r, layers, compute, m)
            err = pred * 1e3 / r["step_ms"] - 1
            fitted = (r["strategy"] == "multi_worker" and r["rate"] == "none"
                      and r["delay_us"] == 0 and r["transport"] == "tcp")
            if not fitted:
                errs.append((r["strategy"], abs(err)))
            print("| %s%s | %d | %s | %s | %.1f ms | %s | %.1f | %.1f | %+.0f%% |" % (
                r["label"], " (fit)" if fitted else "", r["namespaces"], r["transport"],
                r["rate"], r["delay_us"] / 1000,
                " / ".join("%.1f" % x for x in r["step_ms_each"]), r["step_ms"], pred * 1e3,
                100 * err))
        print()
        for strat in ("multi_worker", "parameter_server"):
            e = sorted(x for st, x in errs if st == strat)
            if e:
                print("# %s: %d predicted runs; |error| median %.0f%%, max %.0f%%; within 20%%: "
                      "%d of %d" % (strat, len(e), 100 * e[len(e) // 2], 100 * e[-1],
                                    sum(x <= 0.2 for x in e), len(e)))
    if a.extrapolate:
        extrapolate(layers, compute, a)


def extrapolate(layers, compute, a):
    """Real clusters: every worker on its own host with its own core(s); kernel TCP. One-way
    latencies are assumptions (docs/scaling.md): 25 us on 10 GbE, 10 us on 100 GbE."""
    nets = [("10 Gbit/s", 10e9 / 8, 25e-6), ("100 Gbit/s", 100e9 / 8, 10e-6)]
    msg, byte_cpu = a.ext_msg_us * 1e-6, a.ext_byte_ns * 1e-9
    bucket = a.bucket_kib << 10
    print()
    print("## Extrapolation: seed CNN (%d parameters), one thread per worker at this CPU's "
          "speed; %.1f us per message, %.2f ns per byte; overlap: %d KiB buckets"
          % (layers["params"], a.ext_msg_us, a.ext_byte_ns, a.bucket_kib))
    print()
    print("| workers | link | batch/worker | compute ms | all-reduce (auto) ms | ring ms | "
          "3 metric reduces ms | step ms today | efficiency | step ms with overlap | "
          "hidden |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for world in (2, 8, 64, 1000):
        for name, rate, alpha in nets:
            net = {"alpha": alpha, "rate": rate, "msg": msg, "byte_cpu": byte_cpu}
            for batch in (64, 256):
                r = mw_step(world, batch, layers, compute, net)
                o = mw_step(world, batch, layers, compute, net, overlap_bytes=bucket)
                ring = allreduce("ring", 4 * layers["params"], world, net)[0]
                hidden = 1 - o["exposed"] / r["exposed"] if r["exposed"] else 0.0
                shown = "%.0f%%" % (100 * hidden) if hidden >= 0 else "worse"
                print("| %d | %s | %d | %.2f | %.2f (%s) | %.2f | %.2f | %.2f | %.0f%% | %.2f | "
                      "%s |" % (world, name, batch, r["compute"] * 1e3, r["allreduce"] * 1e3,
                                r["algorithm"], ring * 1e3, r["metrics"] * 1e3,
                                r["step"] * 1e3, 100 * r["compute"] / r["step"],
                                o["step"] * 1e3, shown))
    print()
    # The chief's rate is the busiest ps's once enough workers supply closures: the same for
    # 64 and 1,000 workers, so one table.
    print("| ps | link | closure ms (one worker) | busiest ps ms per closure | "
          "steps/s (round-robin) | steps/s (even shards: a partitioner) | workers that "
          "saturate the even shards |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for workers in (64,):
        for ps in (1, 2, 4, 8):
            for name, rate, alpha in nets:
                net = {"alpha": alpha, "rate": rate, "msg": msg, "byte_cpu": byte_cpu}
                r = ps_step(workers, ps, 64, layers, compute, net, a.ps_apply_ms * 1e-3)
                e = ps_step(workers, ps, 64, layers, compute, net, a.ps_apply_ms * 1e-3, True)
                print("| %d | %s | %.2f | %.3f | %.0f | %.0f | %.0f |" % (
                    ps, name, r["worker_closure"] * 1e3, r["ps_bound"] * 1e3,
                    1 / r["step"], 1 / e["step"], e["worker_closure"] / e["ps_bound"]))


if __name__ == "__main__":
    sys.exit(main())
