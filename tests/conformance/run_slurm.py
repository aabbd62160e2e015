"""Slurm conformance: libdist's Slurm resolver (cluster_json --slurm) against TensorFlow 2.20's
SlurmClusterResolver on the same environments, field by field: the cluster (job "worker",
every task's address), task_type and task_id.

Usage (the venv's python): run_slurm.py CLUSTER_JSON_PROGRAM
TensorFlow 2.20 expands the hostlist in Python (no scontrol) and reads SLURM_PROCID,
SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST and SLURM_STEP_TASKS_PER_NODE; libdist reads
SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST and SLURM_STEP_TASKS_PER_NODE. srun sets both
families; each case sets both to the same values. On CPUs TensorFlow's resolver needs GPU
counts to place tasks (it pairs each task with a GPU slice): the reference passes
gpus_per_node = the most tasks of a node and gpus_per_task = 1, which places every task, and
auto_set_gpu=False. Deliberate differences are listed in slurm_differences.json with their
reasons; any other difference, or a listed one that no longer holds, fails.
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tensorflow.python.distribute.cluster_resolver import slurm_cluster_resolver as scr  # noqa

PORT = 8888
# (name, procid, ntasks, nodelist, tasks_per_node)
CASES = [
    ("one_node_one_task", 0, 1, "node1", "1"),
    ("two_nodes_rank1", 1, 2, "node[1-2]", "1(x2)"),
    ("two_tasks_per_node_rank3", 3, 4, "gpu[01-02]", "2(x2)"),
    ("uneven_tasks", 2, 5, "a[1-3]", "3,1,1"),
    ("ranges_and_singles", 4, 6, "n[1-2],m5,o[3-4]", "2,1,1,1,1"),
    ("zero_padded_range", 5, 6, "node[008-010]", "2(x3)"),
    ("lists_inside_brackets", 0, 4, "c[1,3,5-6]", "1(x4)"),
    ("prefix_with_dash", 2, 3, "rack-a[1-3]", "1(x3)"),
    ("unsorted_hostlist", 1, 3, "zeta,alpha,mid", "1(x3)"),
    ("unpadded_range_past_9", 2, 10, "n[1-10]", "1(x10)"),
    # refused by both (the texts are Python's and ours; only the refusal is compared)
    ("unclosed_bracket", 0, 2, "node[1-2", "1(x2)"),
    ("more_tasks_than_placed", 0, 5, "node[1-2]", "2(x2)"),
    ("bad_tasks_per_node", 0, 2, "node[1-2]", "two"),
]


def tf_view(case):
    name, procid, ntasks, nodelist, tpn = case
    for k in list(os.environ):
        if k.startswith("SLURM_"):
            del os.environ[k]
    os.environ.update(SLURM_PROCID=str(procid), SLURM_STEP_NUM_TASKS=str(ntasks),
                      SLURM_STEP_NODELIST=nodelist, SLURM_STEP_TASKS_PER_NODE=tpn)
    try:
        most = max(scr.expand_tasks_per_node(tpn))
        r = scr.SlurmClusterResolver(port_base=PORT, gpus_per_node=most, gpus_per_task=1,
                                     auto_set_gpu=False)
        spec = r.cluster_spec().as_dict()
        return {"accept": True, "task_type": r.task_type, "task_id": r.task_id,
                "cluster": {k: list(v) for k, v in spec.items()}}
    except Exception as e:  # TensorFlow's refusals are plain exceptions
        return {"accept": False, "message": str(e)}


def our_view(program, case):
    name, procid, ntasks, nodelist, tpn = case
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "TF_CONFIG"}
    env.update(SLURM_PROCID=str(procid), SLURM_NTASKS=str(ntasks), SLURM_JOB_NODELIST=nodelist,
               SLURM_STEP_TASKS_PER_NODE=tpn)
    p = subprocess.run([program, "--slurm", str(PORT)], env=env, capture_output=True, text=True,
                       timeout=60)
    line = p.stdout.strip()
    if p.returncode == 2 and line.startswith("ERROR: "):
        return {"accept": False, "message": line[len("ERROR: "):]}
    if p.returncode != 0:
        raise RuntimeError("cluster_json exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))
    v = json.loads(line)
    return {"accept": True, "task_type": v["task_type"], "task_id": v["task_id"],
            "cluster": v["cluster"]}


def main():
    program = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "slurm_differences.json")) as f:
        differences = {k: v for k, v in json.load(f).items() if not k.startswith("_")}
    unknown = set(differences) - {c[0] for c in CASES}
    if unknown:
        print("FAIL: slurm_differences.json names cases that do not exist: %s" % sorted(unknown))
        return 1
    failures = 0
    for case in CASES:
        name = case[0]
        t, o = tf_view(case), our_view(program, case)
        same = t == o if t["accept"] and o["accept"] else t["accept"] == o["accept"]
        listed = differences.get(name)
        if listed:
            if same:
                print("FAIL   %-28s listed as a difference, but both agree now: %s" % (name, o))
                failures += 1
            else:
                print("KNOWN  %-28s %s\n         tf:   %s\n         ours: %s"
                      % (name, listed["reason"], json.dumps(t), json.dumps(o)))
            continue
        if same:
            print("EQUAL  %-28s %s" % (name, json.dumps(o)))
        else:
            failures += 1
            print("DIFF   %-28s\n         tf:   %s\n         ours: %s"
                  % (name, json.dumps(t), json.dumps(o)))
    print("%d cases: %d differ" % (len(CASES), failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
