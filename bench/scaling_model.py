#!/usr/bin/env python3
"""Step-time model of libdist's data-parallel training: compute + exposed communication
(docs/scaling.md explains every term and its source).

    bench/scaling_model.py --layers bench/scaling/layers-e.json \\
        --compute bench/scaling/compute.json --probe bench/scaling/probe-e.jsonl \\
        --contention bench/scaling/sweep-[fgh].jsonl --check bench/scaling/sweep-[efgh].jsonl \\
        --rounds --ps-apply-ms 0.488 --extrapolate        # docs/scaling.md section 11
    bench/scaling_model.py --layers bench/scaling/layers.json \\
        --compute bench/scaling/compute.json --probe bench/scaling/sweep-[ab].jsonl \\
        --check bench/scaling/sweep-[abc].jsonl --metric-reduces 3   # the sweeps of section 4

Inputs, all measured on the machine the model is for (bench/RESULTS.md, "Namespace cluster"):
  --layers   bench_layers --json: per-layer forward/backward microseconds of the seed CNN on
             one thread, by batch size, and the parameters per layer.
  --compute  {"cores": C, "step_ms": {"4": t, "8": t, ...}}: distrain --strategy one_device
             --threads 1 step time (train_seconds / steps) by batch size: forward, backward,
             Adam and the input pipeline of one process.
  --probe    run_cluster.sh --probe lines: round trip of 64 bytes and bulk rate between two
             namespaces, direct, through tbf and through ldc_delay_relay (means over files).
  --check    run_cluster.sh result lines (tests/cluster/sweep.sh, sweep_model.sh): predicted
             against measured step time for every run without a fault (means over files;
             --rounds: medians over every line of a label).
  --contention  tests/cluster/contention.sh lines: per-process compute alone (1 process) and
             with N processes sharing the cores.
  --extrapolate  64 and 1,000 workers on 10 and 100 Gbit/s.

The all-reduce costs follow src/collective/net_allreduce.c's algorithms and its auto choice;
a step of distrain's multi_worker makes one gradient all-reduce of 4 x params bytes and three
all-reduce of the metrics (fit.c's run_step; three scalar ones before they were fused:
--metric-reduces 3 for the sweeps of that time). Without --overlap-gradients the gradients are
reduced as one buffer after the backward pass; with it, in buckets as the layers' gradients
become ready (strategy/grad_overlap.c's rule, reproduced by buckets() below).

On the namespace cluster (one 2-core machine) the compute part of a step is measured, not
scaled: --contention gives each N-process, batch-b configuration's per-process step time with N
one_device processes sharing the cores at once (tests/cluster/contention.sh), which is what the
time-sharing does to a worker's forward, backward and update.
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
# fit.c run_step's metrics (loss share, correct, count): three scalar all-reduces in the sweeps
# of docs/scaling.md section 4, one float32[3] all-reduce since (section 9); --metric-reduces.
METRIC_REDUCES = 1
DEFAULT_BUCKET = 256 * 1024  # DIST_OVERLAP_BUCKET_BYTES


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


def buckets(layers, batch, bucket_bytes):
    """(backward seconds, [(seconds into the backward pass when the bucket is ready, bytes)]):
    buckets close in reverse layer order once they hold bucket_bytes (a layer is never split),
    as strategy/grad_overlap.c closes them; the communication thread reduces them one after
    another."""
    seq = layer_table(layers, batch)
    t_bwd = sum(b for _, _, b in seq)
    out, cur, t = [], 0, 0.0
    for name, p, b in seq:
        t += b
        cur += 4 * p
        if cur >= bucket_bytes:
            out.append((t, cur))
            cur = 0
    if cur:
        out.append((t, cur))
    return t_bwd, out


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
    t_small = METRIC_REDUCES * allreduce(small, 4 * 3, world, net)[0]
    t_c = compute_s(compute, batch)
    exposed = t_ar
    if overlap_bytes and world > 1:
        t_bwd, bks = buckets(layers, batch, overlap_bytes)
        end = 0.0
        for ready, nb in bks:
            ab = auto_algorithm(nb, world) if algo == "auto" else algo
            end = max(end, ready) + allreduce(ab, nb, world, net)[0]
        exposed = max(0.0, end - t_bwd)
    return {"algorithm": a, "compute": t_c, "allreduce": t_ar, "exposed": exposed,
            "metrics": t_small, "step": t_c + exposed + t_small, "trips": trips,
            "messages": msgs, "bytes_sent": sent}


def ps_step(workers, ps, batch, layers, compute, net, ps_apply_s, even=False):
    """parameter_server on real hosts: seconds per closure (the chief's step time) with
    `workers` workers, each on its own host, cycling through closures (mva). The busiest ps's
    link into it (pushes) and out of it (pulls, prefetched after each push) and its optimizer
    (Adam on its share, ps_apply_s for the whole model) are queues; the worker's own link is
    in series with the ps's (own_link); a worker's compute, the round trip of its push and
    acknowledgement and its CPU per message and byte are a delay. Round-robin placement in
    creation order puts the dense kernel (102,400 of 121,930 parameters) on ps/0; even=True:
    a partitioner's even shards."""
    share = 1.0 / ps if even else ps_share(layers, ps)
    nbytes = 4 * layers["params"]
    a = net["alpha"]
    wire = nbytes / net["rate"] if net["rate"] != math.inf else 0.0
    cpu = (2 + 2 * ps) * net["msg"] + 2 * nbytes * net["byte_cpu"]
    # two closures in flight per worker (PS_CLOSURES_IN_FLIGHT): the result's trip and the
    # next dispatch are off the worker's path, and the prefetched pull comes in while it
    # waits for its push's acknowledgement
    t_worker = compute_s(compute, batch) + 2 * a + cpu
    stations = [("ps_in", share * wire, True), ("ps_out", share * wire, True), own_link(wire),
                ("ps_apply", share * ps_apply_s, True), ("worker", t_worker, False)]
    t, res = mva(stations, workers)
    return {"worker_closure": t_worker + wire, "ps_bound": share * max(wire, ps_apply_s),
            "step": t}


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

def machine_compute(n, batch, compute, m):
    """Per-process compute seconds of one step when n processes share the machine's cores:
    measured under that contention (--contention) where it was, else n x the single-process
    time spread over the cores (perfect time-sharing: no cache or scheduling losses)."""
    c = m.get("contended", {}).get((n, int(round(batch))))
    if c is not None:
        return c
    return n * compute_s(compute, batch) / min(m["cores"], n)


def mw_comm(run, layers, n, batch):
    """[(trips, messages per rank, bytes sent per rank, seconds into the backward pass the
    collective can start, as a fraction of the pass)] of one multi_worker step's gradient
    all-reduces: one buffer after the pass, or the overlap's buckets."""
    nbytes = 4 * layers["params"]
    zero = {"alpha": 0, "rate": math.inf, "msg": 0, "byte_cpu": 0}
    if not run.get("overlap"):
        _, trips, msgs, sent = allreduce(auto_algorithm(nbytes, n), nbytes, n, zero)
        return [(trips, msgs, sent, 1.0)]
    t_bwd, bks = buckets(layers, batch, run.get("bytes_per_pack") or DEFAULT_BUCKET)
    out = []
    for ready, nb in bks:
        _, trips, msgs, sent = allreduce(auto_algorithm(nb, n), nb, n, zero)
        out.append((trips, msgs, sent, ready / t_bwd))
    return out


def machine_mw(run, layers, compute, m):
    """Predicted step seconds of a namespace run (run_cluster.sh) on this machine. The cores
    run every worker's compute (machine_compute: measured under the same contention) and every
    byte's and message's CPU work (and the relay's copies) one after another, measured in the
    same job without limits or relay where the sweep has it (the base: lockstep losses
    included); the latency trips and the links' serialization add on top, the longer of the
    two, as the links carry earlier data while the relay holds later. With --overlap-gradients a
    bucket's trips and wire time run while the backward pass goes on: the last worker to have
    the bucket ready finishes its backward pass alone while the others wait in the all-reduce,
    so the window is that worker's own backward pass after the bucket (bench_layers' single-
    process times), and only what ends after it is exposed; the buckets' CPU work is not
    hidden, as the cores are busy with the backward pass of every worker."""
    n, batch = run["namespaces"], run["batch_size"] / run["namespaces"]
    relay = run["delay_us"] > 0
    alpha = m["alpha0"] + (run["delay_us"] * 1e-6 + m["relay_alpha"] if relay else 0.0)
    rate = rate_bytes(run["rate"]) * m["tbf_efficiency"]
    comm = mw_comm(run, layers, n, batch)
    zero = {"alpha": 0, "rate": math.inf, "msg": 0, "byte_cpu": 0}
    _, strips, smsgs, ssent = allreduce(auto_algorithm(12, n), 12, n, zero)
    total_bytes = n * sum(c[2] for c in comm)
    total_msgs = n * (sum(c[1] for c in comm) + METRIC_REDUCES * smsgs)
    # the workers' bytes (encrypted under TLS: x tls_factor), and the relay's copies of them
    byte_cpu = m["byte_cpu"] * ((m["tls_factor"] if run["transport"] == "tls" else 1.0)
                                + (m["relay_copy"] if relay else 0.0))
    # the relay reads and writes every message once more, as a receiver and a sender do
    msg_cpu = m["msg"] * (1.0 + (m["relay_copy"] if relay else 0.0))
    t_compute = machine_compute(n, batch, compute, m)
    t_comm_cpu = (total_msgs * msg_cpu + total_bytes * byte_cpu) / min(m["cores"], n)
    base = m.get("base", {}).get((n, run["batch_size"], bool(run.get("overlap"))))
    if base is not None:
        # The same job without limits or relay, measured: what the cores take for a step of
        # these n processes in lockstep (compute and its idle tails at every synchronization,
        # which processes running on their own do not have). Its compute is that step less the
        # model's CPU and trips for its messages; the network's terms are predicted on top.
        base_cpu = (total_msgs * m["msg"] + total_bytes * m["byte_cpu"]) / min(m["cores"], n)
        base_trips = (sum(c[0] for c in comm) + METRIC_REDUCES * strips) * m["alpha0"]
        t_compute = max(0.0, base - base_cpu - base_trips)
    wire = lambda c: c[2] / rate if rate != math.inf else 0.0
    if run.get("overlap"):
        # the window a bucket's wire time can hide in: the backward pass left after the bucket
        # is ready on the LAST worker to get there, which runs it while the others wait in
        # that all-reduce: at its own speed (bench_layers' single-process backward), not
        # stretched by the sharing. (Sections 11.3-11.6 stretched it like the step and hid
        # 5-7 ms that the library's own count never saw hidden on 8 and 16 workers.)
        t_bwd = min(t_compute, sum(b for _, _, b in layer_table(layers, batch)))
        end = 0.0
        for c in comm:
            end = max(end, c[3] * t_bwd) + wire(c)
        t_wire = max(0.0, end - t_bwd)
    else:
        t_wire = sum(wire(c) for c in comm)
    # The links' serialization and the trips' latency overlap: while the relay holds the
    # data of one trip, the links carry what was sent before it (measured: at 8 workers and
    # 1 Gbit/s, 1 ms of latency costs nothing more than 0.1 ms; at 3 ms the latency
    # dominates; docs/scaling.md 11.7). So the step waits for the longer of the two, not for
    # their sum (sections 4-11.6 added them).
    t_latency = (sum(c[0] for c in comm) + METRIC_REDUCES * strips) * alpha
    t_wait = max(t_latency, t_wire)
    t = t_compute + t_comm_cpu + t_wait
    return t, {"compute": t_compute, "comm_cpu": t_comm_cpu, "latency": t_latency,
               "wire": t_wire}


def own_link(wire):
    """The worker's own link as an mva station: a push leaves through it, then queues at the
    ps's link (ps_in); the two are in series, packet by packet, so the push waits for the
    busier of the two, not for both: its wire time shows only where ps_in has no queue.
    (Sections 4-11.8 of docs/scaling.md added the whole wire time, which put the namespace
    runs at 8 tasks 12-20% too slow; 11.9.)"""
    return ("own_link", wire, "hidden:ps_in")


def mva(stations, customers):
    """Exact mean-value analysis of a closed network (the workers are the customers: each runs
    one closure after another). stations: [(name, demand seconds per closure, queueing)]; a
    queueing station serves one closure at a time (a link's direction, the shared cores), a
    delay station serves all at once (latency, a worker's compute); a station whose
    queueing is "behind:NAME" is a message too small to need service that waits in NAME's FIFO
    behind the work queued there (by the arrival theorem, NAME's mean queue with one customer
    fewer, times NAME's demand); one whose queueing is "hidden:NAME" is a link in series with
    NAME's, packet by packet, whose time shows only where NAME has no queue to overlap it (an
    approximation: its demand times 1 - NAME's mean queue at arrival, floored at 0). Returns
    (seconds per closure for the whole job, {station: residence seconds per closure})."""
    q = {name: 0.0 for name, _, _ in stations}
    demand = {name: d for name, d, _ in stations}
    x, res = 0.0, {}

    def residence(name, d, queueing):
        if isinstance(queueing, str):
            kind, target = queueing.split(":", 1)
            if kind == "hidden":
                return d * max(0.0, 1.0 - q[target])
            return q[target] * demand[target]
        return d * (1 + q[name]) if queueing else d

    for k in range(1, customers + 1):
        res = {name: residence(name, d, queueing) for name, d, queueing in stations}
        x = k / sum(res.values())
        q = {name: x * r for name, r in res.items()}
    return 1 / x, res


def machine_ps(run, layers, compute, m):
    """Predicted seconds per closure (the chief's step time) of a namespace parameter_server
    run on this machine. The workers cycle through the resources of a closure, each its own
    queue (mva): the shared cores (every closure's compute at batch b, stretched by the cache
    and scheduling losses measured under the same number of processes; the ps's update of its
    share; the CPU of the pulled and pushed bytes and of the relay's copies of them), the
    busiest ps's link into it (the pushes) and out of it (the pulls: prefetched after each
    push, so the two directions overlap), the push's acknowledgement queued behind the pulls in
    that link's FIFO, the worker's own link carrying its push (in series with the ps's link,
    packet by packet: it shows only where the ps's link has no queue), and a delay for what a
    closure waits on alone: the relay's trips (the push and its acknowledgement, which ends the
    closure). The coordinator keeps two closures in flight on every worker
    (PS_CLOSURES_IN_FLIGHT), so the result's trip to the chief and the next dispatch are off
    the worker's path, and the prefetched pull arrives while the worker waits for its
    acknowledgement. The cores are two servers: as a queue of half the demand plus a delay of
    the other half (Seidmann's approximation of a multi-server station)."""
    n, ps = run["namespaces"], run["ps"]
    workers = n - 1 - ps
    batch = run["batch_size"]
    relay = run["delay_us"] > 0
    alpha = m["alpha0"] + (run["delay_us"] * 1e-6 + m["relay_alpha"] if relay else 0.0)
    rate = rate_bytes(run["rate"]) * m["tbf_efficiency"]
    nbytes = 4 * layers["params"]
    share = ps_share(layers, ps)
    byte_cpu = m["byte_cpu"] * ((m["tls_factor"] if run["transport"] == "tls" else 1.0)
                                + (m["relay_copy"] if relay else 0.0))
    cores = m["cores"]
    msg_cpu = m["msg"] * (1.0 + (m["relay_copy"] if relay else 0.0))
    # a closure's compute in CPU seconds: measured with n processes at this batch sharing the
    # cores (every task counts: the chief and the ps tasks work for every closure too), else
    # the single-process time stretched by the loss measured with n processes at other batches
    c = m.get("contended", {}).get((n, batch))
    t_c = (c * min(cores, n) / n if c is not None
           else compute_s(compute, batch) * contention_loss(n, m, compute))
    cpu = t_c + m["ps_apply"] + 2 * nbytes * byte_cpu + (2 + 2 * ps) * msg_cpu
    wire = nbytes / rate if rate != math.inf else 0.0
    # The push's acknowledgement leaves the ps through the same tbf queue as the pulls, one
    # FIFO, and waits behind the pulls queued there ("ack"; measured on 6 December 2026:
    # workers waited 15 ms a closure for it at 8 tasks, 29-40 ms at 16, docs/scaling.md 11.7).
    # Real hosts' default qdisc (fq_codel) queues each flow apart: the extrapolation's ps_step
    # has no such wait.
    stations = [("cpu", cpu / cores, True), ("ps_in", share * wire, True),
                ("ps_out", share * wire, True), ("ack", 0.0, "behind:ps_out"), own_link(wire),
                ("delay", 2 * alpha + (cores - 1) * cpu / cores, False)]
    t, res = mva(stations, workers)
    # The epoch's drain: dist_fit schedules an epoch's S closures at once and waits for all of
    # them, so its end finds the workers finishing their last closures spread over about one
    # closure's cycle (workers x t) and idle until the last one ends: (W - 1) / (2 W) of a
    # cycle each, on average, per epoch: t (W - 1) / 2 of wall per epoch, t (W - 1) / (2 S) per
    # step, and (like the other terms, per closure of one worker's cycle) W times that. The
    # workers' closure summaries measure it as most of their wait for the chief
    # (docs/scaling.md 11.8 compares the two).
    # The epoch's start is the drain's mirror: the coordinator hands every worker a closure at
    # once, so their first transfers queue together at the ps's link (the pulls; a worker
    # whose prefetched pull is still fresh, PS_PREFETCH_MAX_AGE_S, computes at once and its
    # push queues instead), the i-th behind i others (share x wire each): (W - 1) / 2 of them
    # on average per worker and epoch, where the steady state (mva) has the workers'
    # transfers spread out. As wall time (the workers wait in parallel): (W - 1) share wire / 2
    # per epoch, / S per step, and W times that per closure of a worker's cycle ("burst";
    # docs/scaling.md 11.9: it brings the 16-task runs of five sweeps 4-7 points closer; which
    # phase of a worker's closure its wait shows in moves with the relay's scheduling). Zero
    # without a rate limit.
    steps = run.get("steps_asked") or 0
    if steps > 0 and workers > 1:
        res["drain"] = workers * t * (workers - 1) / (2 * steps)
        t += res["drain"] / workers
        res["burst"] = workers * (workers - 1) * share * wire / (2 * steps)
        t += res["burst"] / workers
    return t, res


def contention_loss(n, m, compute):
    """What sharing the cores among n processes costs beyond the sharing itself: the
    contended per-process step over n x the single-process step / cores, from the --contention
    lines with n processes (their median over batch sizes); 1 without them."""
    ks = [c * min(m["cores"], nn) / (nn * compute_s(compute, b))
          for (nn, b), c in m.get("contended", {}).items() if nn == n]
    return median(ks) if ks else 1.0


def median(xs):
    xs = sorted(xs)
    k = len(xs)
    return xs[k // 2] if k % 2 else 0.5 * (xs[k // 2 - 1] + xs[k // 2])


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
    squares on the runs without limits or relay (unlimited, delay 0), with and without overlap
    (its buckets double the messages, not the bytes, which tells the two apart), where
    step = compute under contention + (messages x msg + bytes x byte_cpu) / cores
    + trips x alpha0. These runs are then the bases of the others (machine_mw), which are
    predicted, not fitted."""
    rows = []
    # only the smallest global batch's runs: there the messages are most of the step, and the
    # compute of independent processes (contention.sh) misses least of the lockstep losses,
    # which grow with the batch (they would be counted as message CPU)
    smallest = min((r["batch_size"] for r in runs if is_base(r)), default=0)
    for r in runs:
        if r.get("fault") != "none" or r["strategy"] != "multi_worker" or not r.get("step_ms"):
            continue
        if r["rate"] != "none" or r["delay_us"] != 0 or r["transport"] != "tcp":
            continue
        if r["label"].startswith("acc-") or r["batch_size"] != smallest:
            continue
        n = r["namespaces"]
        comm = mw_comm(r, layers, n, run_batch(r))
        _, strips, smsgs, _ = allreduce(auto_algorithm(12, n), 12, n,
                                        {"alpha": 0, "rate": math.inf, "msg": 0, "byte_cpu": 0})
        cores = min(m["cores"], n)
        y = r["step_ms"] * 1e-3 - machine_compute(n, run_batch(r), compute, m) \
            - (sum(c[0] for c in comm) + METRIC_REDUCES * strips) * m["alpha0"]
        rows.append((n * (sum(c[1] for c in comm) + METRIC_REDUCES * smsgs) / cores,
                     n * sum(c[2] for c in comm) / cores, y))
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


def is_base(r):
    """A multi_worker run without limits or relay over TCP: the constants' fit and the base of
    the runs with the same workers, batch and overlap."""
    return (r["strategy"] == "multi_worker" and r["rate"] == "none" and r["delay_us"] == 0
            and r["transport"] == "tcp" and r.get("fault", "none") == "none")


def run_batch(r):
    return r["batch_size"] / r["namespaces"] if r["strategy"] == "multi_worker" else r["batch_size"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--layers", required=True)
    ap.add_argument("--compute", required=True,
                    help="single-process step times by batch (JSON); --contention lines of "
                         "one process replace its points")
    ap.add_argument("--probe", nargs="+", metavar="RESULTS",
                    help="files holding run_cluster.sh --probe lines (other lines are skipped)")
    ap.add_argument("--check", nargs="+", metavar="RESULTS",
                    help="run_cluster.sh result files: each label's step time is the mean over "
                         "the files (the last line of a label in each file)")
    ap.add_argument("--rounds", action="store_true",
                    help="--check files hold rounds (tests/cluster/sweep_model.sh): every good "
                         "line of a label counts and its step time is their median")
    ap.add_argument("--contention", nargs="+", metavar="RESULTS",
                    help="files holding contention.sh lines: the per-process compute of N "
                         "processes at batch b sharing the cores (median over the lines)")
    ap.add_argument("--metric-reduces", type=int, default=1,
                    help="all-reduces of the metrics per step: 1 today, 3 for the runs before "
                         "they were fused (docs/scaling.md section 4)")
    ap.add_argument("--measure", choices=("wall", "step"), default="wall",
                    help="the step time the model predicts and checks: 'wall', a step's period "
                         "(distrain's train_wall_seconds: the step and the waits for the input "
                         "pipeline between steps; contention.sh's wall_ms), or 'step', the time "
                         "inside the steps (train_seconds; step_ms), which under contention "
                         "misses the time a process loses its core between steps (lines "
                         "before 6 December 2026 have only this)")
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
    ap.add_argument("--bucket-kib", type=int, default=256,
                    help="extrapolation: bucket size of the modelled overlap, KiB")
    ap.add_argument("--tls-factor", type=float, default=2.4,
                    help="TLS's time per byte against plain TCP's (bench_allreduce, 2 processes, "
                         "1-64 MB: 2.2-2.6x; README.md)")
    a = ap.parse_args()
    lacking = [0]

    def measured(r):
        """The line's step time under --measure (the lines before train_wall_seconds have only
        the time inside the steps: counted, and said)."""
        key = {"wall": "wall_ms" if r.get("contention") else "step_wall_ms",
               "step": "step_ms"}[a.measure]
        if r.get(key) is None:
            lacking[0] += a.measure == "wall"
            return r.get("step_ms")
        return r[key]
    global METRIC_REDUCES
    METRIC_REDUCES = a.metric_reduces
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
    if a.contention:
        cont = {}
        for path in a.contention:
            for l in filter(str.strip, open(path)):
                r = json.loads(l)
                if r.get("contention"):
                    cont.setdefault((r["processes"], r["batch"]), []).append(measured(r))
        # one process alone: the single-process compute(b), replacing --compute's points
        alone = {b: median(v) for (n, b), v in cont.items() if n == 1}
        if alone:
            compute = {"cores": compute.get("cores", 2),
                       "step_ms": {str(b): t for b, t in sorted(alone.items())}}
            print("# compute alone (one_device --threads 1, ms per step, median): %s" % ", ".join(
                "batch %d: %.3f" % (b, t) for b, t in sorted(alone.items())))
        m["contended"] = {k: median(v) * 1e-3 for k, v in cont.items() if k[0] > 1}
        print("# per-process compute under contention (ms, median of %s): %s" % (
            "/".join(sorted({str(len(v)) for v in cont.values()})) + " runs",
            ", ".join("%d x batch %d: %.2f (alone x %d / %d cores: %.2f)" % (
                n, b, m["contended"][(n, b)] * 1e3, n, min(m["cores"], n),
                n * compute_s(compute, b) * 1e3 / min(m["cores"], n))
                for n, b in sorted(m["contended"]))))
    print("# machine: %d cores; one-way latency %.1f us direct, the relay adds %.1f us; tbf "
          "passes %.0f%% of its rate to one flow; TLS x%.1f CPU per byte"
          % (m["cores"], m["alpha0"] * 1e6, m["relay_alpha"] * 1e6,
             100 * m["tbf_efficiency"], m["tls_factor"]))
    if a.check:
        # a label run again in one file (a fixed script, a rerun) counts once: its last line;
        # across files, a label's step time is the mean of the files' good runs
        # (--rounds: every good line counts, the median)
        per_label = {}
        for path in a.check:
            last = {}
            for l in open(path):
                if l.strip():
                    r = json.loads(l)
                    if r.get("contention") or r.get("probe"):
                        continue
                    r["step_ms"] = measured(r)
                    if a.rounds:
                        last.setdefault(r["label"], []).append(r)
                    else:
                        last.pop(r["label"], None)
                        last[r["label"]] = [r]
            for label, rs in last.items():
                for r in rs:
                    if r.get("as_expected") and r.get("step_ms"):
                        per_label.setdefault(label, []).append(r)
        runs = []
        for label, rs in per_label.items():
            r = dict(rs[0])
            r["step_ms_each"] = [x["step_ms"] for x in rs]
            r["step_ms"] = (median(r["step_ms_each"]) if a.rounds
                            else sum(r["step_ms_each"]) / len(rs))
            hid = [x["overlap_stats"] for x in rs if x.get("overlap_stats")]
            r["hidden_each"] = [h["hidden_pct"] for h in hid]
            r["exposed_each"] = [h["exposed_ms_per_pass"] for h in hid]
            runs.append(r)
        if lacking[0]:
            print("# %d lines have no wall period (older sweeps): their time inside the steps "
                  "stands in for it" % lacking[0])
        print("# measured: %s" % {"wall": "a step's period (train_wall_seconds / steps)",
                                  "step": "the time inside a step (train_seconds / steps)"}
              [a.measure])
        calibrate(runs, layers, compute, m)
        # the runs without limits or relay: each one the base of the runs with the same
        # workers, global batch and overlap (machine_mw)
        m["base"] = {(r["namespaces"], r["batch_size"], bool(r.get("overlap"))): r["step_ms"] * 1e-3
                     for r in runs if is_base(r)}
        print("# fitted on the unlimited runs: %.2f us CPU per message, %.3f ns CPU per byte"
              % (m["msg"] * 1e6, m["byte_cpu"] * 1e9))
        print()
        print("| run | tasks | transport | rate | delay | measured ms (each run) | %s | "
              "predicted ms | error | model's terms ms |" % ("median" if a.rounds else "mean"))
        print("|---|---:|---|---|---:|---:|---:|---:|---:|---|")
        errs = []
        for r in runs:
            if r.get("probe") or r.get("fault") != "none" or not r.get("step_ms"):
                continue
            if not r.get("as_expected"):
                continue  # a task failed: its step time is not a cluster's
            if r["label"].startswith("acc-"):
                continue
            if r["strategy"] == "multi_worker":
                pred, terms = machine_mw(r, layers, compute, m)
            else:
                pred, terms = machine_ps(r, layers, compute, m)
            shown = ", ".join("%s %.1f" % (k, v * 1e3) for k, v in terms.items())
            if r["hidden_each"]:
                shown += "; library: %s%% hidden, %s ms exposed" % (
                    "/".join(map(str, r["hidden_each"])),
                    "/".join("%.1f" % x for x in r["exposed_each"]))
            err = pred * 1e3 / r["step_ms"] - 1
            fitted = is_base(r)
            if not fitted:
                errs.append((r["strategy"], abs(err)))
            print("| %s%s | %d | %s | %s | %.1f ms | %s | %.1f | %.1f | %+.0f%% | %s |" % (
                r["label"], " (base)" if fitted else "", r["namespaces"], r["transport"],
                r["rate"], r["delay_us"] / 1000,
                " / ".join("%.1f" % x for x in r["step_ms_each"]), r["step_ms"], pred * 1e3,
                100 * err, shown))
        print()
        for strat in ("multi_worker", "parameter_server"):
            e = sorted(x for st, x in errs if st == strat)
            if e:
                print("# %s: %d predicted runs; |error| median %.0f%%, max %.0f%%; within 20%%: "
                      "%d of %d" % (strat, len(e), 100 * e[len(e) // 2], 100 * e[-1],
                                    sum(x <= 0.2 for x in e), len(e)))
    if a.extrapolate:
        extrapolate(layers, compute, a)


def mw_pick(world, batch, layers, compute, net):
    """The option set with the shortest modelled step: overlap off, or on with 64 KiB, 256 KiB
    (the default) or 1 MiB buckets; all-reduce auto or ring."""
    best = None
    for algo in ("auto", "ring"):
        for ov in (0, 64 << 10, 256 << 10, 1 << 20):
            r = mw_step(world, batch, layers, compute, net, algo, ov)
            if best is None or r["step"] < best[0] - 1e-9:
                best = (r["step"], algo, ov)
    step, algo, ov = best
    what = ("overlap_gradients=1, bytes_per_pack=%s" % ("%d KiB" % (ov >> 10) if ov < 1 << 20
                                                        else "1 MiB") if ov
            else "overlap_gradients=0")
    if algo != "auto":
        what += ", DIST_ALLREDUCE_ALGORITHM=" + algo
    return step, what


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
          "metric reduce ms | step ms, no overlap | efficiency | step ms, overlap | "
          "hidden | best modelled options | its step ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for world in (2, 8, 64, 1000):
        for name, rate, alpha in nets:
            net = {"alpha": alpha, "rate": rate, "msg": msg, "byte_cpu": byte_cpu}
            for batch in (64, 256):
                r = mw_step(world, batch, layers, compute, net)
                o = mw_step(world, batch, layers, compute, net, overlap_bytes=bucket)
                ring = allreduce("ring", 4 * layers["params"], world, net)[0]
                hidden = 1 - o["exposed"] / r["exposed"] if r["exposed"] else 0.0
                shown = "%.0f%%" % (100 * hidden) if hidden >= 0 else "worse"
                best, what = mw_pick(world, batch, layers, compute, net)
                print("| %d | %s | %d | %.2f | %.2f (%s) | %.2f | %.2f | %.2f | %.0f%% | %.2f | "
                      "%s | %s | %.2f |" % (
                          world, name, batch, r["compute"] * 1e3, r["allreduce"] * 1e3,
                          r["algorithm"], ring * 1e3, r["metrics"] * 1e3, r["step"] * 1e3,
                          100 * r["compute"] / r["step"], o["step"] * 1e3, shown, what,
                          best * 1e3))
    print()
    # The chief's closures per second: one worker's closure rate times the workers, until the
    # busiest ps's link or optimizer is the bound.
    print("| workers | ps | link | closure ms (one worker) | steps/s, round-robin placement | "
          "steps/s, even shards (a partitioner) | images/s, even shards |")
    print("|---:|---:|---|---:|---:|---:|---:|")
    for workers in (8, 64, 1000):
        for ps in (1, 2, 8, 64):
            if ps > workers:
                continue
            for name, rate, alpha in nets:
                net = {"alpha": alpha, "rate": rate, "msg": msg, "byte_cpu": byte_cpu}
                r = ps_step(workers, ps, 64, layers, compute, net, a.ps_apply_ms * 1e-3)
                e = ps_step(workers, ps, 64, layers, compute, net, a.ps_apply_ms * 1e-3, True)
                print("| %d | %d | %s | %.2f | %.0f | %.0f | %.0f |" % (
                    workers, ps, name, r["worker_closure"] * 1e3, 1 / r["step"],
                    1 / e["step"], 64 / e["step"]))


if __name__ == "__main__":
    sys.exit(main())
