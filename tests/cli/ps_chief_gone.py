#!/usr/bin/env python3
"""A ps task SIGSTOPped until the chief gives up on it, then woken: it exits by itself.

    ps_chief_gone.py DISTRAIN WORKDIR [stop-ps|kill-chief]

Starts a chief, one worker and one ps task by hand (TF_CONFIG and one cluster token each, as
on a real cluster: no launcher to stop them) with --collective-timeout 3 --connect-timeout 8.
Once the chief trains, the ps is SIGSTOPped; the chief names it and exits. Then the ps gets
SIGCONT: its chief is gone for good, so it must exit within the connect timeout plus 15 s,
saying why, and so must the worker (before, the ps waited for a shutdown that never came).
With kill-chief the chief is SIGKILLed instead (it sends no shutdown to anyone): the ps and
the worker must exit within the connect timeout plus 15 s, saying why.
Exit status 0 when all of that holds, 1 with the reason otherwise."""
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

CONNECT_TIMEOUT = 8


def free_ports(n):
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def main():
    distrain, workdir = sys.argv[1], sys.argv[2]
    mode = sys.argv[3] if len(sys.argv) > 3 else "stop-ps"
    os.makedirs(workdir, exist_ok=True)
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"],
               "ps": [f"127.0.0.1:{ports[2]}"]}
    env = dict(os.environ, DIST_CLUSTER_TOKEN=secrets.token_hex(32))
    tasks = {}
    logs = {}
    for job in ("ps", "worker", "chief"):
        tf_config = '{"cluster":%s,"task":{"type":"%s","index":0}}' % (
            str(cluster).replace("'", '"'), job)
        logs[job] = os.path.join(workdir, job + ".log")
        out = open(logs[job], "wb")
        tasks[job] = subprocess.Popen(
            [distrain, "--strategy", "parameter_server", "--epochs", "30", "--threads", "1",
             "--collective-timeout", "3", "--connect-timeout", str(CONNECT_TIMEOUT)],
            env=dict(env, TF_CONFIG=tf_config), stdout=out, stderr=subprocess.STDOUT)

    def log(job):
        with open(logs[job], errors="replace") as f:
            return f.read()

    def fail(why):
        for p in tasks.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.kill()
                p.wait()
        print("FAIL: " + why)
        for job in tasks:
            print(f"--- {job} ---\n" + log(job)[-3000:])
        sys.exit(1)

    def wait_for(cond, timeout, why):
        end = time.monotonic() + timeout
        while not cond():
            if time.monotonic() > end:
                fail(why)
            time.sleep(0.1)

    wait_for(lambda: "Epoch 2/30" in log("chief"), 60, "the chief never reached epoch 2")
    bound = CONNECT_TIMEOUT + 15
    if mode == "kill-chief":
        tasks["chief"].kill()
        tasks["chief"].wait()
        gone = time.monotonic()
        for job in ("ps", "worker"):
            wait_for(lambda: tasks[job].poll() is not None, max(1.0, gone + bound - time.monotonic()),
                     f"{job}/0 was still running {bound} s after its chief was SIGKILLed")
            if "within the connect timeout" not in log(job):
                fail(f"{job}/0 did not say why it exited")
        print(f"ok: {time.monotonic() - gone:.0f} s after the chief was SIGKILLed the ps "
              f"(code {tasks['ps'].returncode}) and the worker (code "
              f"{tasks['worker'].returncode}) had exited, saying why")
        return
    tasks["ps"].send_signal(signal.SIGSTOP)
    stopped = time.monotonic()
    wait_for(lambda: tasks["chief"].poll() is not None, 40,
             "the chief did not give up on the stopped ps within 40 s")
    if tasks["chief"].returncode == 0:
        fail("the chief exited 0 though its ps stopped")
    if "ps/0" not in log("chief"):
        fail("the chief's error does not name ps/0")
    gave_up = time.monotonic() - stopped
    tasks["ps"].send_signal(signal.SIGCONT)
    woken = time.monotonic()
    wait_for(lambda: tasks["ps"].poll() is not None, bound,
             f"the woken ps was still running {bound} s after SIGCONT, its chief gone")
    ps_took = time.monotonic() - woken
    if "has not connected again within the connect timeout" not in log("ps"):
        fail("the ps did not say why it exited")
    wait_for(lambda: tasks["worker"].poll() is not None, max(1.0, bound - ps_took),
             f"the worker was still running {bound} s after the chief had gone")
    print(f"ok: the chief gave up on the stopped ps after {gave_up:.0f} s; woken, the ps exited "
          f"{ps_took:.0f} s later (code {tasks['ps'].returncode}), and the worker too "
          f"(code {tasks['worker'].returncode})")


if __name__ == "__main__":
    main()
