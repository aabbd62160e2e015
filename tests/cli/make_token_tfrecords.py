"""Fixture of distrain's token models (`distrain --model` on an int32 input read by an
Embedding): TensorFlow's own tf.io.TFRecordWriter and tf.train.Example write a synthetic text
task, and tf_keras writes the model's JSON.

  make_token_tfrecords.py OUT

OUT/tokens-train.tfrecord-0000{0,1}-of-00002, OUT/tokens-test.tfrecord-00000-of-00001: each
record has "ids" (an Int64List of T = 16 token ids in 1..49) and "label" (int64): 1 when token 7
is in the sequence, else 0 (half of each), a task a bag of embeddings learns. OUT/model.json:
Input((16,), int32) -> Embedding(50, 16) -> GlobalAveragePooling1D -> Dense(16, relu) ->
Dense(2); OUT/model_recurrent.json: Embedding(50, 16) -> LSTM(16, return_sequences) ->
GRU(16, go_backwards) -> Dense(2). OUT/padded/: the task on sequences of 3 to 16 ids padded
with 0 to 16, for OUT/model_masked.json: Embedding(50, 16, mask_zero=True) ->
Bidirectional(LSTM(16, dropout=0.1, recurrent_dropout=0.1)) -> Dense(16, relu) -> Dense(2)
(TensorFlow's RNN text tutorial's model, with dropout inside the LSTM), and
OUT/model_attention.json: Embedding(50, 16, mask_zero=True) -> MultiHeadAttention(2 heads of
8, dropout=0.1, use_causal_mask=True) with a residual Add and LayerNormalization -> GlobalAveragePooling1D
-> Dense(16, relu) -> Dense(2) (the mask as the attention's mask). Broken sets, each with one bad training record among good ones:
OUT/out_of_range/ (an id of 2^40, beyond int32), OUT/out_of_vocab/ (an id of 60, beyond the
Embedding's 50 rows), OUT/short/ (15 ids instead of 16).
"""
import os
import random
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf  # noqa: E402
import tf_keras as keras  # noqa: E402

T, VOCAB = 16, 50


def example(ids, label):
    return tf.train.Example(features=tf.train.Features(feature={
        "ids": tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    })).SerializeToString()


def rows(rng, n):
    out = []
    for i in range(n):
        label = i % 2
        ids = [rng.choice([v for v in range(1, VOCAB) if v != 7]) for _ in range(T)]
        if label:
            for _ in range(rng.randint(1, 3)):
                ids[rng.randrange(T)] = 7
        out.append((ids, label))
    rng.shuffle(out)
    return out


def padded_rows(rng, n):
    out = []
    for ids, label in rows(rng, n):
        length = rng.randint(3, T)
        if label and 7 not in ids[:length]:
            ids[rng.randrange(length)] = 7
        out.append((ids[:length] + [0] * (T - length), label))
    return out


def write(path, records):
    with tf.io.TFRecordWriter(path) as w:
        for r in records:
            w.write(r)


def write_set(out, train, test):
    os.makedirs(out, exist_ok=True)
    half = len(train) // 2
    write(os.path.join(out, "tokens-train.tfrecord-00000-of-00002"), train[:half])
    write(os.path.join(out, "tokens-train.tfrecord-00001-of-00002"), train[half:])
    write(os.path.join(out, "tokens-test.tfrecord-00000-of-00001"), test)


def main():
    out = sys.argv[1]
    rng = random.Random(5)
    train = [example(i, l) for i, l in rows(rng, 2000)]
    test = [example(i, l) for i, l in rows(rng, 500)]
    write_set(out, train, test)
    write_set(os.path.join(out, "padded"), [example(i, l) for i, l in padded_rows(rng, 2000)],
              [example(i, l) for i, l in padded_rows(rng, 500)])
    bad = {"out_of_range": [1] * (T - 1) + [1 << 40], "out_of_vocab": [1] * (T - 1) + [60],
           "short": [1] * (T - 1)}
    for name, ids in bad.items():
        write_set(os.path.join(out, name), train[:20] + [example(ids, 0)] + train[20:40],
                  test[:20])
    keras.utils.set_random_seed(1)
    inp = keras.Input(shape=(T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 16)(inp)
    h = keras.layers.GlobalAveragePooling1D()(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with open(os.path.join(out, "model.json"), "w") as f:
        f.write(model.to_json())
    # the same task read by recurrent layers: an LSTM's sequence into a GRU run backwards
    keras.utils.set_random_seed(2)
    inp = keras.Input(shape=(T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 16)(inp)
    h = keras.layers.LSTM(16, return_sequences=True)(h)
    h = keras.layers.GRU(16, go_backwards=True)(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with open(os.path.join(out, "model_recurrent.json"), "w") as f:
        f.write(model.to_json())
    # the padded task under Embedding's mask (the padding's steps skipped)
    keras.utils.set_random_seed(3)
    inp = keras.Input(shape=(T,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(inp)
    h = keras.layers.Bidirectional(keras.layers.LSTM(16, dropout=0.1, recurrent_dropout=0.1))(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with open(os.path.join(out, "model_masked.json"), "w") as f:
        f.write(model.to_json())
    # the padded task through masked, causal self-attention (the mask as its attention mask)
    keras.utils.set_random_seed(4)
    inp = keras.Input(shape=(T,), dtype="int32")
    e = keras.layers.Embedding(VOCAB, 16, mask_zero=True)(inp)
    a = keras.layers.MultiHeadAttention(2, 8, dropout=0.1)(e, e, use_causal_mask=True)
    h = keras.layers.LayerNormalization(epsilon=1e-6)(keras.layers.Add()([e, a]))
    h = keras.layers.GlobalAveragePooling1D()(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with open(os.path.join(out, "model_attention.json"), "w") as f:
        f.write(model.to_json())
    print("wrote", out)


if __name__ == "__main__":
    main()
