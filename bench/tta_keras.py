#!/usr/bin/env python3
"""Time-to-accuracy contestant: the seed CNN in TensorFlow's Keras, model.fit until the test
accuracy reaches a target (bench/time_to_accuracy.sh times the whole process from outside).

The built-in MNIST subset (src/data/mnist_subset), training images as float32 in [0,1],
tf.data shuffle 10000 (reshuffled each epoch) -> batch 64 (the last, partial batch kept, as
distrain's epochs) -> prefetch; Adam(1e-3), sparse softmax cross-entropy, accuracy. After every
epoch Keras evaluates the test split (validation_data); a callback stops fit after the first
epoch whose val_accuracy is >= --target. TensorFlow's default thread pools for the machine
(intra-op = inter-op = --threads, default every core), set before TensorFlow is imported.

Prints one JSON line on stdout: {"epochs": E, "test_accuracy": A, "reached": true|false, ...}.
Exits 3 when TensorFlow or Keras cannot be imported.

  ~/.cache/libdist/venv-tf/bin/python bench/tta_keras.py --target 0.96 --max-epochs 15
"""

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import keras_cnn  # noqa: E402
import tta_args  # noqa: E402


def main():
    args = tta_args.parse(__doc__.split("\n\n")[0], keras_cnn.DEFAULT_DATA)
    keras_cnn.set_thread_env(args.threads, args.threads)
    tf, keras = keras_cnn.import_tf_keras("keras3")
    keras_cnn.set_tf_threads(tf, args.threads, args.threads)
    keras.utils.set_random_seed(args.seed)
    x, y = keras_cnn.load_split(args.data_dir, "train")
    xt, yt = keras_cnn.load_split(args.data_dir, "t10k")
    train = (tf.data.Dataset.from_tensor_slices((x, y))
             .shuffle(10000, seed=args.seed, reshuffle_each_iteration=True)
             .batch(args.batch_size).prefetch(2))
    test = tf.data.Dataset.from_tensor_slices((xt, yt)).batch(args.batch_size).prefetch(2)
    model = keras_cnn.seed_cnn(keras)

    class StopAtTarget(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = 0
            self.accuracy = 0.0

        def on_epoch_end(self, epoch, logs=None):
            self.epochs = epoch + 1
            self.accuracy = float(logs["val_accuracy"])
            reached = self.accuracy >= args.target
            print(f"Epoch {self.epochs}: test accuracy {self.accuracy:.4f}"
                  f"{' (target reached)' if reached else ''}", file=sys.stderr)
            if reached:
                self.model.stop_training = True

    stop = StopAtTarget()
    model.fit(train, epochs=args.max_epochs, validation_data=test, verbose=0, callbacks=[stop])
    print(json.dumps({
        "epochs": stop.epochs,
        "test_accuracy": round(stop.accuracy, 6),
        "reached": stop.accuracy >= args.target,
        "target": args.target,
        "seed": args.seed,
        "threads": args.threads,
        "tensorflow": tf.__version__,
        "keras": keras.__version__,
    }))


if __name__ == "__main__":
    main()
