/* libdist: input pipelines in the manner of tf.data.
 *
 * A dist_dataset is an immutable, reference-counted description of a pipeline: a source
 * (tensor slices, IDX files, a JPEG folder, a list of files read by interleave) followed by
 * transformations (map, filter, shuffle, batch, repeat, take, skip, cache, prefetch, shard,
 * rebatch). A dist_iterator walks one pass ("epoch") of it.
 *
 * Ownership
 *   - Every function that makes a dataset returns it with one reference owned by the caller;
 *     dist_dataset_destroy drops one reference (accepts NULL). dist_dataset_retain adds one.
 *   - Every transformation takes its own reference on its input: the caller may destroy its
 *     handle on the input right after the call. A typical chain is therefore
 *         dist_dataset_batch(ds, 64, 0, &b); dist_dataset_destroy(ds); ds = b;
 *   - An iterator takes a reference on its dataset; destroy the iterator with
 *     dist_iterator_destroy (joins its threads, frees its buffers).
 *   - User pointers (map/filter functions' `user`, borrowed tensor data) are borrowed: they
 *     must outlive every dataset and iterator that uses them.
 *
 * Elements are tuples of up to DIST_ELEMENT_MAX host tensors. The tensors an iterator hands
 * out belong to the iterator and stay valid until its next call (next, reset, restore,
 * destroy). The steady state allocates nothing per element: buffers are reused.
 *
 * Determinism: for a given pipeline, seed and epoch, every iterator yields the same elements
 * in the same order, whatever the thread counts (parallel map and interleave keep order).
 * That is what makes iterator checkpoints small: a saved state names the pipeline, the
 * epoch and the position, and restore replays the epoch up to that position.
 *
 * Errors surface at the earliest point that can name them: sources that read whole files
 * (IDX) fail when the dataset is made; per-file sources (JPEG folders, file lists) fail in
 * dist_iterator_next, naming the file, or, with their skip_bad option, skip the file and count
 * it (dist_iterator_skipped). An iterator that returned an error keeps returning it. */
#ifndef DIST_DATA_H
#define DIST_DATA_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

#include <stddef.h>
#include <stdint.h>

DIST_BEGIN_DECLS

#define DIST_ELEMENT_MAX 8

/* tf.data.AUTOTUNE: as a prefetch buffer size, a map's num_parallel or a JPEG source's
 * num_threads, the value is chosen while the iterator runs, from what it measures:
 *   - prefetch: the buffer starts at 1 element and doubles each time the consumer finds it
 *     empty (not counting a pass's first element) after the producer has been held back by
 *     the buffer's bound since the last doubling, up to DIST_AUTOTUNE_PREFETCH_MAX elements
 *     and to as many as fit in DIST_AUTOTUNE_PREFETCH_BYTES (measured on the first element);
 *   - map: parallelism starts at 1 and grows by one each time that, of 16 consecutive outputs,
 *     4 or more were not ready when the consumer asked for them, up to the online cores
 *     (at most DIST_AUTOTUNE_MAP_MAX).
 * Values only grow, and an iterator keeps them from one epoch to the next. What is tuned is
 * how far ahead and on how many threads elements are made, never which elements or their
 * order: the output is the same as with any fixed setting. */
#define DIST_AUTOTUNE (-1)
#define DIST_AUTOTUNE_PREFETCH_MAX 64
#define DIST_AUTOTUNE_PREFETCH_BYTES ((int64_t)64 << 20)
#define DIST_AUTOTUNE_MAP_MAX 64

typedef struct dist_dataset dist_dataset;
typedef struct dist_iterator dist_iterator;

/* One element: `count` tensors. The tensors belong to whoever filled the element. */
typedef struct dist_element {
    int count;
    dist_tensor *items[DIST_ELEMENT_MAX];
} dist_element;

/* The dtypes and shapes of a dataset's elements (TF's element_spec). A dimension of -1 is
 * unknown (the partial last batch of batch(n, drop_remainder=0), for example). */
typedef struct dist_element_spec {
    int count;
    dist_dtype dtype[DIST_ELEMENT_MAX];
    int ndim[DIST_ELEMENT_MAX];
    int64_t shape[DIST_ELEMENT_MAX][DIST_MAX_DIMS];
} dist_element_spec;

/* Cardinalities, as tf.data.experimental.INFINITE_CARDINALITY / UNKNOWN_CARDINALITY. */
#define DIST_CARDINALITY_INFINITE ((int64_t)-1)
#define DIST_CARDINALITY_UNKNOWN ((int64_t)-2)

/* ---- datasets: lifetime and introspection ---------------------------------------------- */

/* Adds a reference to `ds` and returns it. */
DIST_API dist_dataset *dist_dataset_retain(dist_dataset *ds);
/* Drops one reference; the last one frees the dataset (and its inputs' references). NULL ok. */
DIST_API void dist_dataset_destroy(dist_dataset *ds);
/* The number of elements one pass yields, DIST_CARDINALITY_INFINITE or _UNKNOWN, by TF's
 * rules (filter and skip_bad make it unknown; repeat(-1) makes it infinite). */
