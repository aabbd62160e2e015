"""A text classifier's layers against Keras 3 itself, on the same weights and token ids.

Keras 3 (the conformance venv) builds a Functional model on int32 token ids (vocabulary 200,
sequences of 16):

  ids (16,) int32 -> Embedding(200, 32) -> Dense(32, gelu) on every step -> Add with the
  embeddings -> LayerNormalization -> GlobalAveragePooling1D -> Dense(4)

with every weight drawn by NumPy (some ids repeat in each sequence: the embedding gradient
adds their rows). Keras writes model.to_json() and save_weights(); the keras_text driver
(keras_text.c) builds the model from the JSON (the InputLayer's int32 dtype makes the model take
ids), loads the weights, and writes its logits in inference and the gradient of the mean sparse
softmax cross-entropy of every variable; Keras computes the same with tf.GradientTape at
float32 and at float64. Bounds as conformance.keras_graph_layers: relative, 1e-5 against
float64 Keras, 1e-4 against float32 Keras. Then a Transformer block (MultiHeadAttention
called as self-attention, post-norm residuals, a GELU feed-forward) the same way, and the
weights libdist writes back (its .weights.h5, MHA's sublayer groups included) load into Keras
unchanged. Then a recurrent stack the same way:

  ids -> Embedding(200, 12) -> LSTM(10, return_sequences) -> GRU(8, return_sequences,
  go_backwards) -> GRU(6, reset_after=False, return_sequences) -> SimpleRNN(7): its last
  state, concatenated with LSTM(5, go_backwards, use_bias=False) of the embeddings and with
  Bidirectional(LSTM(3), merge_mode="ave") of Bidirectional(GRU(4, return_sequences)) of
  them -> Dense(4)

(every gate, both GRU forms, outputs in go_backwards' order read by the next layer), and, with
SAVER, the .keras file libdist writes of it opens in Keras and predicts the same.

Masks (Embedding mask_zero=True) on ids with padding at the ends of sequences, a 0 inside one
and at the start of another: the first model's mask through Dense, the Add of two tensors of
one mask and LayerNormalization into GlobalAveragePooling1D's masked mean; and a masked
recurrent model (every cell kind skipping masked steps, go_backwards, zero_output_for_mask,
both Bidirectional forms, the mask passed on by return_sequences, Dense and a last-axis
Concatenate, dropped by Conv1D),
the same way and through its .keras file. The recurrent stack with dropout and
recurrent_dropout in an LSTM and a Bidirectional GRU: in inference Keras's logits (training draws
libdist's masks, not TensorFlow's). Refused by name: an LSTM with
a dropout rate of 1 (which Keras ignores), and masks reaching Softmax, a merge of a masked and an
unmasked input or the model's output. The Transformer block with the ids' mask as its attention
mask (Keras's query and value masks), with use_causal_mask, and with both into Flatten (the
padded query steps' rows, which keep no key, weigh every key equally, as Keras 3's), each
through its .keras file too; with attention dropout in inference (Keras 3 zeroes those rows on
its dropout path); Masking's mask as an attention mask.

Usage: keras_text.py DRIVER WORKDIR [SAVER]
  SAVER: the keras_functional executable (the .keras check)
"""
import os
import subprocess
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402
from keras_graph_layers import keras_file_check  # noqa: E402

N, T, V, D, K = 8, 16, 200, 32, 4
TOL, TOL_F32, FLOOR = 1e-5, 1e-4, 0.1


def make(mask_zero=False):
    L = keras.layers
    ids = keras.Input((T,), dtype="int32", name="ids")
    e = L.Embedding(V, D, mask_zero=mask_zero, name="embed")(ids)
    h = L.Dense(D, activation="gelu", name="ffn")(e)
    h = L.Add(name="residual")([e, h])
    h = L.LayerNormalization(epsilon=1e-6, name="ln")(h)
    h = L.GlobalAveragePooling1D(name="pool")(h)
    y = L.Dense(K, name="out")(h)
    return keras.Model(ids, y, name="text")


