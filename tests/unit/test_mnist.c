/* The MNIST loader: built-in subset, data directories, cache, and downloads from a small HTTP
 * server that this test runs on 127.0.0.1 in a thread. */
#include "core/sha256.h"
#include "dist/mnist.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

static const char *const NAMES[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                     "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

static char g_root[256];                          /* mkdtemp: everything a test writes */
static char g_data[320];                          /* g_root/data: fixture files */
static char g_cache[320];                         /* g_root/cache */
static char g_sums[4][DIST_SHA256_HEX_CHARS + 1]; /* of the last .gz fixture files written */
static const char *g_sum_ptrs[4] = {g_sums[0], g_sums[1], g_sums[2], g_sums[3]};
static char g_log[8192];

/* ---- files ---- */

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            char child[1024];
            snprintf(child, sizeof child, "%s/%s", path, e->d_name);
            remove_tree(child);
        }
        closedir(d);
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int count_entries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return n;
}

static void write_bytes(const char *path, const void *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(bytes, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

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

/* Writes dir/NAME (raw) or dir/NAME.gz: a uint8 IDX file of the given dims. Pixels are
 * (i * 7) % 256, labels i % 10. Records the .gz file's sha256 in g_sums[slot]. */
static void write_idx(const char *dir, int slot, int gz, int ndim, const int *dims) {
    size_t count = 1;
    for (int i = 0; i < ndim; i++) count *= (size_t)dims[i];
    size_t n = 4 + 4 * (size_t)ndim + count;
    unsigned char *buf = malloc(n);
    buf[0] = buf[1] = 0;
    buf[2] = 0x08;
    buf[3] = (unsigned char)ndim;
    for (int i = 0; i < ndim; i++)
        for (int b = 0; b < 4; b++) buf[4 + 4 * i + b] = (unsigned char)(dims[i] >> (24 - 8 * b));
    for (size_t i = 0; i < count; i++)
        buf[4 + 4 * ndim + i] = (unsigned char)(ndim == 1 ? i % 10 : (i * 7) % 256);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s%s", dir, NAMES[slot], gz ? ".gz" : "");
    if (gz) {
        size_t gz_n;
        unsigned char *z = gzip(buf, n, &gz_n);
        write_bytes(path, z, gz_n);
        unsigned char d[DIST_SHA256_BYTES];
        dist_sha256(z, gz_n, d);
        dist_sha256_hex(d, g_sums[slot]);
        free(z);
    } else {
        write_bytes(path, buf, n);
    }
    free(buf);
}

/* A complete small set: n_train / n_test 28x28 images with as many labels. */
static void write_set(const char *dir, int gz, int n_train, int n_test) {
    int train_images[3] = {n_train, 28, 28}, test_images[3] = {n_test, 28, 28};
    write_idx(dir, 0, gz, 3, train_images);
    write_idx(dir, 1, gz, 1, &n_train);
    write_idx(dir, 2, gz, 3, test_images);
    write_idx(dir, 3, gz, 1, &n_test);
}

static void capture_log(dist_log_level level, const char *message, void *user) {
    size_t len = strlen(g_log);
    snprintf(g_log + len, sizeof g_log - len, "%s\n", message);
}

static void setup(void) {
    snprintf(g_root, sizeof g_root, "/tmp/dist_test_mnist_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(g_root));
    snprintf(g_data, sizeof g_data, "%s/data", g_root);
    snprintf(g_cache, sizeof g_cache, "%s/cache", g_root);
    ck_assert_int_eq(mkdir(g_data, 0755), 0);
    /* The loader must see only what each test sets up, never the machine's own settings. */
    unsetenv("DIST_DATA_DIR");
    unsetenv("DIST_CACHE_DIR");
    unsetenv("DIST_MNIST_URL");
    setenv("no_proxy", "127.0.0.1", 1);
    g_log[0] = '\0';
    dist_set_log_callback(capture_log, DIST_LOG_INFO, NULL);
}

static void teardown(void) {
    dist_set_log_callback(NULL, DIST_LOG_INFO, NULL);
    remove_tree(g_root);
}

/* Options that never leave the test's own directories. */
static dist_mnist_options offline_options(void) {
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.cache_dir = g_cache;
    o.allow_download = 0;
    return o;
}

/* ---- offline sources ---- */

START_TEST(test_mnist_embedded_subset_has_7996_train_and_2004_test_digits) {
    dist_mnist_options o = offline_options();
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_str_eq(dist_mnist_source(m), "embedded MNIST subset (7,996 train / 2,004 test)");
    const dist_tensor *ti = dist_mnist_train_images(m), *tl = dist_mnist_train_labels(m);
    const dist_tensor *vi = dist_mnist_test_images(m), *vl = dist_mnist_test_labels(m);
    ck_assert_int_eq(ti->dtype, DIST_U8);
    ck_assert_int_eq(ti->ndim, 3);
    ck_assert_int_eq(ti->shape[0], 7996);
    ck_assert_int_eq(ti->shape[1], 28);
    ck_assert_int_eq(ti->shape[2], 28);
    ck_assert_int_eq(tl->shape[0], 7996);
    ck_assert_int_eq(vi->shape[0], 2004);
    ck_assert_int_eq(vl->shape[0], 2004);
    int seen[10] = {0};
    for (int64_t i = 0; i < tl->shape[0]; i++) {
        unsigned label = ((const unsigned char *)tl->data)[i];
        ck_assert_uint_le(label, 9);
        seen[label]++;
    }
    for (int64_t i = 0; i < vl->shape[0]; i++)
        ck_assert_uint_le(((const unsigned char *)vl->data)[i], 9);
    for (int d = 0; d < 10; d++) ck_assert_int_gt(seen[d], 500);
    ck_assert_ptr_nonnull(strstr(g_log, "MNIST: using embedded MNIST subset"));
    ck_assert_ptr_nonnull(strstr(g_log, "disabled by allow_download = 0"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_data_dir_with_gzip_files_is_used) {
    write_set(g_data, 1, 6, 4);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    char want[1024];
    snprintf(want, sizeof want, "data dir %s", g_data);
    ck_assert_str_eq(dist_mnist_source(m), want);
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 6);
    ck_assert_int_eq(dist_mnist_test_labels(m)->shape[0], 4);
    ck_assert_uint_eq(((const unsigned char *)dist_mnist_train_images(m)->data)[1], 7);
    ck_assert_uint_eq(((const unsigned char *)dist_mnist_train_labels(m)->data)[5], 5);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_data_dir_with_raw_files_is_used) {
    write_set(g_data, 0, 3, 2);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_int_eq(dist_mnist_train_labels(m)->shape[0], 3);
    ck_assert_int_eq(dist_mnist_test_images(m)->shape[0], 2);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_missing_data_dir_is_an_error_not_a_fallback) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/nowhere", g_root);
    dist_mnist_options o = offline_options();
    o.data_dir = dir;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_NOT_FOUND);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), dir));
}
END_TEST

