/* Input-pipeline throughput alone (no training), against what one training replica consumes
 * and against tf.data.
 *
 *   bench_data [--sections idx,jpeg,autotune,tfrecord] [--runs N] [--tf PYTHON | --no-tf] ...
 *   (bench_data --help lists every option)
 *
 * 1. IDX (the shipped MNIST subset, gzip) -> image_normalize -> shuffle(10000) -> batch(64)
 *    -> prefetch(2), 5 epochs of 7,996 images per run.
 * 2. A JPEG class folder (MNIST digits written as 28x28 JPEGs) -> decode on 1 and 2 threads
 *    -> image_normalize -> batch(64) -> prefetch(2), 3 passes over 7,996 files per run.
 * 3. AUTOTUNE against hand-set values, with a consumer that spends --consume-us of CPU per
 *    image (a training step's share of the same cores): a slow map (range -> busy map of
 *    --map-us per element -> batch(64) -> prefetch) and the JPEG folder of 2 (decode ->
 *    normalize -> batch(64) -> prefetch), each over every hand-set (parallelism, prefetch) in
 *    {1, 2, 4} x {1, 2, 8} (JPEG: {1, 2} x {1, 2, 8}) and with DIST_AUTOTUNE for both; 2 epochs
 *    per iterator, so AUTOTUNE's ramp-up from 1 is in the time.
 * 4. TFRecord against tf.data on the same files: the 10,000 digits of the subset (train and
 *    test) written as --shards TFDS-style shards, images PNG-encoded ("image") or raw
 *    ("image_raw", 784 bytes), label int64, uncompressed and GZIP -> parse_example -> decode
 *    (decode_image, or decode_raw to [28,28,1]) -> batch(64), one full pass per run, at 1 thread
 *    and at 2 (decode on 2 threads; files read one after the other or 2 at once). tf.data runs
 *    the same pipeline (bench/tf_data_tfrecord.py, one process per thread count, driven through
 *    a pipe) and its passes alternate with libdist's, so that the machine's load hits both.
 * Prints medians in images/s and the ratios: pipeline / consumption (target >= 10), JPEG
 * 2 threads / 1 thread (target >= 1.8), libdist / tf.data (target >= 1). */
#include "dist/data.h"
#include "dist/idx.h"
#include "tfrecord_fixture.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

/* The repository root (src/data/mnist_subset, bench/tf_data_tfrecord.py): --source-dir,
 * $DIST_SOURCE_DIR, or the tree this binary was built from. */
#ifdef DIST_SOURCE_DIR
static const char *g_src = DIST_SOURCE_DIR;
#else
static const char *g_src = ".";
#endif

static const char *subset(const char *name) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/src/data/mnist_subset/%s", g_src, name);
    return buf[k];
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        dist_status st_ = (call);                                                                  \
        if (st_ != DIST_OK) {                                                                      \
            fprintf(stderr, "%s failed: %s: %s\n", #call, dist_status_name(st_),                   \
                    dist_last_error());                                                            \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHAIN(ds, call)                                                                            \
    do {                                                                                           \
        dist_dataset *next_ = NULL;                                                                \
        CHECK(call);                                                                               \
        dist_dataset_destroy(ds);                                                                  \
        (ds) = next_;                                                                              \
    } while (0)

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double g_cpu_us_per_image; /* of the last drain: process CPU time / images */
static int64_t g_images;          /* of the last drain */
static double g_consume_us;       /* the consumer's CPU time per image (section 3) */

/* Busy work for about `us` microseconds: a loop calibrated once (reading a CPU-time clock in
 * the loop would be a system call each time, and their cost would be most of the time). */
static double g_iters_per_us;

static uint32_t spin_iters(double iters) {
    volatile uint32_t x = 1;
    for (double i = 0; i < iters; i++) x = x * 1664525u + 1013904223u;
    return x;
}

/* On this thread's CPU clock, so that a descheduled moment does not count. */
static void calibrate_spin(void) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    spin_iters(2e7);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    double us = 1e6 * (double)(b.tv_sec - a.tv_sec) + 1e-3 * (double)(b.tv_nsec - a.tv_nsec);
    g_iters_per_us = 2e7 / us;
}

static void spin_us(double us) { spin_iters(us * g_iters_per_us); }

/* Images per second of `epochs` passes of `ds` (counting rows of item 0). */
static double drain(dist_dataset *ds, int epochs) {
    dist_iterator *it = NULL;
    CHECK(dist_iterator_create(ds, &it));
    double t0 = now_s(), c0 = cpu_s();
    int64_t images = 0;
    for (int e = 0; e < epochs; e++) {
        if (e) CHECK(dist_iterator_reset(it));
        for (;;) {
            dist_element el;
            int eos = 0;
            CHECK(dist_iterator_next(it, &el, &eos));
            if (eos) break;
            images += el.items[0]->shape[0];
            if (g_consume_us > 0) spin_us(g_consume_us * (double)el.items[0]->shape[0]);
        }
    }
    double dt = now_s() - t0;
    g_cpu_us_per_image = 1e6 * (cpu_s() - c0) / (double)images;
    g_images = images;
    dist_iterator_destroy(it);
    return (double)images / dt;
}