def make_transformer(cross=False, mask_zero=False, causal=False, flatten=False, dropout=0.0):
    """One encoder block (2 heads of 8, Keras's self-attention call with query and value the
    same tensor; key too in the second form), post-norm, GELU feed-forward. With mask_zero the
    ids' mask becomes the attention's (query and value masks), with causal use_causal_mask;
    flatten ends in Flatten (which drops the mask) instead of the masked mean, so the rows of
    padded query steps (no key kept: equal weights over all keys) reach the logits."""
    L = keras.layers
    ids = keras.Input((T,), dtype="int32", name="ids")
    x = L.Embedding(V, 16, mask_zero=mask_zero, name="embed")(ids)
    if cross:
        # cross-attention: value another tensor (12 features); with 2 a key of its own (10);
        # with 3 a value of half the steps (MaxPooling1D, which drops the mask: only the
        # query's then)
        other = L.Dense(12, name="other")(x)
        if cross == 3:
            other = L.MaxPooling1D(2, name="half")(other)
        query = x
        if cross == 4:  # a query without a mask (Conv1D drops it), a masked value
            query = L.Conv1D(16, 3, padding="same", name="conv")(x)
        if cross == 2:
            key = L.Dense(10, name="keys")(x)
            a = L.MultiHeadAttention(2, 8, name="mha")(x, other, key)
        else:
            a = L.MultiHeadAttention(2, 8, dropout=dropout, name="mha")(
                query, other, use_causal_mask=causal)
    elif causal:
        a = L.MultiHeadAttention(2, 8, dropout=dropout, seed=7, name="mha")(
            x, x, use_causal_mask=True)
    else:
        a = L.MultiHeadAttention(2, 8, dropout=dropout, name="mha")(x, x, x)
    h = L.LayerNormalization(epsilon=1e-6, name="ln1")(
        L.Add(name="res1")([query if cross else x, a]))
    f = L.Dense(32, activation="gelu", name="ffn1")(h)
    f = L.Dense(16, name="ffn2")(f)
    h = L.LayerNormalization(epsilon=1e-6, name="ln2")(L.Add(name="res2")([h, f]))
    if flatten:
        h = L.Flatten(name="flat")(h)
    else:
        h = L.GlobalAveragePooling1D(name="pool")(h)
    y = L.Dense(K, name="out")(h)
    return keras.Model(ids, y, name="transformer")


def make_recurrent(dropout=0.0, recurrent_dropout=0.0):
    L = keras.layers
    ids = keras.Input((T,), dtype="int32", name="ids")
    e = L.Embedding(V, 12, name="embed")(ids)
    a = L.LSTM(10, return_sequences=True, dropout=dropout,
               recurrent_dropout=recurrent_dropout, name="lstm")(e)
    b = L.GRU(8, return_sequences=True, go_backwards=True, name="gru")(a)
    c = L.GRU(6, reset_after=False, return_sequences=True, name="gru_before")(b)
    d = L.SimpleRNN(7, name="rnn")(c)
    f = L.LSTM(5, go_backwards=True, use_bias=False, name="lstm_back")(e)
    g = L.Bidirectional(L.GRU(4, return_sequences=True, dropout=dropout,
                              recurrent_dropout=recurrent_dropout), name="bi")(e)
    g = L.Bidirectional(L.LSTM(3), merge_mode="ave", name="bi_ave")(g)
    h = L.Concatenate(name="cat")([d, f, g])
    y = L.Dense(K, name="out")(h)
    return keras.Model(ids, y, name="recurrent")


