"""distrain's .keras model files, opened by Keras 3 itself (keras 3.15, the conformance venv).

1. A model trained by distrain (mirrored on 2 CPU replicas, 2 epochs) and written with
   --save-model final.keras (and --save-weights final.weights.h5 in the same run) loads with
   keras.models.load_model, and its predictions on the test set equal libdist's: the class
   probabilities (softmax of the logits, what `distrain predict` prints) within 1e-5, the
   logits within 1e-4. libdist's come from the keras_models driver (the seed CNN from the JSON
   Keras itself writes for it, not from the archive, whose config is under test; the weights
   from distrain's final.weights.h5; dist_predict on 2 replicas). The archive's weights equal final.weights.h5's, value for value. The logits'
   bound is looser because both sides round in float32: after 60 training steps each is about
   5e-6 to 8e-6 away from a float64 evaluation of the same weights (measured on a 2-core
   Xeon; Keras vs libdist 9.1e-6), an error that grows with the weights as training goes on.
2. save-best-only keeps the epoch the monitor chose: distrain trains 3 epochs with
   --checkpoint-best-only --checkpoint-mode max (monitor val_loss, which falls as the model
   learns, so every epoch after the first is worse under max) writing --checkpoint-dir and
   --save-model best.keras, and --save-weights last.weights.h5 (the last epoch's weights). The
   checkpoints written must be exactly the epochs whose val_loss (from --csv-log) beat every
   earlier one under max, at least one later epoch must be worse and absent, best.keras must
   hold the chosen epoch's weights (equal to its ckpt-EE.safetensors) and not the last epoch's,
   and Keras's predictions from best.keras must equal libdist's for those weights, as in 1.

The test set is the embedded MNIST subset's t10k file (2,004 images), scaled to [0, 1] as
distrain scales it.

Usage: keras_model_file.py DISTRAIN DRIVER WORKDIR T10K_IMAGES.gz
"""
import csv
import gzip
import io
import os
import shutil
import subprocess
import sys
import zipfile

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import h5py  # noqa: E402
import numpy as np  # noqa: E402
import keras  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

TOL = 1e-5  # on the predicted class probabilities
LOGIT_TOL = 1e-4
QUICK = ["--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--threads", "1",
         "--steps-per-epoch", "30", "--validation-split", "0.1", "--quiet"]


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{os.path.basename(args[0])} failed ({r.returncode}): {' '.join(args[1:])}\n"
                 f"{r.stdout}\n{r.stderr}")
    return r.stdout


