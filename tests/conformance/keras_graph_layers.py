"""The layers of Functional models against Keras 3 itself, on the same weights and inputs.

Keras 3 (the conformance venv) builds, from a fixed seed, a Functional model that uses every
layer libdist reads for graphs, with every weight (biases, gamma and beta included) then drawn
by NumPy:

  x (8, 8, 3) -> Rescaling(1/2, offset 0.25) -> ZeroPadding2D(((1, 0), (0, 1))) -> c1
  Conv2D(6, 3) -> a = ReLU;  b = Conv2D(6, 3, same, silu)(a);  c = Activation(gelu)(a)
  Subtract([b, c]); Multiply([a, b]); Average([a, b, c]); Maximum([b, c, a]); Minimum([a, c])
  (ties where a = 0 = gelu(a)); PReLU(shared_axes=[1, 2])(sub); Add([prelu, mul, avg, max,
  min]);
  Concatenate(axis=-1)([add, a]) -> LayerNormalization -> Cropping2D(((1, 0), (0, 2))) ->
  MaxPooling2D((3, 2), strides=(2, 1), same) -> Conv2DTranspose(4, (3, 2), strides=(2, 1),
  same, relu) -> Conv2DTranspose(3, (2, 1), strides=(1, 2)) -> UpSampling2D((2, 3)) ->
  AveragePooling2D((2, 3), strides=(1, 2), same) -> GlobalMaxPooling2D, concatenated with x ->
  Reshape((64, 3)) -> Cropping1D((3, 6)) -> UpSampling1D(3) -> AveragePooling1D(3, 2, same) ->
  Permute((2, 1)) -> GlobalAveragePooling1D; then d =
  Dense(12, swish) -> PReLU; Reshape((3, 4)) -> Softmax -> Reshape((12,)) -> Multiply with d ->
  Activation(swish) -> Activation(softmax) -> Dense(4)

`a` is read by six layers. Two classifier heads that end in a softmax follow the same body
(dense_softmax: GlobalMaxPooling2D -> Dense(4, activation="softmax"); softmax_layer: ... ->
Dense(4) -> Activation("softmax")): Keras trains them with
SparseCategoricalCrossentropy(from_logits=False); libdist returns the logits under the softmax
(dist_model_output_is_softmax), so the driver's logits are compared through a softmax with
Keras's probabilities, and its gradients (of the cross-entropy from those logits) with Keras's
from_logits=False gradients.

Keras writes model.to_json() and save_weights(); the keras_layers
driver (keras_layers.c) builds the model from the JSON, loads the weights, and writes its
logits in inference and the gradient of the mean sparse softmax cross-entropy of every
variable; Keras computes the same with tf.GradientTape at float32 and at float64 (every
layer's dtype and keras floatx float64: the exact reference), as conformance.keras_layers.
Bounds, relative (||libdist - keras|| / max(||libdist||, ||keras||), per variable, the
denominator at least 10% of the whole gradient's norm): 1e-5 against float64 Keras, 1e-4
against float32 Keras (conformance.keras_layers says why two).

Then libdist writes each model back as a .keras file (the keras_functional driver with 0 training
steps: dist_model_save_keras, Keras's Functional config of every layer above and the weights it
loaded): keras.models.load_model opens it and predicts what the original Keras model predicts,
within 1e-5 relative.

Usage: keras_graph_layers.py DRIVER WORKDIR [SAVER]
  DRIVER: the keras_layers executable; SAVER: the keras_functional executable (the .keras check)
"""
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

N, H, W, C, K = 16, 8, 8, 3, 4
TOL, TOL_F32, FLOOR = 1e-5, 1e-4, 0.1