static void rm_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) {
        unlink(path);
        return;
    }
    struct dirent *e;
    char sub[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        rm_tree(sub);
    }
    closedir(d);
    rmdir(path);
}

/* Writes the first n MNIST images as root/<label>/<i>.jpg (quality 90). */
static void write_jpeg_folder(const char *root, int n) {
    dist_tensor *img = NULL, *lab = NULL;
    CHECK(dist_idx_read(subset("train-images-idx3-ubyte.gz"), &img));
    CHECK(dist_idx_read(subset("train-labels-idx1-ubyte.gz"), &lab));
    const int64_t total = img->shape[0]; /* sorted by digit: sample evenly */
    if (n > total) n = (int)total;
    char path[512];
    for (int c = 0; c < 10; c++) {
        snprintf(path, sizeof path, "%s/%d", root, c);
        mkdir(path, 0755);
    }
    tjhandle tj = tjInitCompress();
    for (int k = 0; k < n; k++) {
        int i = (int)((int64_t)k * total / n);
        unsigned char *jpeg = NULL;
        unsigned long size = 0;
        const unsigned char *px = (const unsigned char *)img->data + (size_t)i * 784;
        if (tjCompress2(tj, px, 28, 28, 28, TJPF_GRAY, &jpeg, &size, TJSAMP_GRAY, 90, 0) != 0)
            exit(1);
        snprintf(path, sizeof path, "%s/%d/%05d.jpg", root, ((unsigned char *)lab->data)[i], i);
        FILE *f = fopen(path, "wb");
        if (!f || fwrite(jpeg, 1, size, f) != size) exit(1);
        fclose(f);
        tjFree(jpeg);
    }
    tjDestroy(tj);
    dist_tensor_destroy(img);
    dist_tensor_destroy(lab);
}

static dist_dataset *idx_pipeline(void) {
    dist_dataset *ds = NULL;
    CHECK(dist_dataset_from_idx(subset("train-images-idx3-ubyte.gz"),
                                subset("train-labels-idx1-ubyte.gz"), &ds));
    CHAIN(ds, dist_dataset_map_image_normalize(ds, &next_));
    CHAIN(ds, dist_dataset_shuffle(ds, 10000, 42, 1, &next_));
    CHAIN(ds, dist_dataset_batch(ds, 64, 0, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, 2, &next_));
    return ds;
}

static dist_dataset *jpeg_pipeline_with(const char *root, int threads, int prefetch) {
    dist_jpeg_folder_options o = DIST_JPEG_FOLDER_OPTIONS_INIT;
    o.num_threads = threads;
    dist_dataset *ds = NULL;
    CHECK(dist_dataset_from_jpeg_folder(root, &o, &ds));
    CHAIN(ds, dist_dataset_map_image_normalize(ds, &next_));
    CHAIN(ds, dist_dataset_batch(ds, 64, 0, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, prefetch, &next_));
    return ds;
}

static dist_dataset *jpeg_pipeline(const char *root, int threads) {
    return jpeg_pipeline_with(root, threads, 2);
}

static double g_map_us = 40; /* the slow map's CPU time per element */

static dist_status slow_map(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    spin_us(g_map_us);
    *(float *)out->items[0]->data = (float)*(const int32_t *)in->items[0]->data;
    return DIST_OK;
}

static dist_dataset *slow_map_pipeline(int n, int parallel, int prefetch) {
    int64_t shape[1] = {n};
    dist_tensor *t = NULL;
    CHECK(dist_tensor_create(DIST_I32, 1, shape, &t));
    for (int i = 0; i < n; i++) ((int32_t *)t->data)[i] = i;
    dist_dataset *ds = NULL;
    CHECK(dist_dataset_from_tensor_slices(&t, 1, 1, &ds));
    dist_tensor_destroy(t);
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_F32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    o.num_parallel = parallel;
    o.name = "slow";
    CHAIN(ds, dist_dataset_map(ds, slow_map, NULL, &o, &next_));
    CHAIN(ds, dist_dataset_batch(ds, 64, 0, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, prefetch, &next_));
    return ds;
}

static const char *setting(int v, char *buf) {
    if (v == DIST_AUTOTUNE) return "AUTOTUNE";
    sprintf(buf, "%d", v);
    return buf;
}

/* Section 3: one row per setting, runs alternating over the settings so that load changes on
 * this shared machine hit all of them; the best hand-set row and AUTOTUNE's are summarized. */
