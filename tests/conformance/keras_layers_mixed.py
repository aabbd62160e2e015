"""Each layer under mixed_bfloat16 against tf_keras, one at a time: where libdist rounds.

For each layer a small Functional model (an image or a token input, the layer, and a float32
global average pooling as its output) is written by tf_keras under
keras.mixed_precision.set_global_policy("mixed_bfloat16"); libdist reads the policy from that
JSON and trains one SGD step (tests/conformance/keras_functional.c, the driver of
conformance.keras_functional) from weights whose biases, gammas and betas are drawn away from
their initial zeros and ones (so that rounding them shows); then tf_keras, in a tf.function as
Keras fit runs it, computes the logits of the batch with libdist's weights, under
mixed_bfloat16 and under float32.

The model's output is that float32 pooling of the layer's bfloat16 output, so one value that
differs moves the output by its own share, not by a whole bfloat16 step of a rounded result.
Where TF's bfloat16 products accumulate in float32 and round once (oneDNN's kernels: CPUs with
AVX512_BF16 or AMX; keras_zoo.tf_rounds_like_libdist), libdist's output must be TF's bits
(relative distance <= 1e-6), except for the layers named below with the reason: where TF's
graph rounds at other points (DIFFERENT) or its bfloat16 kernel approximates (APPROXIMATE:
libdist must then also be at least as near float32 as TF), within 1.5x the distance of TF's
own mixed_bfloat16 output from its float32 one; where the products sum in another order
(REORDERED), within a quarter of it. Elsewhere (TF's Eigen kernels round partial sums) every
layer is held to 2x. A layer rounding once where TF rounds twice, or the reverse, or a variable
autocast that TF keeps float32 (LayerNormalization's gamma and beta, which this test found),
moves the output by the full distance: far beyond 1e-6.

Then the step itself: TF trains one SGD step from the same weights under mixed_bfloat16 (and
under float32) in a tf.function, and each variable's update must be TF's bits where its
products round once, except where named (update_bound): a moving variance (tf_keras's Bessel
correction), the attention's key (it moves by rounding alone), the biases TF's bfloat16
BiasAddGrad sums in bfloat16 (libdist's must be nearer TF's float32 update than TF's is), the
DIFFERENT and REORDERED layers (1.5x, 0.75x TF's own mixed / float32 distance). This found that
a float32 output layer passed the loss's gradient back rounded (libdist's final cast) and did
not round what it passed on (Keras's cast of its input does), and that the normalizations'
gamma and beta gradients were rounded (TF's kernels give them in float32).

Usage: keras_layers_mixed.py DRIVER WORKDIR
"""
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras as K  # noqa: E402

from keras_zoo import rel, tf_rounds_like_libdist  # noqa: E402

L = K.layers
B, H, W, C = 8, 12, 12, 8  # images
SEQ, VOCAB, E = 64, 500, 32  # tokens

# TF's graph rounds these differently from libdist (and from its own eager ops)
DIFFERENT = {
    "conv_add": "grappler fuses Conv2D + BiasAdd + Add into one op that rounds once; libdist "
                "rounds the convolution's output, then the sum",
    "dense_3d": "a Dense on [batch, steps, features] is tensordot + BiasAdd in TF, rounded "
                "twice; libdist adds the bias in its product and rounds once",
    "dense_4d": "as dense_3d, on [batch, h, w, features]",
}

# the recurrent layers round at other points than TF's graph: Keras's GRU mixes z h + (1 - z) hh,
# libdist hh + z (h - hh); the steps' gradients of a weight read at every step are summed in
# float32 and rounded once, TF sums them in bfloat16 step by step; and each step's roundings
# compound through the state over the 64 steps. Measured (AMX Xeon, 7 December 2026): the
# output 2.5e-3 (LSTM) and 5.3e-3 (GRU) from TF's mixed_bfloat16, TF's own mixed / float32
# distance 2.8e-3 and 4.7e-3; every update within 1.3x TF's own distance. Held to 2x TF's own
# distance, output and updates: a bound that mixed_bfloat16 stays as near TF as TF is to itself
# in float32, not a check of each rounding point (leaving the summed step gradients of a weight
# unrounded stays within it)
RECURRENT = {
    "lstm": "the steps' roundings compound through the state; TF sums a weight's step "
            "gradients in bfloat16, libdist in float32 rounded once",
    "gru": "Keras mixes z h + (1 - z) hh, libdist hh + z (h - hh); the roundings compound "
           "through the state",
}

