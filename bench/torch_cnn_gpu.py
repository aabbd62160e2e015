#!/usr/bin/env python3
"""PyTorch eager reference for the libdist GPU benchmark: the seed CNN on one GPU.

Conv2D(32, 3x3, relu) -> MaxPool2 -> Conv2D(64, 3x3, relu) -> MaxPool2 -> Flatten
-> Dense(64, relu) -> Dense(10), Adam(lr 1e-3, eps 1e-7 as Keras), softmax cross-entropy.
MNIST-shaped random data (uint8 images scaled to [0, 1], labels 0..9), channels-last like
TensorFlow. Prints one line per batch size: "torch batch=B images_per_sec=X".

Float32 matmuls and convolutions run in true float32 (no TF32) unless --tf32, to match
libdist's default.
"""
import argparse
import time

import torch
import torch.nn as nn


def make_model():
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 64), nn.ReLU(), nn.Linear(64, 10))


def bench(batch, steps, warmup, device, images=60000):
    torch.manual_seed(0)
    model = make_model().to(device).to(memory_format=torch.channels_last)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = nn.CrossEntropyLoss()
    nbatches = max(1, min(images // batch, 64))
    xs = torch.randint(0, 256, (nbatches, batch, 1, 28, 28), dtype=torch.uint8, device=device)
    ys = torch.randint(0, 10, (nbatches, batch), device=device)

    def step(i):
        x = (xs[i % nbatches].float() / 255.0).contiguous(memory_format=torch.channels_last)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), ys[i % nbatches])
        loss.backward()
        opt.step()
        return loss

    for i in range(warmup):
        step(i)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(steps):
        step(i)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    return steps * batch / dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch-sizes", default="64,1024")
    ap.add_argument("--seconds", type=float, default=5.0, help="about how long to time each batch size")
    ap.add_argument("--tf32", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32
    torch.backends.cudnn.benchmark = True
    device = torch.device("cuda")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)} tf32={args.tf32}", flush=True)
    for b in (int(s) for s in args.batch_sizes.split(",")):
        probe = bench(b, steps=20, warmup=10, device=device)  # also the warm-up
        steps = max(20, int(args.seconds * probe / b))
        ips = bench(b, steps=steps, warmup=10, device=device)
        print(f"torch batch={b} steps={steps} images_per_sec={ips:.0f}", flush=True)


if __name__ == "__main__":
    main()
