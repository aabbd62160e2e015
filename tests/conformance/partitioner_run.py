"""Partitioner conformance driver: TensorFlow's partitioners under a real ParameterServerStrategy
(partitioner_reference.py, run by the venv's python) against libdist's (the partitioner_cases
program), case by case.

Usage: partitioner_run.py VENV_PYTHON PARTITIONER_CASES_PROGRAM CASES.json
A case agrees when both give the same shard count and the same rows in every shard, or when
both refuse it; where TF refuses with a ValueError, its message must appear in ours. Any other
difference is printed and fails the test.
"""
import json
import os
import subprocess
import sys


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
        if tf_result["type"] == "ValueError" and tf_result["error"] not in ours["error"]:
            return "TF's message %r is not in ours %r" % (tf_result["error"], ours["error"])
        return None
    if "error" in ours:
        return "TF gives %s, ours refuses: %s" % (tf_result, ours["error"])
    if (tf_result["shards"], tf_result["rows"]) != (ours["shards"], ours["rows"]):
        return "TF %d shards %s, ours %d shards %s" % (tf_result["shards"], tf_result["rows"],
                                                       ours["shards"], ours["rows"])
    return None


def main():
    venv_python, program, cases_path = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(cases_path) as f:
        cases = json.load(f)
    tf = run_json([venv_python, os.path.join(here, "partitioner_reference.py"), cases_path],
                  "the TensorFlow reference")
    ours = run_json([program, cases_path], "partitioner_cases")
    failures = 0
    for case in cases:
        name = case["name"]
        if name not in tf or name not in ours:
            failures += 1
            print("DIFF   %-36s missing from %s" % (name, "TF" if name not in tf else "ours"))
            continue
        problem = compare(tf[name], ours[name])
        if problem:
            failures += 1
            print("DIFF   %-36s %s" % (name, problem))
        elif "error" in ours[name]:
            print("EQUAL  %-36s refused: %s" % (name, ours[name]["error"]))
        else:
            rows = ours[name]["rows"]
            shown = rows if len(rows) <= 8 else rows[:8] + ["..."]
            print("EQUAL  %-36s %d shard(s), rows %s" % (name, ours[name]["shards"], shown))
    print("%d cases, %d differ" % (len(cases), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
