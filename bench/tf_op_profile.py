#!/usr/bin/env python3
"""TensorFlow's per-op profile of a zoo model's training step, the reference for bench_models
--profile (libdist's op profile, dist_op_profile_start in dist/tape.h).

The model, data, optimizer and threads are zoo_keras_fit.py's (tf_keras model_from_json of
bench/models/NAME.json, Adam(1e-3), synthetic batches, model.fit). After a warm-up epoch,
TensorFlow's own profiler (tf.profiler.experimental) records one epoch of --steps steps; the
XPlane it writes is read here: every op TensorFlow's executor ran ("name:Type" events on the
tf_Compute threads) is summed by its type, per step. The step time is the profiled epoch's
wall time over its steps (the profiler's own overhead included, as in libdist's).

Prints a table, and one JSON line starting with "TFPROFILE " for scripts.

  ~/.cache/libdist/venv-tf/bin/python bench/tf_op_profile.py --model resnet20 --threads 1
"""
import argparse
import collections
import glob
import json
import os
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import keras_cnn  # noqa: E402
import zoo_keras_fit  # noqa: E402

# ops that run other ops: their time is their children's, counted where those ran
CALLS = ("PartitionedCall", "StatefulPartitionedCall", "While", "If", "StatelessIf",
         "StatelessWhile", "__inference")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--models-dir", default=os.path.join(HERE, "models"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args()
    shape, dtype, batch, _ = zoo_keras_fit.zoo_entry(args.models_dir, args.model)
    keras_cnn.set_thread_env(args.threads, 1)
    tf, keras = keras_cnn.import_tf_keras("tf_keras")
    keras_cnn.set_tf_threads(tf, args.threads, 1)
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    keras.utils.set_random_seed(35)
    model, ds = zoo_keras_fit.compiled_model_and_data(tf, keras, args.models_dir, args.model,
                                                      shape, dtype, batch)
    model.fit(ds, epochs=1, steps_per_epoch=max(3, args.steps // 2), verbose=0)
    logdir = tempfile.mkdtemp(prefix="tf_op_profile_")
    try:
        tf.profiler.experimental.start(logdir)
        t0 = time.perf_counter()
        model.fit(ds, epochs=1, steps_per_epoch=args.steps, verbose=0)
        seconds = time.perf_counter() - t0
        tf.profiler.experimental.stop()
        files = sorted(glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True))
        if not files:
            keras_cnn.die(f"the profiler wrote no .xplane.pb under {logdir}")
        space = xplane_pb2.XSpace()
        with open(files[-1], "rb") as f:
            space.ParseFromString(f.read())
    finally:
        shutil.rmtree(logdir, ignore_errors=True)
    per_type = collections.defaultdict(float)
    calls = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute") and not line.name.startswith("tf_numa"):
                continue
            for e in line.events:
                name = plane.event_metadata[e.metadata_id].name
                if ":" not in name or "::" in name:
                    continue
                kind = name.rsplit(":", 1)[1]
                if kind.startswith(CALLS) or not kind:
                    continue
                per_type[kind] += e.duration_ps * 1e-9  # ms
                calls[kind] += 1
    step_ms = 1e3 * seconds / args.steps
    rows = sorted(per_type.items(), key=lambda kv: -kv[1])
    total = sum(per_type.values()) / args.steps
    print(f"TensorFlow {tf.__version__} op profile: {args.model}, batch {batch}, "
          f"{args.threads} thread(s), {args.steps} steps; step {step_ms:.3f} ms")
    print(f"  {'op type':34s} {'ms/step':>9s} {'% step':>7s} {'calls':>7s}")
    for kind, ms in rows[:args.top]:
        print(f"  {kind:34s} {ms / args.steps:9.3f} {100 * ms / args.steps / step_ms:6.1f}% "
              f"{calls[kind] / args.steps:7.1f}")
    rest = sum(ms for _, ms in rows[args.top:]) / args.steps
    print(f"  {'(other op types)':34s} {rest:9.3f} {100 * rest / step_ms:6.1f}%")
    print(f"  {'(outside ops)':34s} {step_ms - total:9.3f} {100 * (step_ms - total) / step_ms:6.1f}%")
    print("TFPROFILE " + json.dumps({
        "model": args.model, "threads": args.threads, "batch_size": batch, "steps": args.steps,
        "step_ms": round(step_ms, 3), "tensorflow": tf.__version__,
        "ops": {k: round(v / args.steps, 4) for k, v in rows},
        "calls": {k: calls[k] / args.steps for k, _ in rows}}))


if __name__ == "__main__":
    main()
