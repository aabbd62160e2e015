/* TFRecord files (framing, both CRCs, GZIP/ZLIB, damage, ignore_errors, glob) and
 * tf.train.Example parsing, with files and protobuf bytes written here. */
#include "core/crc32c.h"
#include "data/tfrecord.h"
#include "dist/data.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

static char g_dir[256];

static void make_dir(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/dist_test_tfrecord_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_dir));
}

static void remove_dir(void) { dist_test_remove_flat_dir(g_dir); }

/* A growable byte buffer. */
typedef struct buf {
    unsigned char b[1 << 16];
    size_t n;
} buf;

static void put(buf *o, const void *p, size_t n) {
    ck_assert_uint_le(o->n + n, sizeof o->b);
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_le(buf *o, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) {
        unsigned char c = (unsigned char)(v >> (8 * i));
        put(o, &c, 1);
    }
}

/* One record framed as TFRecordWriter frames it: length, masked CRC of the length, data,
 * masked CRC of the data. */
static void put_record(buf *o, const void *data, size_t n) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)n >> (8 * i));
    put(o, len, 8);
    put_le(o, dist_crc32c_mask(dist_crc32c(len, 8)), 4);
    put(o, data, n);
    put_le(o, dist_crc32c_mask(dist_crc32c(data, n)), 4);
}

static const char *path_of(const char *name) {
    static char path[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(path[k], sizeof path[k], "%s/%s", g_dir, name);
    return path[k];
}

static const char *write_file(const char *name, const void *bytes, size_t n) {
    const char *path = path_of(name);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    return path;
}

static const char *write_gzip(const char *name, const void *bytes, size_t n) {
    const char *path = path_of(name);
    gzFile f = gzopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(gzwrite(f, bytes, (unsigned)n), (int)n);
    gzclose(f);
    return path;
}

static const char *write_zlib(const char *name, const void *bytes, size_t n) {
    static unsigned char z[1 << 17];
    uLongf zn = sizeof z;
    ck_assert_int_eq(compress2(z, &zn, bytes, (uLong)n, 6), Z_OK);
    return write_file(name, z, zn);
}

/* The three records of most tests: "alpha", "" (an empty record), "gamma!". */
static void three_records(buf *o) {
    put_record(o, "alpha", 5);
    put_record(o, "", 0);
    put_record(o, "gamma!", 6);
}

/* Reads every element of ds: their bytes joined with '|' into text; returns the status of
 * the first failing next (DIST_OK at the end). */
static dist_status read_all(dist_dataset *ds, char *text, size_t size, int64_t *skipped) {
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    size_t n = 0;
    text[0] = 0;
    dist_status st;
    for (;;) {
        dist_element e;
        int end = 0;
        st = dist_iterator_next(it, &e, &end);
        if (st != DIST_OK || end) break;
        ck_assert_int_eq(e.count, 1);
        ck_assert_int_eq(e.items[0]->dtype, DIST_U8);
        ck_assert_int_eq(e.items[0]->ndim, 1);
        size_t len = (size_t)e.items[0]->shape[0];
        ck_assert_uint_lt(n + len + 2, size);
        if (n) text[n++] = '|';
        memcpy(text + n, e.items[0]->data, len);
        n += len;
        text[n] = 0;
    }
    if (skipped) *skipped = dist_iterator_skipped(it);
    dist_iterator_destroy(it);
    return st;
}

static dist_status read_files(const char *const *files, int n, const dist_tfrecord_options *o,
                              char *text, size_t size, int64_t *skipped) {
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(files, n, o, &ds), DIST_OK);
    dist_status st = read_all(ds, text, size, skipped);
    dist_dataset_destroy(ds);
    return st;
}

START_TEST(test_tfrecord_round_trip_over_two_files_in_list_order) {
    buf a = {.n = 0}, b = {.n = 0};
    three_records(&a);
    put_record(&b, "delta", 5);
    const char *files[2] = {write_file("a.tfrecord", a.b, a.n), write_file("b.tfrecord", b.b, b.n)};
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(files, 2, NULL, &ds), DIST_OK);
    const dist_element_spec *spec = dist_dataset_element_spec(ds);
    ck_assert_int_eq(spec->count, 1);
    ck_assert_int_eq(spec->dtype[0], DIST_U8);
    ck_assert_int_eq(spec->ndim[0], 1);
    ck_assert_int_eq(spec->shape[0][0], -1);
    ck_assert_int_eq(dist_dataset_cardinality(ds), DIST_CARDINALITY_UNKNOWN);
    char text[256];
    ck_assert_int_eq(read_all(ds, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "alpha||gamma!|delta");
    ck_assert_int_eq(read_all(ds, text, sizeof text, NULL), DIST_OK); /* a second pass */
    ck_assert_str_eq(text, "alpha||gamma!|delta");
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_tfrecord_gzip_and_zlib_read_the_same_records) {
    buf a = {.n = 0};
    three_records(&a);
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.buffer_size = 7; /* many small reads */
    char text[256];
    const char *gz = write_gzip("a.tfrecord.gz", a.b, a.n);
    o.compression = DIST_TFRECORD_GZIP;
    ck_assert_int_eq(read_files(&gz, 1, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "alpha||gamma!");
    const char *zl = write_zlib("a.tfrecord.zz", a.b, a.n);
    o.compression = DIST_TFRECORD_ZLIB;
    ck_assert_int_eq(read_files(&zl, 1, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "alpha||gamma!");
    /* a GZIP file read as ZLIB is corrupt data, named */
    ck_assert_int_eq(read_files(&gz, 1, &o, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "a.tfrecord.gz"));
}
END_TEST

START_TEST(test_tfrecord_truncated_length_names_file_and_record_offset) {
    buf a = {.n = 0};
    put_record(&a, "alpha", 5); /* 21 bytes: the second record starts at 21 */
    put(&a, "\x05\x00\x00", 3);
    const char *f = write_file("t.tfrecord", a.b, a.n);
    char text[256];
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_str_eq(text, "alpha");
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "t.tfrecord"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "truncated record at 21"));
}
END_TEST

