/* What reading a safetensors file costs: memory bounded by what the caller reads, not by what the
 * file claims (sparse multi-GiB files take a few KB of disk, so anyone who can write a backup
 * directory can plant one), and time linear in the number of tensors. The memory bound is
 * measured as the growth of the peak resident set (VmHWM, reset through /proc/self/clear_refs)
 * across the load. */
#include "dist/checkpoint.h"
#include "dist/fit.h"
#include "testutil.h"

#include <fcntl.h>
#include <linux/falloc.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define MB (1024.0 * 1024.0)
#define GIB ((int64_t)1 << 30)
/* The bound on the peak resident growth of a load: a few small tensors, the header, the CRC's
 * buffer, with room for the allocator. */
#define RSS_BOUND_BYTES (100 * 1024 * 1024)

static char tmpdir[64];

static void setup(void) {
    strcpy(tmpdir, "/tmp/dist_st_limits_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
}

static int remove_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void teardown(void) { nftw(tmpdir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

/* /proc/self/status's VmHWM (peak resident set) in bytes. */
static int64_t peak_rss(void) {
    FILE *f = fopen("/proc/self/status", "r");
    ck_assert_ptr_nonnull(f);
    char line[256];
    long long kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmHWM: %lld kB", &kb) == 1) break;
    fclose(f);
    ck_assert_int_ge(kb, 0);
    return (int64_t)kb * 1024;
}

/* Sets the peak to the present resident set (Linux 4.0: "5" in clear_refs). */
static void reset_peak_rss(void) {
    int fd = open("/proc/self/clear_refs", O_WRONLY);
    ck_assert_msg(fd >= 0, "cannot open /proc/self/clear_refs to reset the peak RSS");
    ck_assert_int_eq(write(fd, "5", 1), 1);
    close(fd);
}

/* A safetensors file: 8-byte length, `header` padded with spaces to `pad_to` bytes (0: none),
 * then `data` (n bytes), then the file extended with a hole to `total` bytes. */
static void write_sparse(const char *p, const char *header, size_t pad_to, const void *data,
                         size_t n, int64_t total) {
    size_t hlen = strlen(header), padded = pad_to > hlen ? pad_to : hlen;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(len8, 1, 8, f), 8);
    ck_assert_uint_eq(fwrite(header, 1, hlen, f), hlen);
    for (size_t i = hlen; i < padded; i++) fputc(' ', f);
    ck_assert_uint_eq(fwrite(data, 1, n, f), n);
    ck_assert_int_eq(fflush(f), 0);
    ck_assert_int_eq(ftruncate(fileno(f), (off_t)total), 0);
    fclose(f);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_size, total);
}

/* The header of a file with "a" (F32 [4]), "b" (I64 [2]) and "huge" (F32, `huge_floats`) after
 * them, with the metadata `meta` (a JSON object's members, or ""). */
static void huge_header(char *h, size_t size, int64_t huge_floats, const char *meta) {
    snprintf(h, size,
             "{\"__metadata__\":{%s},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[16,32]},"
             "\"huge\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[32,%lld]}}",
             meta, (long long)huge_floats, (long long)(32 + 4 * huge_floats));
}

static const float a_values[4] = {1.5f, -2.0f, 3.25f, 4.0f};
static const int64_t b_values[2] = {7, -9};

static void small_data(unsigned char data[32]) {
    memcpy(data, a_values, 16);
    memcpy(data + 16, b_values, 16);
}

/* The calling thread's CPU time since t0 (CLOCK_THREAD_CPUTIME_ID): the bounds below catch a
 * quadratic walk, and other programs' load on a shared machine must not move them (a wall-clock
 * bound failed at 1.06 s beside a load of 11 on 2 cores). */
static double seconds_since(const struct timespec *t0) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)(t.tv_sec - t0->tv_sec) + (double)(t.tv_nsec - t0->tv_nsec) * 1e-9;
}

