/* Variable partitioners: the shard counts of TF's FixedShardsPartitioner, MinSizePartitioner
 * and MaxSizePartitioner (their docstrings' examples pinned), ParameterServerStrategy's row
 * division, the CLI form, and every error. */
#include "dist/partitioner.h"
#include "testutil.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>

static dist_partitioner fixed(int num_shards) {
    dist_partitioner p = DIST_PARTITIONER_INIT;
    p.kind = DIST_PARTITIONER_FIXED_SHARDS;
    p.num_shards = num_shards;
    return p;
}

static dist_partitioner min_size(int64_t min_shard_bytes, int max_shards) {
    dist_partitioner p = DIST_PARTITIONER_INIT;
    p.kind = DIST_PARTITIONER_MIN_SIZE;
    p.min_shard_bytes = min_shard_bytes;
    p.max_shards = max_shards;
    return p;
}

static dist_partitioner max_size(int64_t max_shard_bytes, int max_shards) {
    dist_partitioner p = DIST_PARTITIONER_INIT;
    p.kind = DIST_PARTITIONER_MAX_SIZE;
    p.max_shard_bytes = max_shard_bytes;
    p.max_shards = max_shards;
    return p;
}

/* The shard count, or -1 when the call fails. */
static int shards_of(dist_partitioner p, int64_t rows, int64_t cols, dist_dtype dtype) {
    int64_t shape[2] = {rows, cols};
    int n = -1;
    return dist_partitioner_num_shards(&p, 2, shape, dtype, &n) == DIST_OK ? n : -1;
}

static void assert_fails_with(dist_partitioner p, int64_t rows, int64_t cols, dist_dtype dtype,
                              const char *message) {
    int64_t shape[2] = {rows, cols};
    int n = -7;
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 2, shape, dtype, &n), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), message), "'%s' lacks '%s'", dist_last_error(),
                  message);
    ck_assert_int_eq(n, -7);
}

START_TEST(test_partitioner_none_is_one_shard) {
    dist_partitioner p = DIST_PARTITIONER_INIT;
    ck_assert_int_eq(shards_of(p, 1000000, 512, DIST_F32), 1);
    ck_assert_int_eq(shards_of(p, 0, 512, DIST_F32), 1);
}
END_TEST

START_TEST(test_partitioner_fixed_shards_docstring_two_shards_of_five_rows) {
    /* FixedShardsPartitioner(num_shards=2) on TensorShape([10, 3]) -> [2, 1]. */
    ck_assert_int_eq(shards_of(fixed(2), 10, 3, DIST_F32), 2);
    ck_assert_int_eq(shards_of(fixed(2), 10, 1, DIST_F32), 2);
    int64_t offset = -1, count = -1;
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 2, 0, &offset, &count), DIST_OK);
    ck_assert_int_eq(offset, 0);
    ck_assert_int_eq(count, 5);
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 2, 1, &offset, &count), DIST_OK);
    ck_assert_int_eq(offset, 5);
    ck_assert_int_eq(count, 5);
}
END_TEST

START_TEST(test_partitioner_fixed_shards_are_capped_at_the_rows_and_ignore_the_dtype) {
    ck_assert_int_eq(shards_of(fixed(8), 3, 4, DIST_F32), 3);
    ck_assert_int_eq(shards_of(fixed(8), 1, 4, DIST_F32), 1);
    ck_assert_int_eq(shards_of(fixed(4), 1000, 1000, DIST_I64), 4);
    ck_assert_int_eq(shards_of(fixed(4), 1000, 1000, DIST_U8), 4);
}
END_TEST

START_TEST(test_partitioner_fixed_shards_of_zero_is_refused_as_parameter_server_strategy_does) {
    /* TF's partitioner returns [0, 1]; ParameterServerStrategy refuses a 0 on axis 0. */
    assert_fails_with(fixed(0), 10, 3, DIST_F32, "(non-zero), got: [0, 1]");
    assert_fails_with(fixed(-2), 10, 3, DIST_F32, "got: [-2, 1]");
    /* And a variable of no rows: min(2, 0) is 0 again. */
    assert_fails_with(fixed(2), 0, 3, DIST_F32, "(non-zero), got: [0, 1]");
}
END_TEST

