"""distrain's weight histograms and batch scalars read back by TensorBoard's own readers, and the
histograms compared with tf.summary.histogram on the same weights.

Usage (with the venv's python): check_tensorboard_histograms.py DISTRAIN
Trains 2 epochs of 6 steps with --logdir --histogram-freq 1 --update-freq 4 --save-weights, then:
  - TensorBoard's EventAccumulator finds one tensor summary per variable per epoch in logdir/train,
    tagged "sequential/<variable>/histogram" (Keras 3's weight.path + "/histogram"), with plugin
    "histograms", at steps 0 and 1, and batch_loss / batch_accuracy at the global batch counts
    4, 8 and 12;
  - the last epoch's histograms equal, value for value (float64 edges and counts), the buckets
    tf.summary.histogram writes for the saved weights (read back from TensorFlow's own event
    file);
  - the epoch scalars are still there.
"""
import glob
import os
import subprocess
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from tensorboard.backend.event_processing import event_accumulator  # noqa: E402


def tf_histograms(weights, logdir):
    """What tf.summary.histogram writes for each weight, read back from its event file."""
    import tensorflow as tf
    writer = tf.summary.create_file_writer(logdir)
    with writer.as_default():
        for name, w in weights.items():
            tf.summary.histogram(name, tf.constant(w), step=1)
    writer.flush()
    writer.close()
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: tf.make_ndarray(acc.Tensors(tag)[0].tensor_proto) for tag in acc.Tags()["tensors"]}


def main():
    distrain = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        logdir = os.path.join(tmp, "logs")
        wpath = os.path.join(tmp, "w.safetensors")
        cmd = [distrain, "--quiet", "--epochs", "2", "--steps-per-epoch", "6", "--logdir", logdir,
               "--histogram-freq", "1", "--update-freq", "4", "--save-weights", wpath,
               "--threads", "1"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode != 0:
            print("FAIL: distrain exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))
            return 1
        weights = load_file(wpath)
        train = os.path.join(logdir, "train")
        if len(glob.glob(os.path.join(train, "events.out.tfevents.*"))) != 1:
            print("FAIL: expected one event file in %s" % train)
            return 1
        acc = event_accumulator.EventAccumulator(train, size_guidance={"tensors": 0, "scalars": 0})
        acc.Reload()
        want_tags = sorted("sequential/%s/histogram" % n for n in weights)
        got_tags = sorted(t for t in acc.Tags()["tensors"] if t.endswith("/histogram"))
        if got_tags != want_tags:
            failures.append("histogram tags %s, expected %s" % (got_tags, want_tags))
        import tensorflow as tf
        reference = tf_histograms(weights, os.path.join(tmp, "tf"))
        for name in sorted(weights):
            tag = "sequential/%s/histogram" % name
            if tag not in got_tags:
                continue
            events = acc.Tensors(tag)
            md = acc.SummaryMetadata(tag)
            if md.plugin_data.plugin_name != "histograms":
                failures.append("%s: plugin %r" % (tag, md.plugin_data.plugin_name))
            if [e.step for e in events] != [0, 1]:
                failures.append("%s: steps %s, expected [0, 1]" % (tag, [e.step for e in events]))
                continue
            ours = tf.make_ndarray(events[1].tensor_proto)
            ref = reference[name]
            if ours.dtype != np.float64 or ours.shape != (30, 3):
                failures.append("%s: %s %s, expected float64 (30, 3)" % (tag, ours.dtype, ours.shape))
            elif not np.array_equal(ours, ref):
                bad = np.argwhere(ours != ref)[:5].tolist()
                failures.append("%s: differs from tf.summary.histogram at %s: ours %s, TF's %s"
                                % (tag, bad, [ours[i][j] for i, j in bad], [ref[i][j] for i, j in bad]))
            elif ours[:, 2].sum() != weights[name].size:
                failures.append("%s: counts sum to %s, %d values" % (tag, ours[:, 2].sum(),
                                                                       weights[name].size))
            else:
                print("ok  %-40s 30 buckets, %5d values, equal to tf.summary.histogram's"
                      % (tag, weights[name].size))
        scalars = acc.Tags()["scalars"]
        for tag in ("batch_loss", "batch_accuracy"):
            steps = [e.step for e in acc.Scalars(tag)] if tag in scalars else []
            if steps != [4, 8, 12]:
                failures.append("%s at steps %s, expected [4, 8, 12]" % (tag, steps))
            else:
                print("ok  %-40s at steps %s" % (tag, steps))
        for tag in ("epoch_loss", "epoch_accuracy", "epoch_learning_rate"):
            steps = [e.step for e in acc.Scalars(tag)] if tag in scalars else []
            if steps != [0, 1]:
                failures.append("%s at steps %s, expected [0, 1]" % (tag, steps))
        # every record's CRCs through TensorFlow's own reader
        n = sum(1 for _ in tf.compat.v1.train.summary_iterator(
            glob.glob(os.path.join(train, "events.out.tfevents.*"))[0]))
        print("ok  summary_iterator read %d records" % n)

    for f in failures:
        print("FAIL: " + f)
    print("%s: tensorboard histogram conformance" % ("FAILED" if failures else "PASSED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