START_TEST(test_tfrecord_truncated_data_names_file_and_record_offset) {
    buf a = {.n = 0};
    put_record(&a, "alpha", 5);
    put_record(&a, "beta-beta", 9);
    char text[256];
    /* cut inside the second record's data, then inside its data CRC */
    const char *f = write_file("t.tfrecord", a.b, 21 + 12 + 4);
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "truncated record at 21"));
    f = write_file("t2.tfrecord", a.b, a.n - 2);
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "t2.tfrecord"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "truncated record at 21"));
    /* the same cut in a gzip file, where the size cannot be checked first */
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = DIST_TFRECORD_GZIP;
    f = write_gzip("t3.tfrecord.gz", a.b, 21 + 12 + 4);
    ck_assert_int_eq(read_files(&f, 1, &o, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "truncated record at 21"));
}
END_TEST

START_TEST(test_tfrecord_a_flipped_data_bit_fails_the_data_crc_naming_file_and_offset) {
    buf a = {.n = 0};
    three_records(&a); /* records at 0, 21 (empty, 16 bytes), 37 */
    a.b[37 + 12 + 3] ^= 0x10;
    const char *f = write_file("d.tfrecord", a.b, a.n);
    char text[256];
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_str_eq(text, "alpha|");
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "d.tfrecord"));
    /* TensorFlow's number: the offset of the data, 12 bytes into the record */
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupted record at 49"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "6 bytes of data of the record at 37"));
}
END_TEST

START_TEST(test_tfrecord_a_flipped_length_bit_fails_the_length_crc) {
    buf a = {.n = 0};
    three_records(&a);
    a.b[21] ^= 0x01; /* the empty record now claims 1 byte */
    const char *f = write_file("l.tfrecord", a.b, a.n);
    char text[256];
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_str_eq(text, "alpha");
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupted record at 21"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "length's CRC"));
}
END_TEST

static int g_warnings;
static char g_warning[512];
static void count_warnings(dist_log_level level, const char *message, void *user) {
    (void)user;
    if (level != DIST_LOG_WARN) return;
    g_warnings++;
    snprintf(g_warning, sizeof g_warning, "%s", message);
}

START_TEST(test_tfrecord_ignore_errors_skips_the_rest_of_a_damaged_file_and_counts_it) {
    buf a = {.n = 0}, b = {.n = 0};
    put_record(&a, "a1", 2); /* 18 bytes */
    put_record(&a, "a2", 2);
    put_record(&a, "a3", 2); /* at 36: damaged */
    put_record(&a, "a4", 2); /* intact, but after the damage: skipped as TF skips it */
    a.b[36 + 12] ^= 0xff;
    put_record(&b, "b1", 2);
    const char *files[2] = {write_file("a.tfrecord", a.b, a.n), write_file("b.tfrecord", b.b, b.n)};
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.ignore_errors = 1;
    g_warnings = 0;
    dist_set_log_callback(count_warnings, DIST_LOG_WARN, NULL);
    char text[256];
    int64_t skipped = -1;
    dist_status st = read_files(files, 2, &o, text, sizeof text, &skipped);
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
    ck_assert_int_eq(st, DIST_OK);
    ck_assert_str_eq(text, "a1|a2|b1");
    ck_assert_int_eq(skipped, 1);
    ck_assert_int_eq(g_warnings, 1);
    ck_assert_ptr_nonnull(strstr(g_warning, "a.tfrecord"));
    ck_assert_ptr_nonnull(strstr(g_warning, "corrupted record at 48"));
}
END_TEST

/* A record header whose length CRC is right: only the cap can refuse it. */
static void put_header(buf *o, uint64_t n) {
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)(n >> (8 * i));
    put(o, len, 8);
    put_le(o, dist_crc32c_mask(dist_crc32c(len, 8)), 4);
}

START_TEST(test_tfrecord_a_hostile_length_is_refused_before_any_allocation) {
    buf a = {.n = 0};
    put_header(&a, (uint64_t)1 << 62); /* a length field of 2^62 */
    put(&a, "xyz", 3);
    char text[256];
    const char *f = write_file("h.tfrecord", a.b, a.n);
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupted record at 0"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "max_record_bytes"));
    /* under the cap but above the file's size */
    buf b = {.n = 0};
    put_header(&b, 1000);
    put(&b, "xyz", 3);
    f = write_file("h2.tfrecord", b.b, b.n);
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "bytes left in the file"));
    /* gzip with no cap to speak of (1 TiB): the buffer grows with the data that is there, so
     * a 512 GiB claim over 3 bytes ends as a truncated record, not an allocation failure */
    buf c = {.n = 0};
    put_header(&c, (uint64_t)1 << 39);
    put(&c, "xyz", 3);
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = DIST_TFRECORD_GZIP;
    o.max_record_bytes = (int64_t)1 << 40;
    f = write_gzip("h3.tfrecord.gz", c.b, c.n);
    ck_assert_int_eq(read_files(&f, 1, &o, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "truncated record at 0"));
}
END_TEST

START_TEST(test_tfrecord_missing_file_is_not_found_naming_it) {
    const char *f = path_of("absent.tfrecord");
    char text[64];
    ck_assert_int_eq(read_files(&f, 1, NULL, text, sizeof text, NULL), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "absent.tfrecord"));
}
END_TEST