DIST_API int64_t dist_dataset_cardinality(const dist_dataset *ds);
/* The element spec. Borrowed: valid while `ds` lives. */
DIST_API const dist_element_spec *dist_dataset_element_spec(const dist_dataset *ds);
/* A one-line description of the pipeline, outermost first
 * ("prefetch(2) <- batch(64,0) <- shuffle(10000,42,1) <- map(image_normalize) <- slices(...)").
 * Borrowed: valid while `ds` lives. Iterator states carry it to detect a foreign pipeline. */
DIST_API const char *dist_dataset_describe(const dist_dataset *ds);

/* ---- sources ---------------------------------------------------------------------------- */

/* Elements are the slices along dimension 0 of `count` (1..8) host tensors that share that
 * dimension (like tf.data.Dataset.from_tensor_slices of a tuple). With copy = 0 the tensors'
 * data is borrowed (it must outlive the dataset); with copy != 0 it is copied now. The
 * dist_tensor structs themselves are only read during the call.
 * Errors: DIST_INVALID_ARGUMENT (count, rank 0, dimension 0 differs, non-host tensor). */
DIST_API dist_status dist_dataset_from_tensor_slices(dist_tensor *const *tensors, int count,
                                                     int copy, dist_dataset **out);

/* Reads an IDX images file and, if labels_path is not NULL, an IDX labels file (raw or gzip,
 * with dist_idx_read) and makes (images[i], labels[i]) slices. The files are read now.
 * Errors: those of dist_idx_read (each names its file), DIST_FORMAT when the two files
 * disagree on the number of examples (naming both). */
DIST_API dist_status dist_dataset_from_idx(const char *images_path, const char *labels_path,
                                           dist_dataset **out);

typedef enum dist_jpeg_size_policy {
    DIST_JPEG_RESIZE = 0, /* bilinear resize (half-pixel centres) to height x width */
    DIST_JPEG_REJECT = 1  /* an image of another size is a bad file (error, or skipped) */
} dist_jpeg_size_policy;

typedef struct dist_jpeg_folder_options {
    int version;                       /* DIST_JPEG_FOLDER_OPTIONS_VERSION */
    int channels;                      /* 1 (grayscale) or 3 (RGB); default 1 */
    int height, width;                 /* output size; 0 = the size of the first image */
    dist_jpeg_size_policy size_policy; /* default DIST_JPEG_RESIZE */
    int skip_bad;                      /* non-zero: skip (and count) bad files and empty class
                                          folders instead of failing */
    int num_threads;    /* decode threads; <= 1 decodes on the caller's thread; DIST_AUTOTUNE */
    int64_t max_pixels; /* a header claiming more (width x height) is a bad file,
                           refused before any allocation; 0 = the default cap */
} dist_jpeg_folder_options;

/* The default pixel cap: 64 Mpx (8192 x 8192). A 65535 x 65535 header would ask for 12 GiB. */
#define DIST_JPEG_MAX_PIXELS_DEFAULT ((int64_t)1 << 26)

/* Version 2 added max_pixels; a version 1 struct (without it) is still accepted. */
#define DIST_JPEG_FOLDER_OPTIONS_VERSION 2
#define DIST_JPEG_FOLDER_OPTIONS_INIT                                                              \
    { DIST_JPEG_FOLDER_OPTIONS_VERSION, 1, 0, 0, DIST_JPEG_RESIZE, 0, 1, 0 }

/* Elements (image uint8 [height, width, channels], label int32 []) from root/<class>/<file>
 * where <file> ends in .jpg or .jpeg (any case). Labels are the indices of the class folder
 * names in byte-wise sorted order (like tf.keras.utils.image_dataset_from_directory); files
 * are listed in sorted order within each class. The folder is scanned now; images are decoded
 * by the iterator (with libjpeg-turbo), on opts->num_threads threads, order kept.
 * A file that is not a JPEG, is truncated, or (DIST_JPEG_REJECT) has another size makes
 * dist_iterator_next fail with DIST_FORMAT naming the file, unless skip_bad.
 * Errors now: DIST_NOT_FOUND (no root), DIST_FORMAT (no class folders; an empty class folder,
 * unless skip_bad; height/width 0 and the first image unreadable), DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_dataset_from_jpeg_folder(const char *root,
                                                   const dist_jpeg_folder_options *opts,
                                                   dist_dataset **out);

/* dist_dataset_from_jpeg_folder with the classes given, in label order (Keras's class_names,
 * e.g. those of the training split for the test split): a class without a folder under root
 * has no examples; a folder that is not in the list is DIST_FORMAT naming it. class_names
 * (count > 0 entries) is borrowed. */