START_TEST(test_an_8_gib_sparse_file_loads_without_reading_its_unused_tensor) {
    char path[128], header[1024];
    snprintf(path, sizeof path, "%s/big.safetensors", tmpdir);
    int64_t huge = 2 * GIB; /* floats: 8 GiB */
    huge_header(header, sizeof header, huge, "\"format\":\"pt\"");
    unsigned char data[32];
    small_data(data);
    size_t pad = (strlen(header) + 7) & ~(size_t)7;
    write_sparse(path, header, pad, data, sizeof data, 8 + (int64_t)pad + 32 + 4 * huge);
    reset_peak_rss();
    int64_t before = peak_rss();
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    float a[4];
    int64_t b[2];
    dist_tensor ta = dist_tensor_view(a, DIST_F32, 1, (int64_t[]){4});
    dist_tensor tb = dist_tensor_view(b, DIST_I64, 1, (int64_t[]){2});
    ck_assert_int_eq(
        dist_checkpoint_restore(c, 2, (const char *const[]){"a", "b"}, (dist_tensor *[]){&ta, &tb}),
        DIST_OK);
    const dist_tensor *h = dist_checkpoint_find(c, "huge");
    ck_assert_ptr_nonnull(h);
    ck_assert_int_eq(h->shape[0], huge);
    int64_t growth = peak_rss() - before;
    dist_checkpoint_destroy(c);
    printf("8 GiB sparse file loaded: peak RSS grew by %.1f MB\n", (double)growth / MB);
    ck_assert(!memcmp(a, a_values, sizeof a) && !memcmp(b, b_values, sizeof b));
    ck_assert_msg(growth < RSS_BOUND_BYTES, "loading grew the peak RSS by %.1f MB",
                  (double)growth / MB);
}
END_TEST

START_TEST(test_a_sparse_4_gib_backup_planted_as_the_newest_is_refused_in_bounded_memory) {
    char dir[128], path[192], header[1024];
    snprintf(dir, sizeof dir, "%s/backup", tmpdir);
    dist_checkpoint_manager *m = NULL;
    ck_assert_int_eq(dist_checkpoint_manager_create(dir, 2, &m), DIST_OK);
    dist_checkpoint *good = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&good), DIST_OK);
    dist_tensor ta = dist_tensor_view((void *)a_values, DIST_F32, 1, (int64_t[]){4});
    ck_assert_int_eq(dist_checkpoint_add(good, "a", &ta), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_manager_save(m, good, 1), DIST_OK);
    dist_checkpoint_destroy(good);
    /* A file that says libdist wrote it, with a checksum that cannot match: only reading all of
     * it tells. */
    snprintf(path, sizeof path, "%s/ckpt-999999.safetensors", dir);
    int64_t huge = GIB; /* floats: 4 GiB */
    huge_header(header, sizeof header, huge,
                "\"libdist.writer\":\"libdist\",\"libdist.crc32c\":\"00000000\"");
    unsigned char data[32];
    small_data(data);
    size_t pad = (strlen(header) + 7) & ~(size_t)7;
    write_sparse(path, header, pad, data, sizeof data, 8 + (int64_t)pad + 32 + 4 * huge);
    reset_peak_rss();
    int64_t before = peak_rss();
    struct timespec t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    dist_checkpoint *c = NULL;
    int64_t step = -1;
    ck_assert_int_eq(dist_checkpoint_manager_restore_latest(m, &c, &step), DIST_OK);
    double seconds = seconds_since(&t0);
    int64_t growth = peak_rss() - before;
    printf("4 GiB sparse planted backup refused: peak RSS grew by %.1f MB, %.3f s\n",
           (double)growth / MB, seconds);
    ck_assert_int_eq(step, 1);
    ck_assert_msg(seconds < 5.0, "refusing it took %.1f s", seconds);
    const dist_tensor *t = dist_checkpoint_find(c, "a");
    ck_assert_ptr_nonnull(t);
    ck_assert(!memcmp(t->data, a_values, sizeof a_values));
    dist_checkpoint_destroy(c);
    dist_checkpoint_manager_destroy(m);
    ck_assert_msg(growth < RSS_BOUND_BYTES, "restoring grew the peak RSS by %.1f MB",
                  (double)growth / MB);
}
END_TEST

