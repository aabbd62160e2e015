"""tf.data reading bench_data's TFRecord shards: the reference of bench_data's TFRecord rows.

Pipeline, as bench_data builds it in libdist:
    TFRecordDataset(files, compression_type, num_parallel_reads)
    -> map(parse_single_example + decode_png(channels=1) | decode_raw + reshape [28,28,1],
           num_parallel_calls)
    -> batch(64)
A pass is one full iteration, counted by Dataset.reduce inside a tf.function (the loop runs in
TensorFlow's C++, no Python per batch). tf.config.threading's intra- and inter-op thread counts and
the dataset's threading.private_threadpool_size are all --threads. Each configuration runs one
untimed warm-up pass (tracing, file cache) the first time it is asked for.

A configuration is "VARIANT COMPRESSION READS CALLS [MODE]": png|raw, none|gzip,
num_parallel_reads (1: one file after the other), num_parallel_calls (>= 1), and MODE "record"
(the default: the map above, one record at a time) or "batch" (raw only: batch(64) first, then
one map of parse_example + decode_raw over the batch, the vectorized form TensorFlow's
performance guide recommends). Files: DIR/mnist-VARIANT[-gzip].tfrecord-*.

    tf_data_tfrecord.py --dir DIR --threads T --serve
        prints "READY" once TensorFlow is imported, then reads configurations from stdin, one a
        line, runs one timed pass of each and answers "RESULT images=N wall_s=S cpu_s=C" (cpu_s:
        the process's CPU time during the pass) or "ERROR why" (and exits);
        bench_data drives it so that its passes and TensorFlow's alternate.
    tf_data_tfrecord.py --dir DIR --threads T --config png,none,1,1 [--passes 5]
        runs the passes itself and prints each, then the median in images/s.
"""

import argparse
import glob
import os
import statistics
import sys
import time


def parse_config(text, sep):
    parts = text.strip().split(sep)
    if len(parts) == 4:
        parts.append("record")
    if len(parts) != 5:
        raise ValueError(
            f"configuration {text.strip()!r}: want VARIANT COMPRESSION READS CALLS [MODE]"
        )
    variant, compression, reads, calls, mode = parts
    if mode not in ("record", "batch") or (mode == "batch" and variant != "raw"):
        raise ValueError(f"mode {mode!r}: want record, or batch with raw")
    if variant not in ("png", "raw"):
        raise ValueError(f"variant {variant!r}: want png or raw")
    if compression not in ("none", "gzip"):
        raise ValueError(f"compression {compression!r}: want none or gzip")
    reads, calls = int(reads), int(calls)
    if reads < 1 or calls < 1:
        raise ValueError(f"reads {reads}, calls {calls}: want >= 1")
    return variant, compression, reads, calls, mode


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="the directory of the shards")
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--serve", action="store_true")
    ap.add_argument("--config", help="VARIANT,COMPRESSION,READS,CALLS[,MODE]")
    ap.add_argument("--passes", type=int, default=5)
    a = ap.parse_args()
    if a.threads < 1:
        ap.error("--threads must be >= 1")
    if a.serve == bool(a.config):
        ap.error("give exactly one of --serve and --config")
    if a.passes < 1:
        ap.error("--passes must be >= 1")
    try:
        single = parse_config(a.config, ",") if a.config else None
    except ValueError as e:
        ap.error(str(e))

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    tf.get_logger().setLevel("ERROR")  # one tf.function per configuration: no retracing news
    tf.config.threading.set_intra_op_parallelism_threads(a.threads)
    tf.config.threading.set_inter_op_parallelism_threads(a.threads)
    options = tf.data.Options()
    options.threading.private_threadpool_size = a.threads

    def build(variant, compression, reads, calls, mode):
        name = f"mnist-{variant}" + ("-gzip" if compression == "gzip" else "")
        files = sorted(glob.glob(os.path.join(a.dir, name + ".tfrecord-*")))
        if not files:
            raise FileNotFoundError(f"no {name}.tfrecord-* in {a.dir}")
        ds = tf.data.TFRecordDataset(
            files,
            compression_type="GZIP" if compression == "gzip" else "",
            num_parallel_reads=reads if reads > 1 else None,
        )
        key = "image" if variant == "png" else "image_raw"
        spec = {
            key: tf.io.FixedLenFeature([], tf.string),
            "label": tf.io.FixedLenFeature([], tf.int64),
        }

        def parse_png(record):
            ex = tf.io.parse_single_example(record, spec)
            return tf.io.decode_png(ex[key], channels=1), ex["label"]

        def parse_raw(record):
            ex = tf.io.parse_single_example(record, spec)
            return tf.reshape(tf.io.decode_raw(ex[key], tf.uint8), [28, 28, 1]), ex["label"]

        def parse_raw_batch(records):
            ex = tf.io.parse_example(records, spec)
            return tf.reshape(tf.io.decode_raw(ex[key], tf.uint8), [-1, 28, 28, 1]), ex["label"]

        if mode == "batch":
            ds = ds.batch(64).map(parse_raw_batch, num_parallel_calls=calls)
        else:
            ds = ds.map(parse_png if variant == "png" else parse_raw, num_parallel_calls=calls)
            ds = ds.batch(64)
        ds = ds.with_options(options)

        @tf.function
        def one_pass():
            return ds.reduce(
                tf.constant(0, tf.int64), lambda n, b: n + tf.cast(tf.shape(b[0])[0], tf.int64)
            )

        one_pass()  # warm-up: tracing, the files in the page cache
        return one_pass

    built = {}

    def timed(config):
        if config not in built:
            built[config] = build(*config)
        c0, t0 = time.process_time(), time.perf_counter()
        images = int(built[config]())
        if built[config].experimental_get_tracing_count() != 1:
            raise RuntimeError(f"{config}: the pass was traced again, its time is not the pipeline's")
        return images, time.perf_counter() - t0, time.process_time() - c0

    if single:
        rates = []
        for p in range(a.passes):
            images, wall, cpu = timed(single)
            rates.append(images / wall)
            print(f"pass {p + 1}: {images} images in {wall:.4f} s ({images / wall:,.0f} images/s, "
                  f"{1e6 * cpu / images:.1f} us CPU/image)")
        print(f"median: {statistics.median(rates):,.0f} images/s")
        return 0

    print("READY", flush=True)  # TensorFlow imported: bench_data's timing may start
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            config = parse_config(line, None)
            images, wall, cpu = timed(config)
        except (ValueError, OSError, RuntimeError, tf.errors.OpError) as e:
            print(f"ERROR {e}".replace("\n", " "), flush=True)
            return 1
        print(f"RESULT images={images} wall_s={wall:.6f} cpu_s={cpu:.6f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