DIST_API dist_status dist_dataset_from_jpeg_folder_classes(const char *root,
                                                           const dist_jpeg_folder_options *opts,
                                                           const char *const *class_names,
                                                           int count, dist_dataset **out);

/* Elements (image uint8 [height, width, channels], index int32 []) of the listed JPEG files, in
 * list order: the second item is the file's index in `paths`. Decoding, sizes and bad files as
 * for a JPEG folder (a missing file fails dist_iterator_next with DIST_NOT_FOUND naming it, unless
 * skip_bad). paths (count > 0 entries) is borrowed for the call. Errors now:
 * DIST_INVALID_ARGUMENT, DIST_FORMAT (height/width 0 and the first image unreadable). */
DIST_API dist_status dist_dataset_from_jpeg_files(const char *const *paths, int count,
                                                  const dist_jpeg_folder_options *opts,
                                                  dist_dataset **out);

/* A JPEG source (as dist_dataset_from_jpeg_folder, _folder_classes or _files made it, with no
 * transformation above it) with its files in a seeded order: the permutation that numpy's
 * RandomState(seed).shuffle makes of the source's list (class by class in label order, names
 * sorted within a class), which is what tf.keras.utils.image_dataset_from_directory(shuffle=True,
 * seed=seed) does to the same folder of JPEGs (no subfolders in the classes) before its
 * validation_split takes the last fraction. Labels go with their files. A folder split by
 * position without it holds out whole classes. The order depends only on the listing and the
 * seed: the same on every run and every worker. ds is borrowed; *out is a new dataset.
 * Errors: DIST_INVALID_ARGUMENT (NULL, or ds is not such a source). */
DIST_API dist_status dist_dataset_shuffle_files(const dist_dataset *ds, uint32_t seed,
                                                dist_dataset **out);

/* The number of classes of a JPEG-folder dataset (or of the JPEG source under a chain of
 * transformations), and the name of class `index` (borrowed, valid while `ds` lives).
 * Return 0 / NULL for other datasets. */
DIST_API int dist_dataset_class_count(const dist_dataset *ds);
DIST_API const char *dist_dataset_class_name(const dist_dataset *ds, int index);

/* Opens one file of a file list as a dataset (tf.data's interleave(lambda f: Reader(f))). On
 * success *out is owned by the interleave. On failure set the message with a libdist call or
 * leave it: the interleave prefixes the file name. */
typedef dist_status (*dist_file_reader_fn)(const char *path, void *user, dist_dataset **out);

typedef struct dist_interleave_options {
    int version;      /* DIST_INTERLEAVE_OPTIONS_VERSION */
    int cycle_length; /* files open at once; default 4 */
    int block_length; /* consecutive elements taken from each; default 1 */
    int num_parallel; /* > 1: each open file is read ahead on its own thread (a DIST_AUTOTUNE
                         prefetch per file) */
    int skip_bad;     /* skip (and count) files that fail to open or read */
    const dist_element_spec *element_spec; /* optional: the files' element spec (copied) */
    const char *name; /* optional: the reader's name, part of the description */
} dist_interleave_options;

#define DIST_INTERLEAVE_OPTIONS_VERSION 1
#define DIST_INTERLEAVE_OPTIONS_INIT                                                               \
    { DIST_INTERLEAVE_OPTIONS_VERSION, 4, 1, 1, 0, NULL, NULL }

/* Elements of the datasets that `reader` opens for each of the `n` paths (copied), interleaved
 * like TF's Dataset.interleave: cycle_length files at once, block_length elements from each in
 * turn, a finished file replaced by the next path. Order is deterministic. */
DIST_API dist_status dist_dataset_from_files(const char *const *paths, int n,
                                             dist_file_reader_fn reader, void *user,
                                             const dist_interleave_options *opts,
                                             dist_dataset **out);

/* ---- TFRecord files and tf.train.Example (tf.data.TFRecordDataset, tf.io.parse_example) ---- */

typedef enum dist_tfrecord_compression {
    DIST_TFRECORD_NONE = 0, /* compression_type "" */
    DIST_TFRECORD_GZIP,     /* "GZIP": the whole file is one gzip stream (members may follow) */
    DIST_TFRECORD_ZLIB,     /* "ZLIB": the whole file is one zlib stream */
    DIST_TFRECORD_AUTO      /* libdist's own: each file's first bytes tell (see below) */
} dist_tfrecord_compression;

typedef struct dist_tfrecord_options {
    int version;                           /* DIST_TFRECORD_OPTIONS_VERSION */
    dist_tfrecord_compression compression; /* default DIST_TFRECORD_NONE */
    int64_t buffer_size;      /* bytes read from a file at a time; 0 = 256 KiB (TF's default) */
    int64_t max_record_bytes; /* a record claiming more is damaged, refused before any
                                 allocation; 0 = DIST_TFRECORD_MAX_RECORD_BYTES_DEFAULT */
    int ignore_errors;        /* non-zero: a damaged record ends its file (see below) */
    int num_parallel_reads;   /* > 1: that many files read at once (see below); 0 or 1: one
                                 file after the other */
} dist_tfrecord_options;

