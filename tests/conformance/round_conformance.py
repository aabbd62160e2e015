"""Rounding conformance: TensorFlow's own tf.cast to float16 / bfloat16 and back against
libdist's dist_op_cast (the round_cast program), bit for bit.

Usage: round_conformance.py ROUND_CAST_PROGRAM WORKDIR   (run by the venv's python)
Values: the edge cases (float16's largest finite, its overflow threshold 65520, its smallest
subnormal and the ties around it, ties to even in both formats, float32's largest finite,
signed zeros, infinities, NaN) and 400,000 random ones (random bit patterns, and uniform
exponents over float16's range). float32 subnormals are left out: TensorFlow flushes them to
zero on its CPU threads, libdist rounds their bits.
"""
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf


def edge_cases():
    ulp16, ulp_bf = 2.0 ** -10, 2.0 ** -7
    v = [0.0, -0.0, 1.0, -1.0, 1 + ulp16 / 2, 1 + 3 * ulp16 / 2, 1 + ulp16 / 2 + 2 ** -20,
         1 + ulp_bf / 2, 1 + 3 * ulp_bf / 2, 65504.0, 65519.0, 65520.0, -65520.0, 65536.0,
         1e6, 2.0 ** -24, 2.0 ** -25, 1.5 * 2.0 ** -24, 2.0 ** -26, 2.0 ** -14, 0.1, 1 / 3,
         np.pi, 3.3895313892515355e38, 3.3961e38, float(np.finfo(np.float32).max),
         float("inf"), float("-inf"), 1e-30, -7.25e-20, 2.0 ** -126]
    return np.array(v, dtype=np.float32)


def random_values(rng):
    bits = rng.integers(0, 2 ** 32, size=200000, dtype=np.uint64).astype(np.uint32)
    a = bits.view(np.float32)
    e = rng.uniform(-26, 16.5, size=200000)
    b = (np.sign(rng.uniform(-1, 1, size=200000)) * 2.0 ** e).astype(np.float32)
    x = np.concatenate([a, b])
    finite = np.isfinite(x)
    sub = finite & (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
    return x[~sub]


def main():
    program, work = sys.argv[1:3]
    os.makedirs(work, exist_ok=True)
    x = np.concatenate([edge_cases(), random_values(np.random.default_rng(20261202))])
    x = np.ascontiguousarray(x.astype("<f4"))
    src = os.path.join(work, "round_in.f32")
    x.tofile(src)
    failures = 0
    for name, dtype in (("float16", tf.float16), ("bfloat16", tf.bfloat16)):
        out = os.path.join(work, "round_%s.f32" % name)
        p = subprocess.run([program, name, src, out], capture_output=True, text=True,
                           timeout=300)
        if p.returncode != 0:
            print("FAIL: round_cast %s exited %d: %s" % (name, p.returncode, p.stderr))
            return 1
        ours = np.fromfile(out, dtype="<f4")
        ref = tf.cast(tf.cast(tf.constant(x), dtype), tf.float32).numpy()
        nan = np.isnan(ref)
        same = (ours.view(np.uint32) == ref.view(np.uint32)) | (nan & np.isnan(ours))
        bad = np.flatnonzero(~same)
        print("%s: %d values, %d differ from tf.cast" % (name, x.size, bad.size))
        for i in bad[:10]:
            print("  %r (0x%08x): libdist %r, TensorFlow %r"
                  % (float(x[i]), int(x.view(np.uint32)[i]), float(ours[i]), float(ref[i])))
        failures += bad.size
    print("PASS" if failures == 0 else "FAIL")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
