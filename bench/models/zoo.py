#!/usr/bin/env python3
"""The benchmark zoo (issue #35): a Keras definition of each model, written as the Keras JSON
that libdist's bench_models loads (dist_model_from_keras_json), plus each model's training FLOPs
per example, counted from the layer shapes.

Models (tf_keras, TensorFlow's Keras 2, whose to_json() libdist reads; the same code builds them
in Keras 3 when given that module):
  seed_cnn     the seed CNN: Conv32-3x3-relu, MaxPool2, Conv64-3x3-relu, MaxPool2, Flatten,
               Dense64-relu, Dense10 (logits); input 28x28x1; batch 64.
  resnet20     ResNet-20 for CIFAR (He et al. 2015, section 4.2): 32x32x3, Conv16-3x3 + BN + ReLU,
               3 stages of 3 basic blocks (16, 32, 64 filters; the first block of stages 2 and 3
               strides 2), each block Conv3x3-BN-ReLU-Conv3x3-BN + shortcut, Add, ReLU; the
               shortcut is the identity, or a 1x1 Conv with stride 2 + BN where the shape changes
               (the "option B" projection); GlobalAveragePooling2D, Dense10 (logits); batch 128.
               Convolutions have no bias (BN follows each), as the original.
  mlp          784-1024-1024-10: Flatten of 28x28x1, Dense1024-relu, Dropout(0.2), Dense1024-relu,
               Dropout(0.2), Dense10 (logits); batch 64.
  transformer  text classifier: int32 token ids (sequence 128), Embedding(20000, 128) (no position
               embedding: see the comment in transformer()), 2 encoder blocks (MultiHeadAttention 4 heads x 32,
               Add, LayerNormalization, Dense256-gelu, Dense128, Add, LayerNormalization),
               GlobalAveragePooling1D, Dense2 (logits); batch 32.
  lstm         recurrent text classifier: int32 token ids (sequence 128), Embedding(20000, 128),
               LSTM(128) (its last state), Dense2 (logits); batch 32.

FLOPs per example (training, float32): 2 per multiply-add. A layer's forward multiply-adds are
counted from its output shape: Conv2D out_h*out_w*filters*k_h*k_w*in_ch, Dense out_positions*
units*in_units, attention 4 projections (Q, K, V, output: seq*d*d each) + QK^T and AV
(2*heads*seq*seq*head_dim), LSTM seq*4*units*(in + units) (the input's and the state's
products of every step); Embedding lookups, BN, activations, pooling, Add and the loss are
left out (memory-bound, < 2% on these models). Training = 3x forward (forward, backward-data,
backward-weights), except the first layer's backward-data, which nothing needs (left out).

usage: zoo.py [--out bench/models] [--keras tf_keras|keras3] [--weights]
  writes OUT/NAME.json (model.to_json()), OUT/flops.txt ("name input_shape input_dtype batch
  flops_per_example params"), and with --weights OUT/NAME.weights.h5 (Keras 3 only).
"""
import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

SEQ, VOCAB, EMBED, HEADS, FF = 128, 20000, 128, 4, 256

# name -> (input shape, input dtype, batch the issue names)
ZOO = {
    "seed_cnn": ((28, 28, 1), "float32", 64),
    "resnet20": ((32, 32, 3), "float32", 128),
    "mlp": ((28, 28, 1), "float32", 64),
    "transformer": ((SEQ,), "int32", 32),
    "lstm": ((SEQ,), "int32", 32),
}


def seed_cnn(K):
    L = K.layers
    x = K.Input((28, 28, 1), name="image")
    h = L.Conv2D(32, 3, activation="relu", name="conv1")(x)
    h = L.MaxPooling2D(2, name="pool1")(h)
    h = L.Conv2D(64, 3, activation="relu", name="conv2")(h)
    h = L.MaxPooling2D(2, name="pool2")(h)
    h = L.Flatten(name="flatten")(h)
    h = L.Dense(64, activation="relu", name="dense1")(h)
    y = L.Dense(10, name="logits")(h)
    return K.Model(x, y, name="seed_cnn")


def resnet20(K, classes=10):
    L = K.layers
    x = K.Input((32, 32, 3), name="image")
    h = L.Conv2D(16, 3, padding="same", use_bias=False, name="stem")(x)
    h = L.BatchNormalization(name="stem_bn")(h)
    h = L.ReLU(name="stem_relu")(h)
    for s, filters in enumerate((16, 32, 64)):
        for b in range(3):
            stride = 2 if s > 0 and b == 0 else 1
            p = f"s{s}b{b}"
            skip = h
            h = L.Conv2D(filters, 3, strides=stride, padding="same", use_bias=False,
                         name=f"{p}_conv1")(h)
            h = L.BatchNormalization(name=f"{p}_bn1")(h)
            h = L.ReLU(name=f"{p}_relu1")(h)
            h = L.Conv2D(filters, 3, padding="same", use_bias=False, name=f"{p}_conv2")(h)
            h = L.BatchNormalization(name=f"{p}_bn2")(h)
            if stride != 1:
                skip = L.Conv2D(filters, 1, strides=stride, use_bias=False,
                                name=f"{p}_proj")(skip)
                skip = L.BatchNormalization(name=f"{p}_proj_bn")(skip)
            h = L.Add(name=f"{p}_add")([h, skip])
            h = L.ReLU(name=f"{p}_out")(h)
    h = L.GlobalAveragePooling2D(name="pool")(h)
    y = L.Dense(classes, name="logits")(h)
    return K.Model(x, y, name="resnet20")