/* The default record cap: 256 MiB. */
#define DIST_TFRECORD_MAX_RECORD_BYTES_DEFAULT ((int64_t)256 << 20)
#define DIST_TFRECORD_OPTIONS_VERSION 1
#define DIST_TFRECORD_OPTIONS_INIT                                                                 \
    {                                                                                              \
        .version = DIST_TFRECORD_OPTIONS_VERSION, .compression = DIST_TFRECORD_NONE,               \
        .buffer_size = 0, .max_record_bytes = 0, .ignore_errors = 0, .num_parallel_reads = 0       \
    }

/* Elements (record uint8 [length]) of the TFRecord files, in list order, one per record, as
 * tf.data.TFRecordDataset(files, compression_type, buffer_size) yields them. Each record is
 *     uint64 length (little-endian), uint32 masked CRC-32C of those 8 bytes,
 *     length bytes of data, uint32 masked CRC-32C of the data,
 * and both CRCs are checked. Files are streamed (opened in turn by the iterator, read
 * buffer_size bytes at a time, inflated on the fly): memory is one record and one buffer.
 * A damaged record makes dist_iterator_next fail with DIST_FORMAT naming the file and the byte
 * offset (in the uncompressed stream) that TensorFlow's DataLossError names: "corrupted record
 * at N" with N the record's first byte for a length CRC that differs, its data's first byte
 * (N + 12) for a data CRC that differs; "truncated record at N" (the record's first byte) for a
 * file that ends inside a record. A length above max_record_bytes or (NONE) above the bytes left
 * in the file is refused before any allocation, and corrupt gzip/zlib data is DIST_FORMAT too.
 * Unlike TensorFlow 2.20, which ends a file quietly when fewer than 12 bytes are left (a
 * partial length field), libdist reports that as a truncated record. A missing file is
 * DIST_NOT_FOUND naming it.
 * Compression DIST_TFRECORD_AUTO (libdist's own; TensorFlow needs to be told) looks at each
 * file's first 12 bytes: a valid length CRC there means uncompressed (gzip or zlib bytes pass
 * that check once in 2^32), else the gzip magic 1f 8b 08 means GZIP and a zlib header ZLIB;
 * anything else is read as uncompressed (and its first record reported as corrupted).
 * num_parallel_reads N > 1 reads N files at once, each on its own thread, and yields their
 * records interleaved as TF's TFRecordDataset(num_parallel_reads=N) does (cycle_length N,
 * block_length 1, deterministic): the first record of files 0..N-1, then the second of each, a
 * finished file replaced by the next one in the list.
 * Auto-sharding (dist_dataset_auto_shard) treats the source as file based: FILE and AUTO give
 * worker i files i, i + num_workers, ..., and with fewer files than workers both are
 * DIST_INVALID_ARGUMENT, as tf.data's InvalidArgumentError (use DATA then). With
 * ignore_errors, as tf.data.experimental.ignore_errors() over a TFRecordDataset, the failing file
 * is left there: its damaged record and every record after it are skipped (TF moves to the next
 * file after a DataLossError: a length it cannot trust leaves no way to find the next record),
 * dist_iterator_skipped counts one per such file and a warning naming the file and offset is logged
 * once per file (a file that cannot be opened is skipped and counted the same way). The records
 * before the damage are kept. files (num_files > 0 entries) is copied; opts NULL means
 * DIST_TFRECORD_OPTIONS_INIT. The cardinality is unknown. Errors now: DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_dataset_from_tfrecord(const char *const *files, int num_files,
                                                const dist_tfrecord_options *opts,
                                                dist_dataset **out);

/* The paths matching a glob(3) pattern (`dir/train.tfrecord-*-of-*`), sorted byte-wise, as
 * tf.io.gfile.glob and tf.data.Dataset.list_files(pattern, shuffle=False) list them. *paths
 * (an array of *count strings) is the caller's: release it with dist_glob_free.
 * Errors: DIST_NOT_FOUND (nothing matches, naming the pattern), DIST_IO, DIST_OUT_OF_MEMORY. */
DIST_API dist_status dist_glob(const char *pattern, char ***paths, int *count);
DIST_API void dist_glob_free(char **paths, int count);

/* dist_dataset_from_tfrecord over dist_glob(pattern). Errors: those of both. */
DIST_API dist_status dist_dataset_from_tfrecord_glob(const char *pattern,
                                                     const dist_tfrecord_options *opts,
                                                     dist_dataset **out);

typedef enum dist_feature_kind {
    DIST_FEATURE_FIXED_LEN = 0, /* tf.io.FixedLenFeature */
    DIST_FEATURE_VAR_LEN        /* tf.io.VarLenFeature */
} dist_feature_kind;