START_TEST(test_mnist_data_dir_missing_one_file_names_it) {
    write_set(g_data, 1, 3, 2);
    char path[400];
    snprintf(path, sizeof path, "%s/t10k-labels-idx1-ubyte.gz", g_data);
    unlink(path);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), g_data));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "t10k-labels-idx1-ubyte"));
}
END_TEST

START_TEST(test_mnist_data_dir_with_corrupt_file_is_a_format_error) {
    write_set(g_data, 1, 3, 2);
    char path[400];
    snprintf(path, sizeof path, "%s/train-images-idx3-ubyte.gz", g_data);
    write_bytes(path, "\x1f\x8bnot really gzip", 17);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), path));
}
END_TEST

START_TEST(test_mnist_label_count_differing_from_image_count_is_a_format_error) {
    write_set(g_data, 1, 6, 4);
    int five = 5;
    write_idx(g_data, 1, 1, 1, &five); /* 5 train labels for 6 images */
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "has 6 images but"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "train-labels-idx1-ubyte.gz' has 5 labels"));
}
END_TEST

START_TEST(test_mnist_images_that_are_not_28x28_are_a_format_error) {
    write_set(g_data, 1, 6, 4);
    int small[3] = {4, 14, 14};
    write_idx(g_data, 2, 1, 3, small);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_FORMAT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "(4, 14, 14)"));
}
END_TEST

START_TEST(test_mnist_dist_data_dir_env_is_used_and_a_bad_one_is_an_error) {
    write_set(g_data, 1, 2, 1);
    setenv("DIST_DATA_DIR", g_data, 1);
    dist_mnist_options o = offline_options();
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), g_data));
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 2);
    dist_mnist_destroy(m);
    m = NULL;

    setenv("DIST_DATA_DIR", "/nonexistent/dist-mnist", 1);
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_NOT_FOUND);
    ck_assert_ptr_null(m);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "DIST_DATA_DIR"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "/nonexistent/dist-mnist"));
}
END_TEST