START_TEST(test_tensors_not_aligned_in_the_file_read_back_aligned) {
    /* No padding: the data starts at 8 + 63 bytes, so every tensor is misaligned in the file. */
    char path[128], header[256];
    snprintf(path, sizeof path, "%s/odd.safetensors", tmpdir);
    snprintf(header, sizeof header,
             "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"b\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[16,32]}}");
    size_t hlen = strlen(header);
    ck_assert_uint_ne((8 + hlen) % 8, 0);
    unsigned char data[32];
    small_data(data);
    write_sparse(path, header, 0, data, sizeof data, (int64_t)(8 + hlen + 32));
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    const dist_tensor *a = dist_checkpoint_find(c, "a"), *b = dist_checkpoint_find(c, "b");
    ck_assert(a && b);
    ck_assert_uint_eq((uintptr_t)a->data % 4, 0);
    ck_assert_uint_eq((uintptr_t)b->data % 8, 0);
    ck_assert(!memcmp(a->data, a_values, 16) && !memcmp(b->data, b_values, 16));
    ck_assert_ptr_eq(dist_checkpoint_find(c, "a"), a); /* copied once */
    /* and it saves as it was read */
    char again[160];
    snprintf(again, sizeof again, "%s/again.safetensors", tmpdir);
    ck_assert_int_eq(dist_checkpoint_save(c, again), DIST_OK);
    dist_checkpoint_destroy(c);
    ck_assert_int_eq(dist_checkpoint_load(again, &c), DIST_OK);
    ck_assert(!memcmp(dist_checkpoint_find(c, "b")->data, b_values, 16));
    dist_checkpoint_destroy(c);
}
END_TEST

START_TEST(test_a_checkpoint_with_holes_and_a_valid_crc_loads) {
    /* 64 MiB of zeros between two small tensors, saved by libdist (so with its CRC), then
     * punched out of the file: the bytes are the same, the CRC runs over the hole unread. */
    char path[128];
    snprintf(path, sizeof path, "%s/holes.safetensors", tmpdir);
    int64_t n = 16 << 20;
    float *zeros = calloc((size_t)n, sizeof *zeros);
    ck_assert_ptr_nonnull(zeros);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    dist_tensor tb = dist_tensor_view((void *)b_values, DIST_I64, 1, (int64_t[]){2});
    dist_tensor tz = dist_tensor_view(zeros, DIST_F32, 1, &n);
    dist_tensor ta = dist_tensor_view((void *)a_values, DIST_F32, 1, (int64_t[]){4});
    ck_assert_int_eq(dist_checkpoint_add(c, "b", &tb), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add(c, "zeros", &tz), DIST_OK);
    ck_assert_int_eq(dist_checkpoint_add(c, "a", &ta), DIST_OK); /* after the hole */
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);
    free(zeros);
    int fd = open(path, O_RDWR);
    ck_assert_int_ge(fd, 0);
    int punched = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 1 << 20, 48 << 20);
    struct stat sb;
    ck_assert_int_eq(fstat(fd, &sb), 0);
    close(fd);
    printf("holes: %s; %lld of %lld bytes on disk\n", punched == 0 ? "punched" : "not supported",
           (long long)sb.st_blocks * 512, (long long)sb.st_size);
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    ck_assert(!memcmp(dist_checkpoint_find(c, "a")->data, a_values, sizeof a_values));
    ck_assert(!memcmp(dist_checkpoint_find(c, "b")->data, b_values, sizeof b_values));
    dist_checkpoint_destroy(c);
    /* and one byte of data in the hole breaks the CRC */
    fd = open(path, O_WRONLY);
    ck_assert_int_eq(pwrite(fd, "\1", 1, 20 << 20), 1);
    close(fd);
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "CRC"));
}
END_TEST

/* Builds a checkpoint of n tensors and n metadata keys, saves it, loads it and looks every one up;
 * returns the thread CPU seconds of the building and of the loading with the lookups. */
