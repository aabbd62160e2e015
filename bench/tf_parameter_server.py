#!/usr/bin/env python3
"""TensorFlow reference for libdist's ParameterServerStrategy: steps/s of TF's own one.

TensorFlow's tf.distribute.ParameterServerStrategy driven by a
tf.distribute.coordinator.ClusterCoordinator, with an in-process cluster on loopback as in TF's
parameter-server tutorial: this process is the coordinator and also hosts one
tf.distribute.Server per worker and per ps task (gRPC on 127.0.0.1, free ports), found through a
SimpleClusterResolver.

Model (libdist's seed CNN, 121,930 parameters): Conv2D(32,3x3,relu) -> MaxPool 2x2 ->
Conv2D(64,3x3,relu) -> MaxPool 2x2 -> Flatten -> Dense(64,relu) -> Dense(10); softmax
cross-entropy from logits; Adam(1e-3, eps 1e-7); input 28x28x1 float32. Built with tf_keras
(Keras 2, as TF's tutorial with TF_USE_LEGACY_KERAS=1; Keras 3 was not tried). Variables are
placed round-robin over the ps tasks (no partitioner), Adam's slots next to them.

Training step: a tf.function with a GradientTape and optimizer.apply_gradients inside
strategy.run, scheduled with coordinator.schedule on per-worker datasets
(coordinator.create_per_worker_dataset) of the 7,996-image MNIST subset (gzip IDX read with
gzip + numpy; shuffled, repeated, batch --batch-size per worker step, uint8 -> float32 / 255 in the
pipeline). One scheduled step = one batch on one worker = one apply_gradients on the ps.

Measurement: --warmup steps scheduled and joined, then --steps steps scheduled and
coordinator.join()ed, timed: steps/s = steps / time, images/s = steps/s * batch size. Every
(configuration, repeat) runs in its own fresh subprocess (TF's in-process servers cannot be torn
down), repeats interleaved round-robin over the configurations so that background load spreads
over all of them; the table gives the median of the repeats (and min/max).

--ps-update-only: the workers do no forward/backward; each step is apply_gradients of a
constant, worker-made gradient (tf.fill, every trainable variable, 121,930 floats) so the table
gives the raw rate at which the ps tasks apply full-model Adam updates pushed over gRPC.

THREADS (the deadlock pitfall). All in-process servers share ONE inter-op thread pool: TF's
ComputePool() (core/common_runtime/process_util.cc) is a process-wide static created from the
ConfigProto of the first server that asks for it (the intra-op Eigen pool is global by default
too). Likely mechanism (not traced thread by thread): each worker holds inter-op threads blocked (its step function waits on RPCs to the ps, the
remote iterator, the closure's remote call) while other work needs threads of the same pool, so
with the default size (= number of cores, 2 here) and 2 workers the cluster can hang. The
script gives every server (workers and ps alike, so creation order does not matter) a
ConfigProto with inter_op_parallelism_threads = max(workers + 1, cores) unless
--inter-op-threads says otherwise (TF's tutorial: workers + 1 when cores < workers + 1).
--threads sets intra_op_parallelism_threads (0 = TF's default, the number of cores). A child
that has not finished after --timeout seconds is killed and reported as "hung" with the last
stage it reached. Checked on a 2-core machine (TF 2.20): --inter-op-threads 2 with 2 workers
(2x1, 2x2) hangs for good with idle CPUs; so does 2x1 with the workers given 3 threads but the
ps server created first with a default ConfigProto (its 2 threads win: stage "model built", i.e.
in the warm-up steps), which shows the pool is process-wide and the first server's config counts.

Usage (TF venv: ~/.cache/libdist/venv-tf/bin/python):
  ~/.cache/libdist/venv-tf/bin/python bench/tf_parameter_server.py
  ~/.cache/libdist/venv-tf/bin/python bench/tf_parameter_server.py --steps 1000 --repeats 5
  ~/.cache/libdist/venv-tf/bin/python bench/tf_parameter_server.py --configs 2x1 --json
  ~/.cache/libdist/venv-tf/bin/python bench/tf_parameter_server.py --ps-update-only
Configurations are WORKERSxPS. Output: CPU model and TF version, then the table (or, with
--json, one JSON object on stdout). TF_CPP_MIN_LOG_LEVEL defaults to 2.
"""

