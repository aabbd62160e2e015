"""EarlyStopping and ReduceLROnPlateau conformance: tf-keras's own callbacks (TF_USE_LEGACY_KERAS=1)
against libdist's (the callback_trace program), epoch by epoch, on the sequences of
callback_cases.json.

Usage (with the venv's python): callback_conformance.py CALLBACK_TRACE_PROGRAM CASES.json
Keras's callbacks are driven directly, as fit drives them, on a Dense(1) model: before epoch e
ends every weight is set to e + 1, so the weights left at the end say which epoch EarlyStopping
restored. Compared: stop_training after every epoch, stopped_epoch, best_epoch, the restored
weights (EarlyStopping); the learning rate after every epoch, as float32 (ReduceLROnPlateau).
"""
import json
import os
import subprocess
import sys

os.environ["TF_USE_LEGACY_KERAS"] = "1"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tf_keras  # noqa: E402


def dummy_model(lr):
    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(1,))])
    model.compile(optimizer=tf_keras.optimizers.SGD(learning_rate=lr), loss="mse")
    return model


def keras_es(case):
    kwargs = dict(monitor=case["monitor"], min_delta=case["min_delta"], patience=case["patience"],
                  mode=case["mode"], baseline=case["baseline"],
                  restore_best_weights=bool(case["restore"]),
                  start_from_epoch=case["start_from_epoch"])
    cb = tf_keras.callbacks.EarlyStopping(**kwargs)
    model = dummy_model(0.01)
    cb.set_model(model)
    model.stop_training = False
    cb.on_train_begin()
    epochs = []
    for e, v in enumerate(case["values"]):
        model.set_weights([np.full((1, 1), e + 1, np.float32), np.full((1,), e + 1, np.float32)])
        cb.on_epoch_end(e, {case["monitor"]: v})
        epochs.append([e, int(bool(model.stop_training))])
        if model.stop_training:
            break
    cb.on_train_end()
    w = float(model.get_weights()[0][0, 0])
    return {"epochs": epochs, "stopped_epoch": int(cb.stopped_epoch),
            "best_epoch": int(cb.best_epoch), "weight": w}


def keras_rlr(case):
    cb = tf_keras.callbacks.ReduceLROnPlateau(
        monitor=case["monitor"], factor=case["factor"], patience=case["patience"],
        mode=case["mode"], min_delta=case["min_delta"], cooldown=case["cooldown"],
        min_lr=case["min_lr"])
    model = dummy_model(case["lr"])
    cb.set_model(model)
    cb.on_train_begin()
    lrs = []
    for e, v in enumerate(case["values"]):
        cb.on_epoch_end(e, {case["monitor"]: v})
        lrs.append(float(np.float32(tf_keras.backend.get_value(model.optimizer.learning_rate))))
    return {"lr": lrs}


def ours(program, case):
    def num(v):
        return repr(float(v))

    if case["kind"] == "es":
        args = ["es", case["monitor"], num(case["min_delta"]), str(case["patience"]), case["mode"],
                "none" if case["baseline"] is None else num(case["baseline"]), str(case["restore"]),
                str(case["start_from_epoch"]), "0"]
    else:
        args = ["rlr", case["monitor"], num(case["factor"]), str(case["patience"]), case["mode"],
                num(case["min_delta"]), str(case["cooldown"]), num(case["min_lr"]), num(case["lr"])]
    args.append(",".join(repr(float(v)) for v in case["values"]))
    p = subprocess.run([program] + args, capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError("callback_trace exited %d: %s" % (p.returncode, p.stderr))
    lines = [l.split() for l in p.stdout.splitlines()]
    if case["kind"] == "es":
        last = lines[-1]
        return {"epochs": [[int(l[1]), int(l[3])] for l in lines[:-1]],
                "stopped_epoch": int(last[1]), "best_epoch": int(last[3]),
                "weight": float(last[5])}
    return {"lr": [float(np.float32(float(l[3]))) for l in lines]}


def main():
    program, cases_path = sys.argv[1:3]
    with open(cases_path) as f:
        cases = json.load(f)
    failures = 0
    for case in cases:
        k = keras_es(case) if case["kind"] == "es" else keras_rlr(case)
        o = ours(program, case)
        if k != o:
            failures += 1
            print("FAIL %s:\n  keras %s\n  ours  %s" % (case["name"], k, o))
        else:
            print("ok   %s: %s" % (case["name"], k))
    n_es = sum(c["kind"] == "es" for c in cases)
    print("%d EarlyStopping and %d ReduceLROnPlateau cases, %d failed"
          % (n_es, len(cases) - n_es, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