START_TEST(test_tfrecord_glob_lists_shards_in_byte_order) {
    const char *names[3] = {"train.tfrecord-00002-of-00003", "train.tfrecord-00000-of-00003",
                            "train.tfrecord-00001-of-00003"};
    const char *data[3] = {"two", "zero", "one"};
    for (int i = 0; i < 3; i++) {
        buf a = {.n = 0};
        put_record(&a, data[i], strlen(data[i]));
        write_file(names[i], a.b, a.n);
    }
    write_file("train.tfrecord-index", "x", 1); /* does not match */
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/train.tfrecord-*-of-*", g_dir);
    char **paths = NULL;
    int n = 0;
    ck_assert_int_eq(dist_glob(pattern, &paths, &n), DIST_OK);
    ck_assert_int_eq(n, 3);
    ck_assert_str_eq(paths[0], path_of("train.tfrecord-00000-of-00003"));
    ck_assert_str_eq(paths[2], path_of("train.tfrecord-00002-of-00003"));
    dist_glob_free(paths, n);
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord_glob(pattern, NULL, &ds), DIST_OK);
    char text[64];
    ck_assert_int_eq(read_all(ds, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "zero|one|two");
    dist_dataset_destroy(ds);
    snprintf(pattern, sizeof pattern, "%s/eval-*", g_dir);
    ck_assert_int_eq(dist_dataset_from_tfrecord_glob(pattern, NULL, &ds), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "eval-*"));
}
END_TEST

/* Reads ds after auto_shard(policy, workers, index); the status of the shard call. */
static dist_status shard_text(dist_dataset *ds, dist_auto_shard_policy policy, int workers,
                              int index, char *text, size_t size) {
    dist_dataset *mine = NULL;
    dist_status st = dist_dataset_auto_shard(ds, policy, workers, index, 1, &mine);
    if (st != DIST_OK) return st;
    ck_assert_int_eq(read_all(mine, text, size, NULL), DIST_OK);
    dist_dataset_destroy(mine);
    return DIST_OK;
}

/* Three files: a (a0 a1), b (b0), c (c0 c1 c2). */
static void abc_files(const char **files) {
    buf a = {.n = 0}, b = {.n = 0}, c = {.n = 0};
    put_record(&a, "a0", 2);
    put_record(&a, "a1", 2);
    put_record(&b, "b0", 2);
    put_record(&c, "c0", 2);
    put_record(&c, "c1", 2);
    put_record(&c, "c2", 2);
    static char names[3][512];
    snprintf(names[0], sizeof names[0], "%s", write_file("a.tfrecord", a.b, a.n));
    snprintf(names[1], sizeof names[1], "%s", write_file("b.tfrecord", b.b, b.n));
    snprintf(names[2], sizeof names[2], "%s", write_file("c.tfrecord", c.b, c.n));
    for (int i = 0; i < 3; i++) files[i] = names[i];
}

START_TEST(test_tfrecord_auto_shard_gives_each_worker_its_files_as_tf_data) {
    const char *files[3];
    abc_files(files);
    char text[128];
    for (int reads = 0; reads <= 2; reads += 2) {
        dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
        o.num_parallel_reads = reads;
        dist_dataset *ds = NULL, *top = NULL;
        ck_assert_int_eq(dist_dataset_from_tfrecord(files, 3, &o, &ds), DIST_OK);
        for (int p = DIST_AUTO_SHARD_AUTO; p <= DIST_AUTO_SHARD_FILE; p++) {
            /* worker 0 reads files 0 and 2, worker 1 file 1 (tf.data's FILE sharding) */
            ck_assert_int_eq(shard_text(ds, p, 2, 0, text, sizeof text), DIST_OK);
            ck_assert_str_eq(text, reads ? "a0|c0|a1|c1|c2" : "a0|a1|c0|c1|c2");
            ck_assert_int_eq(shard_text(ds, p, 2, 1, text, sizeof text), DIST_OK);
            ck_assert_str_eq(text, "b0");
        }
        /* the stages above the source are rebuilt over each worker's files */
        ck_assert_int_eq(dist_dataset_take(ds, 2, &top), DIST_OK);
        ck_assert_int_eq(shard_text(top, DIST_AUTO_SHARD_FILE, 2, 0, text, sizeof text), DIST_OK);
        ck_assert_str_eq(text, reads ? "a0|c0" : "a0|a1");
        /* DATA: every worker reads every file and keeps every second record */
        ck_assert_int_eq(shard_text(ds, DIST_AUTO_SHARD_DATA, 2, 1, text, sizeof text), DIST_OK);
        ck_assert_str_eq(text, reads ? "b0|c0|c2" : "a1|c0|c2");
        /* fewer files than workers: FILE and AUTO fail as tf.data does, DATA works */
        for (int p = DIST_AUTO_SHARD_AUTO; p <= DIST_AUTO_SHARD_FILE; p++) {
            ck_assert_int_eq(shard_text(ds, p, 4, 3, text, sizeof text), DIST_INVALID_ARGUMENT);
            ck_assert_ptr_nonnull(strstr(dist_last_error(), "has 3 file(s), fewer than the 4"));
        }
        ck_assert_int_eq(shard_text(ds, DIST_AUTO_SHARD_DATA, 4, 3, text, sizeof text), DIST_OK);
        ck_assert_str_eq(text, "c0");
        dist_dataset_destroy(top);
        dist_dataset_destroy(ds);
    }
}
END_TEST