START_TEST(test_partitioner_min_size_docstring_examples) {
    /* MinSizePartitioner(min_shard_bytes=4, max_shards=2) on [6, 1] float32 -> [2, 1]. */
    ck_assert_int_eq(shards_of(min_size(4, 2), 6, 1, DIST_F32), 2);
    /* MinSizePartitioner(min_shard_bytes=4, max_shards=10) on [6, 1] float32 -> [6, 1]. */
    ck_assert_int_eq(shards_of(min_size(4, 10), 6, 1, DIST_F32), 6);
    ck_assert_int_eq(shards_of(min_size(4, 2), 10, 1, DIST_F32), 2);
    /* min_max_variable_partitioner's docstring: [1024, 1024] float32 at 256K a slice is 16
     * partitions when max_partitions >= 16, else max_partitions. */
    ck_assert_int_eq(shards_of(min_size(256 << 10, 16), 1024, 1024, DIST_F32), 16);
    ck_assert_int_eq(shards_of(min_size(256 << 10, 100), 1024, 1024, DIST_F32), 16);
    ck_assert_int_eq(shards_of(min_size(256 << 10, 5), 1024, 1024, DIST_F32), 5);
}
END_TEST

START_TEST(test_partitioner_min_size_defaults_to_one_shard) {
    dist_partitioner p = DIST_PARTITIONER_INIT;
    p.kind = DIST_PARTITIONER_MIN_SIZE; /* min_shard_bytes=256K, max_shards=1 */
    ck_assert_int_eq(shards_of(p, 1024, 1024, DIST_F32), 1);
}
END_TEST

START_TEST(test_partitioner_min_size_rounds_the_shard_count_up_and_caps_it_at_the_rows) {
    /* 40 bytes / 16 = 2.5 -> 3 shards. */
    ck_assert_int_eq(shards_of(min_size(16, 10), 10, 1, DIST_F32), 3);
    /* 40 bytes / 20 = 2 exactly. */
    ck_assert_int_eq(shards_of(min_size(20, 10), 10, 1, DIST_F32), 2);
    /* float16 halves the bytes: 20 bytes / 16 -> 2. */
    ck_assert_int_eq(shards_of(min_size(16, 10), 10, 1, DIST_F16), 2);
    /* 3 rows of 4 KiB with 1 byte a shard: as many shards as rows. */
    ck_assert_int_eq(shards_of(min_size(1, 100), 3, 1024, DIST_F32), 3);
}
END_TEST

START_TEST(test_partitioner_min_size_of_an_empty_variable_is_one_shard) {
    ck_assert_int_eq(shards_of(min_size(4, 10), 0, 5, DIST_F32), 1);
    ck_assert_int_eq(shards_of(min_size(4, 10), 6, 0, DIST_F32), 1);
}
END_TEST

START_TEST(test_partitioner_max_size_docstring_examples) {
    /* MaxSizePartitioner(max_shard_bytes=4) on [6, 1] float32 -> [6, 1]. */
    ck_assert_int_eq(shards_of(max_size(4, 0), 6, 1, DIST_F32), 6);
    /* MaxSizePartitioner(max_shard_bytes=4, max_shards=2) -> [2, 1]. */
    ck_assert_int_eq(shards_of(max_size(4, 2), 6, 1, DIST_F32), 2);
    /* MaxSizePartitioner(max_shard_bytes=1024) -> [1, 1]. */
    ck_assert_int_eq(shards_of(max_size(1024, 0), 6, 1, DIST_F32), 1);
}
END_TEST