def make_recurrent_masked():
    L = keras.layers
    ids = keras.Input((T,), dtype="int32", name="ids")
    e = L.Embedding(V, 12, mask_zero=True, name="embed")(ids)
    a = L.LSTM(10, return_sequences=True, name="lstm")(e)
    a = L.GRU(8, return_sequences=True, go_backwards=True, name="gru")(a)
    a = L.GRU(6, reset_after=False, return_sequences=True, zero_output_for_mask=True,
              name="gru_before")(a)
    a = L.Dense(6, activation="tanh", name="steps")(a)
    a = L.GlobalAveragePooling1D(name="pool")(a)
    d = L.SimpleRNN(7, name="rnn")(e)
    f = L.LSTM(5, go_backwards=True, zero_output_for_mask=True, name="lstm_back")(e)
    g = L.Bidirectional(L.GRU(4, return_sequences=True), name="bi")(e)
    g = L.Bidirectional(L.LSTM(3), merge_mode="ave", name="bi_ave")(g)
    c = L.Conv1D(4, 3, name="conv")(e)  # drops the mask (Keras 3 warns)
    c = L.LSTM(3, name="after_conv")(c)
    # a masked last-axis Concatenate (Keras writes its mask as ExpandDims, ZerosLike, LogicalOr,
    # a Concatenate operation and Any)
    s = L.Concatenate(name="cat_steps")([e, L.Dense(4, name="e_proj")(e)])
    s = L.GRU(3, name="after_cat")(s)
    h = L.Concatenate(name="cat")([a, d, f, g, c, s])
    y = L.Dense(K, name="out")(h)
    return keras.Model(ids, y, name="recurrent_masked")


def make_masking():
    """Keras's Masking on float features: the masked steps through an LSTM, a GRU run
    backwards and a Dense into GlobalAveragePooling1D."""
    L = keras.layers
    x = keras.Input((T, 3), name="x")
    m = L.Masking(mask_value=0.0, name="masking")(x)
    a = L.LSTM(5, return_sequences=True, name="lstm")(m)
    a = L.GRU(4, go_backwards=True, name="gru")(a)
    b = L.Dense(4, activation="tanh", name="steps")(m)
    b = L.GlobalAveragePooling1D(name="pool")(b)
    y = L.Dense(K, name="out")(L.Concatenate(name="cat")([a, b]))
    return keras.Model(x, y, name="masking")


def make_masking_attention():
    """Masking's mask as MultiHeadAttention's attention mask (query and value masks), its
    output's mask into the masked mean."""
    L = keras.layers
    x = keras.Input((T, 3), name="x")
    m = L.Masking(mask_value=0.0, name="masking")(x)
    h = L.Dense(8, name="proj")(m)
    a = L.MultiHeadAttention(2, 4, name="mha")(h, h)
    h = L.LayerNormalization(epsilon=1e-6, name="ln")(L.Add(name="res")([h, a]))
    y = L.Dense(K, name="out")(L.GlobalAveragePooling1D(name="pool")(h))
    return keras.Model(x, y, name="masking_attention")


def make_mask_refused(kind):
    """A masked model that libdist refuses: the mask reaching `kind`."""
    L = keras.layers
    ids = keras.Input((T,), dtype="int32", name="ids")
    e = L.Embedding(V, 8, mask_zero=True, name="embed")(ids)
    if kind == "softmax":
        h = L.GlobalAveragePooling1D(name="pool")(L.Softmax(name="softmax")(e))
    elif kind == "mixed":
        e2 = L.Embedding(V, 8, name="embed2")(ids)
        h = L.GlobalAveragePooling1D(name="pool")(L.Add(name="add")([e, e2]))
    else:
        return keras.Model(ids, L.Dense(K, name="out")(L.LSTM(4, return_sequences=True,
                                                               name="lstm")(e)), name="seq")
    return keras.Model(ids, L.Dense(K, name="out")(h), name=kind)


def seeded(seed, make_model, rng):
    """make_model() built under Keras seed `seed`, every weight then drawn by NumPy."""
    keras.utils.set_random_seed(seed)
    model = make_model()
    model.set_weights([rng.uniform(-0.6, 0.6, w.shape).astype(np.float32)
                       for w in model.get_weights()])
    return model