START_TEST(test_tfrecord_parallel_reads_interleave_files_in_tf_order) {
    const char *files[3];
    abc_files(files);
    char text[128];
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    /* TFRecordDataset(files, num_parallel_reads=2): cycle 2, block 1; b ends, c takes its place */
    o.num_parallel_reads = 2;
    ck_assert_int_eq(read_files(files, 3, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "a0|b0|a1|c0|c1|c2");
    o.num_parallel_reads = 3;
    ck_assert_int_eq(read_files(files, 3, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "a0|b0|c0|a1|c1|c2");
    o.num_parallel_reads = 8; /* more than the files: all at once */
    ck_assert_int_eq(read_files(files, 3, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "a0|b0|c0|a1|c1|c2");
    /* a damaged file among them: the error names it; ignore_errors skips its rest and counts */
    buf d = {.n = 0};
    put_record(&d, "d0", 2);
    put_record(&d, "d1", 2);
    d.b[d.n - 6] ^= 1; /* d1's data */
    const char *four[4] = {files[0], write_file("d.tfrecord", d.b, d.n), files[1], files[2]};
    ck_assert_int_eq(read_files(four, 4, &o, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "d.tfrecord"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupted record at 30"));
    o.ignore_errors = 1;
    int64_t skipped = 0;
    ck_assert_int_eq(read_files(four, 4, &o, text, sizeof text, &skipped), DIST_OK);
    ck_assert_str_eq(text, "a0|d0|b0|c0|a1|c1|c2");
    ck_assert_int_eq(skipped, 1);
    o.num_parallel_reads = -1;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(files, 3, &o, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "num_parallel_reads -1"));
}
END_TEST

START_TEST(test_tfrecord_auto_compression_reads_each_file_by_its_first_bytes) {
    buf a = {.n = 0};
    three_records(&a);
    const char *files[3] = {write_file("n.tfrecord", a.b, a.n), write_gzip("g.tfrecord", a.b, a.n),
                            write_zlib("z.tfrecord", a.b, a.n)};
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = DIST_TFRECORD_AUTO;
    char text[256];
    ck_assert_int_eq(read_files(files, 3, &o, text, sizeof text, NULL), DIST_OK);
    ck_assert_str_eq(text, "alpha||gamma!|alpha||gamma!|alpha||gamma!");
    /* an uncompressed file whose first bytes look like gzip (a record of 0x088b1f bytes: the
     * length field starts 1f 8b 08) is read as uncompressed: its length CRC holds */
    size_t big = 0x088b1f;
    unsigned char *data = malloc(big + 16);
    buf g = {.n = 0};
    put_header(&g, big);
    ck_assert_int_eq(g.b[0], 0x1f);
    ck_assert_int_eq(g.b[1], 0x8b);
    ck_assert_int_eq(g.b[2], 0x08);
    memcpy(data, g.b, 12);
    memset(data + 12, 'q', big);
    uint32_t crc = dist_crc32c_mask(dist_crc32c(data + 12, big));
    for (int i = 0; i < 4; i++) data[12 + big + (size_t)i] = (unsigned char)(crc >> (8 * i));
    const char *f = write_file("looks_gzip.tfrecord", data, big + 16);
    free(data);
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, &o, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->shape[0], (int64_t)big);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    /* bytes of no kind: read as uncompressed, the first record is corrupted */
    f = write_file("junk.tfrecord", "0123456789abcdefgh", 18);
    ck_assert_int_eq(read_files(&f, 1, &o, text, sizeof text, NULL), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "corrupted record at 0"));
}
END_TEST

START_TEST(test_tfrecord_bad_arguments_are_refused) {
    const char *f = "x";
    dist_dataset *ds = NULL;
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 0, NULL, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_dataset_from_tfrecord(NULL, 1, NULL, &ds), DIST_INVALID_ARGUMENT);
    o.compression = (dist_tfrecord_compression)7;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, &o, &ds), DIST_INVALID_ARGUMENT);
    o = (dist_tfrecord_options)DIST_TFRECORD_OPTIONS_INIT;
    o.version = 99;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, &o, &ds), DIST_INVALID_ARGUMENT);
}
END_TEST

/* ---- tf.train.Example, encoded by hand --------------------------------------------------------
 */

static void put_varint(buf *o, uint64_t v) {
    do {
        unsigned char c = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) c |= 0x80;
        put(o, &c, 1);
    } while (v);
}

static void put_field(buf *o, int field, const buf *msg) {
    put_varint(o, (uint64_t)field << 3 | 2);
    put_varint(o, msg->n);
    put(o, msg->b, msg->n);
}

/* features is the concatenation of map entries; returns Example{features}. */
static void example_of(buf *ex, const buf *entries) {
    static buf features;
    features.n = 0;
    put(&features, entries->b, entries->n);
    ex->n = 0;
    put_field(ex, 1, &features);
}

/* Appends a map entry {key, Feature{list_field: list}}. */
static void put_entry(buf *entries, const char *key, int list_field, const buf *list) {
    static buf feature, entry, k;
    feature.n = 0;
    put_field(&feature, list_field, list);
    k.n = 0;
    put(&k, key, strlen(key));
    entry.n = 0;
    put_field(&entry, 1, &k);
    put_field(&entry, 2, &feature);
    put_field(entries, 1, &entry);
}

/* Int64List{value: v...}: packed (one length-delimited field) or one varint field each. */
static void int64_list(buf *l, const int64_t *v, int n, int packed) {
    l->n = 0;
    if (packed) {
        buf p = {.n = 0};
        for (int i = 0; i < n; i++) put_varint(&p, (uint64_t)v[i]);
        put_field(l, 1, &p);
        return;
    }
    for (int i = 0; i < n; i++) {
        put_varint(l, 1 << 3 | 0);
        put_varint(l, (uint64_t)v[i]);
    }
}

static void float_list(buf *l, const float *v, int n, int packed) {
    l->n = 0;
    if (packed) {
        buf p = {.n = 0};
        put(&p, v, 4 * (size_t)n);
        put_field(l, 1, &p);
        return;
    }
    for (int i = 0; i < n; i++) {
        put_varint(l, 1 << 3 | 5);
        put(l, &v[i], 4);
    }
}

static void bytes_list(buf *l, const char *s) {
    buf v = {.n = 0};
    put(&v, s, strlen(s));
    l->n = 0;
    put_field(l, 1, &v);
}

/* Writes the examples as a TFRecord file and opens parse_example over it. */
static dist_iterator *parse_over(const buf *examples, int n, const dist_feature_spec *spec,
                                 int nf) {
    buf file = {.n = 0};
    for (int i = 0; i < n; i++) put_record(&file, examples[i].b, examples[i].n);
    const char *f = write_file("ex.tfrecord", file.b, file.n);
    dist_dataset *rec = NULL, *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, NULL, &rec), DIST_OK);
    ck_assert_int_eq(dist_dataset_parse_example(rec, spec, nf, &ds), DIST_OK);
    dist_dataset_destroy(rec);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_dataset_destroy(ds);
    return it;
}

static buf g_ex[3];

