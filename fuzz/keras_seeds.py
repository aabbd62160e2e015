"""Writes the seeds of fuzz_keras_json that Keras itself makes: small models whose to_json()
covers every layer class and argument form the importer reads (dist/nn.h's list), from Keras 3
and from tf_keras, as fuzz/corpus/fuzz_keras_json/seed-k3-*.json and seed-tfk-*.json.

The other seeds there are copies of bench/models/*.json and tests/data/*.json.

Usage (the conformance venv, which has both Kerases):
  ~/.cache/libdist/venv-tf/bin/python fuzz/keras_seeds.py fuzz/corpus/fuzz_keras_json
"""
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def models(k):
    """(name, model) pairs built with the Keras module k (keras or tf_keras)."""
    L = k.layers
    out = []

    x = k.Input((12, 12, 3))
    y = L.Rescaling(1 / 255.0, offset=0.1)(x)
    y = L.ZeroPadding2D(((1, 0), (0, 1)))(y)
    y = L.Conv2D(4, 3, strides=2, padding="same", dilation_rate=1, activation="relu",
                 kernel_regularizer=k.regularizers.L2(1e-4))(y)
    a = L.BatchNormalization(momentum=0.9, epsilon=1e-3)(y)
    b = L.DepthwiseConv2D(3, padding="same", depth_multiplier=1, activation="elu")(a)
    c = L.SeparableConv2D(4, 3, padding="same", activation="selu")(a)
    d = L.Conv2D(4, 3, padding="same", groups=2, activation="gelu")(a)
    s = L.Add()([a, b])
    s = L.Subtract()([s, c])
    s = L.Multiply()([s, d])
    s = L.Average()([s, a, b])
    s = L.Maximum()([s, c])
    s = L.Minimum()([s, d])
    s = L.Concatenate(axis=-1)([s, a])
    s = L.PReLU(shared_axes=[1, 2])(s)
    s = L.LeakyReLU()(s)
    s = L.ReLU(max_value=6.0)(s)
    s = L.ELU(alpha=0.5)(s)
    s = L.SpatialDropout2D(0.1)(s)
    s = L.Cropping2D(((1, 0), (0, 1)))(s)
    s = L.MaxPooling2D(2)(s)
    s = L.MaxPooling2D((3, 2), strides=(2, 1), padding="same")(s)
    s = L.UpSampling2D((1, 2))(s)
    s = L.Conv2DTranspose(4, (3, 2), strides=(2, 1), padding="same", activation="relu")(s)
    s = L.Conv2DTranspose(4, 2, strides=2, kernel_regularizer=k.regularizers.L2(1e-4))(s)
    s = L.AveragePooling2D(2, padding="same")(s)
    s = L.LayerNormalization()(s)
    g1 = L.GlobalAveragePooling2D()(s)
    g2 = L.GlobalMaxPooling2D()(s)
    s = L.Concatenate()([g1, g2])
    s = L.Dropout(0.2, seed=3)(s)
    s = L.Dense(10, activation="softmax")(s)
    out.append(("graph", k.Model(x, s)))

    x = k.Input((16, 4))
    y = L.Conv1D(6, 3, padding="causal", activation="swish")(x)
    y = L.MaxPooling1D(2)(y)
    y = L.UpSampling1D(2)(y)
    y = L.MaxPooling1D(2)(y)
    y = L.AveragePooling1D(2, padding="same")(y)
    y = L.Cropping1D((1, 0))(y)
    y = L.SpatialDropout1D(0.1)(y)
    y = L.Permute((2, 1))(y)
    y = L.Reshape((3, 6))(y)
    p = L.GlobalAveragePooling1D()(y)
    q = L.GlobalMaxPooling1D()(y)
    y = L.Concatenate()([p, q])
    y = L.Activation("tanh")(y)
    y = L.Softmax()(y)
    y = L.Flatten()(y)
    y = L.Dense(3, activation="sigmoid")(y)
    out.append(("sequence", k.Model(x, y)))

    x = k.Input((20,), dtype="int32")
    e = L.Embedding(50, 8)(x)
    h = L.MultiHeadAttention(num_heads=2, key_dim=4)(e, e)
    h = L.Add()([e, h])
    h = L.LayerNormalization(epsilon=1e-6)(h)
    h = L.Dense(16, activation="gelu")(h)
    h = L.GlobalAveragePooling1D()(h)
    h = L.Dense(2)(h)
    out.append(("text", k.Model(x, h)))

    x = k.Input((12,), dtype="int32")
    e = L.Embedding(40, 6)(x)
    a = L.LSTM(5, return_sequences=True)(e)
    b = L.GRU(4, return_sequences=True, go_backwards=True)(a)
    c = L.GRU(3, reset_after=False, recurrent_activation="hard_sigmoid")(b)
    d = L.SimpleRNN(4, activation="relu", kernel_regularizer=k.regularizers.L2(1e-4))(a)
    f = L.LSTM(3, go_backwards=True, use_bias=False, unit_forget_bias=False)(e)
    g = L.Bidirectional(L.LSTM(3, return_sequences=True))(e)
    g = L.Bidirectional(L.GRU(2), merge_mode="mul")(g)
    h = L.Concatenate()([c, d, f, g])
    h = L.Dense(2)(h)
    out.append(("recurrent", k.Model(x, h)))

    # Embedding's mask (Keras 3 writes its NotEqual and LogicalOr nodes and mask arguments)
    x = k.Input((10,), dtype="int32")
    e = L.Embedding(30, 6, mask_zero=True)(x)
    a = L.Dense(6, activation="tanh")(e)
    a = L.Add()([e, a])
    a = L.Concatenate()([e, a])
    b = L.Bidirectional(L.GRU(3, return_sequences=True))(a)
    b = L.GlobalAveragePooling1D()(b)
    c = L.LSTM(4, zero_output_for_mask=True, dropout=0.1, recurrent_dropout=0.2, seed=3)(e)
    h = L.Dense(2)(L.Concatenate()([b, c]))
    out.append(("masked", k.Model(x, h)))

    # Embedding's mask as MultiHeadAttention's query and value masks, with use_causal_mask
    x = k.Input((10,), dtype="int32")
    e = L.Embedding(30, 8, mask_zero=True)(x)
    a = L.MultiHeadAttention(num_heads=2, key_dim=4)(e, e, use_causal_mask=True)
    h = L.LayerNormalization(epsilon=1e-6)(L.Add()([e, a]))
    h = L.GlobalAveragePooling1D()(h)
    out.append(("attention_masked", k.Model(x, L.Dense(2)(h))))

    # cross-attention: a value of its own and a key of its own, fewer value steps
    x = k.Input((10,), dtype="int32")
    e = L.Embedding(30, 8, mask_zero=True)(x)
    v = L.MaxPooling1D(2)(L.Dense(6)(e))
    a = L.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3)(e, v, L.Dense(5)(v))
    h = L.GlobalAveragePooling1D()(L.Add()([e, a]))
    out.append(("attention_cross", k.Model(x, L.Dense(2)(h))))

    # Masking on float features (Keras 3 writes its NotEqual and Any nodes)
    x = k.Input((8, 3))
    m = L.Masking(mask_value=-1.0)(x)
    a = L.GRU(4, return_sequences=True)(m)
    h = L.Dense(2)(L.GlobalAveragePooling1D()(a))
    out.append(("masking", k.Model(x, h)))

    seq = k.Sequential([k.Input((6,)), L.Dense(8, activation="softplus"),
                        L.Dense(8, activation="softsign"), L.Dense(8, activation="hard_sigmoid"),
                        L.Dense(8, activation="exponential"), L.Dense(4, activation="linear")])
    out.append(("sequential", seq))
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    import keras
    import tf_keras
    for prefix, k in (("k3", keras), ("tfk", tf_keras)):
        for name, m in models(k):
            path = os.path.join(outdir, f"seed-{prefix}-{name}.json")
            with open(path, "w") as f:
                f.write(m.to_json())
            print(path)


if __name__ == "__main__":
    main()
