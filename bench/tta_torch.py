#!/usr/bin/python3
"""Time-to-accuracy contestant: the seed CNN in PyTorch eager, trained until the test accuracy
reaches a target (bench/time_to_accuracy.sh times the whole process from outside).

The model, optimizer and data reading are bench/torch_cnn.py's (Conv2d 32 / 64, pools, Linear
1600->64->10, CrossEntropy, Adam(1e-3, eps 1e-7)), on the built-in MNIST subset: every epoch
a fresh permutation of the training split in batches of 64 (the last, partial batch kept, as
distrain's and Keras's epochs), then the test split evaluated; training stops after the first
epoch whose test accuracy is >= --target. torch.set_num_threads(--threads, default every core),
OMP/OpenBLAS thread counts set before torch is imported.

Prints one JSON line on stdout: {"epochs": E, "test_accuracy": A, "reached": true|false, ...}.
Exits 3 when torch cannot be imported.

  /usr/bin/python3 bench/tta_torch.py --target 0.96 --max-epochs 15
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import torch_cnn  # noqa: E402
import tta_args  # noqa: E402


def main():
    args = tta_args.parse(__doc__.split("\n\n")[0], torch_cnn.DEFAULT_DATA)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    try:
        import torch
    except ImportError as e:
        print(f"tta_torch.py: torch is not importable with {sys.executable} ({e}); install "
              "python3-torch (tools/setup-deps.sh --bench)", file=sys.stderr)
        sys.exit(3)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    def split(name):
        x = torch_cnn.read_idx(os.path.join(args.data_dir, f"{name}-images-idx3-ubyte.gz"), torch)
        y = torch_cnn.read_idx(os.path.join(args.data_dir, f"{name}-labels-idx1-ubyte.gz"), torch)
        return x.to(torch.float32).div_(255.0).unsqueeze(1).contiguous(), y.to(torch.int64)

    x, y = split("train")
    xt, yt = split("t10k")
    model, loss_fn, opt = torch_cnn.make_cnn(torch)
    bs, n = args.batch_size, x.shape[0]
    epochs, accuracy = 0, 0.0
    for epoch in range(args.max_epochs):
        model.train()
        perm = torch.randperm(n)
        for i in range(0, n, bs):
            idx = perm[i:i + bs]
            opt.zero_grad(set_to_none=True)
            loss_fn(model(x[idx]), y[idx]).backward()
            opt.step()
        model.eval()
        correct = 0
        with torch.no_grad():
            for i in range(0, xt.shape[0], 1000):
                correct += (model(xt[i:i + 1000]).argmax(1) == yt[i:i + 1000]).sum().item()
        epochs, accuracy = epoch + 1, correct / xt.shape[0]
        reached = accuracy >= args.target
        print(f"Epoch {epochs}: test accuracy {accuracy:.4f}{' (target reached)' if reached else ''}",
              file=sys.stderr)
        if reached:
            break
    print(json.dumps({
        "epochs": epochs,
        "test_accuracy": round(accuracy, 6),
        "reached": accuracy >= args.target,
        "target": args.target,
        "seed": args.seed,
        "threads": args.threads,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
