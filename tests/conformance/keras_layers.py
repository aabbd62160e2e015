"""The layers of unit.layers against Keras 3 itself, on the same weights and inputs.

Two Sequential models are made by Keras 3 (the conformance venv) from fixed seeds, every
weight (biases included) then drawn by NumPy so that no bias is zero:

  activations_pooling: Conv2D(6, 3, same, sigmoid) -> AveragePooling2D(2) ->
      Conv2D(8, 3, tanh) -> AveragePooling2D(3, strides=1, same) -> Conv2D(8, 2, gelu) ->
      GlobalAveragePooling2D -> Dense(12, gelu) -> Dense(5, tanh) -> Dense(4)
  with_dropout: the same with Dropout(0.4) after the global pooling.

Keras writes model.to_json() and model.save_weights(); the driver (keras_layers.c) builds the
model from the JSON, loads the weights, and writes its logits in inference and the gradient of
the mean sparse softmax cross-entropy of every variable. Keras computes the same: logits by
model(x, training=False), gradients with tf.GradientTape of
SparseCategoricalCrossentropy(from_logits=True) over model(x, training=True). Both must agree
to 1e-5 relative (||libdist - keras|| / max(||libdist||, ||keras||), per variable). The Dropout
model's gradients are not compared: in training its masks are libdist's own draws, not
TensorFlow's; in inference both are the identity, and its logits are compared.

Usage: keras_layers.py DRIVER WORKDIR
"""
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

N, H, W, C, K = 6, 12, 12, 3, 4
TOL = 1e-5


def make(dropout):
    layers = [
        keras.Input((H, W, C)),
        keras.layers.Conv2D(6, 3, padding="same", activation="sigmoid"),
        keras.layers.AveragePooling2D(2),
        keras.layers.Conv2D(8, 3, activation="tanh"),
        keras.layers.AveragePooling2D(3, strides=1, padding="same"),
        keras.layers.Conv2D(8, 2, activation="gelu"),
        keras.layers.GlobalAveragePooling2D(),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(0.4, seed=5))
    layers += [
        keras.layers.Dense(12, activation="gelu"),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(K),
    ]
    return keras.Sequential(layers)


def rel(a, b):
    d = float(np.linalg.norm(a - b))
    m = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)))
    return d / m if m > 0 else d


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(2026)
    x = rng.standard_normal((N, H, W, C)).astype(np.float32)
    y = rng.integers(0, K, N).astype(np.int32)
    x_path, y_path = os.path.join(work, "x.f32"), os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    failures = 0
    for name, dropout in (("activations_pooling", False), ("with_dropout", True)):
        keras.utils.set_random_seed(11)
        model = make(dropout)
        model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                           for w in model.get_weights()])
        json_path = os.path.join(work, f"{name}.json")
        with open(json_path, "w") as f:
            f.write(model.to_json())
        wpath = os.path.join(work, f"{name}.weights.h5")
        model.save_weights(wpath)
        lpath, gpath = os.path.join(work, f"{name}.logits"), os.path.join(work, f"{name}.grads")
        r = subprocess.run([driver, json_path, wpath, x_path, y_path, str(N), str(H), str(W),
                            str(C), lpath, gpath], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"driver failed ({r.returncode}) on {name}:\n{r.stderr}")
        want = model(x, training=False).numpy()
        got = np.fromfile(lpath, dtype=np.float32).reshape(want.shape)
        worst = rel(got, want)
        ok = worst <= TOL
        line = f"logits {worst:.2e}"
        if not dropout:
            loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
            with tf.GradientTape() as tape:
                loss = loss_fn(y, model(x, training=True))
            grads = tape.gradient(loss, model.trainable_weights)
            flat = np.fromfile(gpath, dtype=np.float32)
            at = 0
            for v, g in zip(model.trainable_weights, grads):
                g = g.numpy()
                mine = flat[at:at + g.size].reshape(g.shape)
                at += g.size
                e = rel(mine, g)
                ok = ok and e <= TOL
                worst = max(worst, e)
                if e > TOL:
                    line += f"; {v.path} gradient {e:.2e}"
            ok = ok and at == flat.size
            line += f"; worst of logits and {len(grads)} gradients {worst:.2e}"
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {line} (bound {TOL:g})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