def body(L, x):
    h = L.Rescaling(0.5, offset=0.25, name="rescale")(x)
    h = L.ZeroPadding2D(((1, 0), (0, 1)), name="pad")(h)
    h = L.Conv2D(6, 3, name="c1")(h)
    a = L.ReLU(name="a")(h)
    b = L.Conv2D(6, 3, padding="same", activation="silu", name="b")(a)
    c = L.Activation("gelu", name="c")(a)
    sub = L.Subtract(name="sub")([b, c])
    mul = L.Multiply(name="mul")([a, b])
    avg = L.Average(name="avg")([a, b, c])
    # ties where a = 0 (ReLU's zeros) and c = gelu(0) = 0: the gradient goes to the earlier side
    mx = L.Maximum(name="max")([b, c, a])
    mn = L.Minimum(name="min")([a, c])
    pr = L.PReLU(shared_axes=[1, 2], name="prelu")(sub)  # one alpha per channel
    add = L.Add(name="add")([pr, mul, avg, mx, mn])
    h = L.Concatenate(axis=-1, name="cat")([add, a])
    h = L.LayerNormalization(epsilon=1e-3, name="ln")(h)
    h = L.Cropping2D(((1, 0), (0, 2)), name="crop2d")(h)
    # 6x5 -> 3x5: rectangular windows that overlap, strides of their own, same padding
    h = L.MaxPooling2D((3, 2), strides=(2, 1), padding="same", name="mp2d")(h)
    # 3x5 -> 6x5 -> 7x10 (valid, a kernel narrower than its stride along the width)
    h = L.Conv2DTranspose(4, (3, 2), strides=(2, 1), padding="same", activation="relu",
                          name="ct1")(h)
    h = L.Conv2DTranspose(3, (2, 1), strides=(1, 2), name="ct2")(h)
    h = L.UpSampling2D((2, 3), name="up2d")(h)  # -> 14x30
    h = L.AveragePooling2D((2, 3), strides=(1, 2), padding="same", name="ap2d")(h)  # -> 14x15
    h = L.GlobalMaxPooling2D(name="gmp")(h)
    # the input again, as 64 steps of 3: Reshape -> Cropping1D -> AveragePooling1D (same: the
    # last window's mean over the steps it covers) -> Permute -> GlobalAveragePooling1D
    e = L.Reshape((64, 3), name="seq")(x)
    e = L.Cropping1D((3, 6), name="crop1d")(e)
    e = L.UpSampling1D(3, name="up1d")(e)
    e = L.AveragePooling1D(3, strides=2, padding="same", name="avg1d")(e)
    e = L.Permute((2, 1), name="swap")(e)
    e = L.GlobalAveragePooling1D(name="gap1d")(e)
    return L.Concatenate(name="both")([h, e])


def make(head):
    L = keras.layers
    x = keras.Input((H, W, C), name="x")
    h = body(L, x)
    if head == "dense_softmax":
        y = L.Dense(K, activation="softmax", name="out")(h)
    elif head == "softmax_layer":
        y = L.Activation("softmax", name="probs")(L.Dense(K, name="out")(h))
    else:
        d = L.Dense(12, activation="swish", name="d")(h)
        d = L.PReLU(name="prelu_d")(d)  # an alpha per unit
        s = L.Reshape((3, 4), name="rows")(d)
        s = L.Softmax(name="softmax")(s)
        s = L.Reshape((12,), name="flat")(s)
        h = L.Multiply(name="gate")([s, d])
        h = L.Activation("swish", name="sw")(h)
        h = L.Activation("softmax", name="probs")(h)
        y = L.Dense(K, name="out")(h)
    return keras.Model(x, y, name=head)


def softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def rel(a, b, floor=0.0):
    d = float(np.linalg.norm(a - b))
    m = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), floor)
    return d / m if m > 0 else d


