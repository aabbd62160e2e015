#!/usr/bin/env python3
"""TensorFlow reference for libdist's training speed: the seed CNN in Keras, model.fit on the CPU.

Model and training as bench_train's libdist rows: the seed CNN (bench/keras_cnn.py), global
batch 64, Adam(1e-3), sparse softmax cross-entropy with accuracy; data: the built-in MNIST
subset's training images (src/data/mnist_subset) as float32 in [0,1] through tf.data
(shuffle 10000 -> batch 64, drop remainder -> repeat -> prefetch 2), as libdist's pipeline.

One model.fit call of 1 + R epochs of --steps steps each: the first epoch is the warm-up
(tracing, oneDNN primitive creation), the R timed ones are the repeats, each timed from
on_epoch_begin to on_epoch_end (so Keras's per-epoch work counts, as it does in a real fit).

Threads: intra-op = N (the compute), inter-op = 1 by default at every N: the step is a chain of
ops with no parallelism between them worth a second pool, and inter-op N would let a 1-thread
run use a second core for tf.data and the optimizer's ops. --inter-op N is there to check that.
OMP_NUM_THREADS / TF_NUM_INTRAOP_THREADS / TF_NUM_INTEROP_THREADS are set before TensorFlow is
imported, and tf.config.threading after.

With --mixed-precision bf16: Keras's mixed_bfloat16 policy (bfloat16 compute, float32 variables),
the reference for libdist's mixed_bfloat16 rows (bench_train --mixed-precision).

With --mirrored: tf.distribute.MirroredStrategy over N logical CPU devices (the one physical CPU
split with tf.config.set_logical_device_configuration), each with the same thread pools.

Prints one JSON line on stdout (the keys bench/torch_cnn.py uses):
  {"threads": N, "images_per_sec_median": ..., "runs": [...], "tensorflow": ..., ...}
Exits nonzero with a message when TensorFlow or Keras cannot be imported.

  ~/.cache/libdist/venv-tf/bin/python bench/tf_keras_fit.py --threads 1
  ~/.cache/libdist/venv-tf/bin/python bench/tf_keras_fit.py --threads 2 --steps 150 --repeats 5
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_cnn  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="intra-op threads (default 1)")
    p.add_argument("--inter-op", type=int, default=1, help="inter-op threads (default 1)")
    p.add_argument("--steps", type=int, default=150, help="steps per repeat (default 150)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data-dir", default=keras_cnn.DEFAULT_DATA)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keras", choices=["keras3", "tf_keras"], default="keras3",
                   help="Keras 3 (TF 2.20's tf.keras) or tf_keras (Keras 2); default keras3")
    p.add_argument("--jit-compile", choices=["off", "on"], default="off",
                   help="XLA-compile the train step (default off: TF's own kernels, oneDNN)")
    p.add_argument("--mixed-precision", choices=["none", "bf16"], default="none",
                   help="bf16: Keras's global dtype policy mixed_bfloat16 (oneDNN's bfloat16 "
                        "kernels where the CPU has AVX512_BF16 or AMX)")
    p.add_argument("--mirrored", action="store_true",
                   help="MirroredStrategy over --threads logical CPUs, 1 intra-op thread each")
    args = p.parse_args()
    if min(args.threads, args.inter_op, args.steps, args.repeats, args.batch_size) < 1:
        p.error("--threads, --inter-op, --steps, --repeats and --batch-size must be >= 1")
    return args


def main():
    args = parse_args()
    keras_cnn.set_thread_env(args.threads, args.inter_op)
    tf, keras = keras_cnn.import_tf_keras(args.keras)
    keras_cnn.set_tf_threads(tf, args.threads, args.inter_op)
    strategy = None
    if args.mirrored:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(args.threads)])
        strategy = tf.distribute.MirroredStrategy(
            [f"/cpu:{i}" for i in range(args.threads)],
            cross_device_ops=tf.distribute.ReductionToOneDevice())
    keras.utils.set_random_seed(args.seed)
    if args.mixed_precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")

    x, y = keras_cnn.load_split(args.data_dir, "train")
    ds = (tf.data.Dataset.from_tensor_slices((x, y))
          .shuffle(10000, seed=args.seed, reshuffle_each_iteration=True)
          .batch(args.batch_size, drop_remainder=True).repeat().prefetch(2))
    if strategy:
        with strategy.scope():
            model = keras_cnn.seed_cnn(keras, jit_compile=args.jit_compile == "on")
    else:
        model = keras_cnn.seed_cnn(keras, jit_compile=args.jit_compile == "on")

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.t0)
            print(f"epoch {epoch + 1}/{args.repeats + 1}{' (warm-up)' if epoch == 0 else ''}: "
                  f"{args.steps * args.batch_size / self.seconds[-1]:.0f} images/s, "
                  f"loss {logs.get('loss', float('nan')):.4f}", file=sys.stderr)

    timer = EpochTimer()
    model.fit(ds, epochs=1 + args.repeats, steps_per_epoch=args.steps, verbose=0,
              callbacks=[timer])
    runs = [round(args.steps * args.batch_size / s, 1) for s in timer.seconds[1:]]
    if len(runs) != args.repeats:
        keras_cnn.die(f"{len(runs)} of {args.repeats} repeats timed")
    print(json.dumps({
        "threads": args.threads,
        "inter_op": args.inter_op,
        "images_per_sec_median": round(statistics.median(runs), 1),
        "runs": runs,
        "batch_size": args.batch_size,
        "steps": args.steps,
        "warmup_steps": args.steps,
        "mirrored": args.mirrored,
        "keras": f"{args.keras} {keras.__version__}",
        "jit_compile": args.jit_compile,
        "dtype_policy": "mixed_bfloat16" if args.mixed_precision == "bf16" else "float32",
        "tensorflow": tf.__version__,
        "onednn": os.environ.get("TF_ENABLE_ONEDNN_OPTS", "default (on)"),
    }))


if __name__ == "__main__":
    main()