START_TEST(test_partitioner_max_size_fits_whole_rows_into_a_shard) {
    /* A row of [10, 3] float32 is 12 bytes: 30 bytes hold 2 rows -> 5 shards; 36 hold 3 -> 4. */
    ck_assert_int_eq(shards_of(max_size(30, 0), 10, 3, DIST_F32), 5);
    ck_assert_int_eq(shards_of(max_size(35, 0), 10, 3, DIST_F32), 5);
    ck_assert_int_eq(shards_of(max_size(36, 0), 10, 3, DIST_F32), 4);
    /* A row larger than the limit still makes one shard per row. */
    ck_assert_int_eq(shards_of(max_size(4, 0), 5, 100, DIST_F32), 5);
    /* float16 rows are half as large as float32 ones, int64 rows twice. */
    ck_assert_int_eq(shards_of(max_size(16, 0), 8, 4, DIST_F16), 4);
    ck_assert_int_eq(shards_of(max_size(16, 0), 8, 4, DIST_F32), 8);
    ck_assert_int_eq(shards_of(max_size(64, 0), 8, 4, DIST_I64), 4);
}
END_TEST

START_TEST(test_partitioner_max_size_uses_the_whole_row_of_a_rank_three_variable) {
    dist_partitioner p = max_size(2 * 3 * 4 * 4, 0); /* two rows of [3, 4] float32 */
    int64_t shape[3] = {7, 3, 4};
    int n = 0;
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 3, shape, DIST_F32, &n), DIST_OK);
    ck_assert_int_eq(n, 4);
}
END_TEST

START_TEST(test_partitioner_max_size_of_an_empty_variable_fails_where_tf_divides_by_zero) {
    assert_fails_with(max_size(4, 0), 0, 3, DIST_F32, "no elements");
    assert_fails_with(max_size(4, 0), 6, 0, DIST_F32, "no elements");
}
END_TEST

START_TEST(test_partitioner_max_size_past_int_max_shards_fails_unless_max_shards_caps_it) {
    /* 3e9 rows of one byte at one byte a shard. */
    assert_fails_with(max_size(1, 0), 3000000000LL, 1, DIST_U8, "shards, more than");
    ck_assert_int_eq(shards_of(max_size(1, 4), 3000000000LL, 1, DIST_U8), 4);
}
END_TEST

START_TEST(test_partitioner_tf_argument_checks_with_tf_messages) {
    assert_fails_with(min_size(0, 2), 10, 1, DIST_F32,
                      "Argument `min_shard_bytes` must be positive. Received: 0");
    assert_fails_with(min_size(4, 0), 10, 1, DIST_F32,
                      "Argument `max_shards` must be positive. Received: 0");
    assert_fails_with(min_size(4, -3), 10, 1, DIST_F32,
                      "Argument `max_shards` must be positive. Received: -3");
    assert_fails_with(max_size(0, 0), 10, 1, DIST_F32,
                      "Argument `max_shard_bytes` must be positive. Received 0");
    assert_fails_with(max_size(-5, 0), 10, 1, DIST_F32,
                      "Argument `max_shard_bytes` must be positive. Received -5");
    assert_fails_with(max_size(4, -1), 10, 1, DIST_F32,
                      "Argument `max_shards` must be positive. Received -1");
    dist_partitioner p = min_size(4, 2);
    p.bytes_per_string = 0;
    assert_fails_with(p, 10, 1, DIST_F32,
                      "Argument `bytes_per_string` must be positive. Received: 0");
    p = max_size(4, 2);
    p.bytes_per_string = -1;
    assert_fails_with(p, 10, 1, DIST_F32,
                      "Argument `bytes_per_string` must be positive. Received: -1");
}
END_TEST

START_TEST(test_partitioner_max_size_max_shards_zero_means_no_limit) {
    /* TF: `if max_shards and ...`, so 0 is None. */
    ck_assert_int_eq(shards_of(max_size(4, 0), 6, 1, DIST_F32), 6);
}
END_TEST

START_TEST(test_partitioner_refuses_bad_shapes_dtypes_kinds_and_nulls) {
    dist_partitioner p = fixed(2);
    int64_t shape[2] = {10, 3};
    int n = -7;
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 0, shape, DIST_F32, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "rank 0"), "%s", dist_last_error());
    ck_assert_int_eq(dist_partitioner_num_shards(&p, -1, shape, DIST_F32, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_num_shards(NULL, 2, shape, DIST_F32, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 2, NULL, DIST_F32, &n), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 2, shape, DIST_F32, NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 2, shape, DIST_DTYPE_COUNT, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "unknown dtype"), "%s", dist_last_error());
    assert_fails_with(fixed(2), 10, -1, DIST_F32, "dimension 1 is -1");
    assert_fails_with(fixed(2), -4, 3, DIST_F32, "dimension 0 is -4");
    p.kind = (dist_partitioner_kind)42;
    ck_assert_int_eq(dist_partitioner_num_shards(&p, 2, shape, DIST_F32, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "unknown partitioner kind 42"), "%s",
                  dist_last_error());
    ck_assert_int_eq(n, -7);
}
END_TEST

