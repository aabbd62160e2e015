"""Loss-scale traces from Keras itself, for loss_scale_run.py (run by the conformance venv).

Usage: loss_scale_reference.py CASES.json
Prints a JSON object {case name: [[scale, counter, applied], ...]} with one entry per step.
Rule "tf_keras" drives tf_keras.mixed_precision.LossScaleOptimizer (TF_USE_LEGACY_KERAS=1),
rule "keras3" drives keras.optimizers.LossScaleOptimizer (Keras 3, TensorFlow backend), each
around SGD(learning_rate=1) on one variable of 3 elements. A step's gradients are {x, 1, 1} with
x = 1 (F), Inf (I) or NaN (N).
"""
import json
import os
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

# apply_gradients on raw gradients warns about get_scaled_loss on every step.
tf.get_logger().setLevel("ERROR")

VALUE = {"F": 1.0, "I": float("inf"), "N": float("nan")}


def expand(steps):
    for run in steps.split():
        for _ in range(int(run[1:])):
            yield tf.constant([VALUE[run[0]], 1.0, 1.0], dtype=tf.float32)


def tf_keras_trace(case):
    import tf_keras

    kwargs = {"dynamic": case["dynamic"]}
    if case["initial_scale"] is not None:
        kwargs["initial_scale"] = case["initial_scale"]
    if case["growth_steps"] is not None:
        kwargs["dynamic_growth_steps"] = case["growth_steps"]
    opt = tf_keras.mixed_precision.LossScaleOptimizer(tf_keras.optimizers.SGD(1.0), **kwargs)
    v = tf.Variable([0.0, 0.0, 0.0])
    trace = []
    for g in expand(case["steps"]):
        # tf-keras increments iterations on skipped steps too: detect an update on the weights.
        # Element 1 always gets gradient 1, so it moves by exactly 1 whenever the update runs.
        before = float(v.numpy()[1])
        opt.apply_gradients([(g, v)])
        applied = int(float(v.numpy()[1]) != before)
        counter = int(opt.dynamic_counter.numpy()) if opt.dynamic else 0
        trace.append([float(tf.convert_to_tensor(opt.loss_scale).numpy()), counter, applied])
    return trace


def keras3_trace(case):
    import keras

    kwargs = {}
    if case["initial_scale"] is not None:
        kwargs["initial_scale"] = case["initial_scale"]
    if case["growth_steps"] is not None:
        kwargs["dynamic_growth_steps"] = case["growth_steps"]
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0), **kwargs)
    v = keras.Variable([0.0, 0.0, 0.0])
    trace = []
    for g in expand(case["steps"]):
        # Keras 3's iterations are the inner optimizer's, which skipped steps leave alone.
        before = int(opt.iterations.numpy())
        opt.apply([g], [v])
        applied = int(opt.iterations.numpy()) - before
        trace.append([float(opt.dynamic_scale.numpy()), int(opt.step_counter.numpy()), applied])
    return trace


def main():
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    out = {}
    for case in cases:
        fn = keras3_trace if case["rule"] == "keras3" else tf_keras_trace
        out[case["name"]] = fn(case)
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
