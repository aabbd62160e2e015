/* Variable partitioners: TF's FixedShardsPartitioner, MinSizePartitioner and MaxSizePartitioner
 * (include/dist/partitioner.h has the rules).
 *
 * TF computes MinSize's total_bytes / min_shard_bytes and MaxSize's max_shard_bytes / row_bytes
 * in doubles, then rounds; here both are integer divisions. They agree whenever the operands
 * are below 2^53 (8 PiB), which is every variable that fits in memory: a double quotient of two
 * such integers cannot round across an integer. */
#include "dist/partitioner.h"

#include "core/error.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char dist_partitioner_forms[] =
    "none, fixed:N, min_size:BYTES[:MAX_SHARDS] or max_size:BYTES[:MAX_SHARDS]";

/* The checks of TF's constructors (MinSizePartitioner.__init__, MaxSizePartitioner.__init__),
 * with their messages. FixedShardsPartitioner checks nothing; its num_shards is checked where
 * ParameterServerStrategy would refuse the result (dist_partitioner_num_shards). */
static dist_status dist_partitioner_check_arguments(const dist_partitioner *p) {
    switch (p->kind) {
    case DIST_PARTITIONER_NONE:
    case DIST_PARTITIONER_FIXED_SHARDS: return DIST_OK;
    case DIST_PARTITIONER_MIN_SIZE:
        DIST_CHECK_ARG(p->min_shard_bytes >= 1,
                       "Argument `min_shard_bytes` must be positive. Received: %" PRId64,
                       p->min_shard_bytes);
        DIST_CHECK_ARG(p->max_shards >= 1, "Argument `max_shards` must be positive. Received: %d",
                       p->max_shards);
        break;
    case DIST_PARTITIONER_MAX_SIZE:
        /* TF's MaxSizePartitioner writes no colon after "Received" in these two. */
        DIST_CHECK_ARG(p->max_shard_bytes >= 1,
                       "Argument `max_shard_bytes` must be positive. Received %" PRId64,
                       p->max_shard_bytes);
        /* max_shards=None and 0 both mean no limit in TF (`if max_shards and ...`). */
        DIST_CHECK_ARG(p->max_shards >= 0, "Argument `max_shards` must be positive. Received %d",
                       p->max_shards);
        break;
    default: return dist_error(DIST_INVALID_ARGUMENT, "unknown partitioner kind %d", (int)p->kind);
    }
    DIST_CHECK_ARG(p->bytes_per_string >= 1,
                   "Argument `bytes_per_string` must be positive. Received: %d",
                   p->bytes_per_string);
    return DIST_OK;
}

/* "[a, b, c]" of TF's partition list: `first` on axis 0, 1 elsewhere. */
static void dist_partitioner_format_list(char *buf, size_t size, int64_t first, int ndim) {
    int n = snprintf(buf, size, "[%" PRId64, first);
    for (int i = 1; i < ndim && n > 0 && (size_t)n < size; ++i)
        n += snprintf(buf + n, size - (size_t)n, ", 1");
    if (n > 0 && (size_t)n < size) snprintf(buf + n, size - (size_t)n, "]");
}

static dist_status dist_partitioner_fixed(const dist_partitioner *p, int ndim, int64_t rows,
                                          int *out) {
    int64_t shards = p->num_shards < rows ? p->num_shards : rows;
    if (shards < 1) {
        char list[96];
        dist_partitioner_format_list(list, sizeof list, shards, ndim);
        return dist_error(DIST_INVALID_ARGUMENT,
                          "variable_partitioner must return a list/tuple whose elements are 1 "
                          "besides the first element (non-zero), got: %s (FixedShardsPartitioner("
                          "num_shards=%d) on %" PRId64 " rows)",
                          list, p->num_shards, rows);
    }
    *out = (int)shards;
    return DIST_OK;
}

