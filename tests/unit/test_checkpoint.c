/* Safetensors checkpoints: round trip, layout, refusal of damaged files, restore checks, the
 * manager keeping the last K and skipping a corrupt newest file, model variables. */
#include "dist/checkpoint.h"
#include "testutil.h"

#include <dirent.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static char tmpdir[64];
static char path[160];

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
    strcpy(tmpdir, "/tmp/dist_ckpt_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(path, sizeof path, "%s/model.safetensors", tmpdir);
}

static unsigned char *slurp(const char *p, size_t *n) { return dist_test_read_file(p, n); }

static void spit(const char *p, const void *b, size_t n) {
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* kernel f32 [2, 3] = 0..5 / 2, steps i64 [4] = 10..13, epoch i32 scalar = 7; metadata lr. */
static dist_checkpoint *sample(void) {
    static float kernel[6] = {0, 0.5f, 1, 1.5f, 2, 2.5f};
    static int64_t steps[4] = {10, 11, 12, 13};
    static int32_t epoch = 7;
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    dist_tensor k = dist_tensor_view(kernel, DIST_F32, 2, (int64_t[]){2, 3});
    dist_tensor s = dist_tensor_view(steps, DIST_I64, 1, (int64_t[]){4});
    dist_tensor e = dist_tensor_view(&epoch, DIST_I32, 0, NULL);
    ck_assert_int_eq(dist_checkpoint_add(c, "dense/kernel", &k), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add(c, "epoch", &e), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add(c, "steps", &s), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "learning_rate", "0.001"), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "step", "42"), DIST_OK);
    return c;
}

static void save_sample(const char *p) {
    dist_checkpoint *c = sample();
    ck_assert_int_eq(dist_checkpoint_save(c, p), DIST_OK);
    dist_checkpoint_destroy(c);
}

static void expect_refused(const char *p, dist_status want, const char *words) {
    dist_checkpoint *c = (dist_checkpoint *)1;
    ck_assert_int_eq(dist_checkpoint_load(p, &c), want);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dist_last_error(), p) != NULL, "message lacks the path: %s",
                  dist_last_error());
    ck_assert_msg(strstr(dist_last_error(), words) != NULL, "message lacks '%s': %s", words,
                  dist_last_error());
}

START_TEST(test_round_trip_keeps_names_shapes_values_and_metadata) {
    make_tmpdir();
    save_sample(path);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_num_tensors(c), 3);
    const dist_tensor *k = dist_checkpoint_find(c, "dense/kernel");
    ck_assert_ptr_nonnull(k);
    ck_assert_int_eq(k->dtype, DIST_F32);
    ck_assert_int_eq(k->ndim, 2);
    ck_assert_int_eq(k->shape[0], 2);
    ck_assert_int_eq(k->shape[1], 3);
    ck_assert_float_eq(((float *)k->data)[5], 2.5f);
    const dist_tensor *s = dist_checkpoint_find(c, "steps");
    ck_assert_int_eq(s->dtype, DIST_I64);
    ck_assert_int_eq(((int64_t *)s->data)[3], 13);
    const dist_tensor *e = dist_checkpoint_find(c, "epoch");
    ck_assert_int_eq(e->dtype, DIST_I32);
    ck_assert_int_eq(e->ndim, 0);
    ck_assert_int_eq(*(int32_t *)e->data, 7);
    ck_assert_str_eq(dist_checkpoint_metadata(c, "learning_rate"), "0.001");
    ck_assert_str_eq(dist_checkpoint_metadata(c, "step"), "42");
    ck_assert_ptr_nonnull(dist_checkpoint_metadata(c, DIST_CHECKPOINT_CRC_KEY));
    ck_assert_ptr_null(dist_checkpoint_metadata(c, "absent"));
    dist_checkpoint_destroy(c);
}
END_TEST

START_TEST(test_file_layout_is_length_header_then_8_aligned_data) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    ck_assert_uint_eq(hlen % 8, 0);
    ck_assert_uint_eq(b[8], '{');
    /* 6 floats + 4 int64 + 1 int32 */
    ck_assert_uint_eq(n, 8 + hlen + 24 + 32 + 4);
    /* The int64 tensor comes first, so every tensor is aligned to its element size. */
    int64_t first;
    memcpy(&first, b + 8 + hlen, 8);
    ck_assert_int_eq(first, 10);
    b[8 + hlen] = 0;
    ck_assert_ptr_nonnull(strstr((char *)b + 8, "\"__metadata__\""));
    ck_assert_ptr_nonnull(
        strstr((char *)b + 8, "\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[0,32]"));
    free(b);
}
END_TEST

