"""distrain's training logs read by the tools users read them with: TensorBoard's EventAccumulator
on --logdir (logdir/train and logdir/validation), the csv module on --csv-log, and
safetensors.numpy on the --checkpoint-dir files.

Usage (with the venv's python): check_distrain_logs.py DISTRAIN
Runs 3 epochs of 10 steps with --validation-split 0.1 and --reduce-lr-patience 0 at a learning
rate of 1e-7, so small that val_loss improves by less than ReduceLROnPlateau's min_delta (1e-4)
and the rate is cut after epoch 1 (with the MNIST subset in its mixed order a useful rate
improves val_loss every epoch), then checks that every epoch scalar is in the event files at steps 0, 1, 2 with
the CSV's value (as float32), and that each epoch's checkpoint holds the weights and the Adam
slots with the right names and shapes and the update count of its epoch.
"""
import csv
import glob
import os
import struct
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from safetensors.numpy import load_file  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def scalars(logdir):
    files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
    if len(files) != 1:
        raise AssertionError("expected one event file in %s, got %s" % (logdir, files))
    acc = EventAccumulator(logdir)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def main():
    distrain = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        logdir, csv_path, ckdir = (os.path.join(tmp, n) for n in ("logs", "log.csv", "ckpt"))
        cmd = [distrain, "--quiet", "--epochs", "3", "--steps-per-epoch", "10",
               "--validation-split", "0.1", "--reduce-lr-patience", "0", "--learning-rate", "1e-7",
               "--logdir", logdir, "--csv-log", csv_path, "--checkpoint-dir", ckdir,
               "--strategy", "mirrored", "--devices", "cpu:0,cpu:1", "--threads", "1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            print("FAIL: distrain exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))
            return 1
        with open(csv_path, newline="") as f:
            rows = list(csv.DictReader(f))
        if [r["epoch"] for r in rows] != ["0", "1", "2"]:
            failures.append("CSV epochs %s" % [r["epoch"] for r in rows])
        want_cols = ["epoch", "accuracy", "learning_rate", "loss", "val_accuracy", "val_loss"]
        if rows and list(rows[0].keys()) != want_cols:
            failures.append("CSV columns %s, expected %s" % (list(rows[0].keys()), want_cols))
        train = scalars(os.path.join(logdir, "train"))
        val = scalars(os.path.join(logdir, "validation"))
        checks = [(train, "epoch_loss", "loss"), (train, "epoch_accuracy", "accuracy"),
                  (train, "epoch_learning_rate", "learning_rate"),
                  (val, "epoch_loss", "val_loss"), (val, "epoch_accuracy", "val_accuracy")]
        for events, tag, col in checks:
            want = [(i, f32(r[col])) for i, r in enumerate(rows)]
            got = events.get(tag)
            if got != want:
                failures.append("%s: events %s, CSV %s" % (tag, got, want))
        lrs = [float(r["learning_rate"]) for r in rows]
        if len(set(lrs)) < 2:
            failures.append("the learning rate never changed (%s): the test proves nothing" % lrs)
        if lrs[0] != f32(1e-7):
            failures.append("first learning rate %s, expected 1e-7" % lrs[0])
        # ReduceLROnPlateau's factor defaults to Keras's 0.1 (rounded to float32 as the
        # optimizer holds it)
        if lrs[-1] != f32(f32(1e-7) * 0.1):
            failures.append("reduced learning rate %s, expected 1e-7 x 0.1" % lrs[-1])
        for epoch in (1, 2, 3):
            path = os.path.join(ckdir, "ckpt-%02d.safetensors" % epoch)
            t = load_file(path)
            for name, shape in (("conv2d/kernel", (3, 3, 1, 32)), ("dense_1/bias", (10,)),
                                ("optimizer/m/conv2d/kernel", (3, 3, 1, 32)),
                                ("optimizer/v/dense_1/bias", (10,))):
                if name not in t or t[name].shape != shape:
                    failures.append("%s: %s is %s, expected %s" % (
                        path, name, t[name].shape if name in t else "missing", shape))
            if int(t["optimizer/iterations"]) != 10 * epoch:
                failures.append("%s: iterations %s, expected %d"
                                % (path, t["optimizer/iterations"], 10 * epoch))
            # saved after ReduceLROnPlateau: the rate the next epoch trains with
            if epoch < 3 and f32(t["optimizer/learning_rate"]) != f32(lrs[epoch]):
                failures.append("%s: learning rate %s, the next epoch's is %s"
                                % (path, t["optimizer/learning_rate"], lrs[epoch]))
    for f in failures:
        print("FAIL:", f)
    if not failures:
        print("ok: %d epochs of scalars in TensorBoard equal the CSV; checkpoints load" % len(rows))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