START_TEST(test_mnist_explicit_data_dir_wins_over_dist_data_dir) {
    write_set(g_data, 1, 2, 1);
    setenv("DIST_DATA_DIR", "/nonexistent/dist-mnist", 1);
    dist_mnist_options o = offline_options();
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_verified_cache_is_used) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/mnist", g_cache);
    ck_assert_int_eq(mkdir(g_cache, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    write_set(dir, 1, 3, 2);
    dist_mnist_options o = offline_options();
    o.sha256 = g_sum_ptrs;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    char want[1024];
    snprintf(want, sizeof want, "cache %s", dir);
    ck_assert_str_eq(dist_mnist_source(m), want);
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 3);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_cache_failing_its_checksums_is_skipped) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/mnist", g_cache);
    ck_assert_int_eq(mkdir(g_cache, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    write_set(dir, 1, 3, 2); /* checked against the real MNIST sums: no match */
    dist_mnist_options o = offline_options();
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), "embedded"));
    ck_assert_ptr_nonnull(strstr(g_log, "sha256 is"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_cache_dir_comes_from_dist_cache_dir_then_xdg) {
    char dir[400];
    snprintf(dir, sizeof dir, "%s/mnist", g_cache);
    ck_assert_int_eq(mkdir(g_cache, 0755), 0);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    write_set(dir, 1, 3, 2);
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.allow_download = 0;
    o.sha256 = g_sum_ptrs;
    dist_mnist *m = NULL;
    setenv("DIST_CACHE_DIR", g_cache, 1);
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), dir));
    dist_mnist_destroy(m);

    /* $XDG_CACHE_HOME/libdist/mnist */
    unsetenv("DIST_CACHE_DIR");
    char xdg[400], lib[420], xdir[440];
    snprintf(xdg, sizeof xdg, "%s/xdg", g_root);
    snprintf(lib, sizeof lib, "%s/libdist", xdg);
    snprintf(xdir, sizeof xdir, "%s/mnist", lib);
    ck_assert_int_eq(mkdir(xdg, 0755), 0);
    ck_assert_int_eq(mkdir(lib, 0755), 0);
    ck_assert_int_eq(mkdir(xdir, 0755), 0);
    write_set(xdir, 1, 3, 2);
    setenv("XDG_CACHE_HOME", xdg, 1);
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    char want[500];
    snprintf(want, sizeof want, "cache %s", xdir);
    ck_assert_str_eq(dist_mnist_source(m), want);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_fashion_reads_its_data_dir) {
    write_set(g_data, 1, 2, 2);
    dist_mnist_options o = offline_options();
    o.kind = DIST_MNIST_FASHION;
    o.data_dir = g_data;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 2);
    ck_assert_ptr_nonnull(strstr(g_log, "Fashion-MNIST: using data dir"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_fashion_from_the_debian_package) {
    struct stat st;
    if (stat("/usr/share/datasets/fashion-mnist", &st) != 0) return; /* package absent */
    dist_mnist_options o = offline_options();
    o.kind = DIST_MNIST_FASHION;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_str_eq(dist_mnist_source(m), "data dir /usr/share/datasets/fashion-mnist");
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 60000);
    ck_assert_int_eq(dist_mnist_test_labels(m)->shape[0], 10000);
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_rejects_bad_options) {
    dist_mnist *m = NULL;
    dist_mnist_options o = offline_options();
    o.version = 99;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_INVALID_ARGUMENT);
    o = offline_options();
    o.kind = (dist_mnist_kind)7;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_INVALID_ARGUMENT);
    const char *short_sums[4] = {"abc", g_sums[1], g_sums[2], g_sums[3]};
    o = offline_options();
    o.sha256 = short_sums;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "sha256[0]"));
    ck_assert_int_eq(dist_mnist_load(&o, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(m);
    dist_mnist_destroy(NULL);
}
END_TEST

/* ---- downloads from a local HTTP server ---- */

typedef struct http_server {
    int fd;
    int port;
    pthread_t thread;
    atomic_int stop;
    atomic_int requests;
    char root[320];
} http_server;

static http_server g_server;

static void send_all(int fd, const void *data, size_t n) {
    const char *p = data;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k <= 0) return;
        p += k;
        n -= (size_t)k;
    }
}