START_TEST(test_parse_example_fixed_int64_float_and_bytes) {
    buf entries = {.n = 0}, l;
    int64_t ids[2] = {7, -3}; /* -3: a 10-byte varint */
    float w = 0.25f;
    int64_list(&l, ids, 2, 1);
    put_entry(&entries, "ids", 3, &l);
    float_list(&l, &w, 1, 1);
    put_entry(&entries, "weight", 2, &l);
    bytes_list(&l, "\xff\xd8jpeg");
    put_entry(&entries, "image", 1, &l);
    example_of(&g_ex[0], &entries);
    dist_feature_spec spec[3] = {
        {.key = "image", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_U8},
        {.key = "ids", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .ndim = 1, .shape = {2}},
        {.key = "weight", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_F32},
    };
    dist_iterator *it = parse_over(g_ex, 1, spec, 3);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.count, 3);
    ck_assert_int_eq(e.items[0]->dtype, DIST_U8);
    ck_assert_int_eq(e.items[0]->shape[0], 6);
    ck_assert_mem_eq(e.items[0]->data, "\xff\xd8jpeg", 6);
    ck_assert_int_eq(e.items[1]->dtype, DIST_I64);
    ck_assert_int_eq(e.items[1]->ndim, 1);
    ck_assert_int_eq(((int64_t *)e.items[1]->data)[0], 7);
    ck_assert_int_eq(((int64_t *)e.items[1]->data)[1], -3);
    ck_assert_int_eq(e.items[2]->dtype, DIST_F32);
    ck_assert_int_eq(e.items[2]->ndim, 0);
    ck_assert_float_eq(*(float *)e.items[2]->data, 0.25f);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(end, 1);
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_default_value_fills_a_missing_feature) {
    buf entries = {.n = 0}, l;
    int64_t label = 4;
    int64_list(&l, &label, 1, 0);
    put_entry(&entries, "label", 3, &l);
    example_of(&g_ex[0], &entries);
    float dflt[2] = {1.5f, -2.0f};
    dist_feature_spec spec[3] = {
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64},
        {.key = "scale",
         .kind = DIST_FEATURE_FIXED_LEN,
         .dtype = DIST_F32,
         .ndim = 1,
         .shape = {2},
         .default_value = dflt},
        {.key = "name",
         .kind = DIST_FEATURE_FIXED_LEN,
         .dtype = DIST_U8,
         .default_value = "none",
         .default_bytes = 4},
    };
    dist_iterator *it = parse_over(g_ex, 1, spec, 3);
    dflt[0] = 99.0f; /* the spec's default was copied */
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(*(int64_t *)e.items[0]->data, 4);
    ck_assert_float_eq(((float *)e.items[1]->data)[0], 1.5f);
    ck_assert_float_eq(((float *)e.items[1]->data)[1], -2.0f);
    ck_assert_int_eq(e.items[2]->shape[0], 4);
    ck_assert_mem_eq(e.items[2]->data, "none", 4);
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_varlen_gives_the_values_and_their_length) {
    buf entries = {.n = 0}, l;
    int64_t v[3] = {10, 20, 30};
    int64_list(&l, v, 3, 1);
    put_entry(&entries, "tokens", 3, &l);
    example_of(&g_ex[0], &entries);
    buf none = {.n = 0};
    example_of(&g_ex[1], &none); /* the feature absent: 0 values */
    dist_feature_spec spec[1] = {
        {.key = "tokens", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64}};
    dist_iterator *it = parse_over(g_ex, 2, spec, 1);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->ndim, 1);
    ck_assert_int_eq(e.items[0]->shape[0], 3);
    ck_assert_int_eq(((int64_t *)e.items[0]->data)[2], 30);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->shape[0], 0);
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_missing_required_feature_names_it_and_the_record) {
    buf entries = {.n = 0}, l;
    int64_t label = 1;
    int64_list(&l, &label, 1, 1);
    put_entry(&entries, "label", 3, &l);
    example_of(&g_ex[0], &entries);
    buf other = {.n = 0};
    put_entry(&other, "labels", 3, &l); /* a near miss */
    example_of(&g_ex[1], &other);
    dist_feature_spec spec[1] = {
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64}};
    dist_iterator *it = parse_over(g_ex, 2, spec, 1);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 1"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "feature 'label'"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "missing"));
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_wrong_kind_and_wrong_count_name_feature_and_record) {
    buf entries = {.n = 0}, l;
    float x = 1.0f;
    float_list(&l, &x, 1, 1);
    put_entry(&entries, "label", 2, &l); /* a FloatList where an Int64List is expected */
    example_of(&g_ex[0], &entries);
    dist_feature_spec spec[1] = {
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64}};
    dist_iterator *it = parse_over(g_ex, 1, spec, 1);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 0"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "feature 'label'"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "FloatList"));
    dist_iterator_destroy(it);
    dist_feature_spec two[1] = {{.key = "label",
                                 .kind = DIST_FEATURE_FIXED_LEN,
                                 .dtype = DIST_F32,
                                 .ndim = 1,
                                 .shape = {2}}};
    it = parse_over(g_ex, 1, two, 1);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "holds 1 values, its shape holds 2"));
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_packed_and_unpacked_values_are_the_same) {
    int64_t v[3] = {1, -1, (int64_t)1 << 40};
    float f[2] = {0.5f, -8.0f};
    for (int packed = 0; packed < 2; packed++) {
        buf entries = {.n = 0}, l;
        int64_list(&l, v, 3, packed);
        put_entry(&entries, "i", 3, &l);
        float_list(&l, f, 2, packed);
        put_entry(&entries, "f", 2, &l);
        example_of(&g_ex[packed], &entries);
    }
    dist_feature_spec spec[2] = {
        {.key = "i", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64, .ndim = 1, .shape = {3}},
        {.key = "f", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_F32},
    };
    dist_iterator *it = parse_over(g_ex, 2, spec, 2);
    for (int k = 0; k < 2; k++) {
        dist_element e;
        int end = 0;
        ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
        ck_assert_mem_eq(e.items[0]->data, v, sizeof v);
        ck_assert_int_eq(e.items[1]->shape[0], 2);
        ck_assert_mem_eq(e.items[1]->data, f, sizeof f);
    }
    dist_iterator_destroy(it);
}
END_TEST