START_TEST(test_save_leaves_no_temporary_file_and_replaces_the_old_one) {
    make_tmpdir();
    save_sample(path);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "step", "43"), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);
    DIR *d = opendir(tmpdir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') files++;
    closedir(d);
    ck_assert_int_eq(files, 1);
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_num_tensors(c), 0);
    ck_assert_str_eq(dist_checkpoint_metadata(c, "step"), "43");
    dist_checkpoint_destroy(c);
}
END_TEST

START_TEST(test_every_truncation_is_refused_as_format_error) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    for (size_t len = 0; len < n; len++) {
        spit(path, b, len);
        dist_checkpoint *c = NULL;
        ck_assert_msg(dist_checkpoint_load(path, &c) == DIST_FORMAT, "length %zu accepted", len);
        ck_assert_msg(strstr(dist_last_error(), path), "%s", dist_last_error());
    }
    free(b);
}
END_TEST

START_TEST(test_truncated_data_names_the_problem) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    spit(path, b, n - 4);
    free(b);
    expect_refused(path, DIST_FORMAT, "truncated");
}
END_TEST

START_TEST(test_header_length_beyond_the_file_is_refused) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    b[5] = 0x01; /* 2^40 + ... */
    spit(path, b, n);
    free(b);
    expect_refused(path, DIST_FORMAT, "header length");
}
END_TEST

START_TEST(test_a_bit_flip_anywhere_in_the_data_fails_the_crc) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    for (size_t at = 8 + hlen; at < n; at++) {
        b[at] ^= 0x10;
        spit(path, b, n);
        b[at] ^= 0x10;
        dist_checkpoint *c = NULL;
        ck_assert_msg(dist_checkpoint_load(path, &c) == DIST_FORMAT, "flip at %zu accepted", at);
    }
    b[n - 1] ^= 0x01;
    spit(path, b, n);
    free(b);
    expect_refused(path, DIST_FORMAT, "CRC-32C");
}
END_TEST

/* Writes a safetensors file with the given header and data_bytes zero bytes of data. */
static void craft(const char *header, size_t data_bytes) {
    size_t hlen = strlen(header);
    unsigned char *b = calloc(8 + hlen + data_bytes + 1, 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    memcpy(b + 8, header, hlen);
    spit(path, b, 8 + hlen + data_bytes);
    free(b);
}

START_TEST(test_a_file_from_another_writer_without_crc_loads) {
    make_tmpdir();
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_find(c, "a")->shape[0], 2);
    dist_checkpoint_destroy(c);
}
END_TEST

START_TEST(test_overlapping_tensors_are_refused) {
    make_tmpdir();
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
          8);
    expect_refused(path, DIST_FORMAT, "overlaps");
}
END_TEST

START_TEST(test_a_gap_or_trailing_bytes_are_refused) {
    make_tmpdir();
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8);
    expect_refused(path, DIST_FORMAT, "gap");
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 8);
    expect_refused(path, DIST_FORMAT, "data section has 8");
}
END_TEST

START_TEST(test_shape_that_disagrees_with_the_offsets_is_refused) {
    make_tmpdir();
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8);
    expect_refused(path, DIST_FORMAT, "need 12");
}
END_TEST

START_TEST(test_other_dtypes_are_unsupported_and_bad_json_is_format) {
    make_tmpdir();
    craft("{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8);
    expect_refused(path, DIST_UNSUPPORTED, "F16");
    craft("{\"a\":", 0);
    expect_refused(path, DIST_FORMAT, "JSON");
    craft("{\"__metadata__\":{\"k\":1}}", 0);
    expect_refused(path, DIST_FORMAT, "metadata 'k'");
}
END_TEST

START_TEST(test_missing_file_is_not_found) {
    make_tmpdir();
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), path));
}
END_TEST

