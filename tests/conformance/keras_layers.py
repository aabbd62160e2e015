"""The layers of unit.layers against Keras 3 itself, on the same weights and inputs.

Two Sequential models are made by Keras 3 (the conformance venv) from fixed seeds, every
weight (biases included) then drawn by NumPy so that no bias is zero:

  activations_pooling: Conv2D(6, 3, same, sigmoid) -> BatchNormalization ->
      AveragePooling2D(2) -> Conv2D(8, 3, tanh) -> AveragePooling2D(3, strides=1, same) ->
      Conv2D(8, 2, gelu) -> GlobalAveragePooling2D -> Dense(12, gelu) ->
      BatchNormalization(momentum=0.9, center=False) -> Dense(5, tanh) -> Dense(4)
  with_dropout: the same with Dropout(0.4) after the global pooling.
  with_dropout_functional: with_dropout as a Keras 3 Functional model, whose JSON records each
      dropout's call with {"training": false}.
  conv_variants: Conv2D(8, 3, dilation_rate=2, same, tanh) -> Conv2D(8, 3, groups=2, relu) ->
      DepthwiseConv2D(3, depth_multiplier=2, same, sigmoid) ->
      SeparableConv2D(8, 3, depth_multiplier=2, dilation_rate=2, gelu) ->
      DepthwiseConv2D(3, strides=2, same) -> GlobalAveragePooling2D -> Dense(4)
  sequence: Reshape((144, 3)) -> Conv1D(6, 3, causal, dilation_rate=2, tanh) -> MaxPooling1D(2)
      -> Conv1D(8, 3, strides=2, same, relu) -> MaxPooling1D(3, strides=2, same) ->
      Conv1D(8, 5, groups=2) -> MaxPooling1D(2, strides=1) -> GlobalAveragePooling1D -> Dense(4)
  keras_activations: Conv2D(elu) -> ELU(0.5) -> Conv2D(selu) -> LeakyReLU(0.2) ->
      Conv2D(softplus) -> ReLU(max_value=6) -> Conv2D(softsign) -> GlobalAveragePooling2D ->
      Dense(mish) -> ReLU(max_value=0.5) -> Dense(exponential) -> ReLU(negative_slope=0.1) ->
      Dense(selu) -> Activation(softplus) -> Dense(4)
  keras3_activations (Keras 3 only: tf_keras has none of these names, or another function of
      it): Conv2D(relu6) -> Conv2D(leaky_relu) -> Conv2D(hard_silu) -> GlobalAveragePooling2D ->
      Dense -> Activation(relu6) -> Dense(hard_sigmoid) -> Dense -> Activation(leaky_relu) ->
      Dense -> Activation(hard_swish) -> Dense(4)
  sequence_max: Reshape((144, 3)) -> Conv1D(8, 5, elu) -> MaxPooling1D(2) ->
      Conv1D(8, 3, softsign) -> GlobalMaxPooling1D -> Dense(4)
  keras3_piecewise (Keras 3 only): Conv2D(hard_tanh) -> Conv2D(soft_shrink) ->
      GlobalAveragePooling2D -> Dense(sparse_plus) -> Dense(tanh_shrink) -> Activation(hard_shrink)
      -> Dense(log_sigmoid) -> Dense(sparse_sigmoid) -> Dense -> Activation(log_softmax) -> Dense(4)
  tf_keras_hard_sigmoid (tf_keras only): Conv2D(hard_sigmoid) -> GlobalAveragePooling2D ->
      Dense(hard_sigmoid) -> Dense -> Activation(hard_sigmoid) -> Dense(4), tf_keras's JSON
      (its keras_version 2.x selects tf_keras's function) against tf_keras itself at float64
      and float32, with the weights of a Keras 3 twin (linear activations) in its file
conv_variants, sequence, keras_activations and sequence_max are also built by tf_keras (Keras 2): its JSON, with
the same weights file, must give
the same logits and gradients (its configs name the same arguments differently and add some);
and, given the keras_functional driver (SAVER), libdist writes each as a .keras file
(dist_model_save_keras) that Keras's load_model opens and that predicts the original's outputs.

Keras writes model.to_json() and model.save_weights(); the driver (keras_layers.c) builds the
model from the JSON, loads the weights, and writes its logits in inference and the gradient of
the mean sparse softmax cross-entropy of every variable. Keras computes the same: logits by
model(x, training=False), gradients with tf.GradientTape of
SparseCategoricalCrossentropy(from_logits=True) over model(x, training=True), twice: as saved
(float32) and with the same JSON, weights and inputs at float64 (keras floatx and every
layer's dtype float64), the exact reference.

Bounds, relative (||libdist - keras|| / max(||libdist||, ||keras||), per variable):
  - against float64 Keras: 1e-5, the denominator at least 10% of the whole gradient's norm;
  - against float32 Keras: 1e-4, the same denominator.
Why two: the gradients through BatchNormalization carry float32 rounding of about 1e-5 in
TensorFlow itself (measured against float64: 1.8e-5 for the first BatchNormalization's gamma,
whose gradient TensorFlow forms as sum(dy * x) - mean * sum(dy); libdist sums in double,
3e-7), so libdist and float32 TensorFlow differ by up to ~3e-5 while each is within that of the
exact value. The floor: a bias that feeds a BatchNormalization almost only through a near-linear
activation has a gradient that nearly cancels (mathematically zero for a shift); its own norm
(2% of the whole) makes its relative error rounding noise on both sides (float32 TensorFlow is
5e-5 from float64 there). The Dropout model's gradients are not compared: in training its
masks are libdist's own draws, not TensorFlow's; in inference both are the identity (and
BatchNormalization uses the moving statistics), and its logits are compared.

Usage: keras_layers.py DRIVER WORKDIR [SAVER]
"""
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras_graph_layers  # noqa: E402

