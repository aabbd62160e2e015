#!/usr/bin/env python3
"""Checks bench/scaling_model.py against the namespace sweeps committed under bench/scaling/
(docs/scaling.md, sections 11.7 to 11.9), so the model's code and the figures the docs quote cannot drift
apart, and checks how a multi_worker step's terms combine on a run built here.

    tests/cluster/test_scaling_model.py SOURCE_DIR
"""
import json
import math
import os
import re
import subprocess
import sys

src = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "..")
sc = os.path.join(src, "bench", "scaling")
model = os.path.join(src, "bench", "scaling_model.py")
failures = []


def check(cond, what):
    print("%s: %s" % ("ok" if cond else "FAILED", what))
    if not cond:
        failures.append(what)


def run(*files, contention=("sweep-l.jsonl",)):
    out = subprocess.run(
        [sys.executable, model, "--layers", os.path.join(sc, "layers-k.json"),
         "--compute", os.path.join(sc, "compute.json"), "--probe", os.path.join(sc, "probe-k.jsonl"),
         "--contention"] + [os.path.join(sc, f) for f in contention] + ["--check"]
        + [os.path.join(sc, f) for f in files] + ["--rounds", "--ps-apply-ms", "0.142"],
        check=True, capture_output=True, text=True).stdout
    rows = {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 10 and re.match(r"[+-]\d+%$", cells[9]):
            rows[cells[1].replace(" (base)", "")] = (int(cells[9][:-1]), "(base)" in cells[1])
    summary = {g[0]: (int(g[1]), int(g[2])) for g in
               re.findall(r"# (\w+): \d+ predicted runs;.*within 20%: (\d+) of (\d+)", out)}
    return out, rows, summary


# Sweep L (6 December 2026, 2-core AMD EPYC): the model, designed on sweep K, predicts it.
out, rows, summary = run("sweep-l.jsonl")
check(summary.get("multi_worker") == (17, 18),
      "sweep L: multi_worker within 20%% in 17 of 18 predicted runs (got %s)"
      % (summary.get("multi_worker"),))
check(summary.get("parameter_server") == (7, 7),
      "sweep L: parameter_server within 20%% in 7 of 7 (got %s)" % (summary.get("parameter_server"),))
bases = {k: v for k, v in rows.items() if v[1]}
check(len(bases) == 12 and all(e == 0 for e, _ in bases.values()),
      "sweep L: the 12 runs without limits or relay are the bases, each its own prediction")
check("measured: a step's period" in out, "the model checks a step's period (train_wall_seconds)")

# The latency x rate grid: 4 and 8 workers, 0.1 / 1 / 3 ms, with and without 1 Gbit/s.
out, rows, _ = run("sweep-l.jsonl", "latency-wire-k.jsonl")
lw = {k: e for k, (e, _) in rows.items() if k.startswith("lw-")}
check(len(lw) == 12 and all(abs(e) <= 13 for e in lw.values()),
      "the latency x rate grid: 12 runs, every one within 13%% (%s)"
      % ", ".join("%s %+d%%" % kv for kv in sorted(lw.items())))

# Sweep N (section 11.8): parameter_server runs whose workers logged where their closures' time
# went. The model's epoch drain (per closure of a worker's cycle) against the workers' measured
# wait for the chief, at 16 tasks with limits, where it is largest.
out, rows, summary = run("sweep-m.jsonl", "sweep-n.jsonl",
                         contention=("sweep-n.jsonl", "sweep-m.jsonl"))
check(summary.get("parameter_server") == (7, 7),
      "sweeps M and N together: parameter_server within 20%% in 7 of 7 (got %s)"
      % (summary.get("parameter_server"),))
terms = {}
for line in out.splitlines():
    g = re.match(r"\| (ps\S+-n16-1g-1000us-e4) .*\| ([^|]*drain [^|]*) \|$", line)
    if g:
        terms[g.group(1)] = {k: float(v) for k, v in re.findall(r"(\w+) ([0-9.]+)", g.group(2))}
waits = {}
for line in open(os.path.join(sc, "sweep-n.jsonl")):
    r = json.loads(line)
    if r.get("label") in terms and r.get("closure_phases_ms"):
        ws = [d.get("waiting_for_the_chief", [0.0])[0] for d in r["closure_phases_ms"].values()]
        waits.setdefault(r["label"], []).append(sum(ws) / len(ws))
for label, t in sorted(terms.items()):
    w = sorted(waits.get(label, [0.0]))[len(waits.get(label, [0.0])) // 2]
    check(w > 0 and abs(t["drain"] / w - 1) <= 0.25,
          "%s: the model's drain %.1f ms a closure, the workers waited %.1f (within 25%%)"
          % (label, t["drain"], w))
    # (the epoch start's queue, burst, is checked by the steps of every sweep, not against
    # the workers' pulling: which phase shows that wait moves with the relay's scheduling,
    # docs/scaling.md 11.9)
    check(t["burst"] > 0, "%s: the epoch start's queue is in the model (%.1f ms a closure)"
          % (label, t["burst"]))
check(len(terms) == 2, "sweep N: both 16-task runs with limits have drain and burst terms")

# Sweep O (section 11.9): run while the epoch start's queue and the worker's own link in series
# were being added to the model from sweeps L, M and N, and first read after they were: the
# model's out-of-sample check.
out, rows, summary = run("sweep-o.jsonl", contention=("sweep-o.jsonl",))
check(summary.get("multi_worker") == (17, 18),
      "sweep O: multi_worker within 20%% in 17 of 18 (got %s)" % (summary.get("multi_worker"),))
check(summary.get("parameter_server") == (7, 7),
      "sweep O: parameter_server within 20%% in 7 of 7 (got %s)"
      % (summary.get("parameter_server"),))
check(all(abs(e) <= 18 for k, (e, _) in rows.items() if k.startswith("ps")),
      "sweep O: every parameter_server run within 18%% (%s)"
      % ", ".join("%s %+d%%" % (k, e) for k, (e, _) in sorted(rows.items()) if k.startswith("ps")))

# Sweep Q: the same sweep with the relay under SCHED_FIFO (RELAY_FIFO=1); the parameter-server
# model holds there too, and the 16-worker multi_worker runs are within 13%.
out, rows, summary = run("sweep-q-fifo.jsonl", contention=("sweep-q-fifo.jsonl",))
check(summary.get("parameter_server") == (7, 7),
      "sweep Q (relay under SCHED_FIFO): parameter_server within 20%% in 7 of 7 (got %s)"
      % (summary.get("parameter_server"),))
mw16 = {k: e for k, (e, base) in rows.items() if k.startswith("mw-n16-") and not base}
check(len(mw16) == 6 and all(abs(e) <= 13 for e in mw16.values()),
      "sweep Q: the six 16-worker multi_worker runs with the relay within 13%% (%s)"
      % ", ".join("%s %+d%%" % kv for kv in sorted(mw16.items())))

# How the terms combine, on a run made here: compute + CPU + the longer of latency and wire.
sys.path.insert(0, os.path.dirname(model))
import scaling_model as smod  # noqa: E402
layers = json.load(open(os.path.join(sc, "layers-k.json")))
compute = {"cores": 2, "step_ms": {"8": 0.6, "64": 5.0}}
m = {"cores": 2, "alpha0": 30e-6, "relay_alpha": 80e-6, "relay_copy": 1.0, "msg": 10e-6,
     "byte_cpu": 1e-9, "tls_factor": 2.4, "tbf_efficiency": 1.0, "contended": {}}
r = {"namespaces": 8, "batch_size": 64, "delay_us": 1000, "rate": "1gbit", "transport": "tcp"}
t, terms = smod.machine_mw(r, layers, compute, m)
check(math.isclose(t, terms["compute"] + terms["comm_cpu"] + max(terms["latency"], terms["wire"])),
      "a step is compute + CPU + max(latency, wire)")
check(terms["latency"] < terms["wire"], "at 1 ms and 1 Gbit/s the wire is the longer wait")
r3 = dict(r, delay_us=3000)
t3, terms3 = smod.machine_mw(r3, layers, compute, m)
check(terms3["latency"] > terms3["wire"] and math.isclose(t3 - t, terms3["latency"] - terms["wire"]),
      "at 3 ms the latency is the longer wait, and only its excess over the wire adds")
m_base = dict(m, base={(8, 64, False): 0.020})
tb, termsb = smod.machine_mw(dict(r, delay_us=0, rate="none"), layers, compute, m_base)
check(math.isclose(tb, 0.020), "a run without limits or relay predicts its measured base exactly")
ro = dict(r, overlap=True, batch_size=512)
to, termso = smod.machine_mw(ro, layers, compute, m)
tn, termsn = smod.machine_mw(dict(ro, overlap=False), layers, compute, m)
bwd = sum(b for _, _, b in smod.layer_table(layers, 64))
check(termsn["wire"] - termso["wire"] <= bwd + 1e-12,
      "overlap hides at most the single-process backward pass (%.2f ms) of wire time" % (bwd * 1e3))
# The parameter server's queueing network: a message that waits behind a FIFO's backlog.
st = [("link", 0.004, True), ("ack", 0.0, "behind:link"), ("delay", 0.010, False)]
t1, res1 = smod.mva(st, 1)
t8, res8 = smod.mva(st, 8)
check(res1["ack"] == 0.0 and math.isclose(t1, 0.014),
      "one worker alone: its acknowledgement waits behind nothing")
check(res8["ack"] > 0.004 and t8 >= 0.004 - 1e-12,
      "eight workers: the acknowledgement waits behind more than one pull (%.1f ms), and the "
      "job is no faster than the link (%.2f ms a closure)" % (res8["ack"] * 1e3, t8 * 1e3))
# The epoch's drain: S closures an epoch, W workers: (W - 1) / (2 S) of the steady step more.
rp = {"namespaces": 16, "ps": 1, "batch_size": 64, "delay_us": 1000, "rate": "1gbit",
      "transport": "tcp"}
mp = dict(m, ps_apply=0.0001)
t0, _ = smod.machine_ps(rp, layers, compute, mp)
t60, res60 = smod.machine_ps(dict(rp, steps_asked=60), layers, compute, mp)
wire = 4 * layers["params"] / (125e6 * mp["tbf_efficiency"])
burst = 13 * wire / 120  # one ps: its share is the whole model
check(math.isclose(t60, t0 * (1 + 13 / 120) + burst) and
      math.isclose(res60["drain"], 14 * t0 * 13 / 120) and math.isclose(res60["burst"], 14 * burst),
      "14 workers, 60 closures an epoch: the drain adds 13/120 of the step and the epoch "
      "start's queue 13/120 of the wire (%.2f ms), each 14x that a cycle" % (burst * 1e3))
tu, resu = smod.machine_ps(dict(rp, rate="none", delay_us=0, steps_asked=60), layers, compute, mp)
check(resu["burst"] == 0.0 and resu["own_link"] == 0.0,
      "without a rate limit the epoch start's queue and the worker's own link cost nothing")
# The worker's own link, in series with the ps's: whole for a worker alone, hidden behind a queue.
st = [("ps_in", 0.004, True), ("own_link", 0.004, "hidden:ps_in"), ("delay", 0.010, False)]
t1, res1 = smod.mva(st, 1)
t8, res8 = smod.mva(st, 8)
check(math.isclose(res1["own_link"], 0.004) and res8["own_link"] == 0.0,
      "the worker's own link: its whole wire time for one worker alone (%.1f ms), none behind "
      "the ps link's queue of eight (%.1f ms)" % (res1["own_link"] * 1e3, res8["own_link"] * 1e3))
if failures:
    print("%d check(s) failed" % len(failures))
    sys.exit(1)
print("all checks passed")