START_TEST(test_restore_names_the_tensor_whose_shape_or_dtype_differs) {
    dist_checkpoint *c = sample();
    float k[6] = {9, 9, 9, 9, 9, 9};
    int64_t s[4] = {0};
    dist_tensor kt = dist_tensor_view(k, DIST_F32, 2, (int64_t[]){3, 2});
    dist_tensor st = dist_tensor_view(s, DIST_I64, 1, (int64_t[]){4});
    const char *names[] = {"steps", "dense/kernel"};
    dist_tensor *dst[] = {&st, &kt};
    ck_assert_int_eq(dist_checkpoint_restore(c, 2, names, dst), DIST_FORMAT);
    ck_assert_str_eq(
        dist_last_error(),
        "checkpoint '<in memory>': tensor 'dense/kernel' has shape (2, 3), expected (3, 2)");
    ck_assert_int_eq(s[0], 0); /* nothing copied when anything differs */

    dist_tensor kf = dist_tensor_view(k, DIST_I32, 2, (int64_t[]){2, 3});
    dst[1] = &kf;
    ck_assert_int_eq(dist_checkpoint_restore(c, 2, names, dst), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(),
                     "checkpoint '<in memory>': tensor 'dense/kernel' is float32, expected int32");

    const char *missing[] = {"dense/bias"};
    ck_assert_int_eq(dist_checkpoint_restore(c, 1, missing, dst), DIST_FORMAT);
    ck_assert_str_eq(dist_last_error(), "checkpoint '<in memory>': no tensor 'dense/bias'");

    kt = dist_tensor_view(k, DIST_F32, 2, (int64_t[]){2, 3});
    dst[1] = &kt;
    ck_assert_int_eq(dist_checkpoint_restore(c, 2, names, dst), DIST_OK);
    ck_assert_int_eq(s[2], 12);
    ck_assert_float_eq(k[1], 0.5f);
    dist_checkpoint_destroy(c);
}
END_TEST

START_TEST(test_add_refuses_duplicates_reserved_names_and_other_dtypes) {
    dist_checkpoint *c = sample();
    float x = 1;
    uint8_t u = 1;
    dist_tensor t = dist_tensor_view(&x, DIST_F32, 0, NULL);
    dist_tensor tu = dist_tensor_view(&u, DIST_U8, 0, NULL);
    ck_assert_int_eq(dist_checkpoint_add(c, "epoch", &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_checkpoint_add(c, "__metadata__", &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_checkpoint_add(c, "u", &tu), DIST_UNSUPPORTED);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, DIST_CHECKPOINT_CRC_KEY, "0"),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "step", "50"), DIST_OK);
    ck_assert_str_eq(dist_checkpoint_metadata(c, "step"), "50");
    dist_checkpoint_destroy(c);
    dist_checkpoint_destroy(NULL);
}
END_TEST

static int exists_step(int step) {
    char p[200];
    snprintf(p, sizeof p, "%s/ckpt-%d.safetensors", tmpdir, step);
    return access(p, F_OK) == 0;
}

START_TEST(test_manager_keeps_the_last_k_and_skips_a_corrupt_newest) {
    make_tmpdir();
    dist_checkpoint_manager *m = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 2, &m), DIST_OK);
    dist_checkpoint *c = sample();
    int64_t steps[] = {1, 2, 10, 9};
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(dist_checkpoint_manager_save(m, c, steps[i]), DIST_OK);
    dist_checkpoint_destroy(c);
    ck_assert(!exists_step(1) && !exists_step(2) && exists_step(9) && exists_step(10));

    dist_checkpoint *got = NULL;
    int64_t step = -1;
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &got, &step), DIST_OK);
    ck_assert_int_eq(step, 10);
    dist_checkpoint_destroy(got);

    /* Flip the last data byte of the newest file: the manager falls back to step 9. */
    char p[200];
    snprintf(p, sizeof p, "%s/ckpt-10.safetensors", tmpdir);
    size_t n = 0;
    unsigned char *b = slurp(p, &n);
    b[n - 1] ^= 0x80;
    spit(p, b, n);
    free(b);
    dist_checkpoint_manager_destroy(m);
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 2, &m), DIST_OK); /* a restarted run */
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &got, &step), DIST_OK);
    ck_assert_int_eq(step, 9);
    ck_assert_str_eq(dist_checkpoint_metadata(got, "learning_rate"), "0.001");
    dist_checkpoint_destroy(got);

    snprintf(p, sizeof p, "%s/ckpt-9.safetensors", tmpdir);
    spit(p, "junk", 4);
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &got, &step), DIST_NOT_FOUND);
    ck_assert_ptr_null(got);
    dist_checkpoint_manager_destroy(m);
}
END_TEST