def rel(a, b, floor=0.0):
    d = float(np.linalg.norm(a - b))
    m = max(float(np.linalg.norm(a)), float(np.linalg.norm(b)), floor)
    return d / m if m > 0 else d


def keras_reference(json_path, weights_path, x, y, floatx):
    keras.config.set_floatx(floatx)
    try:
        with open(json_path) as f:
            model = keras.models.model_from_json(f.read().replace('"float32"', f'"{floatx}"'))
        model.load_weights(weights_path)
        logits = model(x, training=False).numpy().astype(np.float64)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        grads = tape.gradient(loss, model.trainable_weights)
        return logits, [(v.path, tuple(v.shape), tf.convert_to_tensor(g).numpy().astype(np.float64))
                        for v, g in zip(model.trainable_weights, grads)]
    finally:
        keras.config.set_floatx("float32")


def run_case(driver, work, name, model, x, y, x_path, y_path, gradients=True, saver=None,
             shape=None):
    """`gradients` False: the logits in inference only (a model whose training draws dropout
    masks, which are libdist's, not TensorFlow's). With `saver`, then the .keras file libdist
    writes (keras_file_check, inputs given to the saver as `shape`)."""
    ok = check_case(driver, work, name, model, x, y, x_path, y_path, gradients)
    if saver:
        ok = keras_file_check(saver, work, name, os.path.join(work, f"{name}.json"),
                              os.path.join(work, f"{name}.weights.h5"), x_path, y_path, model,
                              x, shape=shape) and ok
    return ok


def check_case(driver, work, name, model, x, y, x_path, y_path, gradients):
    json_path = os.path.join(work, f"{name}.json")
    wpath = os.path.join(work, f"{name}.weights.h5")
    with open(json_path, "w") as f:
        f.write(model.to_json())
    model.save_weights(wpath)
    lpath, gpath = os.path.join(work, f"{name}.logits"), os.path.join(work, f"{name}.grads")
    back = os.path.join(work, f"{name}.libdist.weights.h5")
    r = subprocess.run([driver, json_path, wpath, x_path, y_path, str(N), str(T), lpath, gpath,
                        back], capture_output=True, text=True)
    if r.returncode != 0:
        print(f"FAIL {name}: driver failed ({r.returncode}): {r.stderr.strip()}")
        return False
    # the weights libdist writes back load into the same Keras model, unchanged
    with open(json_path) as f:
        again = keras.models.model_from_json(f.read())
    again.load_weights(back)
    same = all(np.array_equal(a, b) for a, b in zip(again.get_weights(), model.get_weights()))
    print(f"{'ok  ' if same else 'FAIL'} {name}: libdist's .weights.h5 loads into Keras unchanged")
    got = np.fromfile(lpath, dtype=np.float32).astype(np.float64).reshape(N, K)
    flat = np.fromfile(gpath, dtype=np.float32).astype(np.float64)
    ok, line, worst = True, "", {}
    for floatx, bound in (("float64", TOL), ("float32", TOL_F32)):
        want, grads = keras_reference(json_path, wpath, x, y, floatx)
        worst[floatx] = rel(got, want)
        ok = ok and worst[floatx] <= bound
        if not gradients:
            continue
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
    ok = ok and same
    print(f"{'ok  ' if ok else 'FAIL'} {name}: worst logits and gradients vs float64 Keras "
          f"{worst['float64']:.2e} (bound {TOL:g}), vs float32 Keras {worst['float32']:.2e} "
          f"(bound {TOL_F32:g})" + line)
    return ok


