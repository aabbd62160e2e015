/* libdist: the MNIST and Fashion-MNIST data sets, found offline first.
 *
 * dist_mnist_load looks for the four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
 * t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte; each as NAME.gz or raw NAME) in this order:
 *
 * DIST_MNIST_DIGITS
 *   1. options.data_dir, if given;      2. $DIST_DATA_DIR, if set.
 *      A directory named by either must hold valid files: if it does not, loading fails with
 *      an error naming the directory or file (no silent fallback to other data).
 *   3. the cache: <cache>/mnist/NAME.gz, each verified against its SHA-256;
 *   4. unless allow_download is 0, a download of the full 70,000-digit MNIST from base_url into
 *      the cache (SHA-256 verified, written to a temporary file and renamed, so the cache never
 *      holds a partial or corrupt file);
 *   5. the MNIST subset built into the library (7,996 train / 2,004 test images).
 *   Steps 3-4 that fail are skipped; an INFO log message (dist_set_log_callback) says which
 *   source was used and why the ones before it were skipped.
 *
 * DIST_MNIST_FASHION
 *   1. options.data_dir;  2. $DIST_DATA_DIR;  3. /usr/share/datasets/fashion-mnist (the Debian
 *   package dataset-fashion-mnist). No download, no built-in fallback: DIST_NOT_FOUND otherwise.
 *
 * Every set is checked: images uint8 [N, 28, 28], labels uint8 [N] with values 0..9, the same N
 * in images and labels. */
#ifndef DIST_MNIST_H
#define DIST_MNIST_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

DIST_BEGIN_DECLS

typedef enum dist_mnist_kind {
    DIST_MNIST_DIGITS = 0, /* handwritten digits (LeCun, Cortes, Burges) */
    DIST_MNIST_FASHION = 1 /* Zalando's Fashion-MNIST */
} dist_mnist_kind;

#define DIST_MNIST_OPTIONS_VERSION 1
/* The canonical mirror of the MNIST files (the one TensorFlow Datasets uses). */
#define DIST_MNIST_DEFAULT_URL "https://storage.googleapis.com/cvdf-datasets/mnist/"

typedef struct dist_mnist_options {
    int version;          /* DIST_MNIST_OPTIONS_VERSION */
    dist_mnist_kind kind; /* default DIST_MNIST_DIGITS */
    /* A directory with the 4 files (NAME.gz or NAME). NULL: none. Borrowed. */
    const char *data_dir;
    /* NULL: $DIST_CACHE_DIR, else $XDG_CACHE_HOME/libdist, else $HOME/.cache/libdist. MNIST
     * lives in its "mnist" subdirectory. Borrowed. */
    const char *cache_dir;
    /* Where the 4 .gz files are downloaded from ("<base_url>/NAME.gz"). NULL: $DIST_MNIST_URL,
     * else DIST_MNIST_DEFAULT_URL. Borrowed. */
    const char *base_url;
    int allow_download;      /* 0: never touch the network. Default 1. */
    long connect_timeout_ms; /* per-file connect deadline; 0 means the default, 3000 */
    /* NULL, or 4 lower- or upper-case hex SHA-256 sums of the .gz files, in the order train
     * images, train labels, test images, test labels, replacing those of the real MNIST files
     * for both the cache check and the download (for tests and private mirrors). Borrowed. */
    const char *const *sha256;
} dist_mnist_options;

#define DIST_MNIST_OPTIONS_INIT                                                                    \
    { DIST_MNIST_OPTIONS_VERSION, DIST_MNIST_DIGITS, NULL, NULL, NULL, 1, 3000, NULL }

typedef struct dist_mnist dist_mnist;

/* Loads a data set as described above. `o` may be NULL for the defaults (borrowed, only read
 * during the call). On success *out is the caller's; free it with dist_mnist_destroy.
 * Errors: DIST_INVALID_ARGUMENT (bad options), DIST_NOT_FOUND (a named data directory or one
 * of its files is missing; Fashion-MNIST not installed), DIST_FORMAT (a file is not valid IDX,
 * or the set's shapes, counts or labels are wrong), DIST_IO, DIST_OUT_OF_MEMORY. */
DIST_API dist_status dist_mnist_load(const dist_mnist_options *o, dist_mnist **out);

/* Frees the data set and its tensors. Accepts NULL. */
DIST_API void dist_mnist_destroy(dist_mnist *m);

/* The tensors, owned by `m` (valid until dist_mnist_destroy). Images are uint8 [N, 28, 28]
 * (0 = background), labels uint8 [N]. */
DIST_API const dist_tensor *dist_mnist_train_images(const dist_mnist *m);
DIST_API const dist_tensor *dist_mnist_train_labels(const dist_mnist *m);
DIST_API const dist_tensor *dist_mnist_test_images(const dist_mnist *m);
DIST_API const dist_tensor *dist_mnist_test_labels(const dist_mnist *m);

/* Where the data came from, for people: "embedded MNIST subset (7,996 train / 2,004 test)",
 * "data dir /x", "cache /root/.cache/libdist/mnist", "downloaded from <url> (cached in <dir>)".
 * Owned by `m`. */
DIST_API const char *dist_mnist_source(const dist_mnist *m);

DIST_END_DECLS

#endif