static dist_status dist_partitioner_min_size(const dist_partitioner *p, int64_t rows,
                                             int64_t total_bytes, int *out) {
    int64_t wanted = total_bytes / p->min_shard_bytes + (total_bytes % p->min_shard_bytes != 0);
    int64_t shards = wanted < rows ? wanted : rows;
    if (p->max_shards < shards) shards = p->max_shards;
    *out = shards < 1 ? 1 : (int)shards;
    return DIST_OK;
}

static dist_status dist_partitioner_max_size(const dist_partitioner *p, int64_t rows,
                                             int64_t row_bytes, int *out) {
    /* TF divides by the row's bytes (and by the rows) in floating point: a variable with no
     * elements is a ZeroDivisionError there. */
    DIST_CHECK_ARG(rows > 0 && row_bytes > 0,
                   "MaxSizePartitioner: a variable with no elements cannot be partitioned (TF "
                   "divides by zero); shape has %" PRId64 " rows of %" PRId64 " bytes",
                   rows, row_bytes);
    int64_t rows_per_shard = p->max_shard_bytes / row_bytes;
    if (rows_per_shard < 1) rows_per_shard = 1;
    int64_t shards = rows / rows_per_shard + (rows % rows_per_shard != 0);
    if (p->max_shards > 0 && p->max_shards < shards) shards = p->max_shards;
    DIST_CHECK_ARG(shards <= INT_MAX,
                   "MaxSizePartitioner(max_shard_bytes=%" PRId64 ") asks for %" PRId64
                   " shards, more than %d",
                   p->max_shard_bytes, shards, INT_MAX);
    *out = (int)shards;
    return DIST_OK;
}

dist_status dist_partitioner_num_shards(const dist_partitioner *p, int ndim, const int64_t *shape,
                                        dist_dtype dtype, int *out) {
    DIST_CHECK_ARG(p && shape && out, "dist_partitioner_num_shards: NULL argument");
    DIST_CHECK_ARG(ndim >= 1,
                   "dist_partitioner_num_shards: a variable of rank %d cannot be partitioned "
                   "(partitioners split axis 0; ParameterServerStrategy does not partition "
                   "scalars)",
                   ndim);
    DIST_TRY(dist_partitioner_check_arguments(p));
    size_t element_size = dist_dtype_size(dtype);
    DIST_CHECK_ARG(element_size > 0, "dist_partitioner_num_shards: unknown dtype %d", (int)dtype);

    /* The bytes of one row and of the whole variable, refused past INT64_MAX. */
    int64_t row_bytes = (int64_t)element_size;
    for (int i = 0; i < ndim; ++i) {
        DIST_CHECK_ARG(shape[i] >= 0, "dist_partitioner_num_shards: dimension %d is %" PRId64, i,
                       shape[i]);
        if (i > 0 && __builtin_mul_overflow(row_bytes, shape[i], &row_bytes))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "dist_partitioner_num_shards: one row of the variable is more "
                              "than %" PRId64 " bytes",
                              INT64_MAX);
    }
    int64_t rows = shape[0], total_bytes = 0;
    if (__builtin_mul_overflow(row_bytes, rows, &total_bytes))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_partitioner_num_shards: the variable is more than %" PRId64
                          " bytes (%" PRId64 " rows of %" PRId64 ")",
                          INT64_MAX, rows, row_bytes);

    switch (p->kind) {
    case DIST_PARTITIONER_NONE: *out = 1; return DIST_OK;
    case DIST_PARTITIONER_FIXED_SHARDS: return dist_partitioner_fixed(p, ndim, rows, out);
    case DIST_PARTITIONER_MIN_SIZE: return dist_partitioner_min_size(p, rows, total_bytes, out);
    case DIST_PARTITIONER_MAX_SIZE: return dist_partitioner_max_size(p, rows, row_bytes, out);
    }
    return dist_error(DIST_INTERNAL, "unknown partitioner kind %d", (int)p->kind);
}