START_TEST(test_parse_example_skips_unknown_fields_and_refuses_overrunning_lengths) {
    /* Example{ 7: varint 5, 9: fixed64, 1: Features{ entry{"a" -> Int64List[3]} } } */
    buf entries = {.n = 0}, l;
    int64_t three = 3;
    int64_list(&l, &three, 1, 1);
    put_entry(&entries, "a", 3, &l);
    buf ex = {.n = 0};
    put_varint(&ex, 7 << 3 | 0);
    put_varint(&ex, 5);
    put_varint(&ex, 9 << 3 | 1);
    put(&ex, "12345678", 8);
    buf features = {.n = 0};
    put(&features, entries.b, entries.n);
    put_field(&ex, 1, &features);
    example_value values[1] = {{.data = NULL}};
    dist_feature_spec spec[1] = {{.key = "a", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64}};
    ck_assert_int_eq(example_parse(spec, 1, ex.b, ex.n, 0, values), DIST_OK);
    ck_assert_int_eq(values[0].count, 1);
    ck_assert_int_eq(*(int64_t *)values[0].data, 3);
    /* Features claiming 2^40 bytes in a 7-byte record */
    const unsigned char hostile[] = {0x0a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x20};
    ck_assert_int_eq(example_parse(spec, 1, hostile, sizeof hostile, 5, values), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "record 5"));
    free(values[0].data);
}
END_TEST

START_TEST(test_parse_example_refuses_bad_specs_and_inputs) {
    buf a = {.n = 0};
    put_record(&a, "x", 1);
    const char *f = write_file("s.tfrecord", a.b, a.n);
    dist_dataset *rec = NULL, *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, NULL, &rec), DIST_OK);
    /* five VarLenFeatures of bytes take ten components */
    dist_feature_spec varbytes[5] = {{.key = "s0", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
                                     {.key = "s1", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
                                     {.key = "s2", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
                                     {.key = "s3", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
                                     {.key = "s4", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8}};
    ck_assert_int_eq(dist_dataset_parse_example(rec, varbytes, 4, &ds), DIST_OK);
    dist_dataset_destroy(ds);
    ds = NULL;
    ck_assert_int_eq(dist_dataset_parse_example(rec, varbytes, 5, &ds), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "more than 8 components"));
    dist_feature_spec shaped = {.key = "s", .dtype = DIST_U8, .ndim = 1, .shape = {2}};
    ck_assert_int_eq(dist_dataset_parse_example(rec, &shaped, 1, &ds), DIST_UNSUPPORTED);
    dist_feature_spec twice[2] = {{.key = "k", .dtype = DIST_I64}, {.key = "k", .dtype = DIST_F32}};
    ck_assert_int_eq(dist_dataset_parse_example(rec, twice, 2, &ds), DIST_INVALID_ARGUMENT);
    dist_feature_spec i32 = {.key = "k", .dtype = DIST_I32};
    ck_assert_int_eq(dist_dataset_parse_example(rec, &i32, 1, &ds), DIST_INVALID_ARGUMENT);
    dist_dataset_destroy(rec);
}
END_TEST

START_TEST(test_parse_example_varlen_bytes_gives_the_values_and_their_lengths) {
    buf entries = {.n = 0}, l = {.n = 0}, v = {.n = 0};
    int64_t label = 4;
    int64_list(&l, &label, 1, 0);
    put_entry(&entries, "label", 3, &l);
    const char *values[3] = {"ab", "", "cde"};
    buf list = {.n = 0};
    for (int i = 0; i < 3; i++) {
        v.n = 0;
        put(&v, values[i], strlen(values[i]));
        put_field(&list, 1, &v);
    }
    put_entry(&entries, "frames", 1, &list);
    float w = 0.5f;
    float_list(&l, &w, 1, 1);
    put_entry(&entries, "w", 2, &l);
    example_of(&g_ex[0], &entries);
    buf only = {.n = 0};
    int64_list(&l, &label, 1, 0);
    put_entry(&only, "label", 3, &l);
    float_list(&l, &w, 1, 0);
    put_entry(&only, "w", 2, &l);
    example_of(&g_ex[1], &only); /* "frames" absent: no values */
    dist_feature_spec spec[3] = {
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64},
        {.key = "frames", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_U8},
        {.key = "w", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_F32}};
    dist_iterator *it = parse_over(g_ex, 2, spec, 3);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.count, 4); /* label, the bytes, their lengths, w */
    ck_assert_int_eq(*(int64_t *)e.items[0]->data, 4);
    ck_assert_int_eq(e.items[1]->dtype, DIST_U8);
    ck_assert_int_eq(e.items[1]->shape[0], 5);
    ck_assert_mem_eq(e.items[1]->data, "abcde", 5);
    ck_assert_int_eq(e.items[2]->dtype, DIST_I64);
    ck_assert_int_eq(e.items[2]->shape[0], 3);
    const int64_t *lens = e.items[2]->data;
    ck_assert_int_eq(lens[0], 2);
    ck_assert_int_eq(lens[1], 0);
    ck_assert_int_eq(lens[2], 3);
    ck_assert_float_eq(*(float *)e.items[3]->data, 0.5f);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[1]->shape[0], 0);
    ck_assert_int_eq(e.items[2]->shape[0], 0);
    ck_assert_float_eq(*(float *)e.items[3]->data, 0.5f);
    dist_iterator_destroy(it);
}
END_TEST

