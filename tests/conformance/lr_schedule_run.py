"""Learning-rate schedule and clipping conformance driver: TensorFlow's tf.keras schedules and
SGD clipping (lr_schedule_reference.py, run by the venv's python) against libdist's (the
lr_schedule_cases program), case by case.

Usage: lr_schedule_run.py VENV_PYTHON LR_SCHEDULE_CASES_PROGRAM CASES.json
A case agrees when every value (every learning rate, or every weight after the clipped step)
is within a relative 1e-6 of TF's, or when both refuse it and TF's ValueError message, up to
its "Received:" part (Python's list and number formatting), appears in ours. Any other
difference is printed and fails the test.
"""
import json
import os
import subprocess
import sys

RTOL = 1e-6


def run_json(argv, what):
    p = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        print(p.stdout[-4000:], p.stderr[-4000:])
        raise SystemExit("FAIL: %s exited %d" % (what, p.returncode))
    return json.loads(p.stdout)


def compare(tf_result, ours):
    if "error" in tf_result:
        if "error" not in ours:
            return "TF refuses (%s: %s), ours gives %s" % (tf_result["type"], tf_result["error"],
                                                           ours)
        expected = tf_result["error"].split(" Received:")[0]
        if tf_result["type"] == "ValueError" and expected not in ours["error"]:
            return "TF's message %r is not in ours %r" % (expected, ours["error"])
        return None
    if "error" in ours:
        return "TF gives %s, ours refuses: %s" % (tf_result, ours["error"])
    key = "values" if "values" in tf_result else "weights"
    theirs, mine = tf_result[key], ours.get(key, [])
    if len(theirs) != len(mine):
        return "TF %d %s, ours %d" % (len(theirs), key, len(mine))
    for i, (a, b) in enumerate(zip(theirs, mine)):
        if abs(a - b) > RTOL * max(abs(a), abs(b)):
            return "%s[%d]: TF %.9g, ours %.9g (relative %.3g)" % (
                key, i, a, b, abs(a - b) / max(abs(a), abs(b)))
    return None


def main():
    venv_python, program, cases_path = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(cases_path) as f:
        cases = json.load(f)
    tf = run_json([venv_python, os.path.join(here, "lr_schedule_reference.py"), cases_path],
                  "the TensorFlow reference")
    ours = run_json([program, cases_path], "lr_schedule_cases")
    failures = 0
    for case in cases:
        name = case["name"]
        if name not in tf or name not in ours:
            failures += 1
            print("DIFF   %-34s missing from %s" % (name, "TF" if name not in tf else "ours"))
            continue
        problem = compare(tf[name], ours[name])
        if problem:
            failures += 1
            print("DIFF   %-34s %s" % (name, problem))
        elif "error" in ours[name]:
            print("EQUAL  %-34s refused: %s" % (name, ours[name]["error"]))
        else:
            key = "values" if "values" in ours[name] else "weights"
            print("EQUAL  %-34s %d %s" % (name, len(ours[name][key]), key))
    print("%d cases, %d differ" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
