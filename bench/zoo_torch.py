#!/usr/bin/python3
"""PyTorch eager reference for bench_models: each zoo model (bench/models/zoo.py) written in
PyTorch, layer for layer, trained on the CPU on synthetic data.

  seed_cnn     Conv2d(1,32,3)+ReLU, MaxPool2, Conv2d(32,64,3)+ReLU, MaxPool2, Flatten,
               Linear(1600,64)+ReLU, Linear(64,10)
  resnet20     Conv2d(3,16,3,pad 1, no bias)+BN+ReLU; 3 stages x 3 basic blocks (16/32/64, the
               first block of stages 2 and 3 strides 2, 1x1 projection + BN shortcut there);
               global average pool, Linear(64,10). Keras's BN epsilon 1e-3, momentum 0.99.
  mlp          Flatten, Linear(784,1024)+ReLU, Dropout(0.2), Linear(1024,1024)+ReLU,
               Dropout(0.2), Linear(1024,10)
  transformer  Embedding(20000,128), 2 post-norm encoder blocks (nn.MultiheadAttention 4 heads,
               LayerNorm eps 1e-6, Linear(128,256)+GELU, Linear(256,128)), mean over the
               sequence, Linear(128,2); int64 token ids, sequence 128
  lstm         Embedding(20000,128), nn.LSTM(128, 128, batch_first) (its last state),
               Linear(128,2); int64 token ids, sequence 128
Channels-last memory format for the CNNs (as Keras's NHWC; oneDNN-friendly). Adam(1e-3, eps
1e-7), cross-entropy of the logits; 8 synthetic batches (normal inputs, random labels) cycled.
--warmup steps, then --repeats timed runs of --steps steps; prints one JSON line like
bench/torch_cnn.py: {"model", "threads", "images_per_sec_median", "runs", ...}.

  /usr/bin/python3 bench/zoo_torch.py --model resnet20 --threads 1
"""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def zoo_entry(models_dir, name):
    with open(os.path.join(models_dir, "flops.txt")) as f:
        for line in f:
            parts = line.split()
            if parts and parts[0] == name:
                return (tuple(int(d) for d in parts[1].split("x")), parts[2], int(parts[3]),
                        float(parts[4]))
    sys.exit(f"zoo_torch.py: {name} is not in {models_dir}/flops.txt")


def build(name, torch):
    nn = torch.nn

    def bn(c):
        return nn.BatchNorm2d(c, eps=1e-3, momentum=0.01)

    if name == "seed_cnn":
        return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
                             nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                             nn.Linear(1600, 64), nn.ReLU(), nn.Linear(64, 10))
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 1024), nn.ReLU(), nn.Dropout(0.2),
                             nn.Linear(1024, 1024), nn.ReLU(), nn.Dropout(0.2),
                             nn.Linear(1024, 10))
    if name == "resnet20":
        class Block(nn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.c1, self.b1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False), bn(cout)
                self.c2, self.b2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False), bn(cout)
                self.proj = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), bn(cout))
                             if stride != 1 else nn.Identity())

            def forward(self, x):
                h = torch.relu(self.b1(self.c1(x)))
                return torch.relu(self.b2(self.c2(h)) + self.proj(x))

        layers = [nn.Conv2d(3, 16, 3, 1, 1, bias=False), bn(16), nn.ReLU()]
        cin = 16
        for s, c in enumerate((16, 32, 64)):
            for b in range(3):
                layers.append(Block(cin, c, 2 if s > 0 and b == 0 else 1))
                cin = c
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
        return nn.Sequential(*layers)
    if name == "transformer":
        class Encoder(nn.Module):
            def __init__(self):
                super().__init__()
                self.mha = nn.MultiheadAttention(128, 4, batch_first=True)
                self.ln1, self.ln2 = nn.LayerNorm(128, eps=1e-6), nn.LayerNorm(128, eps=1e-6)
                self.ff = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 128))

            def forward(self, x):
                x = self.ln1(x + self.mha(x, x, x, need_weights=False)[0])
                return self.ln2(x + self.ff(x))

        class Classifier(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(20000, 128)
                self.blocks = nn.Sequential(Encoder(), Encoder())
                self.out = nn.Linear(128, 2)

            def forward(self, x):
                return self.out(self.blocks(self.emb(x)).mean(dim=1))

        return Classifier()
    if name == "lstm":
        class Recurrent(nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = nn.Embedding(20000, 128)
                self.lstm = nn.LSTM(128, 128, batch_first=True)
                self.out = nn.Linear(128, 2)

            def forward(self, x):
                return self.out(self.lstm(self.emb(x))[1][0][-1])

        return Recurrent()
    sys.exit(f"zoo_torch.py: no PyTorch model for {name}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--models-dir", default=os.path.join(HERE, "models"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=0, help="default: the zoo's")
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(35)
    shape, dtype, batch, flops = zoo_entry(args.models_dir, args.model)
    batch = args.batch_size or batch
    model = build(args.model, torch)
    image = len(shape) == 3
    if image:
        model = model.to(memory_format=torch.channels_last)
    classes = 2 if args.model in ("transformer", "lstm") else 10
    g = torch.Generator().manual_seed(35)
    batches = []
    for _ in range(8):
        if dtype == "int32":
            x = torch.randint(0, 20000, (batch,) + shape, generator=g)
        else:  # NHWC values, NCHW view in channels-last memory
            x = torch.randn((batch, shape[2], shape[0], shape[1]), generator=g)
            x = x.contiguous(memory_format=torch.channels_last)
        batches.append((x, torch.randint(0, classes, (batch,), generator=g)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, eps=1e-7)
    loss_fn = torch.nn.CrossEntropyLoss()
    model.train()
    step = 0

    def run(n):
        nonlocal step
        for _ in range(n):
            x, y = batches[step % 8]
            step += 1
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
        return float(loss)

    run(args.warmup)
    runs = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        loss = run(args.steps)
        runs.append(round(args.steps * batch / (time.perf_counter() - t0), 1))
    print(json.dumps({"model": args.model, "threads": args.threads,
                      "images_per_sec_median": round(statistics.median(runs), 1), "runs": runs,
                      "batch_size": batch, "steps": args.steps, "loss": loss,
                      "flops_per_example": flops, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