# TF's bfloat16 kernels of these compute each value less exactly than rounding a float32
# result once (Eigen's fast approximations: TF's bfloat16 sigmoid differs from the once-rounded
# value in ~27% of elements, its GELU in ~32%); libdist rounds once: it must be at least as near
# float32 as TF is, and within 1.5x TF's own distance of TF
APPROXIMATE = {
    "sigmoid": "TF's bfloat16 sigmoid is an approximation",
    "gelu": "TF's bfloat16 GELU is an approximation",
}
# TF's bfloat16 kernels of Keras's other activations round inside the function (Eigen evaluates
# exp(x) - 1, log1p(exp(x)), x / (|x| + 1) and the slope's product op by op in bfloat16, the
# leaky slope itself rounded to bfloat16; their gradient kernels likewise); libdist computes the
# function and its gradient in float32 and rounds once: within 1.5x TF's own distance, for the
# output and for the updates of the layer before it
ROUNDED_INSIDE = {
    "elu": "TF's bfloat16 ELU rounds exp(x) and exp(x) - 1",
    "conv_elu": "TF's bfloat16 ELU rounds exp(x) and exp(x) - 1",
    "selu": "TF's bfloat16 SELU rounds exp(x) - 1 before its scale",
    "softplus": "TF's bfloat16 softplus rounds exp(x) before log1p",
    "softsign": "TF's bfloat16 softsign rounds |x| + 1 before the division",
    "mish": "mish's softplus rounds inside in TF's bfloat16 kernel",
    "leaky_relu": "TF's bfloat16 leaky ReLU multiplies by the slope rounded to bfloat16",
}
# the same rounding points, products summed in another order (oneDNN 3's batched products in
# TF, 2.6's in libdist): a few values land the other side of a rounding boundary
REORDERED = {
    "attention": "the batched products sum in another order; a few values round the other way",
}

# One SGD step from the same weights: every variable's update is TF's bits (<= 1e-6), except
# - a BatchNormalization's moving variance: tf_keras's fused kernel updates it with the
#   Bessel-corrected batch variance, libdist (as Keras 3) with the batch's own (keras_zoo.py
#   bounds it against Keras 3); not compared here;
# - the attention's key bias and kernel: the bias has no gradient in exact arithmetic and the
#   kernel's is second order over these near-uniform attention weights: both move by rounding
#   alone; not compared;
# - the biases of the layers below: TF's bfloat16 BiasAddGrad sums its rows in bfloat16 (0.2-1.3
#   from TF's own float32 update over these 1,152 and 512 rows), libdist in float32: its update
#   must be nearer TF's float32 update than TF's mixed_bfloat16 one is;
# - the DIFFERENT layers' other variables: within 1.5x TF's own mixed / float32 distance; the
#   REORDERED layers' within 0.75x (the flips of their forward pass spread through the step).
# Where TF's products round partial sums (not `exact`: TF's Eigen kernels, e.g. with
# TF_ENABLE_ONEDNN_OPTS=0 or on a CPU without AVX512_BF16), every update within 2x that
# distance, every bias's nearer TF's float32 update than TF's mixed one (Eigen sums every bias
# gradient in bfloat16: 0.6 from float32 for the Conv2D's here).
BIAS_SUMMED_IN_BF16 = {"depthwise", "dense_3d", "dense_4d"}
# TF's swish gradient is a custom gradient of bfloat16 ops (sigmoid, 1 - s, products, each
# rounded, the sigmoid an approximation); libdist sums both parts in float32 and rounds once:
# the updates of the layer before it within 1.5x TF's own distance
GRADIENT_CHAIN = {"conv_swish"}


