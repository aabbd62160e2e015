"""TensorBoard conformance: an event file written by libdist (train_artifacts write DIR) read
back by the tensorboard package's EventAccumulator and by TensorFlow's own record reader
(tf.compat.v1.train.summary_iterator, which verifies every masked CRC-32C).

Usage: check_tensorboard_events.py TRAIN_ARTIFACTS_PROGRAM
Every scalar's tag, step and value must match what train_artifacts.c wrote, as float32.
"""
import glob
import os
import re
import struct
import subprocess
import sys
import tempfile


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


EXPECTED = {
    "epoch_loss": [(s, f32(1.5 - 0.25 * s)) for s in range(5)],
    "epoch_accuracy": [(s, f32(0.5 + 0.0625 * s)) for s in range(5)],
    "learning_rate": [(s, f32(f32(0.001) * (s + 1))) for s in range(5)],
}


def main():
    program = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        p = subprocess.run([program, "write", tmp], capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            print("FAIL: train_artifacts exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))
            return 1
        logdir = os.path.join(tmp, "logs")
        files = glob.glob(os.path.join(logdir, "events.out.tfevents.*"))
        if len(files) != 1 or not re.search(r"events\.out\.tfevents\.\d{10}\.[^/]+$", files[0]):
            print("FAIL: expected one events.out.tfevents.<10 digits>.<host> file, got %s" % files)
            return 1

        from tensorboard.backend.event_processing import event_accumulator
        acc = event_accumulator.EventAccumulator(logdir, size_guidance={"scalars": 0})
        acc.Reload()
        tags = sorted(acc.Tags()["scalars"])
        if tags != sorted(EXPECTED):
            failures.append("EventAccumulator scalar tags %s, expected %s" % (tags, sorted(EXPECTED)))
        for tag, want in EXPECTED.items():
            got = [(e.step, e.value) for e in acc.Scalars(tag)] if tag in tags else []
            if got != want:
                failures.append("EventAccumulator %s: %s, expected %s" % (tag, got, want))
            else:
                print("ok  EventAccumulator %-15s %s" % (tag, got))

        import tensorflow as tf
        events = list(tf.compat.v1.train.summary_iterator(files[0]))
        if events[0].file_version != "brain.Event:2":
            failures.append("first event file_version %r" % events[0].file_version)
        raw = {}
        for e in events[1:]:
            if len(e.summary.value) != 1:
                failures.append("event with %d values" % len(e.summary.value))
                continue
            v = e.summary.value[0]
            raw.setdefault(v.tag, []).append((e.step, v.simple_value))
            if not e.wall_time > 1.5e9:
                failures.append("wall_time %r is not a current time" % e.wall_time)
        if raw != EXPECTED:
            failures.append("summary_iterator read %s, expected %s" % (raw, EXPECTED))
        else:
            print("ok  summary_iterator: %d records, CRCs verified, file_version brain.Event:2"
                  % len(events))

    for f in failures:
        print("FAIL: " + f)
    print("%s: tensorboard conformance" % ("FAILED" if failures else "PASSED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
