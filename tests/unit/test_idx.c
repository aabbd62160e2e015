/* IDX reading: raw and gzip files written here, good and broken. */
#include "dist/idx.h"
#include "testutil.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dist_test_idx_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void remove_dir(void) {
    DIR *d = opendir(g_dir);
    if (!d) return;
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(path, sizeof path, "%s/%s", g_dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(g_dir);
}

/* Writes bytes to g_dir/name and returns the path (static buffer, one at a time). */
static const char *write_file(const char *name, const void *bytes, size_t n) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
    return path;
}

/* gzip-compresses in[0..n) into a malloc'd buffer. */
static unsigned char *gzip(const void *in, size_t n, size_t *out_n) {
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&z, (uLong)n) + 64;
    unsigned char *out = malloc(cap);
    z.next_in = (unsigned char *)in;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    ck_assert_int_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    *out_n = cap - z.avail_out;
    deflateEnd(&z);
    return out;
}

/* 00 00 08 03 | 2 | 3 | 4 | 0..23: a 2x3x4 uint8 IDX file. */
static size_t u8_2x3x4(unsigned char *buf) {
    static const unsigned char head[] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4};
    memcpy(buf, head, sizeof head);
    for (int i = 0; i < 24; i++) buf[sizeof head + i] = (unsigned char)(i * 10);
    return sizeof head + 24;
}

static void assert_u8_2x3x4(const dist_tensor *t) {
    ck_assert_int_eq(t->dtype, DIST_U8);
    ck_assert_int_eq(t->ndim, 3);
    ck_assert_int_eq(t->shape[0], 2);
    ck_assert_int_eq(t->shape[1], 3);
    ck_assert_int_eq(t->shape[2], 4);
    const unsigned char *p = t->data;
    for (int i = 0; i < 24; i++) ck_assert_uint_eq(p[i], (unsigned)(i * 10));
}

START_TEST(test_idx_reads_raw_uint8_file) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("a-idx3-ubyte", buf, n), &t), DIST_OK);
    assert_u8_2x3x4(t);
    dist_tensor_destroy(t);
}
END_TEST

START_TEST(test_idx_reads_gzip_file_whatever_its_name) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf), gz_n;
    unsigned char *gz = gzip(buf, n, &gz_n);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("no-gz-suffix", gz, gz_n), &t), DIST_OK);
    assert_u8_2x3x4(t);
    dist_tensor_destroy(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_reads_concatenated_gzip_members) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf), a_n, b_n;
    unsigned char *a = gzip(buf, 10, &a_n), *b = gzip(buf + 10, n - 10, &b_n);
    unsigned char both[256];
    memcpy(both, a, a_n);
    memcpy(both + a_n, b, b_n);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(both, a_n + b_n, "cat.gz", &t), DIST_OK);
    assert_u8_2x3x4(t);
    dist_tensor_destroy(t);
    free(a);
    free(b);
}
END_TEST

START_TEST(test_idx_reads_int32_big_endian) {
    /* 00 00 0C 01 | 2 | -2 | 0x01020304 */
    static const unsigned char buf[] = {0,    0,    0x0C, 1,    0, 0, 0, 2,
                                        0xFF, 0xFF, 0xFF, 0xFE, 1, 2, 3, 4};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(buf, sizeof buf, "i32", &t), DIST_OK);
    ck_assert_int_eq(t->dtype, DIST_I32);
    ck_assert_int_eq(t->ndim, 1);
    ck_assert_int_eq(t->shape[0], 2);
    ck_assert_int_eq(((int32_t *)t->data)[0], -2);
    ck_assert_int_eq(((int32_t *)t->data)[1], 0x01020304);
    dist_tensor_destroy(t);
}
END_TEST

START_TEST(test_idx_reads_float_big_endian) {
    /* 00 00 0D 02 | 1 | 2 | 1.5f (3F C0 00 00) | -2.0f (C0 00 00 00) */
    static const unsigned char buf[] = {0, 0, 0x0D, 2,    0, 0, 0,    1, 0, 0,
                                        0, 2, 0x3F, 0xC0, 0, 0, 0xC0, 0, 0, 0};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(buf, sizeof buf, "f32", &t), DIST_OK);
    ck_assert_int_eq(t->dtype, DIST_F32);
    ck_assert_int_eq(t->ndim, 2);
    ck_assert_float_eq(((float *)t->data)[0], 1.5f);
    ck_assert_float_eq(((float *)t->data)[1], -2.0f);
    dist_tensor_destroy(t);
}
END_TEST

