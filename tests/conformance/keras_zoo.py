"""A zoo model (bench/models/zoo.py) trained by libdist against tf_keras, step by step: the
issue's "matches tf_keras for 20 SGD steps from the same weights and batches".

tf_keras builds the model from bench/models/zoo.py's definition (the code that writes the JSON
bench_models loads; dropout rate 0 for the comparison) from a fixed seed and writes its to_json()
and its initial weights in get_weights() order. libdist (tests/conformance/keras_functional.c,
the driver of conformance.keras_functional) builds the model from that JSON, sets those weights
and trains STEPS steps of SGD(0.01, momentum 0.9) on the given batches (mean sparse softmax
cross-entropy of the logits); tf_keras trains the same model from the same weights on the same
batches with a GradientTape loop. Bounds as conformance.keras_steps's SGD float32: every loss
within 1e-5 relative, every variable within 2e-4 (||libdist - keras|| / ||keras||), and every
kernel moved at least 5x farther than its distance to Keras. BatchNormalization's moving
variance is bounded against Keras 3 (trained too, from the same weights), whose update uses the
batch's variance as libdist's does; tf_keras's fused batch norm uses the Bessel-corrected one,
which is reported, not bounded.

Where Keras 3 and tf_keras themselves do not agree to those bounds over the steps (ResNet-20:
rounding grows ~10x per step at these batches, the two Keras implementations 5e-2 apart after 20
steps), libdist is held to the bounds after one step, and over the 20 steps to 5x the two
references' drift so far (its running maximum).

Then libdist's files of the trained model go into Keras 3: its .keras (dist_model_save_keras,
MultiHeadAttention included) through keras.models.load_model, and its .weights.h5 into the zoo's
Keras 3 model; each must give libdist's inference logits on the first batch within 1e-5.

The Transformer is the zoo's at full size (int32 token ids, sequence 128, Embedding 20000 x 128,
2 encoder blocks of MultiHeadAttention 4 heads x 32, LayerNormalization, GELU; 2 classes): its
ids are drawn uniformly from the vocabulary and its labels from {0, 1}; the driver reads the ids
as int32 (keras_functional.c).

Under POLICY mixed_bfloat16 (the sixth argument) tf_keras builds the model under
keras.mixed_precision.set_global_policy("mixed_bfloat16"), with Keras's float32 head, and
libdist reads the policy from that JSON (every layer's "dtype"): the same 20 steps against
tf_keras and Keras 3 trained under it too, each step a tf.function as Keras fit runs it. The
first loss within 5e-3 of tf_keras (measured 3e-7 / 4.9e-4 for the MLP / Transformer where TF's
bfloat16 products round once, 6.1e-4 / 1.7e-3 with TF's Eigen kernels, TF_ENABLE_ONEDNN_OPTS=0),
every loss within 3e-2 (5.7e-4 / 9.3e-3; Eigen 3.8e-3 / 1.3e-2), every variable's movement
over the steps within max(MIXED_WEIGHT_TOL, 5x the two Kerases' distance there). Where TF's products round once the
MLP's logits after the steps must be TF's bits. libdist's .keras then loads in Keras 3 as a
mixed_bfloat16 model whose logits are within MIXED_LOGIT_TOL of libdist's. The layers one at a
time: keras_layers_mixed.py.

Usage: keras_zoo.py DRIVER WORKDIR MODEL BATCH [STEPS [POLICY]]
       (MODEL: resnet20, mlp or transformer; POLICY: float32 or mixed_bfloat16)
"""
import os
import shutil
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "bench", "models"))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
import keras  # noqa: E402
import zoo  # noqa: E402

LOSS_TOL, WEIGHT_TOL = 1e-5, 2e-4
CHAOS_FACTOR = 5
STILL_ABS, MOVED_MIN = 1e-6, 1e-4
LOGIT_TOL = 1e-5  # conformance.keras_functional's bound for its .keras and .weights.h5 files
MIXED_FIRST_LOSS_TOL, MIXED_LOSS_TOL, MIXED_WEIGHT_TOL = 5e-3, 3e-2, 0.2
MIXED_LOGIT_TOL = 2e-2


def build(K, name):
    if name == "mlp":
        return zoo.mlp(K, dropout=0.0)
    return zoo.BUILDERS[name](K)