START_TEST(test_partitioner_refuses_variables_past_int64_max_bytes) {
    /* 2^61 rows of 4 float32 bytes: 2^65 bytes. */
    assert_fails_with(min_size(4, 2), (int64_t)1 << 61, 1, DIST_F32, "more than");
    assert_fails_with(max_size(4, 2), (int64_t)1 << 61, 1, DIST_F32, "more than");
    /* One row past INT64_MAX on its own. */
    assert_fails_with(max_size(4, 2), 2, INT64_MAX / 2, DIST_F32, "one row");
    /* Just under: 2^60 rows of 4 bytes fits, and the answer is exact. */
    ck_assert_int_eq(shards_of(min_size(4, 1000), (int64_t)1 << 60, 1, DIST_F32), 1000);
}
END_TEST

START_TEST(test_partitioner_ten_rows_over_three_shards_are_four_three_three) {
    const int64_t want_offset[3] = {0, 4, 7}, want_count[3] = {4, 3, 3};
    for (int i = 0; i < 3; ++i) {
        int64_t offset = -1, count = -1;
        ck_assert_int_eq(dist_partitioner_shard_rows(10, 3, i, &offset, &count), DIST_OK);
        ck_assert_int_eq(offset, want_offset[i]);
        ck_assert_int_eq(count, want_count[i]);
    }
}
END_TEST

START_TEST(test_partitioner_ten_rows_over_four_shards_are_three_three_two_two) {
    /* The example in ParameterServerStrategy's _create_variable: offsets 0, 3, 6, 8. */
    const int64_t want_offset[4] = {0, 3, 6, 8}, want_count[4] = {3, 3, 2, 2};
    for (int i = 0; i < 4; ++i) {
        int64_t offset = -1, count = -1;
        ck_assert_int_eq(dist_partitioner_shard_rows(10, 4, i, &offset, &count), DIST_OK);
        ck_assert_int_eq(offset, want_offset[i]);
        ck_assert_int_eq(count, want_count[i]);
    }
}
END_TEST

START_TEST(test_partitioner_shards_cover_every_row_once_in_order) {
    for (int64_t rows = 0; rows <= 40; ++rows) {
        for (int shards = 1; shards <= 12; ++shards) {
            int64_t next = 0, prev_count = INT64_MAX;
            for (int i = 0; i < shards; ++i) {
                int64_t offset = -1, count = -1;
                ck_assert_int_eq(dist_partitioner_shard_rows(rows, shards, i, &offset, &count),
                                 DIST_OK);
                ck_assert_int_eq(offset, next);
                ck_assert(count <= prev_count && prev_count - count <= (i ? 1 : INT64_MAX));
                next += count;
                prev_count = count;
            }
            ck_assert_int_eq(next, rows);
        }
    }
    /* Huge row counts do not overflow. */
    int64_t offset = -1, count = -1;
    ck_assert_int_eq(dist_partitioner_shard_rows(INT64_MAX, 3, 2, &offset, &count), DIST_OK);
    ck_assert_int_eq(offset + count, INT64_MAX);
}
END_TEST

START_TEST(test_partitioner_more_shards_than_rows_leaves_trailing_shards_empty) {
    int64_t offset = -1, count = -1;
    ck_assert_int_eq(dist_partitioner_shard_rows(2, 3, 1, &offset, &count), DIST_OK);
    ck_assert_int_eq(offset, 1);
    ck_assert_int_eq(count, 1);
    ck_assert_int_eq(dist_partitioner_shard_rows(2, 3, 2, &offset, &count), DIST_OK);
    ck_assert_int_eq(offset, 2);
    ck_assert_int_eq(count, 0);
}
END_TEST