import argparse
import gzip
import json
import os
import platform
import resource
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = "/work/shared/data/mnist-subset"
if not os.path.isdir(DEFAULT_DATA):
    DEFAULT_DATA = os.path.join(HERE, "..", "src", "data", "mnist_subset")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--configs", default="1x1,2x1,1x2,2x2",
                   help="comma-separated WORKERSxPS list (default 1x1,2x1,1x2,2x2)")
    p.add_argument("--steps", type=int, default=500, help="timed steps per run (default 500)")
    p.add_argument("--warmup", type=int, default=50, help="untimed steps first (default 50)")
    p.add_argument("--repeats", type=int, default=3,
                   help="runs per configuration, each a fresh process (default 3)")
    p.add_argument("--batch-size", type=int, default=64, help="images per worker step (64)")
    p.add_argument("--threads", type=int, default=0,
                   help="intra_op_parallelism_threads of the servers (default 0 = TF's: cores)")
    p.add_argument("--inter-op-threads", type=int, default=None,
                   help="inter_op_parallelism_threads of the servers "
                        "(default max(workers + 1, cores); see THREADS above)")
    p.add_argument("--ps-update-only", action="store_true",
                   help="workers push constant gradients: measures ps apply_gradients/s")
    p.add_argument("--data-dir", default=DEFAULT_DATA,
                   help="folder with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a child run is killed and reported as hung (300)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.steps < 1 or a.repeats < 1 or a.warmup < 0 or a.batch_size < 1 or a.threads < 0:
        p.error("--steps, --repeats, --batch-size must be >= 1; --warmup, --threads >= 0")
    try:
        a.config_list = [parse_config(c) for c in a.configs.split(",") if c.strip()]
    except ValueError as e:
        p.error(str(e))
    return a


def parse_config(text):
    parts = text.strip().lower().split("x")
    if len(parts) != 2 or not all(s.isdigit() for s in parts) or min(map(int, parts)) < 1:
        raise ValueError(f"bad configuration {text!r}: want WORKERSxPS, e.g. 2x1")
    return int(parts[0]), int(parts[1])


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ----------------------------------------------------------------------------- child process

def read_idx(path):
    """An IDX file (.gz or raw) as a numpy uint8 array of its shape."""
    import numpy as np
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] != 0x08:
        raise ValueError(f"{path}: not a uint8 IDX file")
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    arr = np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim)
    if arr.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {arr.size} bytes of data, header says {shape}")
    return arr.reshape(shape)


def free_ports(n):
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def stage(name):
    """A progress marker on stderr: the parent names the last one when a child hangs."""
    print(f"STAGE {name}", file=sys.stderr, flush=True)