def train(model, opt, loss_fn, x, y, steps, batch, graph=False):
    """graph: each step a tf.function, as Keras fit runs it (grappler then fuses a Dense's
    MatMul + BiasAdd into one op that rounds once under mixed precision, as libdist does;
    eagerly each op's output is rounded)."""
    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss
    if graph:
        step = tf.function(step)
    losses = []
    for s in range(steps):
        xb, yb = x[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
        losses.append(float(step(tf.constant(xb), tf.constant(yb))))
    return np.array(losses)


def write_model(tk, work, json_name):
    """tf_keras model tk's to_json() and initial weights (get_weights() order, float32) into
    work: (variable names, weights, JSON path, weights path), what run_driver reads."""
    names = [v.name.split(":")[0] for v in tk.weights]
    init = [v.astype(np.float32) for v in tk.get_weights()]
    json_path = os.path.join(work, json_name)
    with open(json_path, "w") as f:
        f.write(tk.to_json())
    init_path = os.path.join(work, "init.f32")
    np.concatenate([v.ravel() for v in init]).tofile(init_path)
    return names, init, json_path, init_path


def run_driver(driver, json_path, init_path, x_path, y_path, dims, steps, batch, out, init):
    """libdist trains the JSON model (keras_functional.c); its losses and final weights, shaped
    as Keras's `init`."""
    os.makedirs(out)
    subprocess.run([driver, json_path, init_path, x_path, y_path, *map(str, dims), str(steps),
                    str(batch), out], check=True, timeout=1200)
    losses = np.loadtxt(os.path.join(out, "losses.txt"), dtype=np.float64, ndmin=1)
    flat = np.fromfile(os.path.join(out, "final.f32"), dtype=np.float32)
    weights, at = [], 0
    for v in init:
        weights.append(flat[at:at + v.size].reshape(v.shape))
        at += v.size
    assert at == flat.size, f"libdist has {flat.size} weights, Keras {at}"
    return losses, weights


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(tag, names, ours_losses, ours, init, ref_losses, ref, unbounded=()):
    loss_err = np.abs(ours_losses - ref_losses) / np.abs(ref_losses)
    errs = {n: rel(o, r) for n, o, r in zip(names, ours, ref)}
    # Variables that start at zero and stay there in the reference (norm below STILL_ABS):
    # attention's key bias, whose gradient is zero in exact arithmetic (the softmax over the
    # keys ignores a shift common to every key), moves by rounding alone (~1e-12 here), so a
    # relative error means nothing; libdist's must stay within STILL_ABS of its start too.
    still = {n for n, r in zip(names, ref)
             if np.linalg.norm(np.asarray(r, np.float64)) <= STILL_ABS}
    still_bad = [n for n, o, i in zip(names, ours, init)
                 if n in still and np.linalg.norm(np.asarray(o, np.float64) - i) > STILL_ABS]
    bounded = {n: e for n, e in errs.items()
               if not any(u in n for u in unbounded) and n not in still}
    worst = max(bounded, key=bounded.get)
    # every kernel that trained (the reference moved it by >= MOVED_MIN relative) moved at
    # least 5x farther than its distance to the reference; a kernel the reference barely moves
    # (the first attention block's query kernel over the small embeddings: ~3e-8 in 20 steps,
    # the softmax nearly uniform) is held by the weight bound alone, and named
    kernels = [i for i, n in enumerate(names) if n.endswith("kernel")]
    trained = [i for i in kernels if rel(ref[i], init[i]) >= MOVED_MIN]
    idle = [names[i] for i in kernels if i not in trained]
    moved = min(rel(ours[i], init[i]) for i in trained)
    kernel_err = max(errs[names[i]] for i in trained)
    ok = (loss_err.max() <= LOSS_TOL and bounded[worst] <= WEIGHT_TOL and moved > 5 * kernel_err
          and not still_bad)
    extra = ""
    if len(bounded) + len(still) < len(errs):
        free_ = {n: e for n, e in errs.items() if n not in bounded and n not in still}
        w = max(free_, key=free_.get)
        extra = f"; not bounded: {w} {free_[w]:.1e}"
    if still:
        extra += (f"; {len(still)} variable(s) the reference keeps at zero kept within "
                  f"{STILL_ABS:g} of their start: {', '.join(sorted(still))}"
                  f"{' (FAILED: ' + ', '.join(still_bad) + ')' if still_bad else ''}")
    if idle:
        extra += f"; kernels the reference moves < {MOVED_MIN:g}: {', '.join(idle)}"
    print(f"{'ok  ' if ok else 'FAIL'} {tag}: losses {ours_losses[0]:.4f} -> "
          f"{ours_losses[-1]:.4f}, worst {loss_err.max():.1e} at step {int(loss_err.argmax())} "
          f"(<= {LOSS_TOL:g}); weights worst {bounded[worst]:.1e} in {worst} "
          f"(<= {WEIGHT_TOL:g}), trained kernels moved >= {moved:.1e}{extra}")
    if not ok:
        for n in sorted(bounded, key=bounded.get, reverse=True)[:4]:
            i = names.index(n)
            print(f"     {n}: {errs[n]:.1e} from the reference, moved {rel(ours[i], init[i]):.1e}")
    return ok


def float32_head(K, model):
    """The model with Keras's mixed-precision advice applied: its logits through a float32
    Activation("linear") (so the loss is computed in float32, as libdist computes it)."""
    y = K.layers.Activation("linear", dtype="float32", name="float32_logits")(model.outputs[0])
    return K.Model(model.inputs, y, name=model.name)


def tf_rounds_like_libdist():
    """Whether TF's bfloat16 matmul on this CPU accumulates in float32 and rounds once (oneDNN's
    kernels, on CPUs with AVX512_BF16 or AMX), as libdist's kernels do; Eigen's, elsewhere,
    round partial sums."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((64, 512)).astype(np.float32)
    b = rng.standard_normal((512, 64)).astype(np.float32)
    ab, bb = tf.cast(a, tf.bfloat16), tf.cast(b, tf.bfloat16)
    got = tf.cast(tf.matmul(ab, bb), tf.float32).numpy()
    want = tf.cast(tf.cast(tf.matmul(tf.cast(ab, tf.float32), tf.cast(bb, tf.float32)),
                           tf.bfloat16), tf.float32).numpy()
    return bool(np.mean(got == want) > 0.99)


def main_mixed(driver, work, name, batch, steps, x, y, x_path, y_path, h, w, c):
    """The same steps under mixed_bfloat16, the policy read from tf_keras's own JSON."""
    n = steps * batch
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    tf_keras.utils.set_random_seed(5)
    tk = float32_head(tf_keras, build(tf_keras, name))
    names, init, json_path, init_path = write_model(tk, work, f"{name}_mixed_bfloat16.json")
    assert '"mixed_bfloat16"' in open(json_path).read(), "tf_keras wrote no mixed policy"
    out = os.path.join(work, "libdist")
    ours_losses, ours = run_driver(driver, json_path, init_path, x_path, y_path,
                                   (n, h, w, c), steps, batch, out, init)
    tk_losses = train(tk, tf_keras.optimizers.SGD(0.01, momentum=0.9),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y,
                      steps, batch, graph=True)
    k3 = float32_head(keras, build(keras, name))
    k3.set_weights(init)
    k3_losses = train(k3, keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y,
                      steps, batch, graph=True)
    ours_err = np.abs(ours_losses - tk_losses) / np.abs(tk_losses)
    spread = np.abs(k3_losses - tk_losses) / np.abs(tk_losses)
    print("     per step, libdist vs tf_keras: " + " ".join(f"{e:.0e}" for e in ours_err))
    print("     per step, Keras 3 vs tf_keras: " + " ".join(f"{e:.0e}" for e in spread))
    tk_w, k3_w = tk.get_weights(), [v.numpy() for v in k3.weights]
    # each variable within max(MIXED_WEIGHT_TOL, CHAOS_FACTOR x the two Kerases' own distance
    # there), as the float32 ResNet's one step: a bias is a sum over every row of rounded
    # gradients, and the attention's key bias has no gradient in exact arithmetic (it moves by
    # rounding alone), so there the references differ by as much as they move. Moving
    # variances: against Keras 3 (tf_keras's Bessel-corrected update, see the float32 case).
    # Each variable's movement over the steps (final - initial, so that a kernel that barely
    # moved cannot pass on its initial value) within max(MIXED_WEIGHT_TOL, CHAOS_FACTOR x the
    # two Kerases' distance there)
    bad, worst, worst_ratio = [], None, -1.0
    for nm, a, o, t, k in zip(names, init, ours, tk_w, k3_w):
        ref = k if "moving_variance" in nm else t
        if np.linalg.norm(np.asarray(ref, np.float64) - a) == 0:
            continue  # the reference did not move it (nothing to compare a movement with)
        k3_dist = rel(k - a, t - a)
        lim = max(MIXED_WEIGHT_TOL, CHAOS_FACTOR * k3_dist if "moving_variance" not in nm
                  else MIXED_WEIGHT_TOL)
        e = rel(o - a, ref - a)
        if e / lim > worst_ratio:
            worst, worst_ratio = f"{nm} {e:.1e} (bound {lim:.1e}; Keras 3 {k3_dist:.1e})", e / lim
        if e > lim:
            bad.append(f"{nm} {e:.1e} > {lim:.1e}")
    kernels = [i for i, nm in enumerate(names) if nm.endswith("kernel")]
    kw = max(kernels, key=lambda i: rel(ours[i], tk_w[i]))
    first = min(10, steps)
    ok = (ours_err[0] <= MIXED_FIRST_LOSS_TOL and ours_err.max() <= MIXED_LOSS_TOL and not bad)
    print(f"{'ok  ' if ok else 'FAIL'} mixed_bfloat16 vs tf_keras: losses {ours_losses[0]:.4f} -> "
          f"{ours_losses[-1]:.4f}; the first {ours_err[0]:.1e} (<= {MIXED_FIRST_LOSS_TOL:g}), "
          f"the first {first} {ours_err[:first].max():.1e}, every loss {ours_err.max():.1e} "
          f"(<= {MIXED_LOSS_TOL:g}; Keras 3 vs tf_keras {spread.max():.1e}); kernels worst "
          f"{names[kw]} {rel(ours[kw], tk_w[kw]):.1e} (Keras 3 {rel(k3_w[kw], tk_w[kw]):.1e}); "
          f"closest to its bound: {worst}; {len(bad)} variable(s) beyond max("
          f"{MIXED_WEIGHT_TOL:g}, {CHAOS_FACTOR}x the Keras distance)"
          f"{': ' + '; '.join(bad[:4]) if bad else ''}")
    # The forward pass, where the rounding is not lost in the steps' noise: libdist's inference
    # logits after the steps against tf_keras's on libdist's trained weights, under
    # mixed_bfloat16 and under float32
    ours_logits = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32)
    tk.set_weights(ours)
    tk_mixed = tf.function(lambda t: tk(t, training=False))(tf.constant(x[:batch]))
    tk_mixed = tk_mixed.numpy().astype(np.float32)
    tf_keras.mixed_precision.set_global_policy("float32")
    tf32 = build(tf_keras, name)
    tf32.set_weights(ours)
    tk_f32 = tf.function(lambda t: tf32(t, training=False))(tf.constant(x[:batch])).numpy()
    tf_keras.mixed_precision.set_global_policy("mixed_bfloat16")
    e_mixed = rel(ours_logits.reshape(tk_mixed.shape), tk_mixed)
    e_f32 = rel(ours_logits.reshape(tk_mixed.shape), tk_f32)
    e_ref = rel(tk_mixed, tk_f32)
    if tf_rounds_like_libdist() and name == "mlp":
        # TF's bfloat16 products accumulate in float32 and round once (oneDNN's kernels): a
        # model of Dense layers on 2-D inputs gives the same bits
        fwd_ok = e_mixed <= 1e-6
        print(f"{'ok  ' if fwd_ok else 'FAIL'} forward: libdist's logits vs tf_keras "
              f"mixed_bfloat16 {e_mixed:.1e} (<= 1e-06), vs tf_keras float32 {e_f32:.1e}; "
              f"tf_keras mixed_bfloat16 vs float32 {e_ref:.1e}")
    else:
        # The Transformer's Dense layers on [batch, seq, features] run tensordot + BiasAdd in
        # TF (rounded twice, once in libdist), its GELU and attention differ by a few values
        # each; the logits, rounded again, turn any one into a whole bfloat16 step. Each layer
        # is held to TF, forward and one step, in conformance.keras_layers_mixed_bfloat16.
        fwd_ok = True
        print(f"note forward: libdist's logits vs tf_keras mixed_bfloat16 {e_mixed:.1e}, vs "
              f"tf_keras float32 {e_f32:.1e}; tf_keras mixed_bfloat16 vs float32 {e_ref:.1e} "
              f"(each layer: conformance.keras_layers_mixed_bfloat16)")
    ok = ok and fwd_ok
    # libdist's .keras carries the policy: Keras 3 loads a mixed_bfloat16 model
    loaded = keras.models.load_model(os.path.join(out, "final.keras"))
    policies = {lay.dtype_policy.name for lay in loaded.layers if lay.weights}
    head = loaded.layers[-1].dtype_policy.name
    want = loaded(x[:batch], training=False).numpy().astype(np.float32)
    e = rel(ours_logits.reshape(want.shape), want)
    good = e <= MIXED_LOGIT_TOL and policies == {"mixed_bfloat16"} and head == "float32"
    print(f"{'ok  ' if good else 'FAIL'} .keras: keras.models.load_model gives layers with "
          f"weights under {sorted(policies)} and a {head} head, logits vs libdist's {e:.1e} "
          f"(<= {MIXED_LOGIT_TOL:g})")
    tf_keras.mixed_precision.set_global_policy("float32")
    keras.mixed_precision.set_global_policy("float32")
    return 0 if ok and good else 1