START_TEST(test_partitioner_shard_rows_refuses_bad_arguments) {
    int64_t offset = -1, count = -1;
    ck_assert_int_eq(dist_partitioner_shard_rows(-1, 2, 0, &offset, &count), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 0, 0, &offset, &count), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 3, 3, &offset, &count), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "shard 3 of 3"), "%s", dist_last_error());
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 3, -1, &offset, &count),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 3, 0, NULL, &count), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_shard_rows(10, 3, 0, &offset, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(offset, -1);
    ck_assert_int_eq(count, -1);
}
END_TEST

START_TEST(test_partitioner_parse_reads_each_form_with_tf_defaults) {
    dist_partitioner p = fixed(99);
    ck_assert_int_eq(dist_partitioner_parse("none", &p), DIST_OK);
    ck_assert_int_eq(p.kind, DIST_PARTITIONER_NONE);

    ck_assert_int_eq(dist_partitioner_parse("fixed:4", &p), DIST_OK);
    ck_assert_int_eq(p.kind, DIST_PARTITIONER_FIXED_SHARDS);
    ck_assert_int_eq(p.num_shards, 4);

    ck_assert_int_eq(dist_partitioner_parse("min_size:1048576", &p), DIST_OK);
    ck_assert_int_eq(p.kind, DIST_PARTITIONER_MIN_SIZE);
    ck_assert_int_eq(p.min_shard_bytes, 1048576);
    ck_assert_int_eq(p.max_shards, 1); /* TF's default */
    ck_assert_int_eq(p.bytes_per_string, 16);

    ck_assert_int_eq(dist_partitioner_parse("min_size:4:2", &p), DIST_OK);
    ck_assert_int_eq(p.min_shard_bytes, 4);
    ck_assert_int_eq(p.max_shards, 2);

    ck_assert_int_eq(dist_partitioner_parse("max_size:67108863", &p), DIST_OK);
    ck_assert_int_eq(p.kind, DIST_PARTITIONER_MAX_SIZE);
    ck_assert_int_eq(p.max_shard_bytes, 67108863);
    ck_assert_int_eq(p.max_shards, 0); /* None: no limit */

    ck_assert_int_eq(dist_partitioner_parse("max_size:4:2", &p), DIST_OK);
    ck_assert_int_eq(p.max_shard_bytes, 4);
    ck_assert_int_eq(p.max_shards, 2);
    ck_assert_int_eq(shards_of(p, 6, 1, DIST_F32), 2);

    ck_assert_int_eq(dist_partitioner_parse("max_size:9223372036854775807:0", &p), DIST_OK);
    ck_assert_int_eq(p.max_shard_bytes, INT64_MAX);
}
END_TEST

static void assert_parse_fails_with(const char *text, const char *message) {
    dist_partitioner p = fixed(99);
    ck_assert_int_eq(dist_partitioner_parse(text, &p), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), message), "'%s': '%s' lacks '%s'", text,
                  dist_last_error(), message);
    ck_assert_int_eq(p.kind, DIST_PARTITIONER_FIXED_SHARDS); /* untouched */
    ck_assert_int_eq(p.num_shards, 99);
}

