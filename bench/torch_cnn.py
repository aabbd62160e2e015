#!/usr/bin/python3
"""PyTorch reference for libdist's training speed: the same MNIST CNN, trained on the CPU.

Model (as in DESIGN.md / the seed): Conv2d(1,32,3)+ReLU -> MaxPool2 -> Conv2d(32,64,3)+ReLU ->
MaxPool2 -> Flatten -> Linear(1600,64)+ReLU -> Linear(64,10); CrossEntropy; Adam(lr 1e-3,
eps 1e-7); batch 64; data: the MNIST subset in src/data/mnist_subset (IDX gzip), read with the
standard library and torch.frombuffer (no numpy).

Runs `--warmup` steps, then times `--steps` steps `--repeats` times and prints one JSON line:
  {"threads": N, "images_per_sec_median": ..., "runs": [...], "blas": {...}, ...}
Progress and the BLAS in use go to stderr.

Meant for Debian 12's python3-torch (1.13) at /usr/bin/python3, whose dense layers call the
system libblas.so.3: install libopenblas0-openmp (tools/setup-deps.sh --bench), or the default
reference BLAS makes them ~13x slower. The script reports which one it got.

  /usr/bin/python3 bench/torch_cnn.py --threads 1
  /usr/bin/python3 bench/torch_cnn.py --threads 2 --steps 300 --repeats 5
"""

import argparse
import gzip
import json
import os
import statistics
import struct
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "src", "data", "mnist_subset")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads(N) (default 1)")
    p.add_argument("--steps", type=int, default=300, help="timed steps per repeat (default 300)")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats (default 5)")
    p.add_argument("--warmup", type=int, default=20, help="untimed steps first (default 20)")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--data-dir", default=DEFAULT_DATA,
                   help="folder with train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flush-denormal", action="store_true",
                   help="torch.set_flush_denormal(True), as TensorFlow's CPU threads do (FTZ/DAZ)")
    args = p.parse_args()
    if args.threads < 1 or args.steps < 1 or args.repeats < 1 or args.warmup < 0:
        p.error("--threads, --steps and --repeats must be >= 1, --warmup >= 0")
    return args


def read_idx(path, torch):
    """An IDX file (raw or .gz) as a uint8 tensor of its shape."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4:
        raise ValueError(f"{path}: truncated IDX header")
    zero, dtype, ndim = struct.unpack_from(">HBB", data, 0)
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack_from(f">{ndim}I", data, 4)
    offset = 4 + 4 * ndim
    count = 1
    for d in dims:
        count *= d
    if len(data) - offset != count:
        raise ValueError(f"{path}: {len(data) - offset} data bytes, header says {count}")
    return torch.frombuffer(bytearray(data), dtype=torch.uint8, offset=offset).reshape(dims)


def blas_in_use(torch):
    """The BLAS library mapped into this process, and a dense-layer-sized SGEMM rate."""
    library = "unknown"
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
        blas = sorted(p for p in paths if "blas" in os.path.basename(p).lower())
        if blas:
            library = ", ".join(os.path.realpath(p) for p in blas)
    except OSError:
        pass
    # The first dense layer's forward at batch 64: [64,1600] x [1600,64], 2*64*1600*64 flops.
    a, b = torch.randn(64, 1600), torch.randn(1600, 64)
    for _ in range(20):
        a @ b
    n = 200
    t0 = time.perf_counter()
    for _ in range(n):
        a @ b
    seconds = time.perf_counter() - t0
    gflops = 2 * 64 * 1600 * 64 * n / seconds / 1e9
    if "openblas" in library:
        kind = "openblas"
    elif "/blas/" in library or library.endswith("libblas.so.3"):
        kind = "reference"
    else:
        kind = "other"
    return {"library": library, "kind": kind, "dense_sgemm_gflops": round(gflops, 1)}


def make_cnn(torch):
    """The seed CNN, its loss and Keras's Adam (eps 1e-7): (model, loss_fn, optimizer)."""
    from torch import nn
    model = nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(1600, 64), nn.ReLU(), nn.Linear(64, 10))
    loss_fn = nn.CrossEntropyLoss()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-7)
    return model, loss_fn, opt


def main():
    args = parse_args()
    # Before torch loads: OpenBLAS (OpenMP build) and libgomp read these at start-up.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        print("warning: this CPU cannot flush denormals", file=sys.stderr)
    torch.manual_seed(args.seed)

    images = read_idx(os.path.join(args.data_dir, "train-images-idx3-ubyte.gz"), torch)
    labels = read_idx(os.path.join(args.data_dir, "train-labels-idx1-ubyte.gz"), torch)
    if images.dim() != 3 or labels.dim() != 1 or images.shape[0] != labels.shape[0]:
        raise ValueError(f"unexpected IDX shapes {tuple(images.shape)} / {tuple(labels.shape)}")
    x_all = images.to(torch.float32).div_(255.0).unsqueeze(1).contiguous()  # N,1,28,28
    y_all = labels.to(torch.int64)
    n = x_all.shape[0]
    bs = args.batch_size
    if n < bs:
        raise ValueError(f"{n} images are fewer than one batch of {bs}")

    model, loss_fn, opt = make_cnn(torch)
    model.train()

    # Shuffled full batches, a fresh permutation per pass over the data (drop the remainder).
    state = {"perm": torch.randperm(n), "pos": 0}

    def next_batch():
        if state["pos"] + bs > n:
            state["perm"] = torch.randperm(n)
            state["pos"] = 0
        idx = state["perm"][state["pos"]:state["pos"] + bs]
        state["pos"] += bs
        return x_all[idx], y_all[idx]

    def step():
        x, y = next_batch()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss

    blas = blas_in_use(torch)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), BLAS: "
          f"{blas['kind']} ({blas['library']}), dense SGEMM {blas['dense_sgemm_gflops']} GFLOP/s",
          file=sys.stderr)
    if blas["kind"] == "reference":
        print("warning: the reference BLAS is in use; install libopenblas0-openmp "
              "(tools/setup-deps.sh --bench)", file=sys.stderr)

    for _ in range(args.warmup):
        step()
    runs = []
    for r in range(args.repeats):
        t0 = time.perf_counter()
        for _ in range(args.steps):
            loss = step()
        seconds = time.perf_counter() - t0
        runs.append(round(args.steps * bs / seconds, 1))
        print(f"repeat {r + 1}/{args.repeats}: {runs[-1]:.0f} images/s "
              f"(loss {loss.item():.4f})", file=sys.stderr)

    print(json.dumps({
        "threads": args.threads,
        "images_per_sec_median": round(statistics.median(runs), 1),
        "runs": runs,
        "batch_size": bs,
        "steps": args.steps,
        "warmup": args.warmup,
        "flush_denormal": args.flush_denormal,
        "torch": torch.__version__,
        "blas": blas,
    }))


if __name__ == "__main__":
    main()
