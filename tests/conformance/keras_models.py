"""Keras models in and out, against Keras 3 itself.

Two models are made by Keras 3 (keras 3.15, the conformance venv) from fixed seeds: the seed CNN
as a Sequential, and a linear Functional model with other layer names, a padding='same'
strided Conv2D and a linear Dense. For each:

  1. Keras -> libdist: Keras writes model.to_json() and model.save_weights('k.weights.h5');
     libdist's driver builds the model from the JSON, loads the weights and predicts 37 inputs
     (mirrored on 2 CPU replicas, global batches of 8: the last batch partial). Its logits must
     equal Keras's model.predict within 1e-5 (absolute).
  2. libdist -> Keras: the driver builds the model from the same JSON with weights from its own
     seed and writes them with dist_model_save_keras_weights; Keras loads them with
     model.load_weights into keras.models.model_from_json(json) and predicts the same inputs;
     the logits must equal libdist's within 1e-5.

The inputs are uniform in [0, 1) (MNIST's normalized range); the weights are Keras's and
libdist's Glorot-uniform initial values. Measured worst differences are printed per case
(on the AVX2 EPYC: 1.6e-7 and 1.5e-7 for the CNN, 1.3e-7 and 4.8e-7 for the Functional model).

Usage: keras_models.py DRIVER WORKDIR
"""
import json
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402

N = 37
TOL = 1e-5


def seed_cnn():
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ])


def functional():
    x = keras.Input((28, 28, 1), name="pixels")
    h = keras.layers.Conv2D(8, (5, 3), strides=2, padding="same", activation="relu",
                            name="stem")(x)
    h = keras.layers.MaxPooling2D(2, name="pool")(h)
    h = keras.layers.Conv2D(16, 3, name="mix")(h)
    h = keras.layers.Flatten(name="flat")(h)
    y = keras.layers.Dense(10, activation="linear", name="logits")(h)
    return keras.Model(x, y, name="functional_net")


def run(driver, *args):
    r = subprocess.run([driver, *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"driver failed ({r.returncode}): {' '.join(args)}\n{r.stderr}")


def main():
    driver, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(1234)
    inputs = rng.random((N, 28, 28, 1), dtype=np.float32)
    in_path = os.path.join(work, "inputs.f32")
    inputs.tofile(in_path)
    failures = 0
    for name, make in (("sequential_cnn", seed_cnn), ("functional_chain", functional)):
        keras.utils.set_random_seed(7)
        model = make()
        json_path = os.path.join(work, f"{name}.json")
        with open(json_path, "w") as f:
            f.write(model.to_json())
        # 1. Keras -> libdist
        kw = os.path.join(work, f"{name}.keras.weights.h5")
        model.save_weights(kw)
        want = model.predict(inputs, batch_size=8, verbose=0)
        out = os.path.join(work, f"{name}.libdist_logits.f32")
        run(driver, json_path, kw, "0", in_path, str(N), out)
        got = np.fromfile(out, dtype=np.float32).reshape(want.shape)
        d1 = float(np.max(np.abs(got - want)))
        # 2. libdist -> Keras
        lw = os.path.join(work, f"{name}.libdist.weights.h5")
        out2 = os.path.join(work, f"{name}.libdist_own_logits.f32")
        run(driver, json_path, "-", "99", in_path, str(N), out2, lw)
        ours = np.fromfile(out2, dtype=np.float32).reshape(want.shape)
        with open(json_path) as f:
            back = keras.models.model_from_json(f.read())
        back.load_weights(lw)
        theirs = back.predict(inputs, batch_size=8, verbose=0)
        d2 = float(np.max(np.abs(ours - theirs)))
        # libdist's own weights differ from Keras's (another generator): the comparison is real
        assert float(np.max(np.abs(ours - want))) > 1e-3
        ok = d1 <= TOL and d2 <= TOL
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name}: keras->libdist max |diff| {d1:.2e}, "
              f"libdist->keras max |diff| {d2:.2e} (bound {TOL:g}, {N} rows x "
              f"{want.shape[1]})")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