def mlp(K, dropout=0.2):
    L = K.layers
    x = K.Input((28, 28, 1), name="image")
    h = L.Flatten(name="flatten")(x)
    h = L.Dense(1024, activation="relu", name="dense1")(h)
    h = L.Dropout(dropout, name="drop1")(h)
    h = L.Dense(1024, activation="relu", name="dense2")(h)
    h = L.Dropout(dropout, name="drop2")(h)
    y = L.Dense(10, name="logits")(h)
    return K.Model(x, y, name="mlp")


def transformer(K, classes=2):
    L = K.layers
    x = K.Input((SEQ,), dtype="int32", name="tokens")
    tok = L.Embedding(VOCAB, EMBED, name="token_embedding")(x)
    # learned positions: an Embedding of the positions 0..SEQ-1 as a constant input would need a
    # second model input; a position table added as a trainable weight of its own layer is not a
    # stock Keras layer, so the positions are left out (the FLOPs do not change).
    h = tok
    for b in range(2):
        a = L.MultiHeadAttention(HEADS, EMBED // HEADS, name=f"b{b}_mha")(h, h)
        h = L.LayerNormalization(epsilon=1e-6, name=f"b{b}_ln1")(L.Add(name=f"b{b}_add1")([h, a]))
        f = L.Dense(FF, activation="gelu", name=f"b{b}_ff1")(h)
        f = L.Dense(EMBED, name=f"b{b}_ff2")(f)
        h = L.LayerNormalization(epsilon=1e-6, name=f"b{b}_ln2")(L.Add(name=f"b{b}_add2")([h, f]))
    h = L.GlobalAveragePooling1D(name="pool")(h)
    y = L.Dense(classes, name="logits")(h)
    return K.Model(x, y, name="transformer")


def lstm(K, classes=2):
    L = K.layers
    x = K.Input((SEQ,), dtype="int32", name="tokens")
    h = L.Embedding(VOCAB, EMBED, name="token_embedding")(x)
    h = L.LSTM(EMBED, name="lstm")(h)
    y = L.Dense(classes, name="logits")(h)
    return K.Model(x, y, name="lstm")


BUILDERS = {"seed_cnn": seed_cnn, "resnet20": resnet20, "mlp": mlp, "transformer": transformer,
            "lstm": lstm}


def shape_of(t):
    s = t.shape
    return tuple(int(d) for d in (s.as_list() if hasattr(s, "as_list") else s)[1:])


def flops_per_example(model):
    """Training FLOPs per example, counted from the layer shapes (module docstring)."""
    total = 0
    first = True
    for layer in model.layers:
        kind = type(layer).__name__
        macs = 0
        if kind == "Conv2D":
            oh, ow, oc = shape_of(layer.output)
            kh, kw, ic, _ = layer.kernel.shape
            macs = oh * ow * oc * int(kh) * int(kw) * int(ic)
        elif kind == "Dense":
            out = shape_of(layer.output)
            positions = 1
            for d in out[:-1]:
                positions *= d
            macs = positions * out[-1] * int(layer.kernel.shape[0])
        elif kind == "MultiHeadAttention":
            seq, d = shape_of(layer.output)
            heads, hd = layer._num_heads, layer._key_dim
            macs = 4 * seq * d * heads * hd + 2 * heads * seq * seq * hd
        elif kind == "LSTM":
            seq, feat = shape_of(layer.input)
            macs = seq * 4 * layer.units * (feat + layer.units)
        if macs:
            # forward + backward-weights + backward-data (none for the first layer with weights)
            total += 2 * macs * (2 if first else 3)
            first = False
    return total


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    p.add_argument("--keras", choices=["tf_keras", "keras3"], default="tf_keras")
    p.add_argument("--weights", action="store_true")
    p.add_argument("--seed", type=int, default=35)
    args = p.parse_args()
    if args.keras == "tf_keras":
        import tf_keras as K
    else:
        import keras as K
    K.utils.set_random_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    lines = []
    for name, (shape, dtype, batch) in ZOO.items():
        m = BUILDERS[name](K)
        with open(os.path.join(args.out, f"{name}.json"), "w") as f:
            f.write(m.to_json())
        if args.weights:
            m.save_weights(os.path.join(args.out, f"{name}.weights.h5"))
        fl = flops_per_example(m)
        lines.append(f"{name} {'x'.join(map(str, shape))} {dtype} {batch} {fl} {m.count_params()}")
        print(lines[-1], file=sys.stderr)
    with open(os.path.join(args.out, "flops.txt"), "w") as f:
        f.write("# name input_shape input_dtype batch train_flops_per_example params "
                "(bench/models/zoo.py)\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