def main():
    driver, work, name, batch = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    steps = int(sys.argv[5]) if len(sys.argv) > 5 else 20
    policy = sys.argv[6] if len(sys.argv) > 6 else "float32"
    assert policy in ("float32", "mixed_bfloat16"), f"policy {policy}"
    shape, dtype = zoo.ZOO[name][0], zoo.ZOO[name][1]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    n = steps * batch
    rng = np.random.default_rng(35)
    if dtype == "int32":
        x = rng.integers(0, zoo.VOCAB, (n,) + shape).astype(np.int32)
        y = rng.integers(0, 2, n).astype(np.int32)
        x_path = os.path.join(work, "x.i32")
    else:
        x = rng.standard_normal((n,) + shape).astype(np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
        x_path = os.path.join(work, "x.f32")
    y_path = os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    h, w, c = (shape + (1, 1, 1))[:3]  # (SEQ,) ids: the driver's H = SEQ, W = C = 1
    print(f"{name}, batch {batch}, {steps} steps, {policy}; TensorFlow {tf.__version__}, "
          f"tf_keras {tf_keras.__version__}, Keras {keras.__version__}")
    if policy == "mixed_bfloat16":
        return main_mixed(driver, work, name, batch, steps, x, y, x_path, y_path, h, w, c)

    tf_keras.utils.set_random_seed(5)
    tk = build(tf_keras, name)
    names, init, json_path, init_path = write_model(tk, work, f"{name}.json")
    out = os.path.join(work, "libdist")
    ours_losses, ours = run_driver(driver, json_path, init_path, x_path, y_path,
                                   (n, h, w, c), steps, batch, out, init)

    tk_losses = train(tk, tf_keras.optimizers.SGD(0.01, momentum=0.9),
                      tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y,
                      steps, batch)
    k3 = build(keras, name)
    k3.set_weights(init)
    k3_losses = train(k3, keras.optimizers.SGD(0.01, momentum=0.9),
                      keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y,
                      steps, batch)
    spread = np.abs(k3_losses - tk_losses) / np.abs(tk_losses)
    ours_err = np.abs(ours_losses - tk_losses) / np.abs(tk_losses)
    print(f"note Keras 3 vs tf_keras themselves: losses worst {spread.max():.1e} at step "
          f"{int(spread.argmax())}")
    print("     per step, libdist vs tf_keras: " + " ".join(f"{e:.0e}" for e in ours_err))
    print("     per step, Keras 3 vs tf_keras: " + " ".join(f"{e:.0e}" for e in spread))
    if spread.max() <= LOSS_TOL:
        # the references agree to the bounds: libdist is held to them
        ok = compare("vs tf_keras", names, ours_losses, ours, init, tk_losses, tk.get_weights(),
                     unbounded=("moving_variance",))
        if any("moving_variance" in n for n in names):
            ok = compare("vs Keras 3 (moving variance bounded)", names, ours_losses, ours, init,
                         k3_losses, [v.numpy() for v in k3.weights]) and ok
    else:
        # A deep network at a small batch amplifies rounding step by step (Keras 3 and tf_keras
        # drift apart as far): libdist is held to the bounds after one step, and over
        # the steps to CHAOS_FACTOR x the references' own drift so far (running maximum).
        one_losses, one_w = run_driver(driver, json_path, init_path, x_path, y_path,
                                       (n, h, w, c), 1, batch,
                                       os.path.join(work, "libdist_one_step"), init)
        k1 = build(keras, name)
        k1.set_weights(init)
        k1_losses = train(k1, keras.optimizers.SGD(0.01, momentum=0.9),
                          keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y, 1,
                          batch)
        t1 = build(tf_keras, name)
        t1.set_weights(init)
        train(t1, tf_keras.optimizers.SGD(0.01, momentum=0.9),
              tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True), x, y, 1, batch)
        k1_w, t1_w = [v.numpy() for v in k1.weights], t1.get_weights()
        one_loss_err = abs(one_losses[0] - k1_losses[0]) / abs(k1_losses[0])
        # A variable whose step is a near-cancelling sum (a BatchNormalization's beta before an
        # Add) has a relative error far above 2e-4 in either Keras against the other: each is
        # held to max(2e-4, CHAOS_FACTOR x the Keras 3 / tf_keras distance of that variable).
        bad = []
        for nm, o, k, t in zip(names, one_w, k1_w, t1_w):
            if "moving_variance" in nm:
                continue  # tf_keras's Bessel correction; bounded against Keras 3 below
            lim = max(WEIGHT_TOL, CHAOS_FACTOR * rel(t, k))
            if rel(o, k) > lim:
                bad.append(f"{nm} {rel(o, k):.1e} > {lim:.1e}")
        mv = [rel(o, k) for nm, o, k in zip(names, one_w, k1_w) if "moving_variance" in nm]
        mv_worst = max(mv) if mv else 0.0
        errs = {nm: rel(o, k) for nm, o, k in zip(names, one_w, k1_w)}
        wn = max(errs, key=errs.get)
        ok = one_loss_err <= LOSS_TOL and not bad and mv_worst <= WEIGHT_TOL
        print(f"{'ok  ' if ok else 'FAIL'} one step vs Keras 3: loss {one_loss_err:.1e} "
              f"(<= {LOSS_TOL:g}); moving variances {mv_worst:.1e} (<= {WEIGHT_TOL:g}); worst "
              f"variable {wn} {errs[wn]:.1e} (Keras 3 vs tf_keras there "
              f"{rel(t1_w[names.index(wn)], k1_w[names.index(wn)]):.1e}); "
              f"{len(bad)} variable(s) beyond max({WEIGHT_TOL:g}, {CHAOS_FACTOR}x the Keras "
              f"distance){': ' + '; '.join(bad[:4]) if bad else ''}")
        envelope = np.maximum(LOSS_TOL, CHAOS_FACTOR * np.maximum.accumulate(spread))
        within = bool(np.all(ours_err <= envelope))
        worst = int(np.argmax(ours_err / envelope))
        print(f"{'ok  ' if within else 'FAIL'} {steps} steps vs tf_keras: every loss within "
              f"{CHAOS_FACTOR}x the Keras 3 / tf_keras drift so far (worst step {worst}: "
              f"{ours_err[worst]:.1e} <= {envelope[worst]:.1e})")
        ok = ok and within

    # libdist's files of the trained model in Keras 3: the .keras (its own Functional
    # config.json, MultiHeadAttention included) through keras.models.load_model, and the
    # .weights.h5 into the zoo's Keras 3 model; each gives libdist's inference logits on the
    # first batch (after the steps) within LOGIT_TOL
    ours_logits = np.fromfile(os.path.join(out, "logits.f32"), dtype=np.float32)
    loaded = keras.models.load_model(os.path.join(out, "final.keras"))
    want = loaded(x[:batch], training=False).numpy()
    e = rel(ours_logits.reshape(want.shape), want)
    # a stack (the MLP) is written as a Sequential, a graph as a Functional
    good = e <= LOGIT_TOL and type(loaded).__name__ in ("Functional", "Sequential")
    print(f"{'ok  ' if good else 'FAIL'} .keras: keras.models.load_model gives a "
          f"{type(loaded).__name__} whose logits vs libdist's {e:.1e} (<= {LOGIT_TOL:g})")
    back = build(keras, name)
    back.load_weights(os.path.join(out, "final.weights.h5"))
    want = back(x[:batch], training=False).numpy()
    e2 = rel(ours_logits.reshape(want.shape), want)
    print(f"{'ok  ' if e2 <= LOGIT_TOL else 'FAIL'} .weights.h5 into the zoo's Keras 3 model: "
          f"logits vs libdist's {e2:.1e} (<= {LOGIT_TOL:g})")
    ok = ok and good and e2 <= LOGIT_TOL
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
