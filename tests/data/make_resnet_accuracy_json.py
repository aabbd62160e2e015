"""Writes tests/data/keras3_resnet_accuracy.json: the small Functional ResNet whose 5-epoch test
accuracy on the embedded MNIST subset conformance.resnet_accuracy compares between distrain
--model and Keras's own fit (issue #35). As model.to_json() of Keras 3 writes it:

  (28, 28, 1) -> Conv2D 16 3x3 + BN + ReLU                                          28 x 28 x 16
              -> block: Conv3x3/2-BN-ReLU-Conv3x3-BN + (Conv1x1/2 + BN), Add, ReLU   14 x 14 x 32
              -> block: Conv3x3/2-BN-ReLU-Conv3x3-BN + (Conv1x1/2 + BN), Add, ReLU    7 x 7 x 64
              -> GlobalAveragePooling2D -> Dense 10 softmax

Convolutions before a BatchNormalization have no bias, as in ResNet. BatchNormalization has
momentum 0.9 (epsilon Keras's 1e-3): with Keras's 0.99 the moving statistics average the last
~100 steps, in which Adam moves the weights far, so the test accuracy (scored with them) sat
well below the training accuracy (0.986 against 0.917 to 0.945) and swung with any change in
the trajectory (Keras against itself on the same batches, the initial weights perturbed by
1e-6: 0.934 and 0.947, past the test's bound); the test compares the training, not that swing. 73,690 weights (the moving statistics included)
and about 5.7M multiply-adds per image forward, so that 5 epochs of the 7,996 training images
fit in a few minutes on two busy cores. A narrower version (a stride-2 stem, 16 and 32
filters) stopped near 0.89 after 5 epochs. The stem has 16 filters, not 24: oneDNN 2.6 has
only its reference kernel for a 1-channel 3x3 convolution into 24 channels (ONEDNN_VERBOSE:
ref:any, 1.5 s a batch of 64 on the 2-core Xeon), which made the run take half an hour.
Run with the conformance venv's python from tests/data/."""
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402

L = keras.layers
MOMENTUM = 0.9


def conv_bn(h, filters, kernel, strides, name):
    h = L.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                 name=f"{name}_conv")(h)
    return L.BatchNormalization(momentum=MOMENTUM, name=f"{name}_bn")(h)


def block(h, filters, strides, name):
    shortcut = h
    if strides != 1 or h.shape[-1] != filters:
        shortcut = conv_bn(h, filters, 1, strides, f"{name}_proj")
    r = L.ReLU(name=f"{name}_relu1")(conv_bn(h, filters, 3, strides, f"{name}_a"))
    r = conv_bn(r, filters, 3, 1, f"{name}_b")
    return L.ReLU(name=f"{name}_out")(L.Add(name=f"{name}_add")([r, shortcut]))


def resnet_accuracy():
    x = keras.Input((28, 28, 1), name="image")
    h = L.ReLU(name="stem_relu")(conv_bn(x, 16, 3, 1, "stem"))
    h = block(h, 32, 2, "block1")
    h = block(h, 64, 2, "block2")
    h = L.GlobalAveragePooling2D(name="pool")(h)
    y = L.Dense(10, activation="softmax", name="probs")(h)
    return keras.Model(x, y, name="resnet_accuracy")


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "keras3_resnet_accuracy.json"
    with open(out, "w") as f:
        f.write(resnet_accuracy().to_json())