/* One feature of a tf.train.Example to parse (tf.io.parse_single_example's features dict).
 * dtype is the tensor's: DIST_I64 for an Int64List, DIST_F32 for a FloatList, DIST_U8 for a
 * BytesList (the bytes themselves). */
typedef struct dist_feature_spec {
    const char *key;        /* the feature's name in the Example's map */
    dist_feature_kind kind; /* FIXED_LEN or VAR_LEN */
    dist_dtype dtype;       /* DIST_I64, DIST_F32 or DIST_U8 */
    int ndim;               /* FIXED_LEN numbers: the shape (0: a scalar); bytes: 0 */
    int64_t shape[DIST_MAX_DIMS];
    /* FIXED_LEN, optional: used when the Example lacks the feature (NULL: it is required):
     * the values (int64_t or float, as many as the shape holds), or for bytes
     * default_bytes bytes. Copied. */
    const void *default_value;
    size_t default_bytes;
} dist_feature_spec;

/* A map from serialized tf.train.Example records (elements of one uint8 [length] tensor, as
 * dist_dataset_from_tfrecord makes) to one tensor per feature, in `spec` order, as
 * tf.io.parse_single_example(record, features) gives them:
 *   - FIXED_LEN int64 / float: DIST_I64 / DIST_F32 of the spec's shape; the list must hold
 *     exactly that many values (row-major);
 *   - FIXED_LEN bytes (a scalar, ndim 0): DIST_U8 [length], the one value's bytes;
 *   - VAR_LEN int64 / float: DIST_I64 / DIST_F32 [n], the list's values; n (the tensor's
 *     dimension 0, 0 when the feature is absent) is its length: TF's SparseTensor for one
 *     Example, values with dense_shape [n];
 *   - VAR_LEN bytes: TWO components, DIST_U8 [total] (the n values' bytes back to back) then
 *     DIST_I64 [n] (each value's length), so the components after it move up by one.
 * Batch the VAR_LEN components with dist_dataset_padded_batch (to the batch's longest) or
 * dist_dataset_ragged_batch (values + row lengths); dist_dataset_batch needs equal shapes.
 * The protobuf is read by a parser of libdist's own (packed and unpacked repeated values;
 * unknown fields skipped; for a key given twice the last wins); every length is checked
 * against the bytes left, so a record cannot make the parser allocate more than a small
 * multiple of its own size. Errors in dist_iterator_next: DIST_FORMAT naming the feature and
 * the record's index in the pass (from 0) for a missing required feature, a list of another
 * kind (an Int64List for a float feature), a wrong number of values, malformed protobuf.
 * spec (num_features 1..DIST_ELEMENT_MAX entries, DIST_ELEMENT_MAX components at most) is
 * copied. Errors now: DIST_INVALID_ARGUMENT (in is not a dataset of one uint8 [length] tensor;
 * a bad spec; too many components), DIST_UNSUPPORTED (FIXED_LEN bytes with a shape). */
DIST_API dist_status dist_dataset_parse_example(dist_dataset *in, const dist_feature_spec *spec,
                                                int num_features, dist_dataset **out);

/* ---- decoding bytes (tf.io.decode_image, tf.io.decode_raw) -------------------------------- */

typedef struct dist_decode_image_options {
    int version;                       /* DIST_DECODE_IMAGE_OPTIONS_VERSION */
    int component;                     /* the element's component holding the bytes; default 0 */
    int channels;                      /* 1 (grayscale, default) or 3 (RGB) */
    int height, width;                 /* required (> 0): every image comes out this size */
    dist_jpeg_size_policy size_policy; /* default DIST_JPEG_RESIZE */
    int64_t max_pixels; /* a header claiming more pixels is refused before any allocation;
                           0 = DIST_JPEG_MAX_PIXELS_DEFAULT */
    int num_parallel;   /* images decoded at once, as map's num_parallel_calls: 0 or 1 on the
                           caller's thread, N > 1 threads, DIST_AUTOTUNE (see above); the order
                           and the results are the same for every value */
} dist_decode_image_options;

#define DIST_DECODE_IMAGE_OPTIONS_VERSION 1
#define DIST_DECODE_IMAGE_OPTIONS_INIT                                                             \
    {                                                                                              \
        .version = DIST_DECODE_IMAGE_OPTIONS_VERSION, .component = 0, .channels = 1, .height = 0,  \
        .width = 0, .size_policy = DIST_JPEG_RESIZE, .max_pixels = 0, .num_parallel = 1            \
    }

