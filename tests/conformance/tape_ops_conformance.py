"""Tape math ops conformance: libdist's dist_op_* (the tape_ops_cases program) against
TensorFlow's own ops and tf.GradientTape, from the same inputs.

Usage: tape_ops_conformance.py TAPE_OPS_CASES_PROGRAM WORKDIR   (run by the venv's python)
For each case the program writes the inputs, libdist's output, the output gradient it fed
back, and libdist's gradient of every input. TensorFlow computes the op on those inputs and
tape.gradient(y, inputs, output_gradients=seed); the output and each gradient must agree to
1e-5 relative (||libdist - tf|| / max(||libdist||, ||tf||)), shapes exactly.
"""
import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

TOL = 1e-5


def reduction(fn):
    def op(p, x):
        naxes, keepdims = p[0], bool(p[1])
        axis = None if naxes == 0 else list(p[2:2 + naxes])
        return fn(x, axis=axis, keepdims=keepdims)
    return op


def keras_elu(x, alpha):
    # keras.activations.elu (tf-keras and Keras 3's TensorFlow backend alike)
    y = tf.nn.elu(x)
    return y if alpha == 1 else tf.where(x > 0, y, alpha * y)


def hard_sigmoid(p, x):
    # p[0] = 0: Keras 3's keras.activations.hard_sigmoid; 1: tf_keras's (a different function
    # of the same name)
    if p[0]:
        import tf_keras
        return tf_keras.activations.hard_sigmoid(x)
    import keras
    return keras.activations.hard_sigmoid(x)


def hard_silu(p, x):
    import keras
    return keras.activations.hard_silu(x)


def keras3(name, *args):
    # keras.activations.<name> of Keras 3 (its TensorFlow backend), with the given arguments
    def run(p, x):
        import keras
        return getattr(keras.activations, name)(x, *[a(p) for a in args])
    return run


def mean_squared_error(y_true, y_pred):
    # keras.losses.mean_squared_error, in tf-keras and Keras 3 alike
    try:
        import tf_keras
        return tf_keras.losses.mean_squared_error(y_true, y_pred)
    except ImportError:
        return tf.keras.losses.mean_squared_error(y_true, y_pred)


OPS = {
    "add": lambda p, a, b: tf.add(a, b),
    "sub": lambda p, a, b: tf.subtract(a, b),
    "mul": lambda p, a, b: tf.multiply(a, b),
    "div": lambda p, a, b: tf.math.divide(a, b),
    "maximum": lambda p, a, b: tf.maximum(a, b),
    "minimum": lambda p, a, b: tf.minimum(a, b),
    "neg": lambda p, x: tf.negative(x),
    "exp": lambda p, x: tf.exp(x),
    "log": lambda p, x: tf.math.log(x),
    "sqrt": lambda p, x: tf.sqrt(x),
    "square": lambda p, x: tf.square(x),
    "abs": lambda p, x: tf.abs(x),
    "sigmoid": lambda p, x: tf.sigmoid(x),
    "tanh": lambda p, x: tf.tanh(x),
    "gelu": lambda p, x: tf.nn.gelu(x, approximate=bool(p[0])),
    # Keras's activations as Keras calls TensorFlow (alpha and caps in hundredths)
    "elu": lambda p, x: keras_elu(x, p[0] / 100.0),
    "selu": lambda p, x: tf.nn.selu(x),
    "softplus": lambda p, x: tf.math.softplus(x),
    "softsign": lambda p, x: tf.nn.softsign(x),
    "leaky_relu": lambda p, x: tf.nn.leaky_relu(x, alpha=p[0] / 100.0),
    "relu6": lambda p, x: tf.nn.relu6(x),
    "relu_max": lambda p, x: tf.clip_by_value(tf.nn.relu(x), 0.0, p[0] / 100.0),
    "mish": lambda p, x: x * tf.math.tanh(tf.math.softplus(x)),
    "hard_sigmoid": hard_sigmoid,
    "hard_silu": hard_silu,
    "hard_tanh": keras3("hard_tanh"),
    "soft_shrink": keras3("soft_shrink", lambda p: p[0] / 100.0),
    "hard_shrink": keras3("hard_shrink", lambda p: p[0] / 100.0),
    "sparse_sigmoid": keras3("sparse_sigmoid"),
    "sparse_plus": keras3("sparse_plus"),
    "log_sigmoid": keras3("log_sigmoid"),
    "tanh_shrink": keras3("tanh_shrink"),
    "matmul": lambda p, a, b: tf.linalg.matmul(a, b, transpose_a=bool(p[0]),
                                               transpose_b=bool(p[1])),
    "reshape": lambda p, x: tf.reshape(x, [-1, p[0]]),
    "transpose": lambda p, x: tf.transpose(x, perm=p[:len(x.shape)]),
    "concat": lambda p, *xs: tf.concat(list(xs), axis=p[0]),
    "slice": lambda p, x: tf.slice(x, begin=p[0:3], size=p[3:6]),
    "reduce_sum": reduction(tf.reduce_sum),
    "reduce_mean": reduction(tf.reduce_mean),
    "reduce_max": reduction(tf.reduce_max),
    "softmax": lambda p, x: tf.nn.softmax(x, axis=-1),
    "log_softmax": lambda p, x: tf.nn.log_softmax(x, axis=-1),
    "sigmoid_cross_entropy_with_logits":
        lambda p, z, x: tf.nn.sigmoid_cross_entropy_with_logits(labels=z, logits=x),
    "mean_squared_error": lambda p, t, y: mean_squared_error(t, y),
}