/* Examples 0..n-1 with "tokens" = [k*10 .. k*10 + len[k]) and "label" = k; the parse of them. */
static dist_dataset *token_examples(const int *len, int n) {
    buf file = {.n = 0};
    for (int k = 0; k < n; k++) {
        buf entries = {.n = 0}, l = {.n = 0}, ex = {.n = 0};
        int64_t v[16];
        for (int i = 0; i < len[k]; i++) v[i] = k * 10 + i;
        int64_list(&l, v, len[k], 1);
        put_entry(&entries, "tokens", 3, &l);
        int64_t label = k;
        int64_list(&l, &label, 1, 0);
        put_entry(&entries, "label", 3, &l);
        example_of(&ex, &entries);
        put_record(&file, ex.b, ex.n);
    }
    const char *f = write_file("tokens.tfrecord", file.b, file.n);
    dist_dataset *rec = NULL, *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tfrecord(&f, 1, NULL, &rec), DIST_OK);
    dist_feature_spec spec[2] = {
        {.key = "tokens", .kind = DIST_FEATURE_VAR_LEN, .dtype = DIST_I64},
        {.key = "label", .kind = DIST_FEATURE_FIXED_LEN, .dtype = DIST_I64}};
    ck_assert_int_eq(dist_dataset_parse_example(rec, spec, 2, &ds), DIST_OK);
    dist_dataset_destroy(rec);
    return ds;
}

START_TEST(test_padded_batch_pads_each_batch_to_its_longest_or_to_a_shape) {
    const int len[5] = {2, 0, 3, 1, 1};
    dist_dataset *ds = token_examples(len, 5), *b = NULL;
    dist_padded_batch_options o = DIST_PADDED_BATCH_OPTIONS_INIT;
    o.padding_values[0] = -1;
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 3, 0, &o, &b), DIST_OK);
    const dist_element_spec *spec = dist_dataset_element_spec(b);
    ck_assert_int_eq(spec->ndim[0], 2);
    ck_assert_int_eq(spec->shape[0][1], -1);
    ck_assert_int_eq(dist_dataset_cardinality(b), DIST_CARDINALITY_UNKNOWN);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->shape[0], 3);
    ck_assert_int_eq(e.items[0]->shape[1], 3); /* the longest of 2, 0, 3 */
    const int64_t want0[9] = {0, 1, -1, -1, -1, -1, 20, 21, 22};
    ck_assert_mem_eq(e.items[0]->data, want0, sizeof want0);
    const int64_t labels0[3] = {0, 1, 2};
    ck_assert_mem_eq(e.items[1]->data, labels0, sizeof labels0);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK); /* the partial last batch */
    ck_assert_int_eq(e.items[0]->shape[0], 2);
    ck_assert_int_eq(e.items[0]->shape[1], 1);
    const int64_t want1[2] = {30, 40};
    ck_assert_mem_eq(e.items[0]->data, want1, sizeof want1);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(end, 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    /* a fixed padded shape: 4 wide; an element above it fails naming it */
    o.has_padded_shapes = 1;
    o.padded_shapes[0][0] = 4;
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 5, 1, &o, &b), DIST_OK);
    ck_assert_int_eq(dist_dataset_element_spec(b)->shape[0][1], 4);
    ck_assert_int_eq(dist_dataset_element_spec(b)->shape[0][0], 5);
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->shape[1], 4);
    ck_assert_int_eq(((int64_t *)e.items[0]->data)[4 * 2 + 3], -1);
    ck_assert_int_eq(((int64_t *)e.items[0]->data)[4 * 4 + 0], 40);
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    o.padded_shapes[0][0] = 2;
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 5, 0, &o, &b), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "element 2 item 0 has 3 in dimension 0"));
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    /* a padded shape below a known dimension is refused now (the label is a scalar: rank 0,
       so give the tokens' rank-1 shape to a known-shape source instead) */
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 0, 0, NULL, &b), DIST_INVALID_ARGUMENT);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_padded_batch_pads_rank_two_blocks_row_by_row) {
    /* float [2,3] elements padded to [3,4] with 9.5 */
    float v[2][2][3] = {{{1, 2, 3}, {4, 5, 6}}, {{7, 8, 9}, {10, 11, 12}}};
    int64_t shape[3] = {2, 2, 3};
    dist_tensor t = dist_tensor_view(v, DIST_F32, 3, shape);
    dist_tensor *ptrs[1] = {&t};
    dist_dataset *ds = NULL, *b = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 1, 1, &ds), DIST_OK);
    dist_padded_batch_options o = DIST_PADDED_BATCH_OPTIONS_INIT;
    o.has_padded_shapes = 1;
    o.padded_shapes[0][0] = 3;
    o.padded_shapes[0][1] = 4;
    o.padding_values[0] = 9.5;
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 2, 0, &o, &b), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->ndim, 3);
    ck_assert_int_eq(e.items[0]->shape[1], 3);
    ck_assert_int_eq(e.items[0]->shape[2], 4);
    const float want[24] = {1, 2, 3, 9.5, 4,  5,  6,  9.5, 9.5, 9.5, 9.5, 9.5,
                            7, 8, 9, 9.5, 10, 11, 12, 9.5, 9.5, 9.5, 9.5, 9.5};
    ck_assert_mem_eq(e.items[0]->data, want, sizeof want);
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    o.padded_shapes[0][1] = 2; /* below the known 3 */
    ck_assert_int_eq(dist_dataset_padded_batch(ds, 2, 0, &o, &b), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "padded shape 2 is below the elements' 3"));
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_padded_batch_pads_float16_and_bfloat16_with_the_nearest_value) {
    /* one-value f16 / bf16 elements padded to 2 wide: the padding's bits, as numpy rounds */
    const double values[8] = {0.333, 65519.0, 65520.0, 1e-7, -2.5, 0x1p-25, 3 * 0x1p-26, 6.1e-5};
    const uint16_t f16[8] = {0x3554, 0x7bff, 0x7c00, 0x0002, 0xc100, 0x0000, 0x0001, 0x03ff};
    const uint16_t bf16[8] = {0x3eaa, 0x4780, 0x4780, 0x33d7, 0xc020, 0x3300, 0x3340, 0x3880};
    for (int v = 0; v < 8; v++)
        for (int kind = 0; kind < 2; kind++) {
            uint16_t one[1] = {0x1234};
            int64_t shape[2] = {1, 1};
            dist_tensor t = dist_tensor_view(one, kind ? DIST_BF16 : DIST_F16, 2, shape);
            dist_tensor *ptrs[1] = {&t};
            dist_dataset *ds = NULL, *b = NULL;
            ck_assert_int_eq(dist_dataset_from_tensor_slices(ptrs, 1, 1, &ds), DIST_OK);
            dist_padded_batch_options o = DIST_PADDED_BATCH_OPTIONS_INIT;
            o.has_padded_shapes = 1;
            o.padded_shapes[0][0] = 2;
            o.padding_values[0] = values[v];
            ck_assert_int_eq(dist_dataset_padded_batch(ds, 1, 0, &o, &b), DIST_OK);
            dist_iterator *it = NULL;
            ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
            dist_element e;
            int end = 0;
            ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
            const uint16_t *got = e.items[0]->data;
            ck_assert_uint_eq(got[0], 0x1234);
            ck_assert_msg(got[1] == (kind ? bf16[v] : f16[v]), "%s of %g: %04x, expected %04x",
                          kind ? "bfloat16" : "float16", values[v], got[1],
                          kind ? bf16[v] : f16[v]);
            dist_iterator_destroy(it);
            dist_dataset_destroy(b);
            dist_dataset_destroy(ds);
        }
}
END_TEST