# the gradient's sums in another order than TF's graph with its oneDNN rewrites on some CPUs:
# on a 2-core AMX Xeon (7 December 2026) the embedding's update below the LayerNormalization
# came 2.1e-6 from libdist's (TF's bits on Zen 4); a
# rounding point moved is a thousand times that (TF's own mixed / float32 distance 2.0e-3):
# within 1e-5
GRADIENT_REORDERED = {"layer_norm"}


def update_bound(kind, name, exact, tf_dist):
    """(limit, why) for a variable's update against TF's mixed_bfloat16 one; None: skipped."""
    if "moving_variance" in name:
        return None
    if kind == "attention" and "/key/" in name:
        return None
    if not exact and name.endswith("bias"):
        return float("inf"), "TF's kernels here sum every bias gradient in bfloat16"
    if not exact:
        return 2 * tf_dist, "2x TF's own distance"
    if kind in BIAS_SUMMED_IN_BF16 and name.endswith("bias"):
        return float("inf"), "TF sums the bias gradient in bfloat16"
    if kind in RECURRENT:
        return 2 * tf_dist, "2x TF's own distance (the recurrence)"
    if kind in DIFFERENT or kind in GRADIENT_CHAIN or kind in ROUNDED_INSIDE:
        return 1.5 * tf_dist, "1.5x TF's own distance"
    if kind in REORDERED:
        return 0.75 * tf_dist, "0.75x TF's own distance (products summed in another order)"
    if kind in GRADIENT_REORDERED:
        return 1e-5, "the normalization's gradient summed in another order"
    return 1e-6, "TF's bits"


IMAGE = {
    "conv": lambda h: L.Conv2D(16, 3, padding="same", name="c")(h),
    "conv_relu": lambda h: L.Conv2D(16, 3, activation="relu", name="c")(h),
    "conv_strided": lambda h: L.Conv2D(16, 3, strides=2, padding="same", use_bias=False,
                                       name="c")(h),
    "batch_norm": lambda h: L.BatchNormalization(name="bn")(h),
    "batch_norm_relu": lambda h: L.ReLU(name="r")(L.BatchNormalization(name="bn")(h)),
    "depthwise": lambda h: L.DepthwiseConv2D(3, name="dw")(h),
    "separable": lambda h: L.SeparableConv2D(16, 3, name="sep")(h),
    "avg_pool": lambda h: L.AveragePooling2D(2, name="ap")(h),
    "max_pool": lambda h: L.MaxPooling2D(2, name="mp")(h),
    "sigmoid": lambda h: L.Activation("sigmoid", name="a")(h),
    "tanh": lambda h: L.Activation("tanh", name="a")(h),
    "swish": lambda h: L.Activation("swish", name="a")(h),
    "conv_swish": lambda h: L.Conv2D(16, 3, activation="swish", name="c")(h),
    "gelu": lambda h: L.Activation("gelu", name="a")(h),
    "elu": lambda h: L.ELU(0.5, name="a")(h),
    "selu": lambda h: L.Activation("selu", name="a")(h),
    "softplus": lambda h: L.Activation("softplus", name="a")(h),
    "softsign": lambda h: L.Activation("softsign", name="a")(h),
    "mish": lambda h: L.Activation("mish", name="a")(h),
    "leaky_relu": lambda h: L.LeakyReLU(0.2, name="a")(h),
    "relu_max": lambda h: L.ReLU(max_value=0.5, name="a")(h),
    "conv_elu": lambda h: L.Conv2D(16, 3, activation="elu", name="c")(h),
    "softmax": lambda h: L.Softmax(name="s")(h),
    "multiply": lambda h: L.Multiply(name="mul")([h, L.Conv2D(C, 1, name="c")(h)]),
    "concatenate": lambda h: L.Concatenate(name="cat")([h, L.Conv2D(4, 1, name="c")(h)]),
    "conv_add": lambda h: L.Add(name="add")([h, L.Conv2D(C, 1, name="c")(h)]),
    "rescaling": lambda h: L.Rescaling(0.37, 0.11, name="rs")(h),
    "global_max_pool": lambda h: L.Reshape((1, 1, C), name="rsh")(
        L.GlobalMaxPooling2D(name="g")(h)),
    "zero_padding": lambda h: L.ZeroPadding2D(1, name="zp")(h),
    "dense_4d": lambda h: L.Dense(6, name="d4")(h),
}
TEXT = {
    "embedding": lambda h: h,
    "attention": lambda h: L.MultiHeadAttention(4, 8, name="mha")(h, h),
    "layer_norm": lambda h: L.LayerNormalization(epsilon=1e-6, name="ln")(h),
    "dense_3d": lambda h: L.Dense(48, name="ff")(h),
    "lstm": lambda h: L.LSTM(16, return_sequences=True, name="rnn")(h),
    "gru": lambda h: L.GRU(16, return_sequences=True, go_backwards=True, name="rnn")(h),
}


