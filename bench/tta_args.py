"""The command line both time-to-accuracy contestants share (bench/tta_keras.py,
bench/tta_torch.py): --target, --max-epochs, --threads, --batch-size, --seed, --data-dir."""

import argparse
import os


def parse(description, default_data):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--target", type=float, default=0.96, help="test accuracy to reach")
    p.add_argument("--max-epochs", type=int, default=15)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--data-dir", default=default_data)
    args = p.parse_args()
    if not 0 < args.target <= 1 or args.max_epochs < 1 or args.threads < 1:
        p.error("--target must be in (0, 1], --max-epochs and --threads >= 1")
    return args
