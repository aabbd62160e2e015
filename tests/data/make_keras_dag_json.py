"""Writes tests/data/keras3_dag.json and tests/data/tf_keras_dag.json: one small Functional
DAG (a skip connection, a shared tensor read by three layers, Add and Concatenate) as Keras 3
and as tf-keras write model.to_json(). unit.model_graph builds both and expects the same
network. Also tests/data/keras3_resnet_mnist.json (Keras 3 only): a small Functional ResNet on
(28, 28, 1) images with a Dense(10, softmax) head, which the distrain.model_* tests train; and
tests/data/tf_keras_mixed_resnet_mnist.json: that network as tf-keras writes it under
keras.mixed_precision.set_global_policy("mixed_bfloat16"), with Keras's float32 head (Dense(10)
then Activation("softmax", dtype="float32")), which distrain.model_mixed_policy trains.
Run with the conformance venv's python from tests/data/."""
import os
import subprocess
import sys

CODE = """
x = keras.Input((6, 6, 2), name="img")
c1 = keras.layers.Conv2D(4, 3, padding="same", name="c1")(x)
r = keras.layers.ReLU(name="r")(c1)
c2 = keras.layers.Conv2D(4, 3, padding="same", name="c2")(r)
s = keras.layers.Add(name="skip")([c2, r])
j = keras.layers.Concatenate(axis=-1, name="join")([s, r])
g = keras.layers.GlobalAveragePooling2D(name="gap")(j)
y = keras.layers.Dense(3, name="out")(g)
m = keras.Model(x, y, name="dag")
open(OUT, "w").write(m.to_json())
"""

RESNET = """
x = keras.Input((28, 28, 1), name="image")
h = keras.layers.Conv2D(8, 3, strides=2, padding="same", name="stem")(x)
h = keras.layers.BatchNormalization(name="stem_bn")(h)
h = keras.layers.ReLU(name="stem_relu")(h)
s = h
h = keras.layers.Conv2D(8, 3, padding="same", name="conv1")(h)
h = keras.layers.BatchNormalization(name="bn1")(h)
h = keras.layers.ReLU(name="relu1")(h)
h = keras.layers.Conv2D(8, 3, padding="same", name="conv2")(h)
h = keras.layers.BatchNormalization(name="bn2")(h)
h = keras.layers.Add(name="skip")([h, s])
h = keras.layers.ReLU(name="out_relu")(h)
h = keras.layers.GlobalAveragePooling2D(name="pool")(h)
y = HEAD(h)
m = keras.Model(x, y, name="resnet_mnist")
open(OUT, "w").write(m.to_json())
"""


def softmax_head(h):
    return keras.layers.Dense(10, activation="softmax", name="probs")(h)


def float32_softmax_head(h):
    h = keras.layers.Dense(10, name="logits")(h)
    return keras.layers.Activation("softmax", dtype="float32", name="probs")(h)

if len(sys.argv) == 1:
    for out, legacy in (("keras3_dag.json", "0"), ("tf_keras_dag.json", "1"),
                        ("keras3_resnet_mnist.json", "0"),
                        ("tf_keras_mixed_resnet_mnist.json", "1")):
        env = dict(os.environ, TF_USE_LEGACY_KERAS=legacy, TF_CPP_MIN_LOG_LEVEL="2",
                   KERAS_BACKEND="tensorflow")
        subprocess.run([sys.executable, __file__, out, legacy], env=env, check=True)
else:
    if sys.argv[2] == "1":
        import tf_keras as keras  # noqa: F401
    else:
        import keras  # noqa: F401
    OUT = sys.argv[1]
    HEAD = softmax_head
    if "mixed" in OUT:
        keras.mixed_precision.set_global_policy("mixed_bfloat16")
        HEAD = float32_softmax_head
    exec(RESNET if "resnet" in OUT else CODE)