/* A map over elements whose component opts->component holds an encoded image (uint8
 * [length], as dist_dataset_parse_example gives a bytes feature), as tf.io.decode_image with
 * expand_animations=False followed by a resize: the component becomes uint8 [height, width,
 * channels]; the other components pass through unchanged. PNG (libpng; any bit depth and colour
 * type, alpha composited on black) and JPEG (libjpeg-turbo) are told apart by their first bytes.
 * An image of another size is resized (bilinear, half-pixel centres, as the JPEG folder source)
 * or, with DIST_JPEG_REJECT, an error. Errors in dist_iterator_next: DIST_FORMAT naming the
 * element's index in the pass (from 0) and what its bytes are: another format ("record 3 is a
 * GIF image"), bytes of no known format, a truncated or damaged PNG or JPEG, a header claiming
 * more than max_pixels pixels. Errors now: DIST_INVALID_ARGUMENT (the component is not uint8
 * [length]; bad options). */
DIST_API dist_status dist_dataset_map_decode_image(dist_dataset *in,
                                                   const dist_decode_image_options *opts,
                                                   dist_dataset **out);

/* A map that reinterprets component `component` (uint8 [length]) as little-endian values of
 * `dtype` (DIST_U8, DIST_I32, DIST_I64 or DIST_F32) of the given shape (ndim 0..DIST_MAX_DIMS,
 * every dimension known), as tf.io.decode_raw followed by a reshape; the other components pass
 * through. A record whose length is not numel * dtype size is DIST_FORMAT in
 * dist_iterator_next, naming its index and both lengths. Errors now: DIST_INVALID_ARGUMENT. */
DIST_API dist_status dist_dataset_map_decode_raw(dist_dataset *in, int component, dist_dtype dtype,
                                                 int ndim, const int64_t *shape,
                                                 dist_dataset **out);

/* ---- transformations (each takes a reference on `in`; see Ownership above) ---------------- */

/* A map function: reads `in` (borrowed) and writes `out`, whose tensors are preallocated with
 * the spec declared in dist_map_options (write their data; do not change shapes or dtypes).
 * Return DIST_OK, or an error made with a libdist call that sets the message. It may run on
 * several threads at once (num_parallel > 1) and must then be thread-safe. */
typedef dist_status (*dist_map_fn)(const dist_element *in, dist_element *out, void *user);

typedef struct dist_map_options {
    int version;                          /* DIST_MAP_OPTIONS_VERSION */
    const dist_element_spec *output_spec; /* required; all dimensions known (copied) */
    int num_parallel; /* threads; <= 1 (but -1) runs on the caller's thread; DIST_AUTOTUNE */
    int skip_errors;  /* drop (and count) elements whose map failed */
    const char *name; /* part of the description; default "map" */
} dist_map_options;

#define DIST_MAP_OPTIONS_VERSION 1
#define DIST_MAP_OPTIONS_INIT                                                                      \
    { DIST_MAP_OPTIONS_VERSION, NULL, 1, 0, NULL }

DIST_API dist_status dist_dataset_map(dist_dataset *in, dist_map_fn fn, void *user,
                                      const dist_map_options *opts, dist_dataset **out);

/* The built-in map of the MNIST-style pipelines: (image uint8 [H,W] or [H,W,C], label of an
 * integer dtype) -> (image float32 [H,W,C] (C = 1 for rank-2 images) scaled by 1/255,
 * label int32). A one-tensor input gives a one-tensor output. */
DIST_API dist_status dist_dataset_map_image_normalize(dist_dataset *in, dist_dataset **out);

/* Token ids for an Embedding: every integer component (uint8, int32, int64; others pass
 * through unchanged) as int32, as tf.cast(x, tf.int32), e.g. a tf.train.Example's Int64List
 * of ids and its int64 label. The first component holds the ids: with vocabulary > 0 each must
 * lie in [0, vocabulary) (dist_model_input_vocabulary; TensorFlow's CPU lookup fails on
 * others, where the lookup op would give a row of zeros); every other value must fit int32.
 * A value that does not is an error in dist_iterator_next (DIST_FORMAT naming the value, its
 * position and the range), never wrapped. Every dimension must be known. Errors now:
 * DIST_INVALID_ARGUMENT (the first component is not integers; vocabulary outside
 * [0, 2^31]). */
DIST_API dist_status dist_dataset_map_token_ids(dist_dataset *in, int64_t vocabulary,
                                                dist_dataset **out);

/* Keeps the elements for which `pred` sets *keep != 0. */
typedef dist_status (*dist_filter_fn)(const dist_element *in, int *keep, void *user);
DIST_API dist_status dist_dataset_filter(dist_dataset *in, dist_filter_fn pred, void *user,
                                         const char *name, dist_dataset **out);

/* TF's shuffle: a buffer of buffer_size elements, each output drawn uniformly from it and
 * replaced by the next input. buffer_size 1 is the identity. The order depends on seed and,
 * with reshuffle_each_iteration, on the epoch (and on the repetition inside a repeat). */
DIST_API dist_status dist_dataset_shuffle(dist_dataset *in, int64_t buffer_size, uint64_t seed,
                                          int reshuffle_each_iteration, dist_dataset **out);

