/* TensorBoard event files: CRC-32C, the TFRecord mask, the exact bytes of a scalar event. */
#include "core/crc32c.h"
#include "dist/tensorboard.h"
#include "testutil.h"

#include <ftw.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Event{wall_time 1.5, step 3, summary{value{tag "loss", simple_value 0.25}}}, by hand:
 * 09 <1.5 as LE double>  field 1, fixed64
 * 10 03                  field 2, varint 3
 * 2a 0d                  field 5, 13 bytes of Summary
 *   0a 0b                Summary.value, 11 bytes of Value
 *     0a 04 "loss"       Value.tag
 *     15 <0.25 as LE float> Value.simple_value, fixed32 */
static const unsigned char loss_event[] = {0x09, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xf8, 0x3f,
                                           0x10, 0x03, 0x2a, 0x0d, 0x0a, 0x0b, 0x0a, 0x04, 'l',
                                           'o',  's',  's',  0x15, 0x00, 0x00, 0x80, 0x3e};

static char tmpdir[64];

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

/* Removes the test's temporary directory, if it made one. */
static void remove_tmpdir(void) {
    if (tmpdir[0]) nftw(tmpdir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    tmpdir[0] = '\0';
}

static void make_tmpdir(void) {
    strcpy(tmpdir, "/tmp/dist_tb_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static unsigned char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc(*n + 1);
    ck_assert_uint_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The SSE4.2 path (where the processor has it) and the table agree at every length and
 * alignment, across chunked calls too. */
START_TEST(test_crc32c_fast_path_equals_the_table_at_every_length_and_alignment) {
    unsigned char buf[600];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 131u + 7u);
    for (size_t off = 0; off < 9; off++)
        for (size_t n = 0; n + off <= sizeof buf; n += 13) {
            uint32_t fast = dist_crc32c_extend(0x1234u, buf + off, n);
            ck_assert_uint_eq(fast, dist_crc32c_extend_table(0x1234u, buf + off, n));
            uint32_t two = dist_crc32c_extend(dist_crc32c_extend(0, buf + off, n / 3),
                                              buf + off + n / 3, n - n / 3);
            ck_assert_uint_eq(two, dist_crc32c_extend_table(0, buf + off, n));
        }
}
END_TEST

START_TEST(test_crc32c_check_value_of_123456789) {
    ck_assert_uint_eq(dist_crc32c("123456789", 9), 0xE3069283u);
}
END_TEST

START_TEST(test_crc32c_of_32_zero_bytes_is_the_rfc3720_vector) {
    unsigned char zeros[32] = {0};
    ck_assert_uint_eq(dist_crc32c(zeros, 32), 0x8A9136AAu);
}
END_TEST

START_TEST(test_crc32c_extend_in_pieces_equals_one_shot) {
    uint32_t c = dist_crc32c_extend(0, "1234", 4);
    ck_assert_uint_eq(dist_crc32c_extend(c, "56789", 5), 0xE3069283u);
}
END_TEST

START_TEST(test_masked_crc_rotates_right_15_and_adds_a282ead8) {
    /* (0xE3069283 >> 15 | 0xE3069283 << 17) = 0x2507c60d; + 0xa282ead8 = 0xc78ab0e5 */
    ck_assert_uint_eq(dist_crc32c_mask(0xE3069283u), 0xc78ab0e5u);
    ck_assert_uint_eq(dist_crc32c_mask(0), 0xa282ead8u);
}
END_TEST

START_TEST(test_encode_scalar_gives_the_hand_encoded_bytes) {
    unsigned char buf[64];
    size_t len = 0;
    ck_assert_int_eq(dist_tensorboard_encode_scalar(1.5, 3, "loss", 0.25f, buf, sizeof buf, &len),
                     DIST_OK);
    ck_assert_uint_eq(len, sizeof loss_event);
    ck_assert_mem_eq(buf, loss_event, sizeof loss_event);
}
END_TEST

START_TEST(test_encode_scalar_reports_the_size_needed) {
    unsigned char buf[8];
    size_t len = 0;
    ck_assert_int_eq(dist_tensorboard_encode_scalar(1.5, 3, "loss", 0.25f, buf, sizeof buf, &len),
                     DIST_INVALID_ARGUMENT);
    ck_assert_uint_eq(len, 26);
}
END_TEST

START_TEST(test_negative_step_is_a_ten_byte_varint) {
    unsigned char buf[64];
    size_t len = 0;
    ck_assert_int_eq(dist_tensorboard_encode_scalar(1.5, -1, "loss", 0.25f, buf, sizeof buf, &len),
                     DIST_OK);
    ck_assert_uint_eq(len, 26 + 9);
    ck_assert_uint_eq(buf[9], 0x10);
    for (int i = 10; i < 19; i++) ck_assert_uint_eq(buf[i], 0xff);
    ck_assert_uint_eq(buf[19], 0x01);
}
END_TEST

START_TEST(test_writer_names_the_file_and_frames_each_record) {
    make_tmpdir();
    char logdir[128];
    snprintf(logdir, sizeof logdir, "%s/run/train", tmpdir); /* parents are created */
    dist_summary_writer *w = NULL;
    ck_assert_int_eq(dist_summary_writer_create(logdir, &w), DIST_OK);
    const char *path = dist_summary_writer_path(w);
    regex_t re;
    ck_assert_int_eq(
        regcomp(&re, "/run/train/events\\.out\\.tfevents\\.[0-9]{10}\\.[^/]+$", REG_EXTENDED), 0);
    ck_assert_msg(regexec(&re, path, 0, NULL, 0) == 0, "unexpected event file name %s", path);
    regfree(&re);
    ck_assert_int_eq(dist_summary_writer_scalar_at(w, "loss", 0.25f, 3, 1.5), DIST_OK);

    /* Flushed: readable before the writer is destroyed. */
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    /* Record 1: Event{wall_time, file_version "brain.Event:2"}: 9 + 2 + 13 = 24 bytes. */
    ck_assert_uint_eq(n, (8 + 4 + 24 + 4) + (8 + 4 + 26 + 4));
    ck_assert_uint_eq(b[0], 24);
    for (int i = 1; i < 8; i++) ck_assert_uint_eq(b[i], 0);
    ck_assert_uint_eq(le32(b + 8), dist_crc32c_mask(dist_crc32c(b, 8)));
    ck_assert_uint_eq(b[12], 0x09);
    ck_assert_uint_eq(b[21], 0x1a);
    ck_assert_uint_eq(b[22], 13);
    ck_assert_mem_eq(b + 23, "brain.Event:2", 13);
    ck_assert_uint_eq(le32(b + 36), dist_crc32c_mask(dist_crc32c(b + 12, 24)));

    const unsigned char *r = b + 40;
    const unsigned char len26[8] = {26, 0, 0, 0, 0, 0, 0, 0};
    ck_assert_mem_eq(r, len26, 8);
    ck_assert_uint_eq(le32(r + 8), dist_crc32c_mask(dist_crc32c(len26, 8)));
    ck_assert_mem_eq(r + 12, loss_event, sizeof loss_event);
    ck_assert_uint_eq(le32(r + 38), dist_crc32c_mask(dist_crc32c(loss_event, sizeof loss_event)));
    free(b);
    dist_summary_writer_destroy(w);
}
END_TEST

START_TEST(test_two_writers_in_one_second_get_two_files) {
    make_tmpdir();
    dist_summary_writer *a = NULL, *b = NULL;
    ck_assert_int_eq(dist_summary_writer_create(tmpdir, &a), DIST_OK);
    ck_assert_int_eq(dist_summary_writer_create(tmpdir, &b), DIST_OK);
    ck_assert_str_ne(dist_summary_writer_path(a), dist_summary_writer_path(b));
    dist_summary_writer_destroy(a);
    dist_summary_writer_destroy(b);
}
END_TEST

START_TEST(test_writer_refuses_an_empty_tag_and_a_file_as_logdir) {
    make_tmpdir();
    dist_summary_writer *w = NULL;
    ck_assert_int_eq(dist_summary_writer_create(tmpdir, &w), DIST_OK);
    ck_assert_int_eq(dist_summary_writer_scalar(w, "", 1.0f, 0), DIST_INVALID_ARGUMENT);
    dist_summary_writer *w2 = NULL;
    ck_assert_int_eq(dist_summary_writer_create(dist_summary_writer_path(w), &w2), DIST_IO);
    ck_assert_ptr_null(w2);
    dist_summary_writer_destroy(w);
    dist_summary_writer_destroy(NULL);
}
END_TEST

/* tf.summary.histogram's rule, by hand: width = (max - min) / k, bucket floor((x - min) / width)
 * with the maximum in the last bucket, edges min + i * width. */
START_TEST(test_histogram_of_0_1_2_3_in_3_buckets_puts_the_maximum_in_the_last) {
    const float data[] = {0.0f, 1.0f, 2.0f, 3.0f};
    double rows[9];
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(data, 4, 3, rows), DIST_OK);
    const double want[9] = {0, 1, 1, 1, 2, 1, 2, 3, 2};
    for (int i = 0; i < 9; i++) ck_assert_double_eq(rows[i], want[i]);
}
END_TEST

START_TEST(test_histogram_of_minus_1_and_1_in_2_buckets_splits_at_0) {
    const float data[] = {1.0f, -1.0f, 0.0f};
    double rows[6];
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(data, 3, 2, rows), DIST_OK);
    const double want[6] = {-1, 0, 1, 0, 1, 2}; /* 0 is the left edge of the second bucket */
    for (int i = 0; i < 6; i++) ck_assert_double_eq(rows[i], want[i]);
}
END_TEST

