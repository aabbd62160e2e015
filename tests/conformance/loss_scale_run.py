"""Loss-scale conformance driver: Keras's LossScaleOptimizer (loss_scale_reference.py, run by the
venv's python) against libdist's (the loss_scale_trace program), step by step.

Usage: loss_scale_run.py VENV_PYTHON LOSS_SCALE_TRACE_PROGRAM CASES.json
After every step of every case, the scale, the counter and applied/skipped must be equal.
"""
import json
import os
import subprocess
import sys


def ours(program, case):
    def arg(v):
        return "default" if v is None else repr(v)

    p = subprocess.run([program, case["rule"], "1" if case["dynamic"] else "0",
                        arg(case["initial_scale"]), arg(case["growth_steps"]), case["steps"]],
                       capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        raise RuntimeError("loss_scale_trace exited %d: %s" % (p.returncode, p.stderr))
    return [[float(s), int(c), int(a)] for s, c, a in (l.split() for l in p.stdout.splitlines())]


def main():
    venv_python, program, cases_path = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(cases_path) as f:
        cases = json.load(f)
    ref = subprocess.run([venv_python, os.path.join(here, "loss_scale_reference.py"), cases_path],
                         capture_output=True, text=True, timeout=600)
    if ref.returncode != 0:
        print(ref.stdout, ref.stderr[-4000:])
        print("FAIL: the Keras reference did not run")
        return 1
    keras = json.loads(ref.stdout)
    failures = 0
    for case in cases:
        name = case["name"]
        k, o = keras[name], ours(program, case)
        problems = []
        if len(k) != len(o):
            problems.append("steps: keras %d, ours %d" % (len(k), len(o)))
        for i, (ks, os_) in enumerate(zip(k, o)):
            if ks != os_:
                problems.append("step %d: keras [scale, counter, applied] = %s, ours %s"
                                % (i + 1, ks, os_))
                break
        if problems:
            failures += 1
            print("DIFF   %-32s %s" % (name, "; ".join(problems)))
        else:
            skipped = sum(1 for s in o if not s[2])
            print("EQUAL  %-32s %d steps, %d skipped, final scale %g counter %d"
                  % (name, len(o), skipped, o[-1][0], o[-1][1]))
    print("%d cases, %d differ" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