def keras_reference(json_path, weights_path, x, y, floatx, from_logits):
    keras.config.set_floatx(floatx)
    try:
        with open(json_path) as f:
            model = keras.models.model_from_json(f.read().replace('"float32"', f'"{floatx}"'))
        model.load_weights(weights_path)
        xs = x.astype(floatx)
        logits = model(xs, training=False).numpy().astype(np.float64)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=from_logits)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(xs, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        return logits, [(v.path, tuple(v.shape), g.numpy().astype(np.float64))
                        for v, g in zip(model.trainable_weights, grads)]
    finally:
        keras.config.set_floatx("float32")


def keras_file_check(saver, work, head, json_path, wpath, x_path, y_path, model, x,
                     shape=(N, H, W, C)):
    """libdist's .keras file of the model (no training steps; the driver's N x H x W x C inputs)
    opens in Keras and predicts the original model's outputs (also keras_layers.py's)."""
    n, h, w, c = shape
    out = os.path.join(work, f"{head}_saved")
    os.makedirs(out, exist_ok=True)
    r = subprocess.run([saver, json_path, wpath, x_path, y_path, str(n), str(h), str(w), str(c),
                        "0", str(n), out], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {head}: writing the .keras file ({r.returncode}): {r.stderr.strip()}")
        return False
    loaded = keras.models.load_model(os.path.join(out, "final.keras"))
    e = rel(loaded(x, training=False).numpy().astype(np.float64),
            model(x, training=False).numpy().astype(np.float64))
    ok = e <= TOL
    print(f"{'ok  ' if ok else 'FAIL'} {head}: libdist's .keras file, loaded by Keras, predicts "
          f"the original model's outputs within {e:.2e} (bound {TOL:g})")
    return ok


def main():
    driver, work = sys.argv[1], sys.argv[2]
    saver = sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(36)
    x = rng.standard_normal((N, H, W, C)).astype(np.float32)
    y = rng.integers(0, K, N).astype(np.int32)
    x_path, y_path = os.path.join(work, "x.f32"), os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    failures = 0
    for head in ("graph_layers", "dense_softmax", "softmax_layer"):
        keras.utils.set_random_seed(12)
        model = make(head)
        model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                           for w in model.get_weights()])
        failures += not run_case(driver, work, head, model, x, y, x_path, y_path)
        if saver:
            failures += not keras_file_check(saver, work, head,
                                             os.path.join(work, f"{head}.json"),
                                             os.path.join(work, f"{head}.weights.h5"),
                                             x_path, y_path, model, x)
    sys.exit(1 if failures else 0)


def run_case(driver, work, head, model, x, y, x_path, y_path):
    json_path = os.path.join(work, f"{head}.json")
    wpath = os.path.join(work, f"{head}.weights.h5")
    with open(json_path, "w") as f:
        f.write(model.to_json())
    model.save_weights(wpath)
    lpath, gpath = os.path.join(work, f"{head}.logits"), os.path.join(work, f"{head}.grads")
    r = subprocess.run([driver, json_path, wpath, x_path, y_path, str(N), str(H), str(W), str(C),
                        lpath, gpath], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"driver failed ({r.returncode}) on {head}:\n{r.stderr}")
    probs = head != "graph_layers"
    got = np.fromfile(lpath, dtype=np.float32).astype(np.float64).reshape(N, K)
    if probs:
        got = softmax(got)
    flat = np.fromfile(gpath, dtype=np.float32).astype(np.float64)
    ok, line, worst = True, "", {}
    for floatx, bound in (("float64", TOL), ("float32", TOL_F32)):
        want, grads = keras_reference(json_path, wpath, x, y, floatx, from_logits=not probs)
        worst[floatx] = rel(got, want)
        ok = ok and worst[floatx] <= bound
        whole = float(np.sqrt(sum(np.sum(g * g) for _, _, g in grads)))
        at = 0
        for path, shape, g in grads:
            mine = flat[at:at + int(np.prod(shape))].reshape(shape)
            at += mine.size
            e = rel(mine, g, FLOOR * whole)
            worst[floatx] = max(worst[floatx], e)
            if e > bound:
                ok = False
                line += f"; {path} gradient vs {floatx} {e:.2e}"
        ok = ok and at == flat.size
    what = "probabilities" if probs else "logits"
    print(f"{'ok  ' if ok else 'FAIL'} {head}: worst {what} and gradients vs float64 Keras "
          f"{worst['float64']:.2e} (bound {TOL:g}), vs float32 Keras {worst['float32']:.2e} "
          f"(bound {TOL_F32:g})" + line)
    return ok

if __name__ == "__main__":
    main()
