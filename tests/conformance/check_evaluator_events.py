"""distrain --task evaluator's TensorBoard scalars read by TensorBoard's own EventAccumulator and
by TensorFlow's record reader (tf.compat.v1.train.summary_iterator, which checks every masked
CRC-32C), against what tests/cli/tfevents_scalars printed for the same file.

Usage: check_evaluator_events.py LOGDIR/validation SCALARS
SCALARS: "TAG STEP VALUE" lines (the distrain.evaluator.during case's dump). The run must hold
epoch_loss and epoch_accuracy at steps 0, 1, 2, equal to the dump as float32.
"""
import glob
import os
import struct
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def f32(x):
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def main():
    run, dump = sys.argv[1], sys.argv[2]
    want = {}
    with open(dump) as f:
        for line in f:
            tag, step, value = line.split()
            want.setdefault(tag, []).append((int(step), f32(value)))
    failures = []
    if sorted(want) != ["epoch_accuracy", "epoch_loss"] or any(
            [s for s, _ in v] != [0, 1, 2] for v in want.values()):
        failures.append("the dump holds %s" % want)

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(run, size_guidance={"scalars": 0})
    acc.Reload()
    got = {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}
    if got != want:
        failures.append("EventAccumulator: %s, expected %s" % (got, want))

    import tensorflow as tf
    files = glob.glob(os.path.join(run, "events.out.tfevents.*"))
    raw = {}
    for path in files:
        for e in tf.compat.v1.train.summary_iterator(path):
            for v in e.summary.value:
                raw.setdefault(v.tag, []).append((e.step, v.simple_value))
    if len(files) != 1 or raw != want:
        failures.append("summary_iterator over %s: %s, expected %s" % (files, raw, want))
    for msg in failures:
        print("FAIL:", msg)
    if not failures:
        print("ok: %s" % sorted(got.items()))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