START_TEST(test_idx_rejects_wrong_magic) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf);
    buf[1] = 0x08;
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("magic.idx", buf, n), &t), DIST_FORMAT);
    ck_assert_ptr_null(t);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "magic.idx"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "bad magic 00 08 08 03"));
}
END_TEST

START_TEST(test_idx_rejects_unknown_and_unsupported_types) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf);
    dist_tensor *t = NULL;
    buf[2] = 0x07;
    ck_assert_int_eq(dist_idx_read_memory(buf, n, "t.idx", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'t.idx': unknown IDX type byte 0x07");
    buf[2] = 0x0E;
    ck_assert_int_eq(dist_idx_read_memory(buf, n, "t.idx", &t), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "float64"));
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_idx_rejects_zero_dimensions_and_short_header) {
    static const unsigned char zero_dims[] = {0, 0, 0x08, 0};
    static const unsigned char cut_dims[] = {0, 0, 0x08, 3, 0, 0, 0, 2, 0, 0};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(zero_dims, sizeof zero_dims, "z", &t), DIST_FORMAT);
    ck_assert_int_eq(dist_idx_read_memory(cut_dims, sizeof cut_dims, "c", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'c': header promises 3 dimensions, file ends after 1");
    ck_assert_int_eq(dist_idx_read_memory(cut_dims, 2, "h", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'h': 2 bytes, too short for an IDX header");
    ck_assert_ptr_null(t);
}
END_TEST

/* Found by fuzz/fuzz_idx: dims 0x04060202 x 0x73 x 0x72632f08 overflow int64 elements, and
 * the zero dimension after them used to hide that (the payload is empty, the shape is not). */
START_TEST(test_idx_a_zero_dimension_does_not_hide_an_overflowing_shape) {
    static const unsigned char crash[] = {0x00, 0x00, 0x08, 0x05, 0x04, 0x06, 0x02, 0x02, 0x00,
                                          0x00, 0x00, 0x73, 0x72, 0x63, 0x2f, 0x08, 0x00, 0x00,
                                          0x00, 0x00, 0x1f, 0x00, 0x00, 0x2a, 0x08};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(crash, sizeof crash, "f", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'f': the dimensions' product overflows");
    ck_assert_ptr_null(t);
    /* A zero dimension with small others is an empty tensor, as before. */
    static const unsigned char empty[] = {0, 0, 0x08, 2, 0, 0, 0, 0, 0, 0, 0, 5};
    ck_assert_int_eq(dist_idx_read_memory(empty, sizeof empty, "e", &t), DIST_OK);
    ck_assert_int_eq(t->shape[1], 5);
    ck_assert_int_eq(dist_tensor_numel(t), 0);
    dist_tensor_destroy(t);
}
END_TEST

START_TEST(test_idx_rejects_truncated_payload) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("short.idx", buf, n - 4), &t), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'"));
    ck_assert_ptr_nonnull(
        strstr(dist_last_error(), "short.idx': header promises 24 bytes of data, file has 20"));

    size_t gz_n;
    unsigned char *gz = gzip(buf, n - 4, &gz_n);
    ck_assert_int_eq(dist_idx_read_memory(gz, gz_n, "short.gz", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(),
                     "'short.gz': header promises 24 bytes of data, the decompressed file has 20");
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_header_promising_more_than_present_names_both_sizes) {
    /* An MNIST training-images header (60000 x 28 x 28) followed by only 1000 bytes. */
    unsigned char buf[16 + 1000] = {0, 0, 0x08, 3, 0, 0, 0xEA, 0x60, 0, 0, 0, 28, 0, 0, 0, 28};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("x.idx", buf, sizeof buf), &t), DIST_FORMAT);
    ck_assert_ptr_nonnull(
        strstr(dist_last_error(), "x.idx': header promises 47040000 bytes of data, file has 1000"));
    size_t gz_n;
    unsigned char *gz = gzip(buf, sizeof buf, &gz_n);
    ck_assert_int_eq(dist_idx_read_memory(gz, gz_n, "x.idx.gz", &t), DIST_FORMAT);
    ck_assert_str_eq(
        dist_last_error(),
        "'x.idx.gz': header promises 47040000 bytes of data, the decompressed file has 1000");
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_rejects_trailing_garbage) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf);
    memcpy(buf + n, "junk", 4);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(buf, n + 4, "tail.idx", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(),
                     "'tail.idx': 4 bytes of trailing data after the 24 the header promises");

    size_t gz_n;
    unsigned char *gz = gzip(buf, n, &gz_n);
    unsigned char with_tail[256];
    memcpy(with_tail, gz, gz_n);
    memcpy(with_tail + gz_n, "junk", 4);
    ck_assert_int_eq(dist_idx_read_memory(with_tail, gz_n + 4, "tail.gz", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(),
                     "'tail.gz': 4 bytes of trailing garbage after the gzip data");
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_rejects_corrupt_gzip) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf), gz_n;
    unsigned char *gz = gzip(buf, n, &gz_n);
    for (size_t i = 12; i < gz_n - 8; i++) gz[i] ^= 0x5A; /* the deflate data, not the header */
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("corrupt.gz", gz, gz_n), &t), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupt.gz'"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "gzip"));
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_rejects_gzip_with_bad_crc) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf), gz_n;
    unsigned char *gz = gzip(buf, n, &gz_n);
    gz[gz_n - 8] ^= 0xFF; /* the CRC-32 in the gzip trailer */
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(gz, gz_n, "crc.gz", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'crc.gz': corrupt gzip data (incorrect data check)");
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_rejects_truncated_gzip) {
    unsigned char buf[64];
    size_t n = u8_2x3x4(buf), gz_n;
    unsigned char *gz = gzip(buf, n, &gz_n);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read_memory(gz, gz_n - 3, "cut.gz", &t), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "'cut.gz': the gzip data is truncated");
    ck_assert_ptr_null(t);
    free(gz);
}
END_TEST