static void many_tensors(int n, double *build, double *load) {
    char path[128], name[32];
    snprintf(path, sizeof path, "%s/many_%d.safetensors", tmpdir, n);
    struct timespec t0;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    dist_checkpoint *c = NULL;
    ck_assert_int_eq(dist_checkpoint_create(&c), DIST_OK);
    int failed = 0; /* counted, not asserted: Check records every assertion it passes */
    for (int i = 0; i < n; i++) {
        float v = (float)i;
        dist_tensor t = dist_tensor_view(&v, DIST_F32, 1, (int64_t[]){1});
        snprintf(name, sizeof name, "layer_%d/kernel", i);
        failed += dist_checkpoint_add(c, name, &t) != DIST_OK;
        snprintf(name, sizeof name, "note_%d", i);
        failed += dist_checkpoint_set_metadata(c, name, "x") != DIST_OK;
    }
    *build = seconds_since(&t0);
    ck_assert_int_eq(failed, 0);
    ck_assert_int_eq(dist_checkpoint_save(c, path), DIST_OK);
    dist_checkpoint_destroy(c);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    ck_assert_int_eq(dist_checkpoint_load(path, &c), DIST_OK);
    int wrong = 0;
    for (int i = n - 1; i >= 0; i--) {
        snprintf(name, sizeof name, "layer_%d/kernel", i);
        const dist_tensor *t = dist_checkpoint_find(c, name);
        wrong += !t || *(const float *)t->data != (float)i;
        snprintf(name, sizeof name, "note_%d", i);
        wrong += !dist_checkpoint_metadata(c, name);
    }
    *load = seconds_since(&t0);
    ck_assert_int_eq(dist_checkpoint_num_tensors(c), n);
    dist_checkpoint_destroy(c);
    ck_assert_int_eq(wrong, 0);
    unlink(path);
}

/* The cost of adding, loading and looking up grows linearly with the number of tensors: ten times
 * the tensors may cost at most 50 times the CPU time (linear measured 10-25 times with the caches,
 * a scan per lookup or per add costs 100 times). A ratio of CPU times on the same thread, so it
 * holds on a slow or sanitized build and on a busy machine; each size's fastest run counts (of
 * three small, two large), so that neither a warm-up nor a pause moves the ratio. */
START_TEST(test_a_header_of_100000_tensors_loads_and_is_looked_up_in_linear_time) {
    enum { N = 100000 };
    double build_small = 1e9, load_small = 1e9, b, l;
    for (int r = 0; r < 3; r++) {
        many_tensors(N / 10, &b, &l);
        build_small = b < build_small ? b : build_small;
        load_small = l < load_small ? l : load_small;
    }
    double build = 1e9, load = 1e9;
    for (int r = 0; r < 2; r++) { /* the faster of two: a busy machine's pause is not the cost */
        many_tensors(N, &b, &l);
        build = b < build ? b : build;
        load = l < load ? l : load;
    }
    printf("%d tensors and metadata keys: built in %.3f s, loaded and looked up in %.3f s "
           "(%d: %.3f s, %.3f s)\n",
           N, build, load, N / 10, build_small, load_small);
    ck_assert_msg(load < 50 * load_small + 0.05,
                  "loading and looking up %d tensors took %.3f s, %d took %.3f s: not linear", N,
                  load, N / 10, load_small);
    ck_assert_msg(build < 50 * build_small + 0.05,
                  "adding %d tensors took %.3f s, %d took %.3f s: not linear", N, build, N / 10,
                  build_small);
}
END_TEST

int main(void) {
    Suite *s = suite_create("safetensors_limits");
    TCase *tc = tcase_create("safetensors_limits");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_an_8_gib_sparse_file_loads_without_reading_its_unused_tensor);
    tcase_add_test(tc, test_a_sparse_4_gib_backup_planted_as_the_newest_is_refused_in_bounded_memory);
    tcase_add_test(tc, test_tensors_not_aligned_in_the_file_read_back_aligned);
    tcase_add_test(tc, test_a_checkpoint_with_holes_and_a_valid_crc_loads);
    tcase_add_test(tc, test_a_header_of_100000_tensors_loads_and_is_looked_up_in_linear_time);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
