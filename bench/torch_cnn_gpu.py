#!/usr/bin/env python3
"""PyTorch eager reference for the libdist GPU benchmark: the seed CNN on one GPU.

Conv2D(32, 3x3, relu) -> MaxPool2 -> Conv2D(64, 3x3, relu) -> MaxPool2 -> Flatten
-> Dense(64, relu) -> Dense(10), Adam(lr 1e-3, eps 1e-7 as Keras), softmax cross-entropy.
MNIST-shaped random data, channels-last like TensorFlow. Two ways to feed it:

  default      the data set lives on the GPU (uint8 images, scaled to [0, 1] there each step);
  --host-data  each batch (float32 images already scaled, int64 labels) is copied from pinned
               host memory with non_blocking=True, as libdist uploads each batch of its host
               input pipeline.

--steps times a fixed number of steps per batch size (bench/bench_train --gpu passes the counts
it times itself); without it each batch size is timed for about --seconds. Each batch size gets
20 warm-up steps first. Prints one line per timed repeat:

  torch batch=B mode=<gpu_data|host_data> steps=S images_per_sec=X

and exits 1 if the last loss of a batch size is not finite. Float32 matmuls and convolutions
run in true float32 (no TF32) unless --tf32, to match libdist's default.
"""
import argparse
import math
import sys
import time

import torch
import torch.nn as nn

WARMUP_STEPS = 20


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 64), nn.ReLU(), nn.Linear(64, 10))


class Trainer:
    """One model, its optimizer and its data set, for one batch size and one way of feeding."""

    def __init__(self, batch, host_data, device, images=60000):
        torch.manual_seed(0)
        self.batch = batch
        self.host_data = host_data
        self.device = device
        self.model = make_model().to(device).to(memory_format=torch.channels_last)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=1e-3, eps=1e-7)
        self.loss_fn = nn.CrossEntropyLoss()
        self.nbatches = max(1, min(images // batch, 64))
        xs = torch.randint(0, 256, (self.nbatches, batch, 1, 28, 28), dtype=torch.uint8)
        ys = torch.randint(0, 10, (self.nbatches, batch))
        if host_data:
            self.xs = (xs.float() / 255.0).pin_memory()
            self.ys = ys.pin_memory()
        else:
            self.xs = xs.to(device)
            self.ys = ys.to(device)
        self.i = 0
        self.loss = None

    def step(self):
        k = self.i % self.nbatches
        self.i += 1
        if self.host_data:
            x = self.xs[k].to(self.device, non_blocking=True)
            y = self.ys[k].to(self.device, non_blocking=True)
        else:
            x = self.xs[k].float() / 255.0
            y = self.ys[k]
        x = x.contiguous(memory_format=torch.channels_last)
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.loss = loss

    def images_per_sec(self, steps):
        """Times `steps` steps, the GPU idle at the start and drained at the end."""
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        torch.cuda.synchronize()
        return steps * self.batch / (time.perf_counter() - t0)


def set_tf32(enabled):
    """TF32 for float32 matmuls and convolutions on or off. The allow_tf32 flags (deprecated
    after PyTorch 2.9, which maps them onto fp32_precision) set matmul, cuDNN conv and cuDNN RNN
    alike; should a later PyTorch ignore them, fp32_precision is set directly."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    want = "tf32" if enabled else "ieee"
    try:
        now = (torch.backends.cuda.matmul.fp32_precision, torch.backends.cudnn.conv.fp32_precision)
    except Exception:  # no fp32_precision API: the flags above are the whole story
        return
    if now != (want, want):
        try:
            torch.backends.cuda.matmul.fp32_precision = want
            torch.backends.cudnn.conv.fp32_precision = want
            torch.backends.cudnn.rnn.fp32_precision = want
        except Exception as e:  # the header line then shows what is in force
            print(f"torch_cnn_gpu.py: cannot set fp32_precision to {want}: {e}", file=sys.stderr)


def fp32_precision():
    """What float32 matmuls and convolutions run as, in the words of PyTorch >= 2.9's API that
    replaces allow_tf32 ("ieee" or "tf32"); for the log only."""
    try:
        return (f"matmul {torch.backends.cuda.matmul.fp32_precision}, "
                f"cudnn conv {torch.backends.cudnn.conv.fp32_precision}")
    except Exception:  # an older PyTorch: allow_tf32 is the only API
        return (f"matmul allow_tf32={torch.backends.cuda.matmul.allow_tf32}, "
                f"cudnn allow_tf32={torch.backends.cudnn.allow_tf32}")


def int_list(text):
    return [int(s) for s in text.split(",") if s.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", default="64,1024")
    ap.add_argument("--steps", default=None,
                    help="timed steps: one count for every batch size, or one per batch size "
                         "(comma-separated); overrides --seconds")
    ap.add_argument("--seconds", type=float, default=5.0,
                    help="without --steps: about how long to time each repeat")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--host-data", action="store_true",
                    help="copy each batch from pinned host memory (non_blocking) instead of "
                         "keeping the data set on the GPU")
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()
    batches = int_list(args.batch_sizes)
    steps = int_list(args.steps) if args.steps is not None else None
    if not batches or min(batches) < 1:
        ap.error("--batch-sizes: positive integers, comma-separated")
    if steps is not None:
        if len(steps) == 1:
            steps = steps * len(batches)
        if len(steps) != len(batches) or min(steps) < 1:
            ap.error("--steps: one positive count, or one per batch size")
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    if not torch.cuda.is_available():
        print("torch_cnn_gpu.py: PyTorch sees no CUDA device", file=sys.stderr)
        return 1

    set_tf32(args.tf32)
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    mode = "host_data" if args.host_data else "gpu_data"
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)} tf32={args.tf32} "
          f"({fp32_precision()}) mode={mode}", flush=True)
    failed = False
    for n, b in enumerate(batches):
        t = Trainer(b, args.host_data, device)
        for _ in range(WARMUP_STEPS):
            t.step()
        if steps is not None:
            s = steps[n]
        else:
            s = max(20, int(args.seconds * t.images_per_sec(20) / b))
        for _ in range(args.repeats):
            ips = t.images_per_sec(s)
            print(f"torch batch={b} mode={mode} steps={s} images_per_sec={ips:.0f}", flush=True)
        loss = t.loss.item()
        if not math.isfinite(loss):
            print(f"torch_cnn_gpu.py: batch {b}, {mode}: the last loss is {loss}, not finite",
                  file=sys.stderr)
            failed = True
        del t
        torch.cuda.empty_cache()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
