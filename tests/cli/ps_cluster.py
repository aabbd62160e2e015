#!/usr/bin/env python3
"""Starts a local parameter-server cluster of one program and checks how it ends.

    ps_cluster.py --workers 2 --ps 1 [--timeout 300] [--expect-chief-exit N]
                  [--kill TASK --kill-after REGEX [--kill-signal KILL|STOP [--cont-after S]]]
                  [--restart] [--expect REGEX ...]
                  [--expect-not REGEX ...] -- PROGRAM ARGS...

Every task (chief/0, worker/i, ps/j) runs PROGRAM ARGS with its TF_CONFIG and a fresh cluster
token in DIST_CLUSTER_TOKEN, on loopback ports the kernel hands out (each port is held by a
listening socket until just before the tasks start). Output lines are forwarded as
"[chief/0] ...". --kill TASK sends SIGKILL to that task once a line of the chief matches
--kill-after; with --restart the task is started again 2 s later (same TF_CONFIG).
--kill-signal STOP sends SIGSTOP instead (a hung task), and --cont-after S a SIGCONT S seconds
later; a stopped task left at the end is killed.
The exit status is 0 when the chief exits with --expect-chief-exit (default 0), every
--expect regex matched some output line, no --expect-not regex did, and (for a chief that
succeeds) every other task exited 0; otherwise 1, with the reason on stderr."""
import argparse
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time


def free_ports(n):
    socks = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--ps", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--expect-chief-exit", type=int, default=0)
    ap.add_argument("--chief-within", type=float, default=0,
                    help="after the kill, the chief must exit within this many seconds")
    ap.add_argument("--kill")
    ap.add_argument("--kill-after")
    ap.add_argument("--restart", action="store_true")
    ap.add_argument("--kill-signal", choices=["KILL", "STOP"], default="KILL")
    ap.add_argument("--cont-after", type=float, default=0)
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--expect-not", action="append", default=[])
    ap.add_argument("cmd", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    if not cmd:
        ap.error("no program")

    tasks = ["chief/0"] + [f"worker/{i}" for i in range(a.workers)] + [f"ps/{j}" for j in range(a.ps)]
    ports = free_ports(len(tasks))
    addr = {t: f"127.0.0.1:{p}" for t, p in zip(tasks, ports)}
    cluster = {"chief": [addr["chief/0"]],
               "worker": [addr[f"worker/{i}"] for i in range(a.workers)],
               "ps": [addr[f"ps/{j}"] for j in range(a.ps)]}
    token = secrets.token_hex(32)
    lines = []
    lock = threading.Lock()
    procs = {}
    killed_at = [None]

    def start(task):
        job, index = task.split("/")
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": job, "index": int(index)}})
        env["DIST_CLUSTER_TOKEN"] = token
        p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        procs[task] = p

        def pump():
            for line in p.stdout:
                line = line.rstrip("\n")
                with lock:
                    lines.append((task, line))
                print(f"[{task}] {line}", flush=True)
                if task == "chief/0" and a.kill and a.kill_after and killed_at[0] is None \
                        and re.search(a.kill_after, line):
                    victim = procs[a.kill]
                    victim.send_signal(getattr(signal, "SIG" + a.kill_signal))
                    killed_at[0] = time.monotonic()
                    print(f"[ps_cluster] killed {a.kill} (SIG{a.kill_signal})", flush=True)
                    if a.kill_signal == "STOP" and a.cont_after > 0:
                        def wake():
                            time.sleep(a.cont_after)
                            if victim.poll() is None:
                                victim.send_signal(signal.SIGCONT)
                                print(f"[ps_cluster] woke {a.kill} (SIGCONT)", flush=True)
                        threading.Thread(target=wake, daemon=True).start()
                    if a.restart:
                        def again():
                            time.sleep(2.0)
                            victim.wait()
                            print(f"[ps_cluster] restarting {a.kill}", flush=True)
                            start(a.kill)
                        threading.Thread(target=again, daemon=True).start()
        t = threading.Thread(target=pump, daemon=True)
        t.start()
        p.pump = t

    for t in tasks:
        start(t)
    deadline = time.monotonic() + a.timeout
    fail = []
    chief = procs["chief/0"]
    try:
        chief.wait(timeout=max(1, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        fail.append(f"the chief did not finish within {a.timeout} s")
    chief_done = time.monotonic()
    if a.chief_within and killed_at[0] is not None and chief_done - killed_at[0] > a.chief_within:
        fail.append(f"the chief exited {chief_done - killed_at[0]:.1f} s after the kill "
                    f"(limit {a.chief_within} s)")
    # the others leave when the chief shuts the cluster down; give them a moment
    for t, p in list(procs.items()):
        if t == "chief/0":
            continue
        try:
            p.wait(timeout=20 if chief.returncode == 0 else 2)
        except subprocess.TimeoutExpired:
            if chief.returncode == 0 and t != a.kill:
                fail.append(f"{t} did not exit after the shutdown")
            p.kill()
            p.wait()
    for p in procs.values():
        if p.poll() is None:
            p.send_signal(signal.SIGCONT)  # a stopped task takes its SIGKILL at once either way
            p.kill()
        p.pump.join(timeout=5)
    if chief.returncode is None:
        chief.kill()
        chief.wait()
    if chief.returncode != a.expect_chief_exit:
        fail.append(f"the chief exited {chief.returncode}, expected {a.expect_chief_exit}")
    if a.expect_chief_exit == 0:
        for t, p in procs.items():
            if t != "chief/0" and p.returncode != 0 and not (a.kill == t and not a.restart):
                fail.append(f"{t} exited {p.returncode}")
    text = [f"[{t}] {l}" for t, l in lines]
    for rx in a.expect:
        if not any(re.search(rx, l) for l in text):
            fail.append(f"no output line matches {rx!r}")
    for rx in a.expect_not:
        bad = [l for l in text if re.search(rx, l)]
        if bad:
            fail.append(f"an output line matches {rx!r}: {bad[0]}")
    for f in fail:
        print(f"ps_cluster: FAIL: {f}", file=sys.stderr)
    return 1 if fail else 0


if __name__ == "__main__":
    sys.exit(main())
