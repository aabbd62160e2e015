"""TensorFlow's side of the learning-rate schedule and clipping conformance test.

Usage: lr_schedule_reference.py CASES.json (run by the conformance venv's python)
Prints one JSON object {name: result}: for a schedule case, {"values": [lr(0), ..., lr(steps-1)]}
from tf.keras.optimizers.schedules (the float32 tensors Keras returns); for a clipping case,
{"weights": [...]}, the variables after one tf.keras.optimizers.SGD(learning_rate=1.0, <clip>)
step on a Dense(units) layer's kernel [inputs, units] and bias [units] (weights and grads given
kernel first, row-major, then bias). {"error": message, "type": class} where Keras refuses.
"""
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SCHEDULES = {
    "exponential_decay": tf.keras.optimizers.schedules.ExponentialDecay,
    "piecewise_constant": tf.keras.optimizers.schedules.PiecewiseConstantDecay,
    "polynomial_decay": tf.keras.optimizers.schedules.PolynomialDecay,
    "inverse_time_decay": tf.keras.optimizers.schedules.InverseTimeDecay,
    "cosine_decay": tf.keras.optimizers.schedules.CosineDecay,
    "cosine_decay_restarts": tf.keras.optimizers.schedules.CosineDecayRestarts,
}


def schedule_case(case):
    schedule = SCHEDULES[case["kind"]](**case["args"])
    # Keras's optimizers call learning_rate(iterations) with iterations an int64 variable
    return {"values": [float(schedule(tf.constant(step, tf.int64)).numpy())
                       for step in range(case["steps"])]}


def clip_case(case):
    n_in, units = case["inputs"], case["units"]
    w = np.array(case["weights"], np.float32)
    g = np.array(case["grads"], np.float32)
    nk = n_in * units
    kernel = tf.Variable(w[:nk].reshape(n_in, units))
    bias = tf.Variable(w[nk:])
    opt = tf.keras.optimizers.SGD(learning_rate=1.0, **case["clip"])
    opt.apply_gradients([(tf.constant(g[:nk].reshape(n_in, units)), kernel),
                         (tf.constant(g[nk:]), bias)])
    return {"weights": [float(x) for x in np.concatenate([kernel.numpy().ravel(),
                                                            bias.numpy().ravel()])]}


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        try:
            out[case["name"]] = clip_case(case) if "clip" in case else schedule_case(case)
        except (ValueError, TypeError) as e:
            out[case["name"]] = {"error": str(e), "type": type(e).__name__}
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