START_TEST(test_manager_in_an_empty_directory_finds_nothing) {
    make_tmpdir();
    dist_checkpoint_manager *m = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 0, &m), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 3, &m), DIST_OK);
    dist_checkpoint *got = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &got, NULL), DIST_NOT_FOUND);
    dist_checkpoint_manager_destroy(m);
}
END_TEST

START_TEST(test_model_variables_round_trip_through_a_file) {
    make_tmpdir();
    dist_model *a = NULL, *b = NULL;
    int64_t in[] = {5};
    ck_assert_int_eq(dist_model_create(NULL, &a), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(a, 4, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(a, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(a, 1, in, 1), DIST_OK);
    ck_assert_int_eq(dist_model_create(NULL, &b), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(b, 4, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(b, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(b, 1, in, 2), DIST_OK);

    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add_model(c, a), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_set_metadata(c, "epoch", "3"), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_num_tensors(c), dist_model_num_variables(a));
    ck_assert_str_eq(dist_checkpoint_tensor_name(c, 0), dist_model_variable_name(a, 0));
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);

    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_restore_model(c, b), DIST_OK);
    dist_checkpoint_destroy(c);
    int64_t n = dist_model_num_params(a);
    ck_assert_int_eq(n, 5 * 4 + 4 + 4 * 3 + 3);
    float *wa = malloc((size_t)n * sizeof *wa), *wb = malloc((size_t)n * sizeof *wb);
    ck_assert_int_eq(dist_model_get_weights(a, 0, wa, n), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(b, 0, wb, n), DIST_OK);
    ck_assert_mem_eq(wa, wb, (size_t)n * sizeof *wa);
    free(wa);
    free(wb);

    /* A model of another shape is refused, naming the variable. */
    dist_model *other = NULL;
    ck_assert_int_eq(dist_model_create(NULL, &other), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(other, 5, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(other, 3, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_build(other, 1, in, 1), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_restore_model(c, other), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), dist_model_variable_name(other, 0)));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "expected (5, 5)"));
    dist_checkpoint_destroy(c);
    dist_model_destroy(other);
    dist_model_destroy(a);
    dist_model_destroy(b);
}
END_TEST

START_TEST(test_a_bit_flip_anywhere_in_the_header_is_refused) {
    make_tmpdir();
    save_sample(path);
    size_t n = 0;
    unsigned char *b = slurp(path, &n);
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)b[i] << (8 * i);
    for (size_t at = 0; at < 8 + hlen; at++)
        for (int bit = 0; bit < 8; bit++) {
            b[at] ^= (unsigned char)(1u << bit);
            spit(path, b, n);
            b[at] ^= (unsigned char)(1u << bit);
            dist_checkpoint *c = NULL;
            dist_status st = dist_checkpoint_load(path, &c);
            ck_assert_msg(st != DIST_OK, "flip of bit %d at byte %zu accepted", bit, at);
            ck_assert_ptr_null(c);
        }
    free(b);
}
END_TEST

START_TEST(test_a_libdist_file_without_its_checksum_key_is_refused) {
    make_tmpdir();
    craft("{\"__metadata__\":{\"libdist.writer\":\"libdist\"},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
          8);
    expect_refused(path, DIST_FORMAT, "checksum key 'libdist.crc32c' is missing");
    craft("{\"__metadata__\":{\"libdist.epoch\":\"3\"},"
          "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
          8);
    expect_refused(path, DIST_FORMAT, "'libdist.epoch'");
}
END_TEST

START_TEST(test_a_shape_whose_element_count_overflows_is_refused) {
    make_tmpdir();
    /* 2^32 * 2^32 wraps to 0 elements in 64 bits, which the empty data_offsets would match. */
    craft("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}",
          0);
    expect_refused(path, DIST_FORMAT, "impossibly large");
}
END_TEST