dist_status dist_partitioner_shard_rows(int64_t rows, int num_shards, int index, int64_t *offset,
                                        int64_t *count) {
    DIST_CHECK_ARG(offset && count, "dist_partitioner_shard_rows: NULL argument");
    DIST_CHECK_ARG(rows >= 0, "dist_partitioner_shard_rows: rows is %" PRId64, rows);
    DIST_CHECK_ARG(num_shards >= 1, "dist_partitioner_shard_rows: num_shards is %d", num_shards);
    DIST_CHECK_ARG(index >= 0 && index < num_shards,
                   "dist_partitioner_shard_rows: shard %d of %d does not exist", index, num_shards);
    int64_t base = rows / num_shards, extra = rows % num_shards;
    /* The first `extra` shards hold base + 1 rows; no product here can overflow. */
    *offset = index * base + (index < extra ? index : extra);
    *count = base + (index < extra);
    return DIST_OK;
}

/* A decimal integer in [lo, hi] that is the whole of `s`. */
static int dist_partitioner_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!((*s >= '0' && *s <= '9') || (*s == '-' && s[1] >= '0' && s[1] <= '9'))) return 0;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < lo || v > hi) return 0;
    *out = (int64_t)v;
    return 1;
}

dist_status dist_partitioner_parse(const char *text, dist_partitioner *out) {
    DIST_CHECK_ARG(text && out, "dist_partitioner_parse: NULL argument");
    dist_partitioner p = DIST_PARTITIONER_INIT;
    char buf[128];
    DIST_CHECK_ARG(strlen(text) < sizeof buf, "partitioner '%.32s...': too long; expected %s", text,
                   dist_partitioner_forms);
    memcpy(buf, text, strlen(text) + 1);

    char *fields[4] = {buf, NULL, NULL, NULL};
    int nfields = 1;
    for (char *c = buf; *c; ++c) {
        if (*c != ':') continue;
        DIST_CHECK_ARG(nfields < 3, "partitioner '%s': too many ':' fields; expected %s", text,
                       dist_partitioner_forms);
        *c = '\0';
        fields[nfields++] = c + 1;
    }
    const char *name = fields[0];
    int64_t a = 0, b = 0;
    if (strcmp(name, "none") == 0 && nfields == 1) {
        p.kind = DIST_PARTITIONER_NONE;
    } else if (strcmp(name, "fixed") == 0 && nfields == 2) {
        DIST_CHECK_ARG(dist_partitioner_parse_int(fields[1], INT_MIN, INT_MAX, &a),
                       "partitioner '%s': the number of shards '%s' is not an integer", text,
                       fields[1]);
        DIST_CHECK_ARG(a >= 1, "partitioner '%s': the number of shards must be at least 1", text);
        p.kind = DIST_PARTITIONER_FIXED_SHARDS;
        p.num_shards = (int)a;
    } else if ((strcmp(name, "min_size") == 0 || strcmp(name, "max_size") == 0) && nfields >= 2) {
        int is_min = name[1] == 'i';
        DIST_CHECK_ARG(dist_partitioner_parse_int(fields[1], INT64_MIN, INT64_MAX, &a),
                       "partitioner '%s': the shard size '%s' is not an integer number of bytes",
                       text, fields[1]);
        b = is_min ? 1 : 0;
        if (nfields == 3)
            DIST_CHECK_ARG(dist_partitioner_parse_int(fields[2], INT_MIN, INT_MAX, &b),
                           "partitioner '%s': the shard limit '%s' is not an integer", text,
                           fields[2]);
        p.kind = is_min ? DIST_PARTITIONER_MIN_SIZE : DIST_PARTITIONER_MAX_SIZE;
        if (is_min)
            p.min_shard_bytes = a;
        else
            p.max_shard_bytes = a;
        p.max_shards = (int)b;
        dist_status st = dist_partitioner_check_arguments(&p);
        if (st != DIST_OK) return dist_error_context(st, "partitioner '%s'", text);
    } else {
        return dist_error(DIST_INVALID_ARGUMENT, "partitioner '%s': expected %s", text,
                          dist_partitioner_forms);
    }
    *out = p;
    return DIST_OK;
}
