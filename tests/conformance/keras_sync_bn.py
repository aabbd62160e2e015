"""SyncBatchNorm against Keras 3's BatchNormalization(synchronized=True) under
tf.distribute.MirroredStrategy, on two replicas, same weights and inputs.

TensorFlow runs on two logical CPUs (tf.config.set_logical_device_configuration) with
MirroredStrategy(["/cpu:0", "/cpu:1"]); libdist's driver (keras_sync_bn.c) on a mirrored
strategy of cpu:0 and cpu:1. The model, made by Keras from fixed seeds with every weight
(moving statistics included) then drawn by NumPy:

  Conv2D(4, 3, same) -> BatchNormalization(synchronized=True) -> AveragePooling2D(2) ->
  GlobalAveragePooling2D -> Dense(6, tanh) -> BatchNormalization(synchronized=True,
  momentum=0.9, center=False) -> Dense(3)

Keras writes to_json() and save_weights(); both sides run one training step on a global batch
of 8 (replica k takes examples 4k .. 4k + 3), loss = tf.nn.compute_average_loss of the sparse
softmax cross-entropy, no optimizer. Compared, relative (||libdist - tf|| / max(||libdist||,
||tf||)): each replica's logits (normalized with the global batch statistics) and every
replica's moving_mean / moving_variance after the step to 1e-5; each replica's gradient of
every trainable variable (through the all-reduced statistics: tf.distribute's all-reduce
gradient) to 3e-5. The gradients pass back through both normalizations (a division by the
batch standard deviation of 8 examples each) and end in sums with cancellation, such as the
second normalization's 6-element beta gradient: float32 kernels that sum in another order (the
ISA oneDNN picks) differ there by 1.26e-5 on the AVX-512 Zen 4 machine (under 1e-5 on AVX2). A control run with synchronized=False on the
TensorFlow side must differ, so the comparison sees the synchronization.

Usage: keras_sync_bn.py DRIVER WORKDIR
"""
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    cpus[0], [tf.config.LogicalDeviceConfiguration(), tf.config.LogicalDeviceConfiguration()])

import keras  # noqa: E402

N, H, W, C, K = 8, 6, 6, 3, 3
TOL = 1e-5
GRAD_TOL = 3e-5


def make(synchronized):
    return keras.Sequential([
        keras.Input((H, W, C)),
        keras.layers.Conv2D(4, 3, padding="same"),
        keras.layers.BatchNormalization(synchronized=synchronized),
        keras.layers.AveragePooling2D(2),
        keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(6, activation="tanh"),
        keras.layers.BatchNormalization(synchronized=synchronized, momentum=0.9, center=False),
        keras.layers.Dense(K),
    ])


def rel(a, b):
    d = float(np.linalg.norm(a - b))
    m = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return d / m if m > 0 else d


def tf_step(strategy, synchronized, weights, x, y):
    """Per replica: logits, {variable path: gradient}, and the variables after the step."""
    with strategy.scope():
        model = make(synchronized)
        model.set_weights(weights)

    def replica_fn(xs, ys):
        with tf.GradientTape() as tape:
            logits = model(xs, training=True)
            per = keras.losses.sparse_categorical_crossentropy(ys, logits, from_logits=True)
            loss = tf.nn.compute_average_loss(per, global_batch_size=N)
        return logits, tape.gradient(loss, model.trainable_weights)

    half = N // 2
    xd = strategy.experimental_distribute_values_from_function(
        lambda ctx: x[ctx.replica_id_in_sync_group * half:(ctx.replica_id_in_sync_group + 1) * half])
    yd = strategy.experimental_distribute_values_from_function(
        lambda ctx: y[ctx.replica_id_in_sync_group * half:(ctx.replica_id_in_sync_group + 1) * half])
    logits, grads = tf.function(lambda a, b: strategy.run(replica_fn, args=(a, b)))(xd, yd)
    out = []
    for r in range(2):
        lg = strategy.experimental_local_results(logits)[r].numpy()
        gr = {v.path: strategy.experimental_local_results(g)[r].numpy()
              for v, g in zip(model.trainable_weights, grads)}
        vs = []
        for layer in model.layers:
            for v in layer.weights:
                vals = getattr(v.value, "values", None) or [v.value]
                vs.append((v.path, v.trainable, np.asarray(vals[min(r, len(vals) - 1)])))
        out.append((lg, gr, vs))
    return model, out


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(77)
    x = (rng.standard_normal((N, H, W, C)) * 1.5 + 0.3).astype(np.float32)
    y = rng.integers(0, K, N).astype(np.int32)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    assert strategy.num_replicas_in_sync == 2

    keras.utils.set_random_seed(3)
    proto = make(True)
    weights = []
    for layer in proto.layers:
        for v in layer.weights:
            lo, hi = (0.5, 1.5) if "moving_variance" in v.path else (-0.6, 0.6)
            weights.append(rng.uniform(lo, hi, v.shape).astype(np.float32))
    proto.set_weights(weights)
    json_path, wpath = os.path.join(work, "model.json"), os.path.join(work, "model.weights.h5")
    with open(json_path, "w") as f:
        f.write(proto.to_json())
    proto.save_weights(wpath)
    x_path, y_path = os.path.join(work, "x.f32"), os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    prefix = os.path.join(work, "libdist")
    r = subprocess.run([driver, json_path, wpath, x_path, y_path, str(N), str(H), str(W), str(C),
                        prefix], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"driver failed ({r.returncode}):\n{r.stderr}")

    model, ref = tf_step(strategy, True, weights, x, y)
    _, local = tf_step(strategy, False, weights, x, y)
    logits = np.fromfile(prefix + ".logits.f32", dtype=np.float32).reshape(2, N // 2, K)
    nparams = sum(w.size for w in weights)
    grads = np.fromfile(prefix + ".grads.f32", dtype=np.float32).reshape(2, nparams)
    varsv = np.fromfile(prefix + ".vars.f32", dtype=np.float32).reshape(2, nparams)

    failures, worst = 0, {"logits": 0.0, "gradients": 0.0, "moving statistics": 0.0}
    for rep in range(2):
        lg, gr, vs = ref[rep]
        e = rel(logits[rep], lg)
        worst["logits"] = max(worst["logits"], e)
        if e > TOL:
            failures += 1
            print(f"FAIL replica {rep} logits: {e:.2e}")
        at = 0
        for path, trainable, value in vs:
            mine_g = grads[rep, at:at + value.size].reshape(value.shape)
            mine_v = varsv[rep, at:at + value.size].reshape(value.shape)
            at += value.size
            if trainable:
                e = rel(mine_g, gr[path])
                what = "gradients"
            else:
                e = rel(mine_v, value)
                what = "moving statistics"
            worst[what] = max(worst[what], e)
            if e > (GRAD_TOL if trainable else TOL):
                failures += 1
                print(f"FAIL replica {rep} {path} ({what}): {e:.2e}")
        assert at == nparams
    # the control: unsynchronized statistics give other logits, so the test sees the all-reduce
    control = max(rel(logits[r], local[r][0]) for r in range(2))
    if control < 1e-3:
        failures += 1
        print(f"FAIL the unsynchronized control matches too ({control:.2e}): the test is blind")
    print(f"{'ok  ' if not failures else 'FAIL'} SyncBatchNorm, 2 replicas: worst relative "
          + ", ".join(f"{k} {v:.2e}" for k, v in worst.items())
          + f" (bounds {TOL:g}, gradients {GRAD_TOL:g}); unsynchronized control differs by "
          + f"{control:.2e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