def main():
    driver, work = sys.argv[1], sys.argv[2]
    saver = sys.argv[3] if len(sys.argv) > 3 else None
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(35)
    x = rng.integers(0, V, (N, T)).astype(np.int32)
    x[:, 1] = x[:, 0]  # a repeated id in every sequence
    x[0, :4] = 7       # and one id repeated across the batch
    y = rng.integers(0, K, N).astype(np.int32)
    x_path, y_path = os.path.join(work, "ids.i32"), os.path.join(work, "y.i32")
    x.tofile(x_path)
    y.tofile(y_path)
    model = seeded(12, make, rng)
    json_path = os.path.join(work, "text.json")
    wpath = os.path.join(work, "text.weights.h5")
    with open(json_path, "w") as f:
        f.write(model.to_json())
    model.save_weights(wpath)
    lpath, gpath = os.path.join(work, "text.logits"), os.path.join(work, "text.grads")
    r = subprocess.run([driver, json_path, wpath, x_path, y_path, str(N), str(T), lpath, gpath],
                       capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"driver failed ({r.returncode}):\n{r.stderr}")
    got = np.fromfile(lpath, dtype=np.float32).astype(np.float64).reshape(N, K)
    flat = np.fromfile(gpath, dtype=np.float32).astype(np.float64)
    ok, line, worst = True, "", {}
    for floatx, bound in (("float64", TOL), ("float32", TOL_F32)):
        want, grads = keras_reference(json_path, wpath, x, y, floatx)
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
    print(f"{'ok  ' if ok else 'FAIL'} text: worst logits and gradients vs float64 Keras "
          f"{worst['float64']:.2e} (bound {TOL:g}), vs float32 Keras {worst['float32']:.2e} "
          f"(bound {TOL_F32:g})" + line)

    tfm = seeded(13, make_transformer, rng)
    ok = run_case(driver, work, "transformer", tfm, x, y, x_path, y_path) and ok

    rec = seeded(14, make_recurrent, rng)
    ok = run_case(driver, work, "recurrent", rec, x, y, x_path, y_path, saver=saver,
                  shape=(N, T, 1, 1)) and ok

    # masks: padding at the ends, a 0 inside a sequence and at its start (every sequence keeps
    # some unmasked steps: GlobalAveragePooling1D of none would be 0 / 0, in Keras too)
    xm = x.copy()
    xm[xm == 0] = 3
    for i, n in enumerate((16, 9, 3, 12, 1, 7, 16, 5)):
        xm[i, n:] = 0
    xm[0, 6] = 0
    xm[6, 0] = 0
    xm_path = os.path.join(work, "ids_masked.i32")
    xm.tofile(xm_path)
    masked = seeded(15, lambda: make(mask_zero=True), rng)
    ok = run_case(driver, work, "text_masked", masked, xm, y, xm_path, y_path) and ok
    # attention masks: the ids' mask as query and value masks, the causal mask, both; the last
    # ending in Flatten, which reads the padded query steps' rows
    for name, seed, kw in (("transformer_masked", 19, dict(mask_zero=True)),
                           ("transformer_causal", 20, dict(causal=True)),
                           ("transformer_masked_causal", 21,
                            dict(mask_zero=True, causal=True, flatten=True))):
        tm = seeded(seed, lambda: make_transformer(**kw), rng)
        ok = run_case(driver, work, name, tm, xm, y, xm_path, y_path, saver=saver,
                      shape=(N, T, 1, 1)) and ok
    # cross-attention: a value of its own, a key of its own, fewer value steps (causal too:
    # 16 queries, 8 keys); masked too; a query whose Conv1D dropped the mask, its value masked
    for name, seed, ids, kw in (("cross", 25, "plain", dict(cross=1)),
                                ("cross_key_masked", 26, "masked", dict(cross=2, mask_zero=True)),
                                ("cross_half_masked", 27, "masked", dict(cross=3, mask_zero=True)),
                                ("cross_half_causal", 28, "masked",
                                 dict(cross=3, mask_zero=True, causal=True)),
                                ("cross_query_unmasked", 29, "masked",
                                 dict(cross=4, mask_zero=True, dropout=0.1, flatten=True))):
        tm = seeded(seed, lambda: make_transformer(**kw), rng)
        xs, xs_path = (x, x_path) if ids == "plain" else (xm, xm_path)
        ok = run_case(driver, work, f"transformer_{name}", tm, xs, y, xs_path, y_path,
                      gradients=not kw.get("dropout"), saver=saver, shape=(N, T, 1, 1)) and ok
    # attention dropout: in inference the layer without it, but for Keras 3's dropout path,
    # which zeroes the probabilities of the padded query steps' rows (read by Flatten); with
    # the causal mask alone no row is empty
    for name, seed, kw in (("transformer_dropout_masked", 22,
                            dict(mask_zero=True, flatten=True, dropout=0.2)),
                           ("transformer_dropout_causal", 23, dict(causal=True, dropout=0.1))):
        tm = seeded(seed, lambda: make_transformer(**kw), rng)
        ok = run_case(driver, work, name, tm, xm, y, xm_path, y_path, gradients=False,
                      saver=saver, shape=(N, T, 1, 1)) and ok
    recm = seeded(16, make_recurrent_masked, rng)
    ok = run_case(driver, work, "recurrent_masked", recm, xm, y, xm_path, y_path, saver=saver,
                  shape=(N, T, 1, 1)) and ok

    # Masking on float features: padded steps (all features 0) and one inside a sequence
    xf = rng.standard_normal((N, T, 3)).astype(np.float32)
    for i, n in enumerate((16, 9, 3, 12, 1, 7, 16, 5)):
        xf[i, n:] = 0
    xf[0, 6] = 0
    xf[2, 1, 0] = 0  # one feature 0 masks nothing
    xf_path = os.path.join(work, "masking.f32")
    xf.tofile(xf_path)
    mk = seeded(18, make_masking, rng)
    ok = run_case(driver, work, "masking", mk, xf, y, xf_path, y_path, saver=saver,
                  shape=(N, T, 3, 1)) and ok

    mka = seeded(24, make_masking_attention, rng)
    ok = run_case(driver, work, "masking_attention", mka, xf, y, xf_path, y_path, saver=saver,
                  shape=(N, T, 3, 1)) and ok

    def refused(what, name, model, *wants):
        """The model's JSON is refused, the driver's message holding every `wants`."""
        path = os.path.join(work, f"{name}.json")
        with open(path, "w") as f:
            f.write(model.to_json())
        r = subprocess.run([driver, path, wpath, x_path, y_path, str(N), str(T), lpath, gpath],
                           capture_output=True, text=True)
        good = r.returncode != 0 and all(w in r.stderr for w in wants)
        print(f"{'ok  ' if good else 'FAIL'} {what} refused: {r.stderr.strip()}")
        return good

    # dropout inside the recurrent layers: read, and in inference the layers without it
    drop = seeded(17, lambda: make_recurrent(dropout=0.25, recurrent_dropout=0.3), rng)
    ok = run_case(driver, work, "recurrent_dropout", drop, x, y, x_path, y_path,
                  gradients=False) and ok

    # a dropout rate of 1 (which Keras ignores), cross-attention (value another tensor than the
    # query) and masks where libdist does not follow them: each refused naming the layer (and
    # the argument)
    ok = refused("LSTM dropout of 1", "dropout", make_recurrent(dropout=1.0),
                 "'lstm' (LSTM): argument 'dropout' is not a rate in [0, 1)") and ok
    for kind, wants in (("softmax", ("'softmax' (Softmax)", "mask of Embedding 'embed'")),
                        ("mixed", ("'add' (Add)", "only with other masked ones")),
                        ("seq", ("'out' (Dense), the model's output", "mask the loss"))):
        ok = refused(f"a mask into {kind}", f"mask_{kind}", make_mask_refused(kind), *wants) and ok
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
