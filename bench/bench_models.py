#!/usr/bin/env python3
"""Runner of the zoo benchmark (issue #35): libdist (build/bench/bench_models), TensorFlow's
Keras fit (bench/zoo_keras_fit.py, tf_keras) and PyTorch eager (bench/zoo_torch.py), each zoo
model at 1 and 2 threads, interleaved: every round runs every (model, threads, framework) once,
each in a fresh process with its own warm-up, so that the machine's drift (other processes on
a shared machine) hits all alike. Medians over the rounds; writes a Markdown table with the
machine (lscpu's model name, the AVX-512/AMX flags), the FP32 FMA peak bench_models measures,
each ratio and the FLOP rate per model, and the load average seen before each round.

Rows per model and thread count: libdist one_device (1t / 2t), libdist mirrored 2 replicas of 1
thread (at 2), TF Keras fit (intra-op N, inter-op 1), PyTorch (torch.set_num_threads(N)). A
model libdist refuses gets its refusal message in the table instead of a number.

  bench/bench_models.py --build build --rounds 3 --out /tmp/zoo_table.md
  options: --models seed_cnn,resnet20,mlp,transformer,lstm --tf-python PY --torch-python PY
           --steps resnet20=3,mlp=30,...  --mixed-precision (mixed_bfloat16 rows of libdist
           and of TF Keras fit too: each mixed row's "vs TF" is against TF's own row of its
           policy, so a CPU where bfloat16 does not pay shows it for both)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_STEPS = {"seed_cnn": 30, "resnet20": 3, "mlp": 30, "transformer": 5, "lstm": 5}


def sh(cmd, timeout=900):
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return -1, "", "timeout"
    return p.returncode, p.stdout, p.stderr


def json_median(out):
    for line in reversed(out.splitlines()):
        if line.startswith("{"):
            return json.loads(line)["images_per_sec_median"]
    return None


def machine():
    _, out, _ = sh(["lscpu"])
    name = re.search(r"Model name:\s*(.*)", out)
    flags = re.search(r"Flags:\s*(.*)", out)
    isa = sorted(f for f in (flags.group(1).split() if flags else [])
                 if f.startswith(("avx512", "amx", "avx2", "fma")))
    cpus = re.search(r"^CPU\(s\):\s*(\d+)", out, re.M)
    return (name.group(1).strip() if name else "?"), " ".join(isa), (cpus.group(1) if cpus else "?")


def tf_row(policy):
    return "TF Keras fit" if policy == "float32" else f"TF Keras fit {policy}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(HERE, "..", "build"))
    p.add_argument("--models", default="seed_cnn,resnet20,mlp,transformer,lstm")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", default="", help="NAME=N,... (default %s)" % DEFAULT_STEPS)
    p.add_argument("--tf-python", default=os.path.expanduser("~/.cache/libdist/venv-tf/bin/python"))
    p.add_argument("--torch-python", default="/usr/bin/python3")
    p.add_argument("--mixed-precision", action="store_true")
    p.add_argument("--out", default="")
    args = p.parse_args()
    steps = dict(DEFAULT_STEPS)
    for kv in filter(None, args.steps.split(",")):
        k, v = kv.split("=")
        steps[k] = int(v)
    models = args.models.split(",")
    bench = os.path.join(args.build, "bench", "bench_models")
    _, out, _ = sh([bench, "--models", "none", "--configs", "1t"])
    peak = re.search(r"peak of one core: ([\d.]+) GFLOP/s \((\w+)\)", out)
    peak_g = float(peak.group(1)) if peak else 0.0
    flops = {}
    with open(os.path.join(HERE, "models", "flops.txt")) as f:
        for line in f:
            if not line.startswith("#"):
                parts = line.split()
                flops[parts[0]] = (float(parts[4]), int(parts[3]))
    res, refused, loads = {}, {}, []
    policies = ["float32"] + (["mixed_bfloat16"] if args.mixed_precision else [])

    def add(key, v):
        if v is not None:
            res.setdefault(key, []).append(v)

    for r in range(args.rounds):
        loads.append(open("/proc/loadavg").read().split()[0])
        for m in models:
            n = steps.get(m, 10)
            for t in (1, 2):
                cfgs = "1t" if t == 1 else "2t,mirrored2"
                if m not in refused:
                    cmd = [bench, "--models", m, "--configs", cfgs, "--steps", str(n), "--warmup",
                           "2", "--repeats", "1", "--no-peak"]
                    if args.mixed_precision:
                        cmd.append("--mixed-precision")
                    rc, out, err = sh(cmd)
                    for line in out.splitlines():
                        mm = re.match(r"RESULT model=(\S+) config=(\S+) policy=(\S+) .*"
                                      r"examples_per_sec=([\d.]+)", line)
                        if mm:
                            add((m, t, f"libdist {mm.group(2)} {mm.group(3)}"),
                                float(mm.group(4)))
                        if line.startswith("REFUSED"):
                            refused[m] = line.split(": ", 1)[1]
                    if rc not in (0, 3):
                        print(f"bench_models {m} {cfgs} failed: {err.strip()[-400:]}",
                              file=sys.stderr)
                for pol in policies:
                    cmd = [args.tf_python, os.path.join(HERE, "zoo_keras_fit.py"), "--model", m,
                           "--threads", str(t), "--steps", str(n)]
                    if pol != "float32":
                        cmd += ["--mixed-precision", "bf16"]
                    rc, out, err = sh(cmd)
                    add((m, t, tf_row(pol)), json_median(out) if rc == 0 else None)
                    if rc != 0:
                        print(f"TF {m} {t} {pol}: {err.strip()[-300:]}", file=sys.stderr)
                rc, out, err = sh([args.torch_python, os.path.join(HERE, "zoo_torch.py"),
                                   "--model", m, "--threads", str(t), "--steps", str(n),
                                   "--warmup", "2"])
                add((m, t, "PyTorch"), json_median(out) if rc == 0 else None)
                if rc != 0:
                    print(f"torch {m} {t}: {err.strip()[-300:]}", file=sys.stderr)
                print(f"round {r + 1}/{args.rounds} {m} {t} thread(s) done", file=sys.stderr)
    loads.append(open("/proc/loadavg").read().split()[0])

    name, isa, cpus = machine()
    lines = [f"Machine: {name}, {cpus} CPUs; ISA flags: {isa}.",
             f"FP32 FMA peak of one core (bench/fma_peak.c): {peak_g:.1f} GFLOP/s.",
             f"Rounds: {args.rounds}, interleaved; 1-minute load average before each round and "
             f"after: {', '.join(loads)}.",
             f"Steps per timed run: {', '.join(f'{m} {steps.get(m, 10)}' for m in models)}.",
             "",
             "| model (batch) | threads | row | examples/s (median) | runs | vs TF | vs PyTorch "
             "| GFLOP/s | % FP32 peak |",
             "|---|---|---|---|---|---|---|---|---|"]
    for m in models:
        fl, batch = flops.get(m, (0.0, 0))
        for t in (1, 2):
            tf_meds = {pol: statistics.median(res[(m, t, tf_row(pol))])
                       for pol in policies if res.get((m, t, tf_row(pol)))}
            pt_med = statistics.median(res[(m, t, "PyTorch")]) \
                if res.get((m, t, "PyTorch")) else None
            rows = [k for k in res if k[0] == m and k[1] == t and k[2].startswith("libdist")]
            rows += [(m, t, tf_row(pol)) for pol in policies] + [(m, t, "PyTorch")]
            if m in refused:
                lines.append(f"| {m} ({batch}) | {t} | libdist | refused: `{refused[m]}` | | | | "
                             f"| |")
            for k in rows:
                v = res.get(k)
                if not v:
                    continue
                med = statistics.median(v)
                pol = next((q for q in policies if k[2].endswith(q)), "float32")
                tf_med = tf_meds.get(pol)
                if k[2].startswith("libdist"):
                    vs_tf = f"{med / tf_med:.2f}x" if tf_med else ""
                elif pol != "float32" and tf_meds.get("float32"):
                    vs_tf = f"{med / tf_meds['float32']:.2f}x (TF float32)"
                else:
                    vs_tf = ""
                vs_pt = f"{med / pt_med:.2f}x" if pt_med and k[2].startswith("libdist") else ""
                rate = med * fl * 1e-9
                pct = f"{100 * rate / (peak_g * t):.1f}%" if peak_g else ""
                lines.append(f"| {m} ({batch}) | {t} | {k[2]} | {med:,.1f} | "
                             f"{', '.join(f'{x:.0f}' for x in v)} | {vs_tf} | {vs_pt} | "
                             f"{rate:.1f} | {pct} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table + "\n")


if __name__ == "__main__":
    main()