START_TEST(test_histogram_of_one_repeated_value_counts_it_in_the_last_bucket) {
    const float data[] = {2.5f, 2.5f, 2.5f};
    double rows[12];
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(data, 3, 4, rows), DIST_OK);
    const double want[12] = {2.5, 2.5, 0, 2.5, 2.5, 0, 2.5, 2.5, 0, 2.5, 2.5, 3};
    for (int i = 0; i < 12; i++) ck_assert_double_eq(rows[i], want[i]);
}
END_TEST

START_TEST(test_histogram_of_nothing_is_all_zeros_and_of_nan_an_error) {
    double rows[6] = {7, 7, 7, 7, 7, 7};
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(NULL, 0, 2, rows), DIST_OK);
    for (int i = 0; i < 6; i++) ck_assert_double_eq(rows[i], 0.0);
    const float bad[] = {1.0f, NAN};
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(bad, 2, 2, rows), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "value 1 of 2 is nan"));
    ck_assert_int_eq(dist_tensorboard_histogram_buckets(bad, 1, 0, rows), DIST_INVALID_ARGUMENT);
}
END_TEST

/* Event{step 7, summary{value{tag "w", metadata{plugin_data{plugin_name "histograms"}},
 * tensor{dtype DT_DOUBLE, shape [1, 3], tensor_content (5, 5, 1)}}}} after the wall time. */
