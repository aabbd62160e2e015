"""What bench/tf_keras_fit.py and bench/tta_keras.py share: the built-in MNIST subset as NumPy
arrays and the seed CNN in Keras. Import it after TensorFlow's environment variables are set
(importing this module imports neither TensorFlow nor Keras)."""

import gzip
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_DATA = os.path.join(HERE, "..", "src", "data", "mnist_subset")
SEED_CNN_PARAMS = 121930


def die(message, code=3):
    """Fails loudly: one line on stderr and a nonzero exit, never a fake result."""
    print(f"{os.path.basename(sys.argv[0])}: {message}", file=sys.stderr)
    sys.exit(code)


def import_tf_keras(which):
    """(tensorflow, keras module) or exits with a message naming what is missing."""
    try:
        import numpy  # noqa: F401
        import tensorflow as tf
    except ImportError as e:
        die(f"TensorFlow is not importable with {sys.executable} ({e}); use the venv, e.g. "
            "~/.cache/libdist/venv-tf/bin/python")
    try:
        if which == "tf_keras":
            import tf_keras as keras
        else:
            import keras
    except ImportError as e:
        die(f"{which} is not importable with {sys.executable} ({e})")
    return tf, keras


def read_idx(path):
    """An IDX file (raw or .gz) as a uint8 NumPy array of its shape."""
    import numpy as np

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read()
    except OSError as e:
        die(f"cannot read {path}: {e}")
    if len(data) < 4:
        die(f"{path}: truncated IDX header")
    zero, dtype, ndim = struct.unpack_from(">HBB", data, 0)
    if zero != 0 or dtype != 0x08:
        die(f"{path}: not an unsigned-byte IDX file (magic {data[:4].hex()})")
    dims = struct.unpack_from(f">{ndim}I", data, 4)
    offset = 4 + 4 * ndim
    arr = np.frombuffer(data, dtype=np.uint8, offset=offset)
    if arr.size != int(np.prod(dims)):
        die(f"{path}: {arr.size} data bytes, header says {int(np.prod(dims))}")
    return arr.reshape(dims)


def load_split(data_dir, split):
    """(images float32 [N,28,28,1] in [0,1], labels int32 [N]) of 'train' or 't10k'."""
    import numpy as np

    x = read_idx(os.path.join(data_dir, f"{split}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data_dir, f"{split}-labels-idx1-ubyte.gz"))
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        die(f"unexpected IDX shapes {x.shape} / {y.shape} in {data_dir}")
    return (x.astype(np.float32) / np.float32(255.0))[..., None], y.astype(np.int32)


def seed_cnn(keras, learning_rate=1e-3, jit_compile=False):
    """The seed CNN (Conv32-3x3-relu, pool, Conv64-3x3-relu, pool, flatten, Dense64-relu,
    Dense10 logits), sparse softmax cross-entropy, Adam(lr, Keras's epsilon 1e-7), accuracy,
    compiled. Keras's default initializers (Glorot uniform, zero biases), as libdist's."""
    layers = keras.layers
    model = keras.Sequential([
        keras.Input(shape=(28, 28, 1)),
        layers.Conv2D(32, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(64, activation="relu"),
        layers.Dense(10),
    ])
    if model.count_params() != SEED_CNN_PARAMS:
        die(f"the Keras model has {model.count_params()} parameters, the seed CNN "
            f"{SEED_CNN_PARAMS}")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=jit_compile)
    return model


def set_thread_env(threads, inter_op):
    """Before TensorFlow is imported: its thread pools and oneDNN's OpenMP read these."""
    os.environ["OMP_NUM_THREADS"] = str(threads)
    os.environ["TF_NUM_INTRAOP_THREADS"] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = str(inter_op)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def set_tf_threads(tf, threads, inter_op):
    """The same through TensorFlow's API (before any op runs)."""
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(inter_op)
