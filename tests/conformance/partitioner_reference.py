"""TensorFlow's side of the partitioner conformance test: each case of CASES.json is a variable
created under a real tf.distribute.experimental.ParameterServerStrategy with the case's
tf.distribute.experimental.partitioners.* partitioner, on an in-process cluster (one worker, two
ps, gRPC on localhost), and the shards are read back from the variable TF made: a
ShardedVariable's .variables, or the one plain variable when TF did not partition. So both the
shard count (the partitioner) and the rows of each shard (ParameterServerStrategy's "div" split
in _create_variable, which TF exposes no function for) come from TensorFlow itself.

Usage: partitioner_reference.py CASES.json
Prints one JSON object on stdout: {name: {"shards": N, "rows": [rows of each shard]}} or
{name: {"error": message, "type": exception class}} where TF raises (in the partitioner's
constructor or when the strategy creates the variable).
"""
import functools
import json
import os
import socket
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

partitioners = tf.distribute.experimental.partitioners


def free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def in_process_cluster():
    """A worker and two ps servers in this process; the coordinator (chief) is this program."""
    cluster = {"worker": ["localhost:%d" % free_port()],
               "ps": ["localhost:%d" % free_port() for _ in range(2)]}
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=i, protocol="grpc", start=True)
               for job in ("worker", "ps") for i in range(len(cluster[job]))]
    cluster["chief"] = ["localhost:%d" % free_port()]
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")
    return resolver, servers


def make_partitioner(spec):
    """The TF partitioner of a case; the constructors' defaults apply to absent arguments."""
    kind = spec["kind"]
    args = {k: v for k, v in spec.items() if k != "kind"}
    if kind == "none":
        return None
    if kind == "fixed":
        return partitioners.FixedShardsPartitioner(**args)
    if kind == "min_size":
        return partitioners.MinSizePartitioner(**args)
    if kind == "max_size":
        return partitioners.MaxSizePartitioner(**args)
    raise SystemExit("unknown partitioner kind %r" % kind)


def run_case(resolver, case):
    try:
        partitioner = make_partitioner(case["partitioner"])
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner)
        dtype = tf.as_dtype(case["dtype"])
        # A callable initial value that takes partition_shape: each shard is initialised alone,
        # and the full value never exists (as when a Keras layer builds its weights).
        init = functools.partial(tf.zeros_initializer(), shape=case["shape"], dtype=dtype)
        with strategy.scope():
            v = tf.Variable(init, shape=case["shape"], dtype=dtype)
    except (ValueError, ZeroDivisionError) as e:
        return {"error": str(e), "type": type(e).__name__}
    shards = list(getattr(v, "variables", [v]))
    for s in shards:
        if s.shape[1:] != tf.TensorShape(case["shape"][1:]):
            raise SystemExit("%s: a shard of shape %s" % (case["name"], s.shape))
    return {"shards": len(shards), "rows": [int(s.shape[0]) for s in shards]}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    resolver, servers = in_process_cluster()
    out = {case["name"]: run_case(resolver, case) for case in cases}
    print(json.dumps(out, indent=1, sort_keys=True))
    del servers  # kept alive until here; in-process servers end with the process
    return 0


if __name__ == "__main__":
    sys.exit(main())