static void autotune_table(const char *what, dist_dataset *(*make)(const void *, int, int),
                           const void *arg, const int *par, int npar, int runs) {
    const int pre[3] = {1, 2, 8};
    int n = npar * 3 + 1;
    dist_dataset *ds[16];
    int sp[16], sq[16];
    double v[16][100], med[16];
    for (int i = 0; i < n; i++) {
        sp[i] = i < n - 1 ? par[i / 3] : DIST_AUTOTUNE;
        sq[i] = i < n - 1 ? pre[i % 3] : DIST_AUTOTUNE;
        ds[i] = make(arg, sp[i], sq[i]);
        drain(ds[i], 1);
    }
    for (int r = 0; r < runs; r++)
        for (int i = 0; i < n; i++) v[i][r] = drain(ds[i], 2);
    int best = 0;
    for (int i = 0; i < n; i++) {
        med[i] = median(v[i], runs);
        if (i < n - 1 && med[i] > med[best]) best = i;
    }
    dist_iterator *it = NULL;
    dist_autotune_state at = {0, 0, 0, 0};
    CHECK(dist_iterator_create(ds[n - 1], &it));
    for (int e = 0; e < 2; e++) {
        for (;;) {
            dist_element el;
            int eos = 0;
            CHECK(dist_iterator_next(it, &el, &eos));
            if (eos) break;
            if (g_consume_us > 0) spin_us(g_consume_us * (double)el.items[0]->shape[0]);
        }
        CHECK(dist_iterator_reset(it));
    }
    CHECK(dist_iterator_autotune(it, &at));
    dist_iterator_destroy(it);
    printf("%s (consumer %.0f us/image)\n%-14s %-10s %14s\n", what, g_consume_us, "parallelism",
           "prefetch", "images/s");
    char b1[16], b2[16];
    for (int i = 0; i < n; i++) {
        printf("%-14s %-10s %14.0f%s\n", setting(sp[i], b1), setting(sq[i], b2), med[i],
               i == best ? "  (best hand-set)" : "");
        dist_dataset_destroy(ds[i]);
    }
    printf("AUTOTUNE / best hand-set: %.2fx; AUTOTUNE chose parallelism %d, prefetch %d\n",
           med[n - 1] / med[best], at.map_parallel, at.prefetch_buffer);
}

static dist_dataset *make_slow(const void *arg, int parallel, int prefetch) {
    return slow_map_pipeline(*(const int *)arg, parallel, prefetch);
}

static dist_dataset *make_jpeg(const void *arg, int parallel, int prefetch) {
    return jpeg_pipeline_with((const char *)arg, parallel, prefetch);
}

/* ---- section 4: TFRecord against tf.data -------------------------------------------------- */

/* The 10,000 digits of the subset, train then test, as uint8 [10000, 28, 28] and [10000]. */
static void load_digits(dist_tensor **images, dist_tensor **labels) {
    dist_tensor *part[2][2] = {{NULL, NULL}, {NULL, NULL}};
    CHECK(dist_idx_read(subset("train-images-idx3-ubyte.gz"), &part[0][0]));
    CHECK(dist_idx_read(subset("train-labels-idx1-ubyte.gz"), &part[0][1]));
    CHECK(dist_idx_read(subset("t10k-images-idx3-ubyte.gz"), &part[1][0]));
    CHECK(dist_idx_read(subset("t10k-labels-idx1-ubyte.gz"), &part[1][1]));
    int64_t n = part[0][0]->shape[0] + part[1][0]->shape[0];
    int64_t ishape[3] = {n, 28, 28}, lshape[1] = {n};
    CHECK(dist_tensor_create(DIST_U8, 3, ishape, images));
    CHECK(dist_tensor_create(DIST_U8, 1, lshape, labels));
    size_t at = 0;
    for (int s = 0; s < 2; s++) {
        size_t k = (size_t)part[s][0]->shape[0];
        memcpy((unsigned char *)(*images)->data + at * 784, part[s][0]->data, k * 784);
        memcpy((unsigned char *)(*labels)->data + at, part[s][1]->data, k);
        at += k;
        dist_tensor_destroy(part[s][0]);
        dist_tensor_destroy(part[s][1]);
    }
}

/* One row of the table: the same pipeline in libdist and in tf.data. */
typedef struct tfr_row {
    bench_image_encoding encoding;
    int gzip;
    int threads;        /* libdist: decode_image's num_parallel; tf.data: num_parallel_calls and the
                           process's thread counts */
    int reads;          /* num_parallel_reads (1: one file after the other) */
    int tf_batch_first; /* tf.data's vectorized form (raw): batch(64), then parse_example +
                           decode_raw over the batch; libdist's pipeline is the same as above */
    dist_dataset *ds;
    double lib[100], tf[100], ratio[100], lib_cpu[100], tf_cpu[100];
} tfr_row;

static const char *tfr_variant(const tfr_row *r) {
    return r->encoding == BENCH_IMAGE_PNG ? "png" : "raw";
}