/* One request: GET /NAME -> root/NAME or 404. */
static void answer(http_server *s, int c) {
    struct timeval tv = {2, 0};
    setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    char req[4096];
    size_t n = 0;
    while (n < sizeof req - 1) {
        ssize_t k = recv(c, req + n, sizeof req - 1 - n, 0);
        if (k <= 0) break;
        n += (size_t)k;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n")) break;
    }
    req[n] = '\0';
    atomic_fetch_add(&s->requests, 1);
    char name[256] = "", path[600];
    FILE *f = NULL;
    if (sscanf(req, "GET /%255s", name) == 1 && !strchr(name, '/') && name[0] != '.') {
        snprintf(path, sizeof path, "%s/%s", s->root, name);
        f = fopen(path, "rb");
    }
    if (!f) {
        const char *nf = "HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(c, nf, strlen(nf));
        return;
    }
    static unsigned char body[1 << 20];
    size_t len = fread(body, 1, sizeof body, f);
    fclose(f);
    char head[128];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 200 OK\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n", len);
    send_all(c, head, (size_t)hl);
    send_all(c, body, len);
}

static void *serve(void *arg) {
    http_server *s = arg;
    while (!atomic_load(&s->stop)) {
        struct pollfd p = {s->fd, POLLIN, 0};
        if (poll(&p, 1, 50) <= 0) continue;
        int c = accept(s->fd, NULL, NULL);
        if (c < 0) continue;
        answer(s, c);
        close(c);
    }
    return NULL;
}

/* A listening socket on 127.0.0.1 at a port the kernel picks (never a taken one). */
static int listen_any_port(int *port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    socklen_t len = sizeof a;
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port = ntohs(a.sin_port);
    return fd;
}

static void server_setup(void) {
    setup();
    memset(&g_server, 0, sizeof g_server);
    snprintf(g_server.root, sizeof g_server.root, "%s/www", g_root);
    ck_assert_int_eq(mkdir(g_server.root, 0755), 0);
    g_server.fd = listen_any_port(&g_server.port);
    ck_assert_int_eq(pthread_create(&g_server.thread, NULL, serve, &g_server), 0);
}

static void server_teardown(void) {
    atomic_store(&g_server.stop, 1);
    pthread_join(g_server.thread, NULL);
    close(g_server.fd);
    teardown();
}

static dist_mnist_options download_options(char *url, size_t cap) {
    snprintf(url, cap, "http://127.0.0.1:%d/", g_server.port);
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.cache_dir = g_cache;
    o.base_url = url;
    o.connect_timeout_ms = 2000;
    return o;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

START_TEST(test_mnist_download_is_verified_cached_and_then_served_from_the_cache) {
    write_set(g_server.root, 1, 6, 4);
    char url[64];
    dist_mnist_options o = download_options(url, sizeof url);
    o.sha256 = g_sum_ptrs;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    char want[1024];
    snprintf(want, sizeof want, "downloaded from %s (cached in %s/mnist)", url, g_cache);
    ck_assert_str_eq(dist_mnist_source(m), want);
    ck_assert_int_eq(dist_mnist_train_images(m)->shape[0], 6);
    ck_assert_int_eq(dist_mnist_test_images(m)->shape[0], 4);
    dist_mnist_destroy(m);
    ck_assert_int_eq(atomic_load(&g_server.requests), 4);

    char dir[400];
    snprintf(dir, sizeof dir, "%s/mnist", g_cache);
    ck_assert_int_eq(count_entries(dir), 4); /* the four files, no temporary leftovers */

    m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    snprintf(want, sizeof want, "cache %s", dir);
    ck_assert_str_eq(dist_mnist_source(m), want);
    ck_assert_int_eq(atomic_load(&g_server.requests), 4); /* nothing fetched again */
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_download_with_wrong_checksum_is_rejected_and_leaves_no_file) {
    write_set(g_server.root, 1, 6, 4);
    char url[64];
    dist_mnist_options o = download_options(url, sizeof url);
    /* no override: the fixtures are checked against the real MNIST sums and fail */
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_str_eq(dist_mnist_source(m), "embedded MNIST subset (7,996 train / 2,004 test)");
    ck_assert_int_ge(atomic_load(&g_server.requests), 1);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/mnist", g_cache);
    ck_assert_int_eq(count_entries(dir), 0);
    ck_assert_ptr_nonnull(strstr(g_log, "download from"));
    ck_assert_ptr_nonnull(strstr(g_log, "sha256 is"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_download_http_404_falls_back_to_the_embedded_subset) {
    char url[64];
    dist_mnist_options o = download_options(url, sizeof url);
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), "embedded MNIST subset"));
    ck_assert_ptr_nonnull(strstr(g_log, "HTTP 404"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_download_from_a_closed_port_falls_back_quickly) {
    int port;
    close(listen_any_port(&port)); /* a port that was just free and is closed now */
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d/", port);
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.cache_dir = g_cache;
    o.base_url = url;
    o.connect_timeout_ms = 1000;
    dist_mnist *m = NULL;
    double t0 = now_s();
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    /* a refused connection ends the download: not even one connect deadline is waited out */
    ck_assert_double_lt(now_s() - t0, dist_test_timeout_bound(o.connect_timeout_ms / 1000.0));
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), "embedded MNIST subset"));
    ck_assert_ptr_nonnull(strstr(g_log, "download from http://127.0.0.1:"));
    dist_mnist_destroy(m);
}
END_TEST