/* Stacks `size` consecutive elements into one (a new leading dimension). The last batch is
 * smaller unless drop_remainder. All elements of a batch must have the same shapes. */
DIST_API dist_status dist_dataset_batch(dist_dataset *in, int64_t size, int drop_remainder,
                                        dist_dataset **out);

/* padded_batch's options: the shape each component is padded to and the value it is padded
 * with (tf.data's padded_shapes and padding_values). */
typedef struct dist_padded_batch_options {
    int version;           /* DIST_PADDED_BATCH_OPTIONS_VERSION */
    int has_padded_shapes; /* 0: every dimension padded to the batch's longest */
    /* component i's dimension d (of the element, before batching): its padded size, or -1 for
     * the batch's longest in that dimension */
    int64_t padded_shapes[DIST_ELEMENT_MAX][DIST_MAX_DIMS];
    /* component i's padding, converted to its dtype (integers exact to 2^53); default 0 */
    double padding_values[DIST_ELEMENT_MAX];
} dist_padded_batch_options;

#define DIST_PADDED_BATCH_OPTIONS_VERSION 1
#define DIST_PADDED_BATCH_OPTIONS_INIT                                                             \
    { .version = DIST_PADDED_BATCH_OPTIONS_VERSION }

/* Batches elements whose shapes differ (the VarLenFeatures of parse_example, token lists) as
 * tf.data's Dataset.padded_batch: each component of a batch becomes [n, D1, .., Dr] with Dd the
 * padded shape's dimension, or the longest of the batch's elements in that dimension; each
 * element's values sit at the start of its block, the rest is the padding value. The elements of
 * a batch must agree on each component's dtype and rank; an element larger than a fixed padded
 * dimension is DIST_INVALID_ARGUMENT in dist_iterator_next naming the batch, element, item and
 * dimension (TF's error), as is a padded shape below a known dimension now. opts NULL: the
 * defaults (pad to the longest, with 0). */
DIST_API dist_status dist_dataset_padded_batch(dist_dataset *in, int64_t size, int drop_remainder,
                                               const dist_padded_batch_options *opts,
                                               dist_dataset **out);

/* Batches as tf.data's Dataset.ragged_batch, with each RaggedTensor given as two components:
 * a component whose dimension 0 is unknown in the element spec (a VarLenFeature, the values of
 * a VarLenFeature of bytes) becomes its elements' values back to back ([sum of the lengths,
 * D1, ..]) followed by an int64 [n] tensor of the elements' lengths (the RaggedTensor's
 * row_lengths()); every other component is stacked as batch does. The other dimensions of a
 * ragged component must agree within a batch. Errors now: DIST_INVALID_ARGUMENT (more than
 * DIST_ELEMENT_MAX components after the split); in dist_iterator_next: DIST_INVALID_ARGUMENT
 * naming the batch, element and item whose shape does not fit. */
DIST_API dist_status dist_dataset_ragged_batch(dist_dataset *in, int64_t size, int drop_remainder,
                                               dist_dataset **out);

/* Splits each batch into num_replicas consecutive pieces of ceil(b / num_replicas) rows (the
 * last pieces may be smaller or empty), as tf.distribute splits a global batch over
 * replicas: range(6).batch(4) over 2 -> [0,1] [2,3] [4] [5]. */
DIST_API dist_status dist_dataset_rebatch(dist_dataset *in, int num_replicas, dist_dataset **out);

/* count < 0: forever. Each repetition restarts the input (a reshuffling shuffle reshuffles). */
DIST_API dist_status dist_dataset_repeat(dist_dataset *in, int64_t count, dist_dataset **out);
/* The first `count` elements (count < 0: all). */
DIST_API dist_status dist_dataset_take(dist_dataset *in, int64_t count, dist_dataset **out);
/* All but the first `count` elements (count < 0: none). */
DIST_API dist_status dist_dataset_skip(dist_dataset *in, int64_t count, dist_dataset **out);
/* Keeps elements index, index + num, index + 2 num, ... (TF's shard). */
DIST_API dist_status dist_dataset_shard(dist_dataset *in, int64_t num, int64_t index,
                                        dist_dataset **out);

/* Caches the elements of the first complete pass. filename NULL or "": in memory, shared by
 * all iterators of this dataset. Otherwise in that file (written to filename.tmp-PID, renamed
 * when the pass completes), which later passes, and later processes, read instead of the
 * input; a cache file of another pipeline is a DIST_FORMAT error. A partial pass caches
 * nothing. */
DIST_API dist_status dist_dataset_cache(dist_dataset *in, const char *filename, dist_dataset **out);

/* Produces up to `buffer_size` elements ahead on a background thread (bounded queue);
 * buffer_size DIST_AUTOTUNE tunes it (see DIST_AUTOTUNE). Errors: DIST_INVALID_ARGUMENT
 * (buffer_size < 1 and not DIST_AUTOTUNE). */
DIST_API dist_status dist_dataset_prefetch(dist_dataset *in, int buffer_size, dist_dataset **out);