static int count_files(const char *dir) {
    DIR *d = opendir(dir);
    ck_assert_ptr_nonnull(d);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (e->d_name[0] != '.') files++;
    closedir(d);
    return files;
}

/* A checkpoint of `floats` float32 values, all equal to `value`. */
static dist_checkpoint *filled(int64_t floats, float value) {
    float *x = malloc((size_t)floats * sizeof *x);
    for (int64_t i = 0; i < floats; i++) x[i] = value;
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    dist_tensor t = dist_tensor_view(x, DIST_F32, 1, &floats);
    ck_assert_int_eq(dist_checkpoint_add(c, "x", &t), DIST_OK);
    free(x);
    return c;
}

/* A file-size limit of `limit` bytes with SIGXFSZ ignored, so write() fails with EFBIG as it
 * does on a full disk; *old receives the limit to put back with fsize_limit_end. */
static void fsize_limit_begin(rlim_t limit, struct rlimit *old) {
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, old), 0);
    struct rlimit small = *old;
    small.rlim_cur = limit;
    signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &small), 0);
}

static void fsize_limit_end(const struct rlimit *old) {
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, old), 0);
    signal(SIGXFSZ, SIG_DFL);
}

START_TEST(test_a_save_past_the_file_size_limit_fails_and_keeps_the_previous_file) {
    make_tmpdir();
    save_sample(path);
    size_t n0 = 0;
    unsigned char *before = slurp(path, &n0);
    dist_checkpoint *big = filled(1 << 16, 3.0f); /* 256 KiB */
    struct rlimit old;
    fsize_limit_begin(64 << 10, &old);
    dist_status st = dist_checkpoint_save(big, path);
    fsize_limit_end(&old);
    ck_assert_int_eq(st, DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), path), "%s", dist_last_error());
    dist_checkpoint_destroy(big);
    /* The previous file, byte for byte, and nothing else. */
    size_t n1 = 0;
    unsigned char *after = slurp(path, &n1);
    ck_assert_uint_eq(n1, n0);
    ck_assert_mem_eq(after, before, n0);
    ck_assert_int_eq(count_files(tmpdir), 1);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert_str_eq(dist_checkpoint_metadata(c, "step"), "42");
    dist_checkpoint_destroy(c);
    free(before);
    free(after);
}
END_TEST

START_TEST(test_a_temporary_left_by_a_crash_is_removed_by_the_next_save) {
    make_tmpdir();
    char dead[200], live[200], other[200];
    /* No process has a pid above pid_max (at most 2^22), so this writer is gone. */
    snprintf(dead, sizeof dead, "%s.tmp.999999999", path);
    snprintf(live, sizeof live, "%s.tmp.%ld", path, (long)getppid());
    snprintf(other, sizeof other, "%s/other.safetensors.tmp.999999999", tmpdir);
    spit(dead, "half a checkpoint", 17);
    spit(live, "a save in progress", 18);
    spit(other, "another target's", 17);
    save_sample(path);
    ck_assert_int_eq(access(dead, F_OK), -1);
    ck_assert_int_eq(access(live, F_OK), 0);
    ck_assert_int_eq(access(other, F_OK), 0);
    ck_assert_int_eq(count_files(tmpdir), 3);
}
END_TEST

START_TEST(test_manager_never_deletes_the_step_it_has_just_saved) {
    make_tmpdir();
    dist_checkpoint_manager *m = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 2, &m), DIST_OK);
    dist_checkpoint *c = sample();
    ck_assert_int_eq(dist_checkpoint_manager_save(m, c, 9), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_manager_save(m, c, 10), DIST_OK);
    /* A restarted run saving below its newest step: step 1 stays, 10 stays, 9 goes. */
    ck_assert_int_eq(dist_checkpoint_manager_save(m, c, 1), DIST_OK);
    ck_assert(exists_step(1) && !exists_step(9) && exists_step(10));
    dist_checkpoint_destroy(c);
    dist_checkpoint_manager_destroy(m);
}
END_TEST