N, H, W, C, K = 32, 12, 12, 3, 4
TOL = 1e-5     # against float64 Keras
TOL_F32 = 1e-4  # against float32 Keras (see above)
FLOOR = 0.1     # the denominator is at least this share of the whole gradient's norm


def make(dropout, functional=False):
    layers = [
        keras.Input((H, W, C)),
        keras.layers.Conv2D(6, 3, padding="same", activation="sigmoid"),
        keras.layers.BatchNormalization(),
        keras.layers.AveragePooling2D(2),
        keras.layers.Conv2D(8, 3, activation="tanh"),
    ]
    if dropout:  # SpatialDropout2D, then (below) Dropout: the identity in inference
        layers.append(keras.layers.SpatialDropout2D(0.3, seed=9))
    layers += [
        keras.layers.AveragePooling2D(3, strides=1, padding="same"),
        keras.layers.Conv2D(8, 2, activation="gelu"),
        keras.layers.GlobalAveragePooling2D(),
    ]
    if dropout:
        layers.append(keras.layers.Dropout(0.4, seed=5))
    layers += [
        keras.layers.Dense(12, activation="gelu"),
        keras.layers.BatchNormalization(momentum=0.9, center=False),
        keras.layers.Dense(5, activation="tanh"),
        keras.layers.Dense(K),
    ]
    if functional:  # Keras 3 records Dropout's training=False in each of its call nodes
        y = layers[0]
        for layer in layers[1:]:
            y = layer(y)
        return keras.Model(layers[0], y)
    return keras.Sequential(layers)


def make_conv_variants(k):
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Conv2D(8, 3, dilation_rate=2, padding="same", activation="tanh"),
        k.layers.Conv2D(8, 3, groups=2, activation="relu"),
        k.layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", activation="sigmoid"),
        k.layers.SeparableConv2D(8, 3, depth_multiplier=2, dilation_rate=2, activation="gelu"),
        k.layers.DepthwiseConv2D(3, strides=2, padding="same"),
        k.layers.GlobalAveragePooling2D(),
        k.layers.Dense(K),
    ])


def make_sequence(k):
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Reshape((H * W, C)),
        k.layers.Conv1D(6, 3, padding="causal", dilation_rate=2, activation="tanh"),
        k.layers.MaxPooling1D(2),
        k.layers.Conv1D(8, 3, strides=2, padding="same", activation="relu"),
        k.layers.MaxPooling1D(3, strides=2, padding="same"),
        k.layers.Conv1D(8, 5, groups=2),
        k.layers.MaxPooling1D(2, strides=1),
        k.layers.GlobalAveragePooling1D(),
        k.layers.Dense(K),
    ])


def make_keras_activations(k):
    # Keras's other activations, as strings and as layers; LeakyReLU's slope is positional
    # (tf_keras calls it alpha, Keras 3 negative_slope)
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Conv2D(6, 3, padding="same", activation="elu"),
        k.layers.ELU(alpha=0.5),
        k.layers.Conv2D(6, 3, activation="selu"),
        k.layers.LeakyReLU(0.2),
        k.layers.Conv2D(8, 3, activation="softplus"),
        k.layers.ReLU(max_value=6.0),
        k.layers.Conv2D(8, 3, padding="same", activation="softsign"),
        k.layers.GlobalAveragePooling2D(),
        k.layers.Dense(12, activation="mish"),
        k.layers.ReLU(max_value=0.5),
        k.layers.Dense(12, activation="exponential"),
        k.layers.ReLU(negative_slope=0.1),
        k.layers.Dense(10, activation="selu"),
        k.layers.Activation("softplus"),
        k.layers.Dense(K),
    ])


