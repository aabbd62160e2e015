"""TF_CONFIG conformance driver: TensorFlow's view (tf_config_reference.py, run by the venv's
python) against libdist's (the cluster_json program) for every case of tf_config_cases.json.

Usage: run_tf_config.py VENV_PYTHON CLUSTER_JSON_PROGRAM CASES.json
Every field, every accept/reject and the text of every rejection must agree, but for the
deliberate differences of tf_config_differences.json (beside this file), each with its reason:
"accept" (TF accepts, libdist rejects) or "message" (both reject, the texts differ). An entry
there that no longer differs as it says fails too, so the list stays true.
"""
import json
import os
import subprocess
import sys

FIELDS = ("task_type", "task_id", "is_chief", "worker_count", "id_in_cluster",
          "collective_leader", "rpc_layer", "cluster")


def ours(program, tf_config):
    env = dict(os.environ)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config if isinstance(tf_config, str) else json.dumps(tf_config)
    p = subprocess.run([program], env=env, capture_output=True, text=True, timeout=60)
    line = p.stdout.strip()
    if p.returncode == 2 and line.startswith("ERROR: "):
        return {"accept": False, "message": line[len("ERROR: "):]}
    if p.returncode == 0:
        return {"accept": True, "view": json.loads(line)}
    raise RuntimeError("cluster_json exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))


def main():
    venv_python, program, cases_path = sys.argv[1:4]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(cases_path) as f:
        cases = json.load(f)
    ref = subprocess.run([venv_python, os.path.join(here, "tf_config_reference.py"), cases_path],
                         capture_output=True, text=True, timeout=600)
    if ref.returncode != 0:
        print(ref.stdout, ref.stderr)
        print("FAIL: the TensorFlow reference did not run")
        return 1
    tf = {r["name"]: r for r in json.loads(ref.stdout)}
    with open(os.path.join(here, "tf_config_differences.json")) as f:
        differences = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    unknown = set(differences) - {c["name"] for c in cases}
    if unknown:
        print("FAIL: tf_config_differences.json names cases that do not exist: %s" % sorted(unknown))
        return 1
    failures, equal, known = 0, 0, 0
    for case in cases:
        name = case["name"]
        t, o = tf[name], ours(program, case["tf_config"])
        problems = []
        listed = differences.get(name)
        if listed and listed["kind"] == "accept":
            if not (t["accept"] and not o["accept"]):
                problems.append("listed difference no longer holds (tf accept=%s, ours accept=%s)"
                                % (t["accept"], o["accept"]))
            else:
                known += 1
                print("KNOWN  %-32s %s | ours: %s" % (name, listed["reason"], o["message"]))
                continue
        elif listed and listed["kind"] == "message":
            if t["accept"] or o["accept"] or t["message"] == o["message"]:
                problems.append("listed message difference no longer holds")
            else:
                known += 1
                print("KNOWN  %-32s messages differ: %s\n         tf:   %s\n         ours: %s"
                      % (name, listed["reason"], t["message"], o["message"]))
                continue
        elif t["accept"] != o["accept"]:
            problems.append("accept: tf=%s ours=%s (%s)" % (
                t["accept"], o["accept"], t.get("message") or o.get("message")))
        elif t["accept"]:
            for k in FIELDS:
                if t["view"].get(k) != o["view"].get(k):
                    problems.append("%s: tf=%r ours=%r" % (k, t["view"].get(k), o["view"].get(k)))
        elif t["message"] != o["message"]:
            problems.append("rejection texts differ:\n         tf:   %s\n         ours: %s"
                            % (t["message"], o["message"]))
        if problems:
            failures += 1
            print("DIFF   %-32s %s" % (name, "; ".join(problems)))
        else:
            equal += 1
            if t["accept"]:
                print("EQUAL  %-32s %s" % (name, json.dumps(o["view"], sort_keys=True)))
            else:
                print("EQUAL  %-32s both reject, same text: %s" % (name, o["message"]))
    print("%d cases: %d equal, %d known differences, %d differ" % (len(cases), equal, known, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