static dist_dataset *tfrecord_pipeline(const char *dir, const tfr_row *r) {
    char pattern[1200];
    snprintf(pattern, sizeof pattern, "%s/mnist-%s%s.tfrecord-*", dir, tfr_variant(r),
             r->gzip ? "-gzip" : "");
    dist_tfrecord_options o = DIST_TFRECORD_OPTIONS_INIT;
    o.compression = r->gzip ? DIST_TFRECORD_GZIP : DIST_TFRECORD_NONE;
    o.num_parallel_reads = r->reads > 1 ? r->reads : 0;
    dist_dataset *ds = NULL;
    CHECK(dist_dataset_from_tfrecord_glob(pattern, &o, &ds));
    dist_feature_spec spec[2];
    memset(spec, 0, sizeof spec);
    spec[0].key = r->encoding == BENCH_IMAGE_PNG ? "image" : "image_raw";
    spec[0].kind = DIST_FEATURE_FIXED_LEN;
    spec[0].dtype = DIST_U8;
    spec[1].key = "label";
    spec[1].kind = DIST_FEATURE_FIXED_LEN;
    spec[1].dtype = DIST_I64;
    CHAIN(ds, dist_dataset_parse_example(ds, spec, 2, &next_));
    if (r->encoding == BENCH_IMAGE_PNG) {
        dist_decode_image_options d = DIST_DECODE_IMAGE_OPTIONS_INIT;
        d.height = d.width = 28;
        d.channels = 1;
        d.num_parallel = r->threads;
        CHAIN(ds, dist_dataset_map_decode_image(ds, &d, &next_));
    } else {
        const int64_t shape[3] = {28, 28, 1};
        CHAIN(ds, dist_dataset_map_decode_raw(ds, 0, DIST_U8, 3, shape, &next_));
    }
    CHAIN(ds, dist_dataset_batch(ds, 64, 0, &next_));
    return ds;
}

/* A bench/tf_data_tfrecord.py --serve process: configurations go down `to`, one a line, and
 * "RESULT images=N wall_s=S cpu_s=C" lines come back on `from_fd`. */
typedef struct tf_ref {
    pid_t pid;
    FILE *to;
    int from_fd;
    char buf[4096];
    size_t have;
    const char *failed; /* why this reference gives no more numbers, or NULL */
} tf_ref;