def model(kind):
    """The layer, then a float32 global average pooling as the output: the pooled values are
    an exact float32 function of the layer's bfloat16 output, not rounded again (a rounding
    after the pooling would turn any one differing element into a whole bfloat16 step)."""
    if kind in IMAGE:
        x = K.Input((H, W, C), name="img")
        h = IMAGE[kind](x)
        y = L.GlobalAveragePooling2D(dtype="float32", name="pool")(h)
    else:
        x = K.Input((SEQ,), dtype="int32", name="tokens")
        h = TEXT[kind](L.Embedding(VOCAB, E, name="emb")(x))
        y = L.GlobalAveragePooling1D(dtype="float32", name="pool")(h)
    return K.Model(x, y, name=kind)


def one_step(m, init, x, y):
    """m's weights after one SGD step from init on (x, y), in a tf.function as Keras fit runs
    it (the driver's SGD and loss)."""
    m.set_weights(init)
    opt = K.optimizers.SGD(0.01, momentum=0.9)
    lossf = K.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = lossf(yb, m(xb, training=True))
        g = tape.gradient(loss, m.trainable_variables)
        opt.apply_gradients(zip(g, m.trainable_variables))
    step(tf.constant(x), tf.constant(y))
    return m.get_weights()


def main():
    driver, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    exact = tf_rounds_like_libdist()
    print(f"TensorFlow {tf.__version__}: its bfloat16 products "
          f"{'round once (libdist is held to its bits)' if exact else 'round partial sums'}")
    failed = []
    for kind in list(IMAGE) + list(TEXT):
        rng = np.random.default_rng(sum(ord(ch) * (i + 1) for i, ch in enumerate(kind)))
        d = os.path.join(work, kind)
        os.makedirs(os.path.join(d, "out"))
        if kind in IMAGE:
            x = rng.standard_normal((B, H, W, C)).astype(np.float32)
            x_path, dims = os.path.join(d, "x.f32"), (H, W, C)
        else:
            x = rng.integers(0, VOCAB, (B, SEQ)).astype(np.int32)
            x_path, dims = os.path.join(d, "x.i32"), (SEQ, 1, 1)
        y = rng.integers(0, 2, B).astype(np.int32)  # the pooled features are the "logits"
        x.tofile(x_path)
        y.tofile(os.path.join(d, "y.i32"))
        K.mixed_precision.set_global_policy("mixed_bfloat16")
        K.utils.set_random_seed(3)
        m = model(kind)
        with open(os.path.join(d, "m.json"), "w") as f:
            f.write(m.to_json())
        init = []
        for v in m.weights:
            a = v.numpy().astype(np.float32)
            if a.ndim == 1:  # biases, gammas, betas, moving statistics: off 0 and 1
                a = a + (0.1 * rng.standard_normal(a.shape)).astype(np.float32)
                if "variance" in v.name:
                    a = np.abs(a)
            init.append(a)
        np.concatenate([a.ravel() for a in init] + [np.zeros(0, np.float32)]).tofile(
            os.path.join(d, "init.f32"))
        subprocess.run([driver, os.path.join(d, "m.json"), os.path.join(d, "init.f32"), x_path,
                        os.path.join(d, "y.i32"), str(B), *map(str, dims), "1", str(B),
                        os.path.join(d, "out")], check=True, timeout=300)
        flat = np.fromfile(os.path.join(d, "out", "final.f32"), dtype=np.float32)
        ws, at = [], 0
        for a in init:
            ws.append(flat[at:at + a.size].reshape(a.shape))
            at += a.size
        ours = np.fromfile(os.path.join(d, "out", "logits.f32"), dtype=np.float32)
        # one step in TF from the same weights: the updates (the gradients' rounding)
        tw = one_step(m, init, x, y)
        K.mixed_precision.set_global_policy("float32")
        fw = one_step(model(kind), init, x, y)
        K.mixed_precision.set_global_policy("mixed_bfloat16")
        upd = []
        for nm, a, o, t, f in zip([v.name for v in m.weights], init, ws, tw, fw):
            if np.linalg.norm(f - a) > 0:
                upd.append((rel(o - a, t - a) if np.linalg.norm(t - a) > 0 else float("inf"),
                            nm.split(":")[0], rel(o - a, f - a), rel(t - a, f - a)))
        bits, bits_ok = [], True  # the variables held to TF's bits: one line for them
        for e_u, nm, e32, tf_dist in upd:
            bound = update_bound(kind, nm, exact, tf_dist)
            if bound is None:
                continue
            lim, why = bound
            ok_u = e_u <= lim
            if lim == float("inf"):  # libdist nearer TF's float32 update than TF's own is
                ok_u = e32 <= tf_dist
                why += f"; libdist {e32:.1e} from TF's float32 update, TF {tf_dist:.1e}"
            if not ok_u:
                failed.append(f"{kind} ({nm}'s update)")
            if lim == 1e-6:
                bits.append(nm)
                bits_ok = bits_ok and ok_u
            if not ok_u or lim > 1e-6:
                print(f"{'ok  ' if ok_u else 'FAIL'} {kind}: {nm}'s update after one step vs "
                      f"TF's mixed_bfloat16 one {e_u:.1e} ({why}); vs TF's float32 one "
                      f"{e32:.1e}; TF's own mixed / float32 distance {tf_dist:.1e}")
        if bits:
            print(f"{'ok  ' if bits_ok else 'FAIL'} {kind}: the updates of {', '.join(bits)} "
                  f"{'are' if bits_ok else 'are not all'} TF's bits")
        m.set_weights(ws)
        tk_mixed = tf.function(lambda t: m(t, training=False))(tf.constant(x)).numpy()
        K.mixed_precision.set_global_policy("float32")
        m32 = model(kind)
        m32.set_weights(ws)
        tk_f32 = tf.function(lambda t: m32(t, training=False))(tf.constant(x)).numpy()
        ours = ours.reshape(tk_mixed.shape)
        e, ref = rel(ours, tk_mixed), rel(tk_mixed, tk_f32)
        e32 = rel(ours, tk_f32)
        nearer = True
        if not exact:
            lim, why = 2 * ref, "2x TF's own mixed_bfloat16 / float32 distance"
        elif kind in RECURRENT:
            lim, why = 2 * ref, "2x TF's own distance: " + RECURRENT[kind]
        elif kind in DIFFERENT:
            lim, why = 1.5 * ref, "1.5x TF's own distance: " + DIFFERENT[kind]
        elif kind in ROUNDED_INSIDE:
            lim, why = 1.5 * ref, "1.5x TF's own distance: " + ROUNDED_INSIDE[kind]
        elif kind in APPROXIMATE:
            lim, why = 1.5 * ref, "1.5x TF's own distance: " + APPROXIMATE[kind]
            nearer = e32 <= ref
            why += f"; libdist as near float32 as TF: {'yes' if nearer else 'NO'}"
        elif kind in REORDERED:
            lim, why = 0.25 * ref, "a quarter of TF's own distance: " + REORDERED[kind]
        else:
            lim, why = 1e-6, "TF's bits"
        ok = e <= lim and nearer
        if not ok:
            failed.append(kind)
        print(f"{'ok  ' if ok else 'FAIL'} {kind}: libdist vs TF mixed_bfloat16 {e:.1e} "
              f"(<= {lim:.1e}, {why}); vs TF float32 {e32:.1e}; TF mixed_bfloat16 "
              f"vs float32 {ref:.1e}", flush=True)
    print(f"{len(IMAGE) + len(TEXT) - len(set(f.split()[0] for f in failed))} of "
          f"{len(IMAGE) + len(TEXT)} layers agree"
          f"{': failed ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
