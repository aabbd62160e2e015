"""TensorFlow's own view of TF_CONFIG cases, in the JSON shape of dist_cluster_to_json.

Usage: tf_config_reference.py CASES.json  -> prints a JSON list, one entry per case:
  {"name": ..., "accept": true, "view": {...}}  or  {"name": ..., "accept": false, "message": ...}

Everything below asks TensorFlow: TFConfigClusterResolver reads TF_CONFIG, ClusterSpec builds the
cluster, multi_worker_util validates and numbers. Two rules come from
MultiWorkerMirroredStrategy (collective_all_reduce_strategy.py) because they live in its
constructor: an empty cluster is local mode (chief, one worker, id 0), and a cluster without a
task is an error. Values TensorFlow leaves undefined for the task (it raises) are null.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from tensorflow.python.distribute import multi_worker_util as mwu  # noqa: E402
from tensorflow.python.distribute.cluster_resolver import TFConfigClusterResolver  # noqa: E402


def _or_none(fn, *errors):
    try:
        return fn()
    except errors:
        return None


def tf_view():
    resolver = TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    task_type = resolver.task_type
    task_id = resolver.task_id
    rpc_layer = resolver.rpc_layer
    as_dict = spec.as_dict()
    cluster = {}
    for job, tasks in as_dict.items():
        if isinstance(tasks, dict):
            cluster[job] = [tasks[i] for i in sorted(tasks)]
        else:
            cluster[job] = list(tasks)
    view = {"task_type": task_type, "task_id": task_id, "rpc_layer": rpc_layer,
            "cluster": cluster}
    if not as_dict:  # MultiWorkerMirroredStrategy._initialize_local
        view.update(is_chief=True, worker_count=1, id_in_cluster=0, collective_leader="")
        return view
    if task_type is None or task_id is None:  # ..._initialize_multi_worker, same text
        raise ValueError("When `cluster_spec` is given, you must also specify "
                         "`task_type` and `task_id`.")
    mwu._validate_cluster_spec(spec, task_type, task_id)
    view["is_chief"] = mwu.is_chief(spec, task_type, task_id)
    view["worker_count"] = _or_none(lambda: mwu.worker_count(spec, task_type), ValueError, KeyError)
    view["id_in_cluster"] = _or_none(lambda: mwu.id_in_cluster(spec, task_type, task_id), ValueError)
    view["collective_leader"] = _or_none(lambda: mwu.collective_leader(spec, task_type, task_id),
                                         AssertionError)
    return view


def case_env(case):
    tf_config = case["tf_config"]
    if tf_config is None:
        return None
    return tf_config if isinstance(tf_config, str) else json.dumps(tf_config)


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = []
    for case in cases:
        env = case_env(case)
        if env is None:
            os.environ.pop("TF_CONFIG", None)
        else:
            os.environ["TF_CONFIG"] = env
        try:
            out.append({"name": case["name"], "accept": True, "view": tf_view()})
        except (ValueError, TypeError, KeyError) as e:  # json.JSONDecodeError is a ValueError
            msg = str(e) if not isinstance(e, KeyError) else "KeyError: %s" % e
            out.append({"name": case["name"], "accept": False, "message": msg})
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
