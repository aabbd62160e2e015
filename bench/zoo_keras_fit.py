#!/usr/bin/env python3
"""TensorFlow reference for bench_models: a zoo model (bench/models/NAME.json, the JSON libdist
loads) in tf_keras, model.fit on the CPU.

The model comes from tf_keras.models.model_from_json of the same file (or Keras 3 with --keras
keras3); Adam(1e-3), sparse softmax cross-entropy of the logits; synthetic data as
bench_models's: 8 batches of float32 inputs (int32 token ids below 20000 for an int32 input)
and random labels, through tf.data (batch, drop remainder, repeat, prefetch 2). One model.fit
of 1 + R epochs of --steps steps: the first is the warm-up (tracing, oneDNN primitives), each
later one a timed repeat (on_epoch_begin to on_epoch_end, as bench/tf_keras_fit.py).

Threads as bench/tf_keras_fit.py: intra-op N, inter-op 1, set in the environment before
TensorFlow is imported and through tf.config.threading after.

Prints one JSON line on stdout: {"model", "threads", "images_per_sec_median", "runs", ...}.

  ~/.cache/libdist/venv-tf/bin/python bench/zoo_keras_fit.py --model resnet20 --threads 1
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import keras_cnn  # noqa: E402


def zoo_entry(models_dir, name):
    with open(os.path.join(models_dir, "flops.txt")) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == name:
                return (tuple(int(d) for d in parts[1].split("x")), parts[2], int(parts[3]),
                        float(parts[4]))
    keras_cnn.die(f"{name} is not in {models_dir}/flops.txt")


def compiled_model_and_data(tf, keras, models_dir, name, shape, dtype, batch):
    """The zoo model NAME from its JSON, compiled with Adam(1e-3) and the sparse softmax
    cross-entropy of the logits, and bench_models's synthetic data: 8 batches of float32 inputs
    (int32 token ids below 20000 for an int32 input) and random labels, through tf.data."""
    import numpy as np

    with open(os.path.join(models_dir, f"{name}.json")) as f:
        model = keras.models.model_from_json(f.read())
    classes = int(model.output_shape[-1])
    rng = np.random.default_rng(35)
    n = 8 * batch
    if dtype == "int32":
        x = rng.integers(0, 20000, (n,) + shape).astype(np.int32)
    else:
        x = rng.standard_normal((n,) + shape).astype(np.float32)
    y = rng.integers(0, classes, n).astype(np.int32)
    ds = (tf.data.Dataset.from_tensor_slices((x, y)).batch(batch, drop_remainder=True)
          .repeat().prefetch(2))
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model, ds


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--models-dir", default=os.path.join(HERE, "models"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--inter-op", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=0, help="default: the zoo's")
    p.add_argument("--keras", choices=["tf_keras", "keras3"], default="tf_keras")
    p.add_argument("--mixed-precision", choices=["none", "bf16"], default="none")
    args = p.parse_args()
    shape, dtype, batch, flops = zoo_entry(args.models_dir, args.model)
    batch = args.batch_size or batch
    keras_cnn.set_thread_env(args.threads, args.inter_op)
    tf, keras = keras_cnn.import_tf_keras(args.keras)
    keras_cnn.set_tf_threads(tf, args.threads, args.inter_op)

    keras.utils.set_random_seed(35)
    if args.mixed_precision == "bf16":
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
    model, ds = compiled_model_and_data(tf, keras, args.models_dir, args.model, shape, dtype,
                                        batch)

    class EpochTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seconds = []

        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds.append(time.perf_counter() - self.t0)

    timer = EpochTimer()
    model.fit(ds, epochs=1 + args.repeats, steps_per_epoch=args.steps, verbose=0,
              callbacks=[timer])
    runs = [round(args.steps * batch / s, 1) for s in timer.seconds[1:]]
    print(json.dumps({
        "model": args.model, "threads": args.threads, "inter_op": args.inter_op,
        "images_per_sec_median": round(statistics.median(runs), 1), "runs": runs,
        "batch_size": batch, "steps": args.steps, "flops_per_example": flops,
        "keras": f"{args.keras} {keras.__version__}", "tensorflow": tf.__version__,
        "dtype_policy": "mixed_bfloat16" if args.mixed_precision == "bf16" else "float32",
    }))


if __name__ == "__main__":
    main()