def array(t):
    return np.array(t["data"], dtype=np.float32).reshape(t["shape"])


def rel_err(ours, ref):
    ours, ref = ours.astype(np.float64), ref.astype(np.float64)
    scale = max(np.linalg.norm(ours), np.linalg.norm(ref), 1e-30)
    return float(np.linalg.norm(ours - ref) / scale)


def check(case):
    """The failures of one case, as strings."""
    p = case["params"]
    inputs = [tf.constant(array(t)) for t in case["inputs"]]
    with tf.GradientTape() as tape:
        for x in inputs:
            tape.watch(x)
        y = OPS[case["op"]](p, *inputs)
    grads = tape.gradient(y, inputs, output_gradients=tf.constant(array(case["seed"])))
    bad = []
    pairs = [("output", array(case["output"]), y.numpy())]
    for i, (ours, ref) in enumerate(zip(case["grads"], grads)):
        ref = np.zeros(ours["shape"], np.float32) if ref is None else ref.numpy()
        pairs.append(("gradient of input %d" % i, array(ours), ref))
    for what, ours, ref in pairs:
        if list(ours.shape) != list(ref.shape):
            bad.append("%s: shape %s, TensorFlow %s" % (what, list(ours.shape), list(ref.shape)))
            continue
        err = rel_err(ours, ref)
        if not err <= TOL:
            bad.append("%s: relative error %.3g\n    libdist    %s\n    TensorFlow %s"
                       % (what, err, ours.ravel()[:8], ref.ravel()[:8]))
    return bad


def main():
    program, work = sys.argv[1:3]
    os.makedirs(work, exist_ok=True)
    out = os.path.join(work, "tape_ops_cases.json")
    p = subprocess.run([program, out], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        print("FAIL: tape_ops_cases exited %d: %s" % (p.returncode, p.stderr))
        return 1
    with open(out) as f:
        cases = json.load(f)
    failures = 0
    ops = set()
    for case in cases:
        ops.add(case["op"])
        bad = check(case)
        label = "%s %s %s" % (case["op"], [t["shape"] for t in case["inputs"]], case["params"])
        print("%s %s" % ("ok  " if not bad else "FAIL", label))
        for b in bad:
            print("    " + b)
        failures += bool(bad)
    missing = set(OPS) - ops
    if missing:
        print("FAIL: no case for %s" % sorted(missing))
        failures += 1
    print("%d cases, %d ops, %d failed: %s" % (len(cases), len(ops), failures,
                                              "PASS" if failures == 0 else "FAIL"))
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