/* ---- multi-worker input: tf.data.experimental.AutoShardPolicy ---------------------------- */

typedef enum dist_auto_shard_policy {
    DIST_AUTO_SHARD_OFF = 0, /* every worker sees the whole dataset */
    DIST_AUTO_SHARD_AUTO,    /* FILE when the source is file based, else DATA */
    DIST_AUTO_SHARD_FILE,    /* split the source's files over workers */
    DIST_AUTO_SHARD_DATA     /* every worker reads everything, keeps every num_workers-th */
} dist_auto_shard_policy;

/* What tf.distribute does to a dataset for worker `worker_index` of `num_workers` with
 * `num_replicas_in_sync` replicas in all (<= 1: no rebatching), keeping a trailing prefetch
 * last:
 *   - num_replicas_in_sync > 1: the (global) batches are split into per-replica batches
 *     (dist_dataset_rebatch);
 *   - DATA: then shard(num_workers, worker_index) of those per-replica batches, so with 12
 *     elements, batch(4), 2 workers and 2 replicas worker 0 sees [0,1] [4,5] [8,9];
 *   - FILE: the source's file list is sharded instead (file i goes to worker i % num_workers);
 *     fewer files than workers is DIST_INVALID_ARGUMENT, no file-based source DIST_NOT_FOUND;
 *   - AUTO: FILE when the source is a JPEG folder, a file list or TFRecord files (the same
 *     error when it has fewer files than workers, as TF raises InvalidArgumentError), else DATA;
 *   - OFF: no sharding.
 * Tensor slices and IDX sources are in-memory, not file-based. */
DIST_API dist_status dist_dataset_auto_shard(dist_dataset *in, dist_auto_shard_policy policy,
                                             int num_workers, int worker_index,
                                             int num_replicas_in_sync, dist_dataset **out);

/* "off", "auto", "file", "data" -> policy. DIST_INVALID_ARGUMENT otherwise. */
DIST_API dist_status dist_auto_shard_policy_parse(const char *text, dist_auto_shard_policy *out);

/* ---- iterators --------------------------------------------------------------------------- */

/* Starts epoch 0 of `ds` (takes a reference on it). Threads of parallel stages start now. */
DIST_API dist_status dist_iterator_create(dist_dataset *ds, dist_iterator **out);
/* Joins the iterator's threads and frees it. Accepts NULL. Safe mid-epoch. */
DIST_API void dist_iterator_destroy(dist_iterator *it);

/* The next element in *out (owned by the iterator, valid until its next call), or
 * *end_of_sequence = 1 (and out->count = 0) at the end of the epoch. */
DIST_API dist_status dist_iterator_next(dist_iterator *it, dist_element *out, int *end_of_sequence);

/* Starts the next epoch (epoch + 1) from the beginning; a reshuffling shuffle reshuffles. */
DIST_API dist_status dist_iterator_reset(dist_iterator *it);
/* Starts epoch `epoch` from the beginning. */
DIST_API dist_status dist_iterator_seek_epoch(dist_iterator *it, int64_t epoch);

DIST_API int64_t dist_iterator_epoch(const dist_iterator *it);
/* Elements returned so far in this epoch. */
DIST_API int64_t dist_iterator_position(const dist_iterator *it);
/* Bad files and failed map elements skipped so far in this epoch (skip_bad / skip_errors). */
DIST_API int64_t dist_iterator_skipped(const dist_iterator *it);

/* What DIST_AUTOTUNE has chosen so far in an iterator's pipeline: the number of autotuned
 * prefetch and map stages and the largest current buffer size and parallelism among them (0
 * when there is no such stage; values of stages beyond the first 16 are not reported). */
typedef struct dist_autotune_state {
    int prefetch_stages, prefetch_buffer;
    int map_stages, map_parallel;
} dist_autotune_state;
DIST_API dist_status dist_iterator_autotune(const dist_iterator *it, dist_autotune_state *out);

/* Saves the iterator's position: a small JSON text (pipeline description and fingerprint,
 * epoch, position) in *bytes (malloc'd, NUL-terminated, *n excludes the NUL; release it with
 * dist_iterator_state_free). */
DIST_API dist_status dist_iterator_save(const dist_iterator *it, void **bytes, size_t *n);
DIST_API void dist_iterator_state_free(void *bytes);

/* Moves the iterator to a saved position: the next element is the one the saved iterator
 * would have returned next. Replays the saved epoch up to the position (deterministic
 * pipelines make that exact), so it costs up to one epoch of input work.
 * Errors: DIST_FORMAT (not an iterator state), DIST_INVALID_ARGUMENT (the state belongs to
 * another pipeline: the message names the first stage that differs), and any error of the
 * replay. */
DIST_API dist_status dist_iterator_restore(dist_iterator *it, const void *bytes, size_t n);

DIST_END_DECLS

#endif