START_TEST(test_idx_missing_file_is_not_found) {
    char path[512];
    snprintf(path, sizeof path, "%s/absent-idx3-ubyte.gz", g_dir);
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(path, &t), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), path));
    ck_assert_ptr_null(t);
}
END_TEST

START_TEST(test_idx_directory_is_io_error) {
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(g_dir, &t), DIST_IO);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), g_dir));
}
END_TEST

START_TEST(test_idx_empty_file_is_format_error) {
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(write_file("empty", "", 0), &t), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "empty': 0 bytes, too short"));
}
END_TEST

START_TEST(test_idx_null_arguments_are_invalid) {
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_idx_read(NULL, &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_idx_read_memory(NULL, 4, "x", &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_idx_read_memory("abcd", 4, "x", NULL), DIST_INVALID_ARGUMENT);
}
END_TEST

static Suite *idx_suite(void) {
    Suite *s = suite_create("idx");
    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, make_dir, remove_dir);
    tcase_add_test(tc, test_idx_reads_raw_uint8_file);
    tcase_add_test(tc, test_idx_reads_gzip_file_whatever_its_name);
    tcase_add_test(tc, test_idx_reads_concatenated_gzip_members);
    tcase_add_test(tc, test_idx_reads_int32_big_endian);
    tcase_add_test(tc, test_idx_reads_float_big_endian);
    tcase_add_test(tc, test_idx_rejects_wrong_magic);
    tcase_add_test(tc, test_idx_rejects_unknown_and_unsupported_types);
    tcase_add_test(tc, test_idx_rejects_zero_dimensions_and_short_header);
    tcase_add_test(tc, test_idx_rejects_truncated_payload);
    tcase_add_test(tc, test_idx_header_promising_more_than_present_names_both_sizes);
    tcase_add_test(tc, test_idx_rejects_trailing_garbage);
    tcase_add_test(tc, test_idx_rejects_corrupt_gzip);
    tcase_add_test(tc, test_idx_rejects_gzip_with_bad_crc);
    tcase_add_test(tc, test_idx_rejects_truncated_gzip);
    tcase_add_test(tc, test_idx_missing_file_is_not_found);
    tcase_add_test(tc, test_idx_directory_is_io_error);
    tcase_add_test(tc, test_idx_empty_file_is_format_error);
    tcase_add_test(tc, test_idx_null_arguments_are_invalid);
    tcase_add_test(tc, test_idx_a_zero_dimension_does_not_hide_an_overflowing_shape);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(idx_suite()); }
