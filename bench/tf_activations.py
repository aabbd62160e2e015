"""TensorFlow's side of bench_activations: each Keras activation on N float32 values from
N(0, 2) at one thread, forward (eager op) and backward (tf.GradientTape.gradient with an output
gradient), best of K calls each, in ms: one line "name forward backward" per activation.

Usage: tf_activations.py [--n N] [--calls K]   (bench_activations runs it with --tf PYTHON)
"""
import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import tensorflow as tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

ACTS = {
    "relu": tf.nn.relu,
    "sigmoid": tf.sigmoid,
    "tanh": tf.tanh,
    "gelu": lambda x: tf.nn.gelu(x, approximate=False),
    "elu": tf.nn.elu,
    "selu": tf.nn.selu,
    "softplus": tf.math.softplus,
    "softsign": tf.nn.softsign,
    "mish": lambda x: x * tf.math.tanh(tf.math.softplus(x)),  # keras.activations.mish
    "relu6": tf.nn.relu6,
    "leaky_relu": lambda x: tf.nn.leaky_relu(x, alpha=0.2),
    # keras.activations.hard_sigmoid and hard_silu (Keras 3's TensorFlow backend)
    "hard_sigmoid": lambda x: tf.nn.relu6(x + 3.0) / 6.0,
    "hard_silu": lambda x: x * (tf.nn.relu6(x + 3.0) / 6.0),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2097152)
    ap.add_argument("--calls", type=int, default=5)
    a = ap.parse_args()
    g = tf.random.Generator.from_seed(7)
    x = g.normal([a.n], stddev=2.0)
    s = g.uniform([a.n], -1.0, 1.0)
    for name, fn in ACTS.items():
        fwd = bwd = float("inf")
        for _ in range(a.calls):
            t0 = time.perf_counter()
            y = fn(x)  # eager CPU ops return computed
            t1 = time.perf_counter()
            fwd = min(fwd, t1 - t0)
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = fn(x)
            t2 = time.perf_counter()
            tape.gradient(y, x, output_gradients=s)
            bwd = min(bwd, time.perf_counter() - t2)
        print(f"{name} {1e3 * fwd:.4f} {1e3 * bwd:.4f}", flush=True)


if __name__ == "__main__":
    main()
