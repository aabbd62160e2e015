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
  - the epoch scalars are still there;
  - Keras 3 itself (keras.callbacks.TensorBoard(histogram_freq=1, update_freq=3) on a model
    with the seed CNN's layer types, 2 epochs of 3 batches), next to distrain with the same
    epochs, batches and --update-freq 3, writes the same histogram tags, plugin, tensor dtype and
    shape, and the same batch_* tags at the same steps; and with validation data, the same
    validation tags (epoch_loss, epoch_accuracy) at the same steps.
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


KERAS_RUN = r"""
import sys, numpy as np, keras
x = np.random.RandomState(0).rand(48, 28, 28, 1).astype("float32")
y = np.random.RandomState(1).randint(0, 10, 48)
m = keras.Sequential([keras.Input((28, 28, 1)), keras.layers.Conv2D(2, 3, activation="relu"),
                      keras.layers.Conv2D(2, 3, activation="relu"), keras.layers.MaxPooling2D(),
                      keras.layers.Flatten(), keras.layers.Dense(4, activation="relu"),
                      keras.layers.Dense(10)])
m.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True),
          metrics=["accuracy"])
m.fit(x, y, batch_size=16, epochs=2, verbose=0, validation_data=(x[:16], y[:16]), callbacks=[
    keras.callbacks.TensorBoard(sys.argv[1], histogram_freq=1, update_freq=3, write_graph=False)])
"""


def summary_of(train_dir):
    """{tag: (plugin, [steps], dtype, shape)} of one writer's directory."""
    import tensorflow as tf
    acc = event_accumulator.EventAccumulator(train_dir, size_guidance={"tensors": 0, "scalars": 0})
    acc.Reload()
    out = {}
    for tag in acc.Tags()["tensors"]:
        events = acc.Tensors(tag)
        t = tf.make_ndarray(events[-1].tensor_proto)
        out[tag] = (acc.SummaryMetadata(tag).plugin_data.plugin_name, [e.step for e in events],
                    str(t.dtype), t.shape)
    for tag in acc.Tags()["scalars"]:  # our simple_value scalars
        out[tag] = ("scalars", [e.step for e in acc.Scalars(tag)], "float32", ())
    return out


def compare_with_keras(distrain, tmp, failures):
    kdir = os.path.join(tmp, "keras")
    p = subprocess.run([sys.executable, "-c", KERAS_RUN, kdir], capture_output=True, text=True,
                       timeout=300)
    if p.returncode != 0:
        failures.append("the Keras run failed: %s" % p.stderr[-2000:])
        return
    ddir = os.path.join(tmp, "distrain_k")
    p = subprocess.run([distrain, "--quiet", "--epochs", "2", "--steps-per-epoch", "3",
                        "--validation-split", "0.1", "--logdir", ddir, "--histogram-freq", "1", "--update-freq", "3",
                        "--threads", "1"], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        failures.append("distrain exited %d: %s" % (p.returncode, p.stderr))
        return
    keras_s = summary_of(os.path.join(kdir, "train"))
    ours = summary_of(os.path.join(ddir, "train"))
    for tag in sorted(set(keras_s) | set(ours)):
        if not (tag.endswith("/histogram") or tag.startswith("batch_")):
            continue
        k, o = keras_s.get(tag), ours.get(tag)
        if k is None or o is None:
            failures.append("tag %s: Keras %s, distrain %s" % (tag, k, o))
        elif tag.endswith("/histogram") and k != o:
            failures.append("%s: Keras %s, distrain %s" % (tag, k, o))
        elif tag.startswith("batch_") and k[1] != o[1]:
            failures.append("%s steps: Keras %s, distrain %s" % (tag, k[1], o[1]))
        else:
            print("ok  as Keras 3: %-36s %s steps %s" % (tag, o[0], o[1]))
    # the validation writer: the same tags at the same steps (epoch_loss and epoch_accuracy at
    # the epochs; Keras 3 writes its evaluation_*_vs_iterations only from evaluate(), not from
    # fit's validation, and neither does distrain)
    keras_v = summary_of(os.path.join(kdir, "validation"))
    ours_v = summary_of(os.path.join(ddir, "validation"))
    if sorted(keras_v) != sorted(ours_v) or not keras_v:
        failures.append("validation tags: Keras %s, distrain %s" % (sorted(keras_v), sorted(ours_v)))
    for tag in sorted(keras_v):
        k, o = keras_v.get(tag), ours_v.get(tag)
        if o is None or k[1] != o[1]:
            failures.append("validation/%s: Keras %s, distrain %s" % (tag, k, o))
        else:
            print("ok  as Keras 3: validation/%-25s steps %s" % (tag, o[1]))


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
        compare_with_keras(distrain, tmp, failures)

    for f in failures:
        print("FAIL: " + f)
    print("%s: tensorboard histogram conformance" % ("FAILED" if failures else "PASSED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
