#!/bin/sh
# usage: make_bad_idx.sh SUBSET_DIR OUT_DIR
# Writes two broken MNIST directories: OUT_DIR/truncated (train images cut short) and
# OUT_DIR/wrongheader (train images with a wrong magic number); the other files are valid.
set -eu
src=$1
out=$2
rm -rf "$out"
for d in truncated wrongheader; do
    mkdir -p "$out/$d"
    for f in train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte; do
        gzip -dc "$src/$f.gz" > "$out/$d/$f"
    done
done
gzip -dc "$src/train-images-idx3-ubyte.gz" | head -c 100000 > "$out/truncated/train-images-idx3-ubyte"
{
    printf '\022\064\010\003'
    gzip -dc "$src/train-images-idx3-ubyte.gz" | tail -c +5
} > "$out/wrongheader/train-images-idx3-ubyte"
