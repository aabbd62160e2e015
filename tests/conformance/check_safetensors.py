"""Safetensors conformance, both directions:
  - a checkpoint written by libdist (train_artifacts write DIR) read by safetensors.numpy.load_file
    and safe_open (metadata): names, dtypes, shapes, values; its "libdist.crc32c" checked here,
    independently of libdist, as the CRC-32C of the whole file with those 8 digits as zeros;
  - a file written by safetensors.numpy.save_file read by libdist (train_artifacts read FILE);
    and a truncated copy of it refused with a message naming the file.

Usage: check_safetensors.py TRAIN_ARTIFACTS_PROGRAM
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

EXPECTED = {
    "dense/kernel": np.array([[0.0, 0.5, 1.0], [1.5, 2.0, 2.5]], dtype=np.float32),
    "dense/bias": np.array([0.1, -0.2, 0.3], dtype=np.float32),
    "counts": np.array([[1, -2], [3, -4]], dtype=np.int32),
    "global_step": np.array(4000000000, dtype=np.int64),
}
EXPECTED_METADATA = {"epoch": "4", "learning_rate": "0.001",
                     "note": "quotes \" and \\ and \u00e9"}


def crc32c(data, crc=0):
    """CRC-32C (Castagnoli, reflected 0x82F63B78), bit by bit: slow, but only a few KB here."""
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def file_crc_ok(path, digits):
    raw = open(path, "rb").read()
    needle = b'"libdist.crc32c":"' + digits.encode()
    if raw.count(needle) != 1:
        return False
    at = raw.index(needle) + len(needle) - 8
    return "%08x" % crc32c(raw[:at] + b"00000000" + raw[at + 8:]) == digits


def check_ours_read_by_safetensors(program, tmp, failures):
    p = subprocess.run([program, "write", tmp], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        failures.append("train_artifacts write exited %d: %s %s" % (p.returncode, p.stdout, p.stderr))
        return
    path = os.path.join(tmp, "ckpt.safetensors")
    got = load_file(path)
    if sorted(got) != sorted(EXPECTED):
        failures.append("load_file names %s, expected %s" % (sorted(got), sorted(EXPECTED)))
    for name, want in EXPECTED.items():
        have = got.get(name)
        if have is None or have.dtype != want.dtype or have.shape != want.shape \
                or not np.array_equal(have, want):
            failures.append("load_file %s = %r, expected %r" % (name, have, want))
        else:
            print("ok  load_file %-13s %s %s" % (name, have.dtype, have.shape))
    with safe_open(path, framework="np") as f:
        meta = f.metadata()
    crc = meta.pop("libdist.crc32c", None)
    writer = meta.pop("libdist.writer", None)
    if meta != EXPECTED_METADATA:
        failures.append("metadata %s, expected %s" % (meta, EXPECTED_METADATA))
    elif writer != "libdist":
        failures.append("metadata libdist.writer is %r, expected 'libdist'" % writer)
    elif crc is None or len(crc) != 8 or not file_crc_ok(path, crc):
        failures.append("libdist.crc32c %r is not the CRC-32C of the file" % crc)
    else:
        print("ok  metadata %s + libdist.writer, libdist.crc32c=%s (verified)" % (meta, crc))


def check_theirs_read_by_libdist(program, tmp, failures):
    tensors = {
        "conv/kernel": np.arange(24, dtype=np.float32).reshape(2, 3, 1, 4) / 8,
        "ids": np.array([7, -8, 9], dtype=np.int64),
        "mask": np.array([[1, 0, 1]], dtype=np.int32),
        "scalar": np.array(0.25, dtype=np.float32),
    }
    meta = {"epoch": "12", "source": "safetensors.numpy"}
    path = os.path.join(tmp, "theirs.safetensors")
    save_file(tensors, path, metadata=meta)
    p = subprocess.run([program, "read", path], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        failures.append("libdist refused safetensors' own file: %s %s" % (p.stdout, p.stderr))
        return
    got = json.loads(p.stdout)
    names = {"float32": np.float32, "int32": np.int32, "int64": np.int64}
    if got["metadata"] != meta:
        failures.append("libdist read metadata %s, expected %s" % (got["metadata"], meta))
    for name, want in tensors.items():
        t = got["tensors"].get(name)
        ok = t is not None and names.get(t["dtype"]) == want.dtype.type \
            and tuple(t["shape"]) == want.shape \
            and np.array_equal(np.array(t["values"], dtype=want.dtype), want.reshape(-1))
        if not ok:
            failures.append("libdist read %s as %s, expected %s %s %s"
                            % (name, t, want.dtype, want.shape, want.reshape(-1).tolist()))
        else:
            print("ok  libdist read %-11s %s %s" % (name, t["dtype"], tuple(t["shape"])))

    with open(path, "rb") as f:
        data = f.read()
    cut = os.path.join(tmp, "cut.safetensors")
    with open(cut, "wb") as f:
        f.write(data[:-3])
    p = subprocess.run([program, "read", cut], capture_output=True, text=True, timeout=60)
    if p.returncode != 2 or cut not in p.stdout:
        failures.append("truncated file: exit %d, %r" % (p.returncode, p.stdout))
    else:
        print("ok  truncated file refused: " + p.stdout.strip())


def main():
    program = sys.argv[1]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        check_ours_read_by_safetensors(program, tmp, failures)
        check_theirs_read_by_libdist(program, tmp, failures)
    for f in failures:
        print("FAIL: " + f)
    print("%s: safetensors conformance" % ("FAILED" if failures else "PASSED"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