def make_sequence_max(k):
    # Keras's text CNN ending: Conv1D -> GlobalMaxPooling1D
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Reshape((H * W, C)),
        k.layers.Conv1D(8, 5, activation="elu"),
        k.layers.MaxPooling1D(2),
        k.layers.Conv1D(8, 3, activation="softsign"),
        k.layers.GlobalMaxPooling1D(),
        k.layers.Dense(K),
    ])


def make_keras3_activations(k):
    # the activation names only Keras 3 has, and its hard_sigmoid (relu6(x + 3) / 6; tf_keras's
    # is another function of that name: conformance.tape_ops checks it)
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Conv2D(6, 3, activation="relu6"),
        k.layers.Conv2D(6, 3, activation="leaky_relu"),
        k.layers.Conv2D(6, 3, activation="hard_silu"),
        k.layers.GlobalAveragePooling2D(),
        k.layers.Dense(12),
        k.layers.Activation("relu6"),
        k.layers.Dense(12, activation="hard_sigmoid"),
        k.layers.Dense(12),
        k.layers.Activation("leaky_relu"),
        k.layers.Dense(12),
        k.layers.Activation("hard_swish"),
        k.layers.Dense(K),
    ])


def make_keras3_piecewise(k):
    # Keras 3's piecewise activations and its log_sigmoid, tanh_shrink and log_softmax
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Conv2D(6, 3, activation="hard_tanh"),
        k.layers.Conv2D(6, 3, activation="soft_shrink"),
        k.layers.GlobalAveragePooling2D(),
        k.layers.Dense(12, activation="sparse_plus"),
        k.layers.Dense(12, activation="tanh_shrink"),
        k.layers.Activation("hard_shrink"),
        k.layers.Dense(12, activation="log_sigmoid"),
        k.layers.Dense(12, activation="sparse_sigmoid"),
        k.layers.Dense(12),
        k.layers.Activation("log_softmax"),
        k.layers.Dense(K),
    ])


def make_tf_keras_hard_sigmoid(k, act="hard_sigmoid"):
    # tf_keras's hard_sigmoid (clip(0.2 x + 0.5, 0, 1), not Keras 3's function of that name);
    # Keras 3 builds the same layers with act="linear" to write the weights file
    return k.Sequential([
        k.Input((H, W, C)),
        k.layers.Conv2D(6, 3, activation=act),
        k.layers.GlobalAveragePooling2D(),
        k.layers.Dense(12, activation=act),
        k.layers.Dense(12),
        k.layers.Activation(act),
        k.layers.Dense(K),
    ])


def tf_keras_reference(json_text, weights, x, y, floatx):
    """keras_reference's results from tf_keras itself, for a tf_keras JSON, with `weights` (the
    Keras 3 twin's, in the same layer order) set into it."""
    import tf_keras
    tf_keras.backend.set_floatx(floatx)
    try:
        model = tf_keras.models.model_from_json(json_text.replace('"float32"', f'"{floatx}"'))
        model.set_weights([w.astype(floatx) for w in weights])
        xs = x.astype(floatx)
        logits = model(xs, training=False).numpy().astype(np.float64)
        loss_fn = tf_keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(xs, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        return logits, [(v.name, tuple(v.shape), g.numpy().astype(np.float64))
                        for v, g in zip(model.trainable_weights, grads)]
    finally:
        tf_keras.backend.set_floatx("float32")


def tf_keras_json(builder):
    import tf_keras
    tf_keras.utils.set_random_seed(11)
    return builder(tf_keras).to_json()


def rel(a, b, floor=0.0):
    d = float(np.linalg.norm(a - b))
    m = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), floor)
    return d / m if m > 0 else d


