"""TFRecord conformance on real data: TensorFlow writes the training digits of the embedded MNIST
subset (7,996) as 4 TFRecord shards, TensorFlow Datasets' naming, shards 0 and 2 GZIP and 1 and
3 uncompressed; each tf.train.Example holds the digit PNG-encoded (tf.io.encode_png) and raw
(784 bytes), its int64 label and one VarLenFeature ("strokes": the columns of row 14 above 128).

tf.data reads them (tf.io.decode_png, tf.io.decode_raw, the VarLenFeature's values) and libdist
reads them (the tfrecord_mnist_conformance program: dist_dataset_from_tfrecord with AUTO
compression, parse_example, decode_image, decode_raw), and every line must be equal, in order:
  - one file after the other, and num_parallel_reads 3 (TFRecordDataset's parallel interleave);
  - FILE auto-sharding for 2 workers and for 3 workers (4 files: worker 0 gets files 0 and 3),
    through tf.data's own auto-shard rewrite;
  - libdist decoding on 2 threads.

Usage: tfrecord_mnist_conformance.py PROGRAM MNIST_DIR WORKDIR   (run by the venv's python)
"""
import gzip
import os
import struct
import subprocess
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.data.experimental.ops import distribute as tf_distribute

FNV_OFFSET, FNV_PRIME = 14695981039346656037, 1099511628211


def fnv(data):
    h = FNV_OFFSET
    for b in data:
        h = ((h ^ b) * FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def idx_images(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n, rows, cols = struct.unpack(">IIII", data[:16])
    assert magic == 2051, "not an IDX images file: %s" % path
    return np.frombuffer(data, np.uint8, offset=16).reshape(n, rows, cols)


def idx_labels(path):
    with gzip.open(path, "rb") as f:
        data = f.read()
    magic, n = struct.unpack(">II", data[:8])
    assert magic == 2049, "not an IDX labels file: %s" % path
    return np.frombuffer(data, np.uint8, offset=8)


def write_shards(mnist_dir, work):
    images = idx_images(os.path.join(mnist_dir, "train-images-idx3-ubyte.gz"))
    labels = idx_labels(os.path.join(mnist_dir, "train-labels-idx1-ubyte.gz"))
    n = len(images)
    files, comps = [], []
    for shard in range(4):
        path = os.path.join(work, "mnist-train.tfrecord-%05d-of-00004" % shard)
        comp = "GZIP" if shard % 2 == 0 else ""
        with tf.io.TFRecordWriter(path, options=tf.io.TFRecordOptions(compression_type=comp)) as w:
            for i in range(shard * n // 4, (shard + 1) * n // 4):
                img = images[i]
                strokes = [int(c) for c in np.nonzero(img[14] > 128)[0]]
                feature = {
                    "image_png": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[tf.io.encode_png(img[:, :, None]).numpy()])),
                    "image_raw": tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[img.tobytes()])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(
                        value=[int(labels[i])])),
                    "strokes": tf.train.Feature(int64_list=tf.train.Int64List(value=strokes)),
                }
                w.write(tf.train.Example(features=tf.train.Features(
                    feature=feature)).SerializeToString())
        files.append(path)
        comps.append(comp)
    return files, comps


FEATURES = {
    "image_png": tf.io.FixedLenFeature([], tf.string),
    "image_raw": tf.io.FixedLenFeature([], tf.string),
    "label": tf.io.FixedLenFeature([], tf.int64),
    "strokes": tf.io.VarLenFeature(tf.int64),
}


def tf_lines(files, comps, reads, workers, index):
    names = tf.data.Dataset.from_tensor_slices((files, comps))
    if reads > 1:  # what TFRecordDataset(num_parallel_reads=N) builds
        ds = names.interleave(lambda f, c: tf.data.TFRecordDataset(f, compression_type=c),
                              cycle_length=reads, block_length=1, num_parallel_calls=reads,
                              deterministic=True)
    else:
        ds = names.flat_map(lambda f, c: tf.data.TFRecordDataset(f, compression_type=c))
    if workers > 1:  # tf.distribute's rewrite, with the FILE policy
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = \
            tf.data.experimental.AutoShardPolicy.FILE
        ds = tf_distribute._AutoShardDataset(ds.with_options(options), workers, index, 1)
    lines = []
    for record in ds:
        p = tf.io.parse_single_example(record, FEATURES)
        png = tf.io.decode_png(p["image_png"], channels=1).numpy().tobytes()
        raw = tf.io.decode_raw(p["image_raw"], tf.uint8).numpy().tobytes()
        lines.append("%d %s %s %s" % (int(p["label"]), fnv(png), fnv(raw), ",".join(
            str(int(v)) for v in p["strokes"].values.numpy())))
    return lines


def main():
    program, mnist_dir, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    files, comps = write_shards(mnist_dir, work)
    failures = 0
    cases = [(0, 1, 0, 1), (3, 1, 0, 1), (0, 2, 0, 1), (0, 2, 1, 1), (0, 3, 0, 2), (2, 3, 1, 1),
             (0, 3, 2, 1)]
    for reads, workers, index, threads in cases:
        want = tf_lines(files, comps, reads, workers, index)
        p = subprocess.run([program, work, str(reads), str(workers), str(index), str(threads)],
                           capture_output=True, text=True, timeout=300)
        got = p.stdout.splitlines()
        what = "reads %d, worker %d of %d, %d decode thread(s)" % (reads, index, workers, threads)
        if p.returncode != 0 or got != want:
            failures += 1
            print("FAIL %s: rc %d, %d lines vs TF's %d %s" % (what, p.returncode, len(got),
                                                                len(want), p.stderr.strip()))
            for k, (a, b) in enumerate(zip(want, got)):
                if a != b:
                    print("  example %d\n  TF     : %s\n  libdist: %s" % (k, a, b))
                    break
        else:
            print("ok %s: %d examples equal (labels, PNG and raw pixels, VarLenFeature)" %
                  (what, len(got)))
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