START_TEST(test_manager_save_on_a_full_disk_deletes_nothing_and_keeps_the_step_file) {
    make_tmpdir();
    dist_checkpoint_manager *m = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_create(tmpdir, 1, &m), DIST_OK);
    dist_checkpoint *c = sample();
    ck_assert_int_eq(dist_checkpoint_manager_save(m, c, 4), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_manager_save(m, c, 5), DIST_OK);
    dist_checkpoint_destroy(c);
    char p5[200];
    snprintf(p5, sizeof p5, "%s/ckpt-5.safetensors", tmpdir);
    size_t n0 = 0;
    unsigned char *before = slurp(p5, &n0);

    dist_checkpoint *big = filled(1 << 16, 1.0f);
    struct rlimit old;
    fsize_limit_begin(64 << 10, &old);
    dist_status st5 = dist_checkpoint_manager_save(m, big, 5);
    dist_status st6 = dist_checkpoint_manager_save(m, big, 6);
    fsize_limit_end(&old);
    ck_assert_int_eq(st5, DIST_IO);
    ck_assert_int_eq(st6, DIST_IO);
    dist_checkpoint_destroy(big);

    ck_assert(exists_step(5) && !exists_step(6));
    ck_assert_int_eq(count_files(tmpdir), 1);
    size_t n1 = 0;
    unsigned char *after = slurp(p5, &n1);
    ck_assert_uint_eq(n1, n0);
    ck_assert_mem_eq(after, before, n0);
    dist_checkpoint *got = NULL;
    int64_t step = -1;
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &got, &step), DIST_OK);
    ck_assert_int_eq(step, 5);
    dist_checkpoint_destroy(got);
    dist_checkpoint_manager_destroy(m);
    free(before);
    free(after);
}
END_TEST

static Suite *checkpoint_suite(void) {
    Suite *s = suite_create("checkpoint");
    TCase *tc = tcase_create("safetensors");
    tcase_add_checked_fixture(tc, NULL, remove_tmpdir);
    tcase_add_test(tc, test_round_trip_keeps_names_shapes_values_and_metadata);
    tcase_add_test(tc, test_file_layout_is_length_header_then_8_aligned_data);
    tcase_add_test(tc, test_save_leaves_no_temporary_file_and_replaces_the_old_one);
    tcase_add_test(tc, test_every_truncation_is_refused_as_format_error);
    tcase_add_test(tc, test_truncated_data_names_the_problem);
    tcase_add_test(tc, test_header_length_beyond_the_file_is_refused);
    tcase_add_test(tc, test_a_bit_flip_anywhere_in_the_data_fails_the_crc);
    tcase_add_test(tc, test_a_file_from_another_writer_without_crc_loads);
    tcase_add_test(tc, test_overlapping_tensors_are_refused);
    tcase_add_test(tc, test_a_gap_or_trailing_bytes_are_refused);
    tcase_add_test(tc, test_shape_that_disagrees_with_the_offsets_is_refused);
    tcase_add_test(tc, test_other_dtypes_are_unsupported_and_bad_json_is_format);
    tcase_add_test(tc, test_missing_file_is_not_found);
    tcase_add_test(tc, test_restore_names_the_tensor_whose_shape_or_dtype_differs);
    tcase_add_test(tc, test_add_refuses_duplicates_reserved_names_and_other_dtypes);
    tcase_add_test(tc, test_manager_keeps_the_last_k_and_skips_a_corrupt_newest);
    tcase_add_test(tc, test_manager_in_an_empty_directory_finds_nothing);
    tcase_add_test(tc, test_model_variables_round_trip_through_a_file);
    tcase_add_test(tc, test_a_bit_flip_anywhere_in_the_header_is_refused);
    tcase_add_test(tc, test_a_libdist_file_without_its_checksum_key_is_refused);
    tcase_add_test(tc, test_a_shape_whose_element_count_overflows_is_refused);
    tcase_add_test(tc, test_a_save_past_the_file_size_limit_fails_and_keeps_the_previous_file);
    tcase_add_test(tc, test_a_temporary_left_by_a_crash_is_removed_by_the_next_save);
    tcase_add_test(tc, test_manager_never_deletes_the_step_it_has_just_saved);
    tcase_add_test(tc, test_manager_save_on_a_full_disk_deletes_nothing_and_keeps_the_step_file);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(checkpoint_suite()); }