/* Starts the script with --threads `threads`; its stderr (TensorFlow's log) goes to `log`. */
static void tf_ref_start(tf_ref *t, const char *python, const char *dir, int threads,
                         const char *log) {
    memset(t, 0, sizeof *t);
    t->from_fd = -1;
    char script[1100], nthreads[16];
    snprintf(script, sizeof script, "%s/bench/tf_data_tfrecord.py", g_src);
    snprintf(nthreads, sizeof nthreads, "%d", threads);
    int down[2], up[2];
    if (pipe(down) || pipe(up)) {
        perror("bench_data: pipe");
        exit(1);
    }
    fflush(NULL);
    t->pid = fork();
    if (t->pid < 0) {
        perror("bench_data: fork");
        exit(1);
    }
    if (t->pid == 0) {
        int err = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (dup2(down[0], 0) < 0 || dup2(up[1], 1) < 0 || (err >= 0 && dup2(err, 2) < 0))
            _exit(127);
        close(down[0]);
        close(down[1]);
        close(up[0]);
        close(up[1]);
        execl(python, python, script, "--serve", "--dir", dir, "--threads", nthreads, (char *)NULL);
        fprintf(stderr, "bench_data: cannot run %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    t->to = fdopen(down[1], "w");
    t->from_fd = up[0];
    if (!t->to) {
        perror("bench_data: fdopen");
        exit(1);
    }
}

/* One line from the script within `timeout_s` (the first pass imports TensorFlow and warms
 * up); 0 and the line, or -1 with t->failed set. */
static int tf_ref_line(tf_ref *t, double timeout_s, char *line, size_t size) {
    double deadline = now_s() + timeout_s;
    for (;;) {
        char *nl = memchr(t->buf, '\n', t->have);
        if (nl) {
            size_t len = (size_t)(nl - t->buf);
            snprintf(line, size, "%.*s", (int)len, t->buf);
            memmove(t->buf, nl + 1, t->have - len - 1);
            t->have -= len + 1;
            return 0;
        }
        if (t->have == sizeof t->buf) {
            t->failed = "an answer longer than 4 KiB";
            return -1;
        }
        double left = deadline - now_s();
        struct pollfd p = {.fd = t->from_fd, .events = POLLIN};
        int ready = left > 0 ? poll(&p, 1, (int)(1000 * left) + 1) : 0;
        if (ready < 0 && errno == EINTR) continue;
        if (ready <= 0) {
            t->failed = "no answer in time";
            return -1;
        }
        ssize_t got = read(t->from_fd, t->buf + t->have, sizeof t->buf - t->have);
        if (got <= 0) {
            t->failed = "the script exited";
            return -1;
        }
        t->have += (size_t)got;
    }
}

/* Images/s of one tf.data pass of row r (its CPU us/image in *cpu_us), or 0 when the
 * reference failed (t->failed says why). */
static double tf_ref_pass(tf_ref *t, const tfr_row *r, int64_t want, double timeout_s,
                          double *cpu_us) {
    if (t->failed) return 0;
    fprintf(t->to, "%s %s %d %d %s\n", tfr_variant(r), r->gzip ? "gzip" : "none", r->reads,
            r->threads, r->tf_batch_first ? "batch" : "record");
    if (fflush(t->to) != 0) {
        t->failed = "the script exited";
        return 0;
    }
    char line[4096];
    if (tf_ref_line(t, timeout_s, line, sizeof line)) return 0;
    long long images = 0;
    double wall = 0, cpu = 0;
    if (sscanf(line, "RESULT images=%lld wall_s=%lf cpu_s=%lf", &images, &wall, &cpu) != 3 ||
        images != want || wall <= 0) {
        static char why[300];
        snprintf(why, sizeof why, "it answered \"%.200s\" (want images=%lld)", line,
                 (long long)want);
        t->failed = why;
        return 0;
    }
    *cpu_us = 1e6 * cpu / (double)images;
    return (double)images / wall;
}

/* Waits for the script's "READY" (TensorFlow imported), so that no import runs beside a timed
 * pass. */
static void tf_ref_ready(tf_ref *t) {
    char line[4096];
    if (tf_ref_line(t, 600, line, sizeof line)) return;
    if (strcmp(line, "READY") != 0) {
        static char why[300];
        snprintf(why, sizeof why, "it said \"%.200s\" instead of READY", line);
        t->failed = why;
    }
}

static void tf_ref_stop(tf_ref *t) {
    if (t->pid <= 0) return;
    if (t->to) fclose(t->to); /* end of input: the script returns */
    if (t->from_fd >= 0) close(t->from_fd);
    int status;
    for (int i = 0; i < 100; i++) {
        if (waitpid(t->pid, &status, WNOHANG) == t->pid) return;
        usleep(50000);
    }
    kill(t->pid, SIGTERM);
    waitpid(t->pid, &status, 0);
}

/* Images/s of one libdist pass (its CPU us/image in *cpu_us); a pass that does not yield
 * every digit is an error. Timed with the iterator's creation and destruction, as tf.data's
 * Dataset.reduce is. */
static double lib_pass(dist_dataset *ds, int64_t want, double *cpu_us) {
    double t0 = now_s();
    drain(ds, 1);
    double rate = (double)g_images / (now_s() - t0);
    if (g_images != want) {
        fprintf(stderr, "bench_data: a TFRecord pass gave %lld images, not %lld\n",
                (long long)g_images, (long long)want);
        exit(1);
    }
    *cpu_us = g_cpu_us_per_image;
    return rate;
}

/* keep_dir: write the shards there and leave them (NULL: a temporary directory, removed). */
static void tfrecord_section(const char *tf_python, const char *tf_missing, int runs, int shards,
                             const char *keep_dir) {
    char dir[1024] = "/tmp/bench_data_tfrecord_XXXXXX";
    if (keep_dir) {
        snprintf(dir, sizeof dir, "%s", keep_dir);
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "bench_data: --tfrecord-dir %s: %s\n", dir, strerror(errno));
            exit(2);
        }
    } else if (!mkdtemp(dir)) {
        perror("bench_data: mkdtemp");
        exit(1);
    }
    dist_tensor *images = NULL, *labels = NULL;
    load_digits(&images, &labels);
    const int64_t n = images->shape[0];
    const char *names[2][2] = {{"mnist-png", "mnist-png-gzip"}, {"mnist-raw", "mnist-raw-gzip"}};
    for (int e = 0; e < 2; e++)
        for (int z = 0; z < 2; z++)
            if (bench_write_tfrecord_mnist(dir, names[e][z], images, labels,
                                           e ? BENCH_IMAGE_RAW : BENCH_IMAGE_PNG, z, shards))
                exit(1);
    dist_tensor_destroy(images);
    dist_tensor_destroy(labels);

    /* Each variant at 1 thread; at 2 threads reading one file at a time; at 2 reading 2 at
     * once. Then raw against tf.data's vectorized form. */
    enum { NROWS = 16 };
    static tfr_row rows[NROWS];
    const int tr[3][2] = {{1, 1}, {2, 1}, {2, 2}}; /* (threads, reads) */
    for (int i = 0; i < NROWS; i++) {
        tfr_row *r = &rows[i];
        if (i < 12) {
            r->encoding = i / 6 ? BENCH_IMAGE_RAW : BENCH_IMAGE_PNG;
            r->gzip = i / 3 % 2;
            r->threads = tr[i % 3][0];
            r->reads = tr[i % 3][1];
        } else {
            r->encoding = BENCH_IMAGE_RAW;
            r->gzip = (i - 12) / 2;
            r->threads = 1 + i % 2;
            r->reads = 1;
            r->tf_batch_first = 1;
        }
        r->ds = tfrecord_pipeline(dir, r);
        double cpu;
        lib_pass(r->ds, n, &cpu); /* warm-up: the page cache, the decoders' buffers */
    }
    char log[] = "/tmp/bench_data_tf_XXXXXX.log";
    tf_ref tf[3]; /* by thread count */
    if (tf_python) {
        int fd = mkstemps(log, 4);
        if (fd < 0) {
            perror("bench_data: mkstemps");
            exit(1);
        }
        close(fd);
        signal(SIGPIPE, SIG_IGN); /* a script that died: a failed write, not our end */
        tf_ref_start(&tf[1], tf_python, dir, 1, log);
        tf_ref_start(&tf[2], tf_python, dir, 2, log);
        tf_ref_ready(&tf[1]);
        tf_ref_ready(&tf[2]);
    }
    /* Round by round, row by row: a libdist pass, then tf.data's of the same row. A row's
     * first tf.data request also imports TensorFlow and runs a warm-up pass, untimed. */
    int first[3] = {1, 1, 1};
    for (int k = 0; k < runs; k++) {
        for (int i = 0; i < NROWS; i++) {
            tfr_row *r = &rows[i];
            r->lib[k] = lib_pass(r->ds, n, &r->lib_cpu[k]);
            r->tf[k] = 0;
            if (tf_python) {
                r->tf[k] = tf_ref_pass(&tf[r->threads], r, n, first[r->threads] ? 600 : 120,
                                       &r->tf_cpu[k]);
                first[r->threads] = 0;
            }
            r->ratio[k] = r->tf[k] > 0 ? r->lib[k] / r->tf[k] : 0;
        }
    }
    const char *why = tf_python ? NULL : tf_missing;
    static char failed[400];
    for (int t = 1; t <= 2 && tf_python; t++) {
        if (tf[t].failed && !why) {
            snprintf(failed, sizeof failed, "failed (the %d-thread process: %s; see %s)", t,
                     tf[t].failed, log);
            why = failed;
        }
        tf_ref_stop(&tf[t]);
    }

    printf("\nTFRecord: %lld digits in %d shards -> parse_example -> decode -> batch(64), one pass "
           "per run, medians of %d runs; libdist's and tf.data's passes alternate\n",
           (long long)n, shards, runs);
    if (tf_python)
        printf("tf.data: %s bench/tf_data_tfrecord.py (its stderr: %s)\n", tf_python, log);
    printf("%-10s %-5s %8s %6s %14s %14s %10s %18s\n", "variant", "gzip", "threads", "reads",
           "libdist img/s", "tf.data img/s", "lib/tf", "CPU us/img lib/tf");
    for (int i = 0; i < NROWS; i++) {
        tfr_row *r = &rows[i];
        double lib = median(r->lib, runs), lc = median(r->lib_cpu, runs);
        const char *variant = r->encoding == BENCH_IMAGE_PNG ? "PNG"
                              : r->tf_batch_first            ? "raw, TF b"
                                                             : "raw";
        if (why) {
            printf("%-10s %-5s %8d %6d %14.0f %14s %10s %11.1f / -\n", variant,
                   r->gzip ? "yes" : "no", r->threads, r->reads, lib, "-", "-", lc);
        } else {
            double tfm = median(r->tf, runs), ratio = median(r->ratio, runs);
            printf("%-10s %-5s %8d %6d %14.0f %14.0f %9.2fx %11.1f / %.1f\n", variant,
                   r->gzip ? "yes" : "no", r->threads, r->reads, lib, tfm, ratio, lc,
                   median(r->tf_cpu, runs));
            printf("RESULT tfrecord variant=%s%s gzip=%d threads=%d reads=%d libdist=%.0f "
                   "tf_data=%.0f ratio=%.3f\n",
                   tfr_variant(r), r->tf_batch_first ? "_tf_batch_first" : "", r->gzip, r->threads,
                   r->reads, lib, tfm, ratio);
        }
        dist_dataset_destroy(r->ds);
    }
    if (why) printf("tf.data: %s\n", why);
    printf("lib/tf: the median of the runs' paired ratios (target >= 1). CPU us/img: process CPU "
           "time per image. \"raw, TF b\": tf.data batches the records first and parses and "
           "decodes each batch in one map (its vectorized form); libdist as in \"raw\"\n");
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("load average at the end: %.2f on %ld cores\n", load[0], sysconf(_SC_NPROCESSORS_ONLN));
    if (!keep_dir) rm_tree(dir);
}

