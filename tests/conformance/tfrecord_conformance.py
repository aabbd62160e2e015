"""TFRecord conformance: files of tf.train.Example records written by TensorFlow's own
tf.io.TFRecordWriter (no compression, GZIP, ZLIB), parsed by tf.io.parse_single_example and by
libdist (the tfrecord_conformance program: dist_dataset_from_tfrecord + dist_dataset_parse_example);
the printed values must be equal, bit for bit. Then damaged copies: TensorFlow's DataLossError
offset ("corrupted record at N" / "truncated record at N") must be the one libdist names.

Usage: tfrecord_conformance.py PROGRAM WORKDIR   (run by the venv's python)
"""
import os
import re
import struct
import subprocess
import sys

import tensorflow as tf

FEATURES = {
    "label": tf.io.FixedLenFeature([], tf.int64),
    "ids": tf.io.FixedLenFeature([3], tf.int64),
    "weight": tf.io.FixedLenFeature([], tf.float32),
    "name": tf.io.FixedLenFeature([], tf.string),
    "tokens": tf.io.VarLenFeature(tf.int64),
    "scores": tf.io.VarLenFeature(tf.float32),
    "extra": tf.io.FixedLenFeature([2], tf.float32, default_value=[1.5, -2.5]),
}


def int64s(v):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=v))


def floats(v):
    return tf.train.Feature(float_list=tf.train.FloatList(value=v))


def examples():
    out = []
    for i in range(12):
        f = {
            "label": int64s([i % 10]),
            "ids": int64s([i, -i * 1000003, (1 << 62) - i]),
            "weight": floats([(-1) ** i * 1.0 / (i + 3) * 10.0 ** (i - 6)]),
            "name": tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[bytes([i, 0, 255 - i]) + ("example-%d-é" % i).encode()])),
            "tokens": int64s(list(range(i % 5))),
            "scores": floats([0.1 * k - i for k in range(i % 4)]),
            "unused": floats([3.0] * i),  # a feature the spec does not ask for
        }
        if i % 3 == 0:
            f["extra"] = floats([i + 0.25, -i - 0.75])
        if i % 4 == 3:
            del f["tokens"]  # a VarLenFeature that is absent
        out.append(tf.train.Example(features=tf.train.Features(feature=f)).SerializeToString())
    # Protobuf merging, by hand: a second Features message giving "label" again (the last value
    # wins) and an unknown Example field (number 5, a varint) that the parsers must skip.
    label = tf.train.Features(feature={"label": int64s([77])}).SerializeToString()
    out.append(out[-1] + b"\x0a" + bytes([len(label)]) + label + b"\x28\x07")
    return out


def bits(values):
    return ",".join("%08x" % struct.unpack("<I", struct.pack("<f", float(v)))[0] for v in values)


def reference(records):
    lines = []
    for i, r in enumerate(records):
        p = tf.io.parse_single_example(r, FEATURES)
        lines.append("%d label=%d ids=%s weight=%s name=%s tokens=%s scores=%s extra=%s" % (
            i, int(p["label"].numpy()), ",".join(str(int(x)) for x in p["ids"].numpy()),
            bits([p["weight"].numpy()]), p["name"].numpy().hex(),
            ",".join(str(int(x)) for x in p["tokens"].values.numpy()),
            bits(p["scores"].values.numpy()), bits(p["extra"].numpy())))
    return lines


def run(program, path, comp, *extra):
    p = subprocess.run([program, path, comp, *extra], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout.splitlines(), p.stderr


def tf_error(path, comp):
    try:
        n = sum(1 for _ in tf.data.TFRecordDataset(path, compression_type=comp))
        return "no error (%d records)" % n
    except tf.errors.DataLossError as e:
        m = re.search(r"(corrupted|truncated) record at (\d+)", str(e))
        return "%s record at %s" % (m.group(1), m.group(2)) if m else str(e)


def main():
    program, work = sys.argv[1:3]
    os.makedirs(work, exist_ok=True)
    records = examples()
    want = reference(records)
    failures = 0
    for comp, flag in (("", "none"), ("GZIP", "gzip"), ("ZLIB", "zlib")):
        path = os.path.join(work, "examples.tfrecord" + ("." + flag if comp else ""))
        with tf.io.TFRecordWriter(path, options=tf.io.TFRecordOptions(compression_type=comp)) as w:
            for r in records:
                w.write(r)
        rc, got, err = run(program, path, flag)
        if rc != 0 or got != want:
            failures += 1
            print("FAIL %s: rc %d %s" % (flag, rc, err.strip()))
            for a, b in zip(want, got + [""] * len(want)):
                if a != b:
                    print("  TF     : %s\n  libdist: %s" % (a, b))
                    break
        else:
            print("ok %s: %d records equal" % (flag, len(got)))

    # Damage: the offsets TensorFlow's DataLossError names are the ones libdist names.
    clean = open(os.path.join(work, "examples.tfrecord"), "rb").read()
    first = 12 + len(records[0]) + 4  # the second record's offset
    cases = {
        "length bit": (first + 2, None),
        "length CRC bit": (first + 9, None),
        "data bit": (first + 12 + 5, None),
        "data CRC bit": (first + 12 + len(records[1]) + 1, None),
        "cut in data": (None, first + 12 + 3),
        "cut in data CRC": (None, first + 12 + len(records[1]) + 2),
    }
    for what, (flip, cut) in cases.items():
        b = bytearray(clean)
        if flip is not None:
            b[flip] ^= 0x04
        if cut is not None:
            b = b[:cut]
        path = os.path.join(work, "damaged.tfrecord")
        open(path, "wb").write(bytes(b))
        expect = tf_error(path, "")
        rc, got, err = run(program, path, "none", "--raw")
        m = re.search(r"(corrupted|truncated) record at (\d+)", "\n".join(got))
        mine = "%s record at %s" % (m.group(1), m.group(2)) if m else "\n".join(got[-1:]) + err
        same = m is not None and expect.split()[-1] == m.group(2)
        print("%s %s: TensorFlow '%s', libdist '%s'" % ("ok" if same else "FAIL", what, expect, mine))
        failures += not same
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