START_TEST(test_partitioner_parse_names_the_text_it_refuses) {
    assert_parse_fails_with("", "partitioner '': expected none, fixed:N");
    assert_parse_fails_with("fixed", "partitioner 'fixed': expected");
    assert_parse_fails_with("fixed:", "'fixed:': the number of shards '' is not an integer");
    assert_parse_fails_with("fixed:x", "'fixed:x': the number of shards 'x' is not an integer");
    assert_parse_fails_with("fixed:4x", "'4x' is not an integer");
    assert_parse_fails_with("fixed: 4", "' 4' is not an integer");
    assert_parse_fails_with("fixed:+4", "'+4' is not an integer");
    assert_parse_fails_with("fixed:0", "'fixed:0': the number of shards must be at least 1");
    assert_parse_fails_with("fixed:-1", "must be at least 1");
    assert_parse_fails_with("fixed:3000000000", "'3000000000' is not an integer");
    assert_parse_fails_with("fixed:2:3", "partitioner 'fixed:2:3': expected");
    assert_parse_fails_with("none:1", "partitioner 'none:1': expected");
    assert_parse_fails_with("NONE", "partitioner 'NONE': expected");
    assert_parse_fails_with("min_size", "partitioner 'min_size': expected");
    assert_parse_fails_with("min_size:1k", "'1k' is not an integer number of bytes");
    assert_parse_fails_with("min_size:4:x", "the shard limit 'x' is not an integer");
    assert_parse_fails_with("min_size:4:2:1", "too many ':' fields");
    assert_parse_fails_with("min_size:0",
                            "partitioner 'min_size:0': Argument `min_shard_bytes` must be "
                            "positive. Received: 0");
    assert_parse_fails_with("min_size:4:0", "Argument `max_shards` must be positive. Received: 0");
    assert_parse_fails_with("max_size:0",
                            "Argument `max_shard_bytes` must be positive. Received 0");
    assert_parse_fails_with("max_size:4:-2", "Argument `max_shards` must be positive. Received -2");
    assert_parse_fails_with("max_size:99999999999999999999", "is not an integer number of bytes");
    assert_parse_fails_with("sharded:4", "partitioner 'sharded:4': expected");
    char long_text[300];
    memset(long_text, '9', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = '\0';
    assert_parse_fails_with(long_text, "too long");
    dist_partitioner p;
    ck_assert_int_eq(dist_partitioner_parse(NULL, &p), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_partitioner_parse("none", NULL), DIST_INVALID_ARGUMENT);
}
END_TEST

static Suite *partitioner_suite(void) {
    Suite *s = suite_create("partitioner");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_partitioner_none_is_one_shard);
    tcase_add_test(tc, test_partitioner_fixed_shards_docstring_two_shards_of_five_rows);
    tcase_add_test(tc, test_partitioner_fixed_shards_are_capped_at_the_rows_and_ignore_the_dtype);
    tcase_add_test(
        tc, test_partitioner_fixed_shards_of_zero_is_refused_as_parameter_server_strategy_does);
    tcase_add_test(tc, test_partitioner_min_size_docstring_examples);
    tcase_add_test(tc, test_partitioner_min_size_defaults_to_one_shard);
    tcase_add_test(tc, test_partitioner_min_size_rounds_the_shard_count_up_and_caps_it_at_the_rows);
    tcase_add_test(tc, test_partitioner_min_size_of_an_empty_variable_is_one_shard);
    tcase_add_test(tc, test_partitioner_max_size_docstring_examples);
    tcase_add_test(tc, test_partitioner_max_size_fits_whole_rows_into_a_shard);
    tcase_add_test(tc, test_partitioner_max_size_uses_the_whole_row_of_a_rank_three_variable);
    tcase_add_test(tc,
                   test_partitioner_max_size_of_an_empty_variable_fails_where_tf_divides_by_zero);
    tcase_add_test(tc,
                   test_partitioner_max_size_past_int_max_shards_fails_unless_max_shards_caps_it);
    tcase_add_test(tc, test_partitioner_tf_argument_checks_with_tf_messages);
    tcase_add_test(tc, test_partitioner_max_size_max_shards_zero_means_no_limit);
    tcase_add_test(tc, test_partitioner_refuses_bad_shapes_dtypes_kinds_and_nulls);
    tcase_add_test(tc, test_partitioner_refuses_variables_past_int64_max_bytes);
    tcase_add_test(tc, test_partitioner_ten_rows_over_three_shards_are_four_three_three);
    tcase_add_test(tc, test_partitioner_ten_rows_over_four_shards_are_three_three_two_two);
    tcase_add_test(tc, test_partitioner_shards_cover_every_row_once_in_order);
    tcase_add_test(tc, test_partitioner_more_shards_than_rows_leaves_trailing_shards_empty);
    tcase_add_test(tc, test_partitioner_shard_rows_refuses_bad_arguments);
    tcase_add_test(tc, test_partitioner_parse_reads_each_form_with_tf_defaults);
    tcase_add_test(tc, test_partitioner_parse_names_the_text_it_refuses);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(partitioner_suite()); }