/* ---- options ------------------------------------------------------------------------------ */

typedef enum opt_kind { OPT_INT, OPT_DOUBLE, OPT_STRING, OPT_FLAG } opt_kind;

typedef struct opt {
    const char *name;
    opt_kind kind;
    void *value;
    double min, max; /* OPT_INT and OPT_DOUBLE: the range allowed */
    const char *help;
} opt;

static void usage(FILE *f, const opt *opts, int n) {
    fprintf(f, "usage: bench_data [options]\n");
    for (int i = 0; i < n; i++) {
        const opt *o = &opts[i];
        char def[64] = "";
        if (o->kind == OPT_INT)
            snprintf(def, sizeof def, " (default %d)", *(int *)o->value);
        else if (o->kind == OPT_DOUBLE)
            snprintf(def, sizeof def, " (default %g)", *(double *)o->value);
        else if (o->kind == OPT_STRING && *(const char **)o->value)
            snprintf(def, sizeof def, " (default %s)", *(const char **)o->value);
        fprintf(f, "  %-16s %-6s %s%s\n", o->name,
                o->kind == OPT_FLAG     ? ""
                : o->kind == OPT_STRING ? "S"
                                        : "N",
                o->help, def);
    }
}

/* Fills the options' values from argv; a wrong option or value prints why and exits 2. */
static void parse_options(int argc, char **argv, const opt *opts, int n) {
    for (int i = 1; i < argc; i++) /* before any value changes: --help shows the defaults */
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout, opts, n);
            exit(0);
        }
    for (int i = 1; i < argc; i++) {
        const opt *o = NULL;
        for (int k = 0; k < n && !o; k++)
            if (strcmp(argv[i], opts[k].name) == 0) o = &opts[k];
        if (!o) {
            fprintf(stderr, "bench_data: unknown option %s (bench_data --help lists them)\n",
                    argv[i]);
            exit(2);
        }
        if (o->kind == OPT_FLAG) {
            *(int *)o->value = 1;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_data: %s needs a value\n", o->name);
            exit(2);
        }
        const char *arg = argv[++i];
        if (o->kind == OPT_STRING) {
            *(const char **)o->value = arg;
            continue;
        }
        char *end = NULL;
        double v = strtod(arg, &end);
        if (end == arg || *end != '\0' || v < o->min || v > o->max ||
            (o->kind == OPT_INT && v != (double)(int)v)) {
            fprintf(stderr, "bench_data: %s %s: want %s from %g to %g\n", o->name, arg,
                    o->kind == OPT_INT ? "an integer" : "a number", o->min, o->max);
            exit(2);
        }
        if (o->kind == OPT_INT)
            *(int *)o->value = (int)v;
        else
            *(double *)o->value = v;
    }
}