START_TEST(test_histogram_event_is_a_float64_tensor_with_the_histograms_plugin) {
    make_tmpdir();
    dist_summary_writer *w = NULL;
    ck_assert_int_eq(dist_summary_writer_create(tmpdir, &w), DIST_OK);
    const float data[] = {5.0f};
    ck_assert_int_eq(dist_summary_writer_histogram(w, "w", data, 1, 1, 7), DIST_OK);
    ck_assert_int_eq(dist_summary_writer_histogram(w, "w", data, 1, 0, 7), DIST_INVALID_ARGUMENT);
    size_t n;
    unsigned char *b = slurp(dist_summary_writer_path(w), &n);
    const unsigned char head[] = {0x10, 0x07, 0x2a, 0x3d, 0x0a, 0x3b, 0x0a, 0x01, 'w',  0x4a, 0x0e,
                                  0x0a, 0x0c, 0x0a, 0x0a, 'h',  'i',  's',  't',  'o',  'g',  'r',
                                  'a',  'm',  's',  0x42, 0x26, 0x08, 0x02, 0x12, 0x08, 0x12, 0x02,
                                  0x08, 0x01, 0x12, 0x02, 0x08, 0x03, 0x22, 0x18};
    const unsigned char *r = b + 40; /* after the file_version record */
    size_t len = (size_t)r[0];
    ck_assert_uint_eq(len, 9 + sizeof head + 24);
    ck_assert_uint_eq(n, 40 + 12 + len + 4);
    ck_assert_uint_eq(r[12], 0x09);
    ck_assert_mem_eq(r + 12 + 9, head, sizeof head);
    double rows[3];
    memcpy(rows, r + 12 + 9 + sizeof head, sizeof rows);
    ck_assert_double_eq(rows[0], 5.0);
    ck_assert_double_eq(rows[1], 5.0);
    ck_assert_double_eq(rows[2], 1.0);
    ck_assert_uint_eq(le32(r + 12 + len), dist_crc32c_mask(dist_crc32c(r + 12, len)));
    free(b);
    dist_summary_writer_destroy(w);
}
END_TEST

static Suite *tensorboard_suite(void) {
    Suite *s = suite_create("tensorboard");
    TCase *tc = tcase_create("events");
    tcase_add_checked_fixture(tc, NULL, remove_tmpdir);
    tcase_add_test(tc, test_crc32c_fast_path_equals_the_table_at_every_length_and_alignment);
    tcase_add_test(tc, test_crc32c_check_value_of_123456789);
    tcase_add_test(tc, test_crc32c_of_32_zero_bytes_is_the_rfc3720_vector);
    tcase_add_test(tc, test_crc32c_extend_in_pieces_equals_one_shot);
    tcase_add_test(tc, test_masked_crc_rotates_right_15_and_adds_a282ead8);
    tcase_add_test(tc, test_encode_scalar_gives_the_hand_encoded_bytes);
    tcase_add_test(tc, test_encode_scalar_reports_the_size_needed);
    tcase_add_test(tc, test_negative_step_is_a_ten_byte_varint);
    tcase_add_test(tc, test_writer_names_the_file_and_frames_each_record);
    tcase_add_test(tc, test_two_writers_in_one_second_get_two_files);
    tcase_add_test(tc, test_writer_refuses_an_empty_tag_and_a_file_as_logdir);
    tcase_add_test(tc, test_histogram_of_0_1_2_3_in_3_buckets_puts_the_maximum_in_the_last);
    tcase_add_test(tc, test_histogram_of_minus_1_and_1_in_2_buckets_splits_at_0);
    tcase_add_test(tc, test_histogram_of_one_repeated_value_counts_it_in_the_last_bucket);
    tcase_add_test(tc, test_histogram_of_nothing_is_all_zeros_and_of_nan_an_error);
    tcase_add_test(tc, test_histogram_event_is_a_float64_tensor_with_the_histograms_plugin);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(tensorboard_suite()); }