START_TEST(test_mnist_download_url_can_come_from_dist_mnist_url) {
    write_set(g_server.root, 1, 2, 2);
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%d", g_server.port); /* no trailing slash */
    setenv("DIST_MNIST_URL", url, 1);
    dist_mnist_options o = DIST_MNIST_OPTIONS_INIT;
    o.cache_dir = g_cache;
    o.sha256 = g_sum_ptrs;
    dist_mnist *m = NULL;
    ck_assert_int_eq(dist_mnist_load(&o, &m), DIST_OK);
    ck_assert_ptr_nonnull(strstr(dist_mnist_source(m), "downloaded from http://127.0.0.1:"));
    dist_mnist_destroy(m);
}
END_TEST

static Suite *mnist_suite(void) {
    Suite *s = suite_create("mnist");
    TCase *tc = tcase_create("offline");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_mnist_embedded_subset_has_7996_train_and_2004_test_digits);
    tcase_add_test(tc, test_mnist_data_dir_with_gzip_files_is_used);
    tcase_add_test(tc, test_mnist_data_dir_with_raw_files_is_used);
    tcase_add_test(tc, test_mnist_missing_data_dir_is_an_error_not_a_fallback);
    tcase_add_test(tc, test_mnist_data_dir_missing_one_file_names_it);
    tcase_add_test(tc, test_mnist_data_dir_with_corrupt_file_is_a_format_error);
    tcase_add_test(tc, test_mnist_label_count_differing_from_image_count_is_a_format_error);
    tcase_add_test(tc, test_mnist_images_that_are_not_28x28_are_a_format_error);
    tcase_add_test(tc, test_mnist_dist_data_dir_env_is_used_and_a_bad_one_is_an_error);
    tcase_add_test(tc, test_mnist_explicit_data_dir_wins_over_dist_data_dir);
    tcase_add_test(tc, test_mnist_verified_cache_is_used);
    tcase_add_test(tc, test_mnist_cache_failing_its_checksums_is_skipped);
    tcase_add_test(tc, test_mnist_cache_dir_comes_from_dist_cache_dir_then_xdg);
    tcase_add_test(tc, test_mnist_fashion_reads_its_data_dir);
    tcase_add_test(tc, test_mnist_fashion_from_the_debian_package);
    tcase_add_test(tc, test_mnist_rejects_bad_options);
    suite_add_tcase(s, tc);

    /* Bounded: every socket wait has a deadline, and Check kills a test past 30 s. */
    TCase *dl = tcase_create("download");
    tcase_add_checked_fixture(dl, server_setup, server_teardown);
    tcase_set_timeout(dl, 30);
    tcase_add_test(dl, test_mnist_download_is_verified_cached_and_then_served_from_the_cache);
    tcase_add_test(dl, test_mnist_download_with_wrong_checksum_is_rejected_and_leaves_no_file);
    tcase_add_test(dl, test_mnist_download_http_404_falls_back_to_the_embedded_subset);
    tcase_add_test(dl, test_mnist_download_from_a_closed_port_falls_back_quickly);
    tcase_add_test(dl, test_mnist_download_url_can_come_from_dist_mnist_url);
    suite_add_tcase(s, dl);
    return s;
}

int main(void) { return dist_test_run(mnist_suite()); }