/* Which of idx, jpeg, autotune, tfrecord a comma-separated list names; a wrong name exits 2. */
static void parse_sections(const char *list, int on[4]) {
    static const char *const names[4] = {"idx", "jpeg", "autotune", "tfrecord"};
    for (int k = 0; k < 4; k++) on[k] = 0;
    const char *p = list;
    while (*p) {
        size_t len = strcspn(p, ",");
        int found = 0;
        for (int k = 0; k < 4; k++)
            if (len == strlen(names[k]) && strncmp(p, names[k], len) == 0) on[k] = found = 1;
        if (!found) {
            fprintf(stderr,
                    "bench_data: --sections: no section \"%.*s\" (idx, jpeg, autotune, "
                    "tfrecord)\n",
                    (int)len, p);
            exit(2);
        }
        p += len + (p[len] == ',');
    }
}

int main(int argc, char **argv) {
    int runs = 7, epochs = 5, jpegs = 8000, jpeg_epochs = 3;
    double consume = 10000.0, consume_us = 20;
    int autotune_runs = 3, tfrecord_runs = 7, shards = 4, no_tf = 0;
    const char *sections = "idx,jpeg,autotune,tfrecord", *tf_python = NULL, *tfrecord_dir = NULL;
    if (getenv("DIST_SOURCE_DIR")) g_src = getenv("DIST_SOURCE_DIR");
    const opt opts[] = {
        {"--sections", OPT_STRING, &sections, 0, 0, "which to run, of idx,jpeg,autotune,tfrecord"},
        {"--runs", OPT_INT, &runs, 1, 99, "runs of sections 1 and 2 (medians)"},
        {"--epochs", OPT_INT, &epochs, 1, 1000, "IDX epochs per run"},
        {"--jpegs", OPT_INT, &jpegs, 1, 1e6, "JPEG files written (at most the subset's 7,996)"},
        {"--consume", OPT_DOUBLE, &consume, 1, 1e9, "one replica's images/s"},
        {"--source-dir", OPT_STRING, &g_src, 0, 0, "the repository (or $DIST_SOURCE_DIR)"},
        {"--consume-us", OPT_DOUBLE, &consume_us, 0, 1e6, "section 3's consumer, us/image"},
        {"--map-us", OPT_DOUBLE, &g_map_us, 0, 1e6, "section 3's slow map, us/element"},
        {"--autotune-runs", OPT_INT, &autotune_runs, 1, 99, "runs of section 3"},
        {"--tfrecord-runs", OPT_INT, &tfrecord_runs, 1, 99, "runs (passes) of section 4"},
        {"--shards", OPT_INT, &shards, 1, 64, "TFRecord files per variant"},
        {"--tfrecord-dir", OPT_STRING, &tfrecord_dir, 0, 0,
         "write the shards there and keep them (else a temporary directory)"},
        {"--tf", OPT_STRING, &tf_python, 0, 0,
         "the Python with TensorFlow (else $DIST_VENV or ~/.cache/libdist/venv-tf)"},
        {"--no-tf", OPT_FLAG, &no_tf, 0, 0, "TFRecord rows without tf.data"},
    };
    const int nopts = (int)(sizeof opts / sizeof opts[0]);
    parse_options(argc, argv, opts, nopts);
    int on[4];
    parse_sections(sections, on);

    char venv_python[1024];
    const char *tf_missing = "not run (--no-tf)";
    if (no_tf) {
        tf_python = NULL;
    } else if (tf_python && access(tf_python, X_OK) != 0) {
        fprintf(stderr, "bench_data: --tf %s: not an executable\n", tf_python);
        return 2;
    } else if (!tf_python) {
        const char *venv = getenv("DIST_VENV"), *home = getenv("HOME");
        if (venv)
            snprintf(venv_python, sizeof venv_python, "%s/bin/python", venv);
        else
            snprintf(venv_python, sizeof venv_python, "%s/.cache/libdist/venv-tf/bin/python",
                     home ? home : "");
        if (access(venv_python, X_OK) == 0)
            tf_python = venv_python;
        else
            tf_missing = "not run: no TensorFlow found (no $DIST_VENV/bin/python or "
                         "~/.cache/libdist/venv-tf/bin/python; tests/conformance/venv.sh makes "
                         "it, --tf PYTHON names one)";
    }
    double v[100];

    double idx_rate = 0;
    if (on[0]) {
        dist_dataset *idx = idx_pipeline();
        drain(idx, 1); /* warm-up */
        for (int r = 0; r < runs; r++) v[r] = drain(idx, epochs);
        idx_rate = median(v, runs);
        dist_dataset_destroy(idx);
    }

    char root[] = "/tmp/bench_data_jpeg_XXXXXX";
    if ((on[1] || on[2]) && !mkdtemp(root)) {
        perror("bench_data: mkdtemp");
        return 1;
    }
    if (on[1] || on[2]) write_jpeg_folder(root, jpegs);
    /* 1 and 2 threads alternate run by run, so that a load change on this shared machine hits
     * both; the scaling is the median of the paired ratios. */
    double jpeg_rate[3] = {0, 0, 0}, r1[100], r2[100], ratio[100], c1[100], c2[100];
    double scaling = 0, cpu1 = 0, cpu2 = 0;
    if (on[1]) {
        dist_dataset *one = jpeg_pipeline(root, 1), *two = jpeg_pipeline(root, 2);
        drain(one, 1);
        drain(two, 1);
        for (int r = 0; r < runs; r++) {
            r1[r] = drain(one, jpeg_epochs);
            c1[r] = g_cpu_us_per_image;
            r2[r] = drain(two, jpeg_epochs);
            c2[r] = g_cpu_us_per_image;
            ratio[r] = r2[r] / r1[r];
        }
        jpeg_rate[1] = median(r1, runs);
        jpeg_rate[2] = median(r2, runs);
        scaling = median(ratio, runs);
        cpu1 = median(c1, runs);
        cpu2 = median(c2, runs);
        dist_dataset_destroy(one);
        dist_dataset_destroy(two);
    }

    if (on[2]) {
        calibrate_spin();
        g_consume_us = consume_us;
        const int par3[3] = {1, 2, 4}, par2[2] = {1, 2};
        int slow_n = 6400;
        char what[160];
        snprintf(what, sizeof what,
                 "slow map (%.0f us/element) -> batch(64) -> prefetch, %d elements, 2 epochs, "
                 "medians of %d runs",
                 g_map_us, slow_n, autotune_runs);
        autotune_table(what, make_slow, &slow_n, par3, 3, autotune_runs);
        snprintf(what, sizeof what,
                 "JPEG folder (%d files), decode -> normalize -> batch(64) -> prefetch, 2 epochs, "
                 "medians of %d runs",
                 jpegs, autotune_runs);
        autotune_table(what, make_jpeg, root, par2, 2, autotune_runs);
        g_consume_us = 0;
    }
    if (on[1] || on[2]) rm_tree(root);

    if (on[3]) tfrecord_section(tf_python, tf_missing, tfrecord_runs, shards, tfrecord_dir);

    if (!on[0] && !on[1]) return 0;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double load[3] = {0, 0, 0};
    if (getloadavg(load, 3) < 1) load[0] = -1;
    printf("bench_data: input pipeline alone, medians of %d runs, %ld cores (load average %.2f at "
           "the end); "
           "consumption %.0f images/s per replica\n",
           runs, cores, load[0], consume);
    printf("%-58s %14s %10s\n", "pipeline", "images/s", "x replica");
    if (on[0])
        printf("%-58s %14.0f %10.1f\n",
               "IDX -> normalize -> shuffle(10000) -> batch(64) -> prefetch(2)", idx_rate,
               idx_rate / consume);
    if (on[1]) {
        printf("%-58s %14.0f %10.1f\n",
               "JPEG folder, decode 1 thread -> normalize -> batch -> prefetch", jpeg_rate[1],
               jpeg_rate[1] / consume);
        printf("%-58s %14.0f %10.1f\n",
               "JPEG folder, decode 2 threads -> normalize -> batch -> prefetch", jpeg_rate[2],
               jpeg_rate[2] / consume);
        printf("JPEG decode scaling 1 -> 2 threads: %.2fx, median of paired runs (target >= 1.8)\n",
               scaling);
        printf("JPEG CPU time per image: %.1f us (1 thread), %.1f us (2 threads): the parallel "
               "version's overhead "
               "is %.0f%%; a scaling below 2x beyond that is cores taken by other processes\n",
               cpu1, cpu2, 100.0 * (cpu2 / cpu1 - 1.0));
    }
    if (on[0]) printf("IDX pipeline / one replica: %.1fx (target >= 10)\n", idx_rate / consume);
    return 0;
}