START_TEST(test_ragged_batch_gives_values_and_row_lengths) {
    const int len[4] = {2, 0, 3, 1};
    dist_dataset *ds = token_examples(len, 4), *b = NULL;
    ck_assert_int_eq(dist_dataset_ragged_batch(ds, 3, 0, &b), DIST_OK);
    const dist_element_spec *spec = dist_dataset_element_spec(b);
    ck_assert_int_eq(spec->count, 3); /* tokens' values, their row lengths, labels */
    ck_assert_int_eq(spec->dtype[1], DIST_I64);
    ck_assert_int_eq(spec->ndim[2], 1);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    dist_element e;
    int end = 0;
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.count, 3);
    ck_assert_int_eq(e.items[0]->shape[0], 5);
    const int64_t values[5] = {0, 1, 20, 21, 22}, lengths[3] = {2, 0, 3}, labels[3] = {0, 1, 2};
    ck_assert_mem_eq(e.items[0]->data, values, sizeof values);
    ck_assert_mem_eq(e.items[1]->data, lengths, sizeof lengths);
    ck_assert_mem_eq(e.items[2]->data, labels, sizeof labels);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(e.items[0]->shape[0], 1);
    ck_assert_int_eq(e.items[1]->shape[0], 1);
    ck_assert_int_eq(((int64_t *)e.items[0]->data)[0], 30);
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    ck_assert_int_eq(dist_dataset_ragged_batch(ds, 3, 1, &b), DIST_OK); /* drop the partial */
    ck_assert_int_eq(dist_iterator_create(b, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_int_eq(end, 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(b);
    dist_dataset_destroy(ds);
}
END_TEST

static Suite *tfrecord_suite(void) {
    Suite *s = suite_create("tfrecord");
    TCase *tc = tcase_create("records");
    tcase_add_checked_fixture(tc, make_dir, remove_dir);
    tcase_add_test(tc, test_tfrecord_round_trip_over_two_files_in_list_order);
    tcase_add_test(tc, test_tfrecord_gzip_and_zlib_read_the_same_records);
    tcase_add_test(tc, test_tfrecord_truncated_length_names_file_and_record_offset);
    tcase_add_test(tc, test_tfrecord_truncated_data_names_file_and_record_offset);
    tcase_add_test(tc, test_tfrecord_a_flipped_data_bit_fails_the_data_crc_naming_file_and_offset);
    tcase_add_test(tc, test_tfrecord_a_flipped_length_bit_fails_the_length_crc);
    tcase_add_test(tc, test_tfrecord_ignore_errors_skips_the_rest_of_a_damaged_file_and_counts_it);
    tcase_add_test(tc, test_tfrecord_a_hostile_length_is_refused_before_any_allocation);
    tcase_add_test(tc, test_tfrecord_missing_file_is_not_found_naming_it);
    tcase_add_test(tc, test_tfrecord_glob_lists_shards_in_byte_order);
    tcase_add_test(tc, test_tfrecord_auto_shard_gives_each_worker_its_files_as_tf_data);
    tcase_add_test(tc, test_tfrecord_parallel_reads_interleave_files_in_tf_order);
    tcase_add_test(tc, test_tfrecord_auto_compression_reads_each_file_by_its_first_bytes);
    tcase_add_test(tc, test_tfrecord_bad_arguments_are_refused);
    suite_add_tcase(s, tc);
    TCase *ex = tcase_create("example");
    tcase_add_checked_fixture(ex, make_dir, remove_dir);
    tcase_add_test(ex, test_parse_example_fixed_int64_float_and_bytes);
    tcase_add_test(ex, test_parse_example_default_value_fills_a_missing_feature);
    tcase_add_test(ex, test_parse_example_varlen_gives_the_values_and_their_length);
    tcase_add_test(ex, test_parse_example_missing_required_feature_names_it_and_the_record);
    tcase_add_test(ex, test_parse_example_wrong_kind_and_wrong_count_name_feature_and_record);
    tcase_add_test(ex, test_parse_example_packed_and_unpacked_values_are_the_same);
    tcase_add_test(ex, test_parse_example_skips_unknown_fields_and_refuses_overrunning_lengths);
    tcase_add_test(ex, test_parse_example_refuses_bad_specs_and_inputs);
    tcase_add_test(ex, test_parse_example_varlen_bytes_gives_the_values_and_their_lengths);
    tcase_add_test(ex, test_padded_batch_pads_each_batch_to_its_longest_or_to_a_shape);
    tcase_add_test(ex, test_padded_batch_pads_rank_two_blocks_row_by_row);
    tcase_add_test(ex, test_ragged_batch_gives_values_and_row_lengths);
    tcase_add_test(ex, test_padded_batch_pads_float16_and_bfloat16_with_the_nearest_value);
    suite_add_tcase(s, ex);
    return s;
}

int main(void) { return dist_test_run(tfrecord_suite()); }