def test_images(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    n, rows, cols = (int.from_bytes(raw[i:i + 4], "big") for i in (4, 8, 12))
    pixels = np.frombuffer(raw, dtype=np.uint8, offset=16).reshape(n, rows, cols, 1)
    return (pixels.astype(np.float32) * np.float32(1.0 / 255.0)).astype(np.float32)


def h5_bytes_weights(data):
    """A Keras 3 weights file's variables: {'conv2d/0': array, ...}."""
    out = {}
    with h5py.File(io.BytesIO(data), "r") as f:
        for key, group in f["layers"].items():
            for i, ds in group["vars"].items():
                out[f"{key}/{i}"] = ds[()]
    return out


def archive_weights(path):
    """A .keras archive's variables and its config.json, after checking its entries."""
    with zipfile.ZipFile(path) as z:
        assert z.namelist() == ["metadata.json", "config.json", "model.weights.h5"], z.namelist()
        return h5_bytes_weights(z.read("model.weights.h5")), z.read("config.json").decode()


def h5_weights(path):
    with open(path, "rb") as f:
        return h5_bytes_weights(f.read())


def same_weights(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


# libdist's variable names for the seed CNN's Keras keys (the checkpoint holds the former)
KEYS = {"conv2d/0": "conv2d/kernel", "conv2d/1": "conv2d/bias",
        "conv2d_1/0": "conv2d_1/kernel", "conv2d_1/1": "conv2d_1/bias",
        "dense/0": "dense/kernel", "dense/1": "dense/bias",
        "dense_1/0": "dense_1/kernel", "dense_1/1": "dense_1/bias"}


def seed_cnn_json():
    """The seed CNN, distrain's model, as Keras itself describes it: libdist's side of the
    comparison must not read the config.json under test."""
    return keras.Sequential([
        keras.Input((28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Conv2D(64, 3, activation="relu"),
        keras.layers.MaxPooling2D(2),
        keras.layers.Flatten(),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(10),
    ]).to_json()


def libdist_logits(driver, work, tag, weights_path, inputs_path, n):
    json_path = os.path.join(work, f"{tag}.seed_cnn.json")
    with open(json_path, "w") as f:
        f.write(seed_cnn_json())
    out = os.path.join(work, f"{tag}.libdist_logits.f32")
    run(driver, json_path, weights_path, "0", inputs_path, str(n), out)
    return np.fromfile(out, dtype=np.float32).reshape(n, -1)


def softmax(z):
    z = z.astype(np.float64)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def compare(theirs, want):
    """(max |diff| of the class probabilities, of the logits, whether both are in bounds)."""
    dp = float(np.max(np.abs(softmax(theirs) - softmax(want))))
    dl = float(np.max(np.abs(theirs - want)))
    return dp, dl, dp <= TOL and dl <= LOGIT_TOL


def keras_logits(path, x):
    model = keras.models.load_model(path)
    return model.predict(x, batch_size=64, verbose=0)


def main():
    distrain, driver, work, t10k = sys.argv[1:5]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    x = test_images(t10k)
    n = x.shape[0]
    inputs_path = os.path.join(work, "test_images.f32")
    x.tofile(inputs_path)
    failures = 0

    # 1. the trained model
    final = os.path.join(work, "final.keras")
    final_w = os.path.join(work, "final.weights.h5")
    run(distrain, *QUICK, "--epochs", "2", "--save-model", final, "--save-weights", final_w)
    got_w, _ = archive_weights(final)
    same = same_weights(got_w, h5_weights(final_w))
    want = libdist_logits(driver, work, "final", final_w, inputs_path, n)
    dp, dl, close = compare(keras_logits(final, x), want)
    ok = same and close
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} trained model: Keras's load_model predicts libdist's "
          f"class probabilities on {n} test images within {dp:.2e} (bound {TOL:g}), logits "
          f"within {dl:.2e} (bound {LOGIT_TOL:g}); archive weights = --save-weights: {same}")

    # 2. save-best-only under mode max
    ck = os.path.join(work, "ck")
    best = os.path.join(work, "best.keras")
    last_w = os.path.join(work, "last.weights.h5")
    log = os.path.join(work, "log.csv")
    run(distrain, *QUICK, "--epochs", "3", "--checkpoint-dir", ck, "--checkpoint-best-only",
        "--checkpoint-mode", "max", "--save-model", best, "--save-weights", last_w,
        "--csv-log", log)
    with open(log) as f:
        val_loss = [float(row["val_loss"]) for row in csv.DictReader(f)]
    improving, best_so_far = [], -float("inf")
    for e, v in enumerate(val_loss, start=1):
        if v > best_so_far:
            improving.append(e)
            best_so_far = v
    written = sorted(int(name[5:7]) for name in os.listdir(ck) if name.startswith("ckpt-"))
    chosen = improving[-1]
    worse_later = [e for e in range(chosen + 1, len(val_loss) + 1) if e not in improving]
    ckpt = load_file(os.path.join(ck, f"ckpt-{chosen:02d}.safetensors"))
    got_w, _ = archive_weights(best)
    holds_chosen = all(np.array_equal(got_w[k], ckpt[v]) for k, v in KEYS.items())
    holds_last = same_weights(got_w, h5_weights(last_w))
    best_w = os.path.join(work, "best.weights.h5")
    with zipfile.ZipFile(best) as z, open(best_w, "wb") as f:
        f.write(z.read("model.weights.h5"))
    want = libdist_logits(driver, work, "best", best_w, inputs_path, n)
    dp, dl, close = compare(keras_logits(best, x), want)
    ok = written == improving and worse_later and holds_chosen and not holds_last and close
    failures += not ok
    print(f"{'ok  ' if ok else 'FAIL'} save-best-only, mode max on val_loss {val_loss}: "
          f"checkpoints {written} (improving epochs {improving}), worse later epochs "
          f"{worse_later} not saved; best.keras holds epoch {chosen}'s weights: {holds_chosen}, "
          f"the last epoch's: {holds_last}; Keras predicts libdist's probabilities within "
          f"{dp:.2e}, logits within {dl:.2e}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
