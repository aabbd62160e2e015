/* libdist: variable partitioners, tf.distribute.experimental.partitioners, for
 * ParameterServerStrategy.
 *
 * A partitioner decides how many shards a variable is split into; TF partitions along axis 0
 * only, so a shard is a run of whole rows. The rules, as TensorFlow 2.20 computes them
 * (tensorflow/python/distribute/sharded_variable.py, ops/partitioned_variables.py):
 *   - FixedShardsPartitioner(num_shards):  min(num_shards, rows).
 *   - MinSizePartitioner(min_shard_bytes, max_shards): max(1, min(rows, max_shards,
 *     ceil(total_bytes / min_shard_bytes))), total_bytes = elements * element size.
 *   - MaxSizePartitioner(max_shard_bytes, max_shards): a row is elements / rows * element size
 *     bytes; rows_per_shard = max(1, floor(max_shard_bytes / row_bytes)); shards =
 *     ceil(rows / rows_per_shard), then min(shards, max_shards) when max_shards is set.
 * ParameterServerStrategy then splits the rows "div" style (dist_partitioner_shard_rows).
 *
 * Errors are DIST_INVALID_ARGUMENT with TensorFlow's message in dist_last_error() where TF has
 * one. Where TF does not check (FixedShardsPartitioner takes any num_shards) the error is the
 * one ParameterServerStrategy raises when it gets the result. */
#ifndef DIST_PARTITIONER_H
#define DIST_PARTITIONER_H

#include "dist/export.h"
#include "dist/status.h"
#include "dist/tensor.h"

#include <stdint.h>

DIST_BEGIN_DECLS

/* The partitioners of tf.distribute.experimental.partitioners, with TF's argument names and
 * defaults. */
typedef enum dist_partitioner_kind {
    /* One shard: ParameterServerStrategy(variable_partitioner=None). */
    DIST_PARTITIONER_NONE = 0,
    /* FixedShardsPartitioner(num_shards). */
    DIST_PARTITIONER_FIXED_SHARDS,
    /* MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=1, bytes_per_string=16). */
    DIST_PARTITIONER_MIN_SIZE,
    /* MaxSizePartitioner(max_shard_bytes, max_shards=None, bytes_per_string=16). */
    DIST_PARTITIONER_MAX_SIZE
} dist_partitioner_kind;

/* The arguments of one partitioner; fields a kind does not use are ignored. Note that the
 * initializer's max_shards is MinSizePartitioner's default (1): a MAX_SIZE partitioner made
 * from it must set max_shards to 0 for TF's default (None, no limit). */
typedef struct dist_partitioner {
    dist_partitioner_kind kind;
    int num_shards;          /* FIXED_SHARDS */
    int64_t min_shard_bytes; /* MIN_SIZE */
    int64_t max_shard_bytes; /* MAX_SIZE */
    int max_shards;          /* MIN_SIZE; MAX_SIZE (0: no limit) */
    int bytes_per_string;    /* for string dtypes in TF; kept for the arguments' sake */
} dist_partitioner;
#define DIST_PARTITIONER_INIT                                                                      \
    { DIST_PARTITIONER_NONE, 0, 256 << 10, 0, 1, 16 }

/* How many shards TF makes for a variable of this shape and dtype: *out >= 1 on success.
 * `shape` is borrowed, ndim entries, each >= 0. The count is never above shape[0] except that
 * a variable of 0 rows is one (empty) shard under NONE and MIN_SIZE.
 * Errors (DIST_INVALID_ARGUMENT, nothing written to *out):
 *   - p, shape or out NULL; ndim < 1; a negative dimension; an unknown kind or dtype;
 *   - FIXED_SHARDS: num_shards < 1, or 0 rows (TF's partitioner returns 0 shards, which
 *     ParameterServerStrategy refuses with "variable_partitioner must return ... (non-zero)");
 *   - MIN_SIZE: min_shard_bytes < 1, max_shards < 1 ("Argument `max_shards` must be positive.
 *     Received: 0" and so on, TF's messages);
 *   - MAX_SIZE: max_shard_bytes < 1, max_shards < 0; a variable with no elements (TF divides by
 *     zero there);
 *   - MAX_SIZE: more than INT_MAX shards (a tiny max_shard_bytes on billions of rows);
 *   - MIN_SIZE, MAX_SIZE: bytes_per_string < 1;
 *   - any kind: a variable of more than INT64_MAX bytes. */
DIST_API dist_status dist_partitioner_num_shards(const dist_partitioner *p, int ndim,
                                                 const int64_t *shape, dist_dtype dtype, int *out);

/* Rows [*offset, *offset + *count) of shard `index` of `num_shards` over `rows` rows, TF's
 * ShardedVariable division (ParameterServerStrategy's "div" strategy): rows / num_shards each,
 * the first rows % num_shards shards one row larger. 10 rows over 3 shards: 4, 3, 3.
 * num_shards above rows gives empty trailing shards (TF never asks for that: it caps the count
 * at rows first). Errors: DIST_INVALID_ARGUMENT for rows < 0, num_shards < 1, index outside
 * [0, num_shards), or a NULL out-parameter. */
DIST_API dist_status dist_partitioner_shard_rows(int64_t rows, int num_shards, int index,
                                                 int64_t *offset, int64_t *count);

/* Parses the CLI form into *out (starting from DIST_PARTITIONER_INIT): "none", "fixed:N",
 * "min_size:BYTES[:MAX_SHARDS]" (MAX_SHARDS defaults to 1, as TF's),
 * "max_size:BYTES[:MAX_SHARDS]" (MAX_SHARDS defaults to 0: no limit). Numbers are decimal.
 * The values are checked as TF's constructors check them. Errors: DIST_INVALID_ARGUMENT with a
 * message that quotes the text; *out is left unchanged. */
DIST_API dist_status dist_partitioner_parse(const char *text, dist_partitioner *out);

DIST_END_DECLS

#endif