def keras_reference(json_path, weights_path, x, y, floatx):
    """Logits (inference) and, for every variable in file order (layer by layer), its gradient
    (None for the moving statistics) at `floatx`."""
    keras.config.set_floatx(floatx)
    try:
        with open(json_path) as f:
            model = keras.models.model_from_json(f.read().replace('"float32"', f'"{floatx}"'))
        model.load_weights(weights_path)
        xs = x.astype(floatx)
        logits = model(xs, training=False).numpy().astype(np.float64)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(xs, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        by_id = {id(v): g.numpy().astype(np.float64)
                 for v, g in zip(model.trainable_weights, grads)}
        return logits, [(v.path, tuple(v.shape), by_id.get(id(v)))
                        for layer in model.layers for v in layer.weights]
    finally:
        keras.config.set_floatx("float32")


def main():
    driver, work = sys.argv[1], sys.argv[2]
    saver = sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(2026)
    x = rng.standard_normal((N, H, W, C)).astype(np.float32)
    y = rng.integers(0, K, N).astype(np.int32)
    x_path, y_path = os.path.join(work, "x.f32"), os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    failures = 0
    cases = (("activations_pooling", lambda: make(False), True, None),
             ("with_dropout", lambda: make(True), False, None),
             ("with_dropout_functional", lambda: make(True, functional=True), False, None),
             ("conv_variants", lambda: make_conv_variants(keras), True, make_conv_variants),
             ("sequence", lambda: make_sequence(keras), True, make_sequence),
             ("keras_activations", lambda: make_keras_activations(keras), True,
              make_keras_activations),
             ("keras3_activations", lambda: make_keras3_activations(keras), True, None),
             ("keras3_piecewise", lambda: make_keras3_piecewise(keras), True, None),
             ("sequence_max", lambda: make_sequence_max(keras), True, make_sequence_max),
             # Keras 3 writes the weights; the JSON and the reference are tf_keras's (below)
             ("tf_keras_hard_sigmoid", lambda: make_tf_keras_hard_sigmoid(keras, "linear"), True,
              None))
    for name, build, with_grads, tf_keras_builder in cases:
        keras.utils.set_random_seed(11)
        model = build()
        # every weight drawn, moving variances positive (layer.weights: Keras's file order)
        model.set_weights([rng.uniform(*((0.5, 1.5) if "moving_variance" in v.path
                                         else (-0.6, 0.6)), v.shape).astype(np.float32)
                           for layer in model.layers for v in layer.weights])
        json_path = os.path.join(work, f"{name}.json")
        with open(json_path, "w") as f:
            f.write(model.to_json())
        wpath = os.path.join(work, f"{name}.weights.h5")
        model.save_weights(wpath)
        if name == "tf_keras_hard_sigmoid":  # tf_keras's JSON against tf_keras itself
            tfk_text = tf_keras_json(make_tf_keras_hard_sigmoid)
            json_path = os.path.join(work, f"{name}.tf_keras.json")
            with open(json_path, "w") as f:
                f.write(tfk_text)
            refs = {floatx: tf_keras_reference(tfk_text, model.get_weights(), x, y, floatx)
                    for floatx in ("float64", "float32")}
        else:
            refs = {floatx: keras_reference(json_path, wpath, x, y, floatx)
                    for floatx in ("float64", "float32")}
        runs = [(name, json_path)]
        if tf_keras_builder:
            tfk_path = os.path.join(work, f"{name}.tf_keras.json")
            with open(tfk_path, "w") as f:
                f.write(tf_keras_json(tf_keras_builder))
            runs.append((f"{name} (tf_keras JSON)", tfk_path))
        for label, jpath in runs:
            tag = label.replace(" ", "_").replace("(", "").replace(")", "")
            lpath = os.path.join(work, f"{tag}.logits")
            gpath = os.path.join(work, f"{tag}.grads")
            r = subprocess.run([driver, jpath, wpath, x_path, y_path, str(N), str(H), str(W),
                                str(C), lpath, gpath], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"driver failed ({r.returncode}) on {label}:\n{r.stderr}")
            got = np.fromfile(lpath, dtype=np.float32).astype(np.float64)
            flat = np.fromfile(gpath, dtype=np.float32).astype(np.float64)
            ok, line, worst = True, "", {}
            for floatx, bound in (("float64", TOL), ("float32", TOL_F32)):
                want, grads = refs[floatx]
                e = rel(got.reshape(want.shape), want)
                ok = ok and e <= bound
                worst[floatx] = e
                if not with_grads:
                    continue
                whole = float(np.sqrt(sum(np.sum(g * g) for _, _, g in grads if g is not None)))
                at = 0
                for path, shape, g in grads:
                    mine = flat[at:at + int(np.prod(shape))].reshape(shape)
                    at += mine.size
                    if g is None:  # moving statistics: no gradient, libdist's is zero
                        ok = ok and not np.any(mine)
                        continue
                    e = rel(mine, g, FLOOR * whole)
                    worst[floatx] = max(worst[floatx], e)
                    if e > bound:
                        ok = False
                        line += f"; {path} gradient vs {floatx} {e:.2e}"
                ok = ok and at == flat.size
            what = "logits and gradients" if with_grads else "logits"
            line = (f"worst {what} vs float64 Keras {worst['float64']:.2e} (bound {TOL:g}), "
                    f"vs float32 Keras {worst['float32']:.2e} (bound {TOL_F32:g})" + line)
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {label}: {line}")
        # the .keras file: of the models tf_keras also builds, and of the Keras 3-only names
        # (hard_sigmoid, hard_silu; SpatialDropout2D)
        if saver and (tf_keras_builder or name in ("with_dropout", "with_dropout_functional",
                                                   "keras3_activations", "keras3_piecewise")):
            failures += not keras_graph_layers.keras_file_check(
                saver, work, name, json_path, wpath, x_path, y_path, model, x, (N, H, W, C))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