def run_child(a):
    workers, ps = parse_config(a.child)
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")   # as TF's tutorial
    os.environ["TF_USE_LEGACY_KERAS"] = "1"
    import numpy as np
    import tensorflow as tf
    import tf_keras as keras

    cores = os.cpu_count() or 1
    inter = a.inter_op_threads if a.inter_op_threads is not None else max(workers + 1, cores)

    # --- in-process cluster (TF tutorial's create_in_process_cluster, same config for all) ---
    ports = free_ports(workers + ps)
    cluster_dict = {"worker": [f"127.0.0.1:{p}" for p in ports[:workers]],
                    "ps": [f"127.0.0.1:{p}" for p in ports[workers:]]}
    cluster_spec = tf.train.ClusterSpec(cluster_dict)
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = inter
    config.intra_op_parallelism_threads = a.threads
    servers = []
    for i in range(workers):
        servers.append(tf.distribute.Server(cluster_spec, job_name="worker", task_index=i,
                                            config=config, protocol="grpc"))
    for i in range(ps):
        servers.append(tf.distribute.Server(cluster_spec, job_name="ps", task_index=i,
                                            config=config, protocol="grpc"))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(cluster_spec,
                                                                    rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    stage("cluster up")

    # --- data ---
    images = read_idx(os.path.join(a.data_dir, "train-images-idx3-ubyte.gz"))
    labels = read_idx(os.path.join(a.data_dir, "train-labels-idx1-ubyte.gz")).astype(np.int32)
    images = images.reshape(-1, 28, 28, 1)
    batch, seed = a.batch_size, a.seed

    def dataset_fn():
        ds = tf.data.Dataset.from_tensor_slices((images, labels))
        ds = ds.shuffle(len(labels), seed=seed, reshuffle_each_iteration=True).repeat()
        ds = ds.batch(batch, drop_remainder=True)
        ds = ds.map(lambda x, y: (tf.cast(x, tf.float32) / 255.0, y),
                    num_parallel_calls=tf.data.AUTOTUNE)
        return ds.prefetch(tf.data.AUTOTUNE)

    # --- model and optimizer on the ps tasks ---
    tf.random.set_seed(seed)
    with strategy.scope():
        model = keras.Sequential([
            keras.layers.Input(shape=(28, 28, 1), dtype=tf.float32),
            keras.layers.Conv2D(32, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Conv2D(64, (3, 3), activation="relu"),
            keras.layers.MaxPooling2D((2, 2)),
            keras.layers.Flatten(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ])
        optimizer = keras.optimizers.Adam(learning_rate=1e-3, epsilon=1e-7)
        optimizer.build(model.trainable_variables)     # slots on the ps, before any step
    n_params = int(sum(np.prod(v.shape) for v in model.trainable_variables))
    placement = sorted({v.device for v in model.trainable_variables})

    if a.ps_update_only:
        shapes = [v.shape for v in model.trainable_variables]

        @tf.function
        def step_fn():
            def replica_fn():
                grads = [tf.fill(s.as_list(), 1e-3) for s in shapes]
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return tf.constant(0.0)
            return strategy.run(replica_fn)

        schedule = lambda: coordinator.schedule(step_fn)           # noqa: E731
    else:
        per_worker_iter = iter(coordinator.create_per_worker_dataset(dataset_fn))

        @tf.function
        def step_fn(iterator):
            def replica_fn(x, y):
                with tf.GradientTape() as tape:
                    logits = model(x, training=True)
                    loss = tf.reduce_mean(
                        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
                grads = tape.gradient(loss, model.trainable_variables)
                optimizer.apply_gradients(zip(grads, model.trainable_variables))
                return loss
            x, y = next(iterator)
            return strategy.run(replica_fn, args=(x, y))

        schedule = lambda: coordinator.schedule(step_fn, args=(per_worker_iter,))  # noqa: E731

    stage("model built")
    t0 = time.perf_counter()
    for _ in range(a.warmup):
        schedule()
    coordinator.join()
    warm_s = time.perf_counter() - t0
    stage("warm-up joined")

    t0 = time.perf_counter()
    last = None
    for _ in range(a.steps):
        last = schedule()
    coordinator.join()
    dt = time.perf_counter() - t0
    loss = float(last.fetch()) if not a.ps_update_only else None

    print(json.dumps({
        "workers": workers, "ps": ps, "steps": a.steps, "seconds": dt,
        "steps_per_sec": a.steps / dt, "images_per_sec": a.steps * batch / dt,
        "warmup_seconds": warm_s, "params": n_params, "last_loss": loss,
        "inter_op_threads": inter, "intra_op_threads": a.threads,
        "variable_devices": placement, "tf_version": tf.__version__,
    }), flush=True)
    sys.stdout.flush()
    # In-process servers do not shut down cleanly; skip interpreter teardown.
    os._exit(0)


# ----------------------------------------------------------------------------- parent process

def child_cmd(a, cfg):
    w, p = cfg
    cmd = [sys.executable, os.path.abspath(__file__), "--child", f"{w}x{p}",
           "--steps", str(a.steps), "--warmup", str(a.warmup), "--batch-size", str(a.batch_size),
           "--threads", str(a.threads), "--data-dir", a.data_dir, "--seed", str(a.seed)]
    if a.inter_op_threads is not None:
        cmd += ["--inter-op-threads", str(a.inter_op_threads)]
    if a.ps_update_only:
        cmd.append("--ps-update-only")
    return cmd


def cpu_busy_seconds():
    """All CPUs' busy time (user+nice+system+irq+softirq+steal) from /proc/stat, in seconds."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:3]) + sum(v[5:8])) / os.sysconf("SC_CLK_TCK")


def others_cpu(fn):
    """Run fn(); also return how many cores' worth of CPU other processes used meanwhile."""
    ru0, busy0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_seconds(), time.time()
    res = fn()
    ru1, busy1, wall = resource.getrusage(resource.RUSAGE_CHILDREN), cpu_busy_seconds(), \
        time.time() - t0
    ours = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return res, max(0.0, (busy1 - busy0) - ours) / max(wall, 1e-9)


def run_one(a, cfg):
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    try:
        r = subprocess.run(child_cmd(a, cfg), env=env, capture_output=True, text=True,
                           timeout=a.timeout)
    except subprocess.TimeoutExpired as e:
        err = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else e.stderr
        stages = [ln[6:] for ln in (err or "").splitlines() if ln.startswith("STAGE ")]
        return {"error": f"hung (killed after {a.timeout:.0f} s; last stage: "
                         f"{stages[-1] if stages else 'none (cluster start)'})"}
    for line in reversed(r.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    tail = (r.stderr or r.stdout).strip().splitlines()[-3:]
    return {"error": f"exit {r.returncode}: " + " | ".join(tail)}


def tf_version():
    r = subprocess.run([sys.executable, "-c", "import tensorflow as tf; print(tf.__version__)"],
                       env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
                       capture_output=True, text=True)
    return r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "unknown"


def main():
    a = parse_args()
    if a.child:
        run_child(a)
        return
    header = {"cpu_model": cpu_model(), "cores": os.cpu_count(), "tf_version": tf_version(),
              "python": platform.python_version(),
              "mode": "ps-update-only" if a.ps_update_only else "train",
              "steps": a.steps, "warmup": a.warmup, "repeats": a.repeats,
              "batch_size": a.batch_size, "intra_op_threads": a.threads,
              "inter_op_threads": a.inter_op_threads if a.inter_op_threads is not None
              else "max(workers+1, cores)",
              "loadavg_start": open("/proc/loadavg").read().split()[:3]}
    if not a.json:
        print(f"CPU: {header['cpu_model']} ({header['cores']} cores)")
        print(f"TensorFlow {header['tf_version']}, Python {header['python']}; mode {header['mode']}"
              f"; {a.steps} timed steps after {a.warmup} warm-up, batch {a.batch_size}/worker "
              f"step, {a.repeats} repeats (fresh process each); load avg "
              f"{' '.join(header['loadavg_start'])}", flush=True)

    runs = {cfg: [] for cfg in a.config_list}
    for rep in range(a.repeats):
        for cfg in a.config_list:
            res, others = others_cpu(lambda: run_one(a, cfg))
            res["other_processes_cores"] = others
            runs[cfg].append(res)
            if not a.json:
                loss = "" if a.ps_update_only else f", loss {res.get('last_loss', 0):.4f}"
                msg = res.get("error") or (f"{res['steps_per_sec']:.1f} steps/s "
                                           f"({res['seconds']:.2f} s{loss}, "
                                           f"others used {others:.2f} cores)")
                print(f"  run {rep + 1}/{a.repeats} {cfg[0]}x{cfg[1]}: {msg}",
                      file=sys.stderr, flush=True)

    rows = []
    for cfg, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        sps = [r["steps_per_sec"] for r in ok]
        rows.append({
            "workers": cfg[0], "ps": cfg[1], "ok_runs": len(ok), "runs": len(rs),
            "steps_per_sec_median": statistics.median(sps) if sps else None,
            "images_per_sec_median": (statistics.median(sps) * a.batch_size
                                      if sps and not a.ps_update_only else None),
            "steps_per_sec_min": min(sps) if sps else None,
            "steps_per_sec_max": max(sps) if sps else None,
            "steps_per_sec_all": sps,
            "errors": [r["error"] for r in rs if "error" in r],
            "params": ok[0]["params"] if ok else None,
            "inter_op_threads": ok[0]["inter_op_threads"] if ok else None,
            "other_processes_cores_max": max(r["other_processes_cores"] for r in rs),
        })
    header["loadavg_end"] = open("/proc/loadavg").read().split()[:3]

    if a.json:
        print(json.dumps({**header, "results": rows}, indent=1))
        return
    unit = "updates/s" if a.ps_update_only else "steps/s"
    print(f"\n{'workers':>7} {'ps':>3} {'median ' + unit:>17} {'images/s':>9} "
          f"{'min':>7} {'max':>7} {'runs':>5} {'inter-op':>8} {'others':>6}")
    for r in rows:
        if r["steps_per_sec_median"] is None:
            print(f"{r['workers']:>7} {r['ps']:>3} {'FAILED':>17}  {'; '.join(r['errors'])}")
            continue
        imgs = "-" if a.ps_update_only else f"{r['images_per_sec_median']:.0f}"
        print(f"{r['workers']:>7} {r['ps']:>3} {r['steps_per_sec_median']:>17.1f} {imgs:>9} "
              f"{r['steps_per_sec_min']:>7.1f} {r['steps_per_sec_max']:>7.1f} "
              f"{r['ok_runs']:>2}/{r['runs']:<2} {r['inter_op_threads']:>8} "
              f"{r['other_processes_cores_max']:>6.2f}")
        for e in r["errors"]:
            print(f"{'':>12}error: {e}")
    print(f"params {rows[0]['params']}; load avg at end {' '.join(header['loadavg_end'])}; "
          f"others = most cores' worth of CPU other processes used during one run")


if __name__ == "__main__":
    main()
