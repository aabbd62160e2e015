/* TensorBoard event files: TFRecord framing around hand-encoded tensorflow.Event protos.
 *
 * A record is appended with pwritev at the end of the last whole record; one cut by a full disk
 * (a short write, then ENOSPC) is truncated away before the error is returned. A reader stops at
 * the first record whose length or CRC is wrong, so a cut record would hide everything written
 * after it once there is room again; and stdio, which wrote these files before, kept the unwritten
 * rest of the record in its buffer and appended it at fclose, after the cut. */
#include "dist/tensorboard.h"

#include "core/crc32c.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

struct dist_summary_writer {
    int fd;
    uint64_t size; /* the bytes of the whole records written: where the next one goes */
    char *path;
};

/* ---- protobuf wire format ------------------------------------------------------------ */

typedef struct pb_buf {
    unsigned char *p;
    size_t size; /* capacity */
    size_t len;  /* bytes wanted so far; may exceed size, nothing is written past it */
} pb_buf;

static void pb_byte(pb_buf *b, unsigned char c) {
    if (b->len < b->size) b->p[b->len] = c;
    b->len++;
}

static void pb_varint(pb_buf *b, uint64_t v) {
    while (v >= 0x80) {
        pb_byte(b, (unsigned char)(v | 0x80));
        v >>= 7;
    }
    pb_byte(b, (unsigned char)v);
}

static size_t varint_size(uint64_t v) {
    size_t n = 1;
    while (v >= 0x80) {
        v >>= 7;
        n++;
    }
    return n;
}

static void pb_fixed(pb_buf *b, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) pb_byte(b, (unsigned char)(v >> (8 * i)));
}

static void pb_tag(pb_buf *b, unsigned field, unsigned wire) { pb_varint(b, (field << 3) | wire); }

static void pb_bytes(pb_buf *b, unsigned field, const void *data, size_t n) {
    pb_tag(b, field, 2);
    pb_varint(b, n);
    for (size_t i = 0; i < n; i++) pb_byte(b, ((const unsigned char *)data)[i]);
}

static void pb_double(pb_buf *b, unsigned field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_tag(b, field, 1);
    pb_fixed(b, bits, 8);
}

static void pb_float(pb_buf *b, unsigned field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_tag(b, field, 5);
    pb_fixed(b, bits, 4);
}

/* Event{1: wall_time, 2: step, 5: Summary{1: Value{1: tag, 2: simple_value}}} */
static void encode_scalar(pb_buf *b, double wall_time, int64_t step, const char *tag, float value) {
    size_t tag_len = strlen(tag);
    size_t value_len = 1 + varint_size(tag_len) + tag_len + 1 + 4;
    size_t summary_len = 1 + varint_size(value_len) + value_len;
    pb_double(b, 1, wall_time);
    pb_tag(b, 2, 0);
    pb_varint(b, (uint64_t)step);
    pb_tag(b, 5, 2);
    pb_varint(b, summary_len);
    pb_tag(b, 1, 2);
    pb_varint(b, value_len);
    pb_bytes(b, 1, tag, tag_len);
    pb_float(b, 2, value);
}

dist_status dist_tensorboard_encode_scalar(double wall_time, int64_t step, const char *tag,
                                           float value, unsigned char *buf, size_t size,
                                           size_t *len) {
    DIST_CHECK_ARG(tag && tag[0] && len, "tensorboard: a scalar needs a non-empty tag");
    DIST_CHECK_ARG(buf || size == 0, "tensorboard: NULL buffer with size %zu", size);
    pb_buf b = {buf, size, 0};
    encode_scalar(&b, wall_time, step, tag, value);
    *len = b.len;
    if (b.len > size)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "tensorboard: event needs %zu bytes, buffer has %zu", b.len, size);
    return DIST_OK;
}

/* ---- TFRecord framing -------------------------------------------------------------------- */

static dist_status write_record(dist_summary_writer *w, const unsigned char *data, size_t n) {
    unsigned char head[12], tail[4];
    for (int i = 0; i < 8; i++) head[i] = (unsigned char)((uint64_t)n >> (8 * i));
    uint32_t len_crc = dist_crc32c_mask(dist_crc32c(head, 8));
    uint32_t data_crc = dist_crc32c_mask(dist_crc32c(data, n));
    for (int i = 0; i < 4; i++) {
        head[8 + i] = (unsigned char)(len_crc >> (8 * i));
        tail[i] = (unsigned char)(data_crc >> (8 * i));
    }
    struct iovec v[3] = {{head, sizeof head}, {(void *)data, n}, {tail, sizeof tail}};
    uint64_t at = w->size;
    for (int i = 0; i < 3;) {
        if (v[i].iov_len == 0) {
            i++;
            continue;
        }
        ssize_t r = pwritev(w->fd, v + i, 3 - i, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int err = r < 0 ? errno : EIO;
            if (at > w->size && ftruncate(w->fd, (off_t)w->size) != 0)
                dist_log(DIST_LOG_WARN, "tensorboard: '%s' ends in a cut record: %s", w->path,
                         strerror(errno));
            return dist_error_errno(DIST_IO, err, "tensorboard: writing '%s'", w->path);
        }
        at += (uint64_t)r;
        for (size_t left = (size_t)r; left > 0;) {
            size_t k = left < v[i].iov_len ? left : v[i].iov_len;
            v[i].iov_base = (char *)v[i].iov_base + k;
            v[i].iov_len -= k;
            left -= k;
            if (v[i].iov_len == 0) i++;
        }
    }
    w->size = at;
    return DIST_OK;
}

static double now_seconds(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + (double)tv.tv_usec * 1e-6;
}

dist_status dist_summary_writer_scalar_at(dist_summary_writer *w, const char *tag, float value,
                                          int64_t step, double wall_time) {
    DIST_CHECK_ARG(w, "tensorboard: NULL writer");
    DIST_CHECK_ARG(tag && tag[0], "tensorboard: a scalar needs a non-empty tag");
    size_t tag_len = strlen(tag);
    DIST_CHECK_ARG(tag_len < 4096, "tensorboard: tag of %zu bytes is too long", tag_len);
    unsigned char buf[4096 + 64];
    pb_buf b = {buf, sizeof buf, 0};
    encode_scalar(&b, wall_time, step, tag, value);
    DIST_TRY(write_record(w, buf, b.len));
    return DIST_OK;
}

dist_status dist_summary_writer_scalar(dist_summary_writer *w, const char *tag, float value,
                                       int64_t step) {
    return dist_summary_writer_scalar_at(w, tag, value, step, now_seconds());
}

/* ---- histograms -------------------------------------------------------------------------- */

dist_status dist_tensorboard_histogram_buckets(const float *data, int64_t n, int k, double *out) {
    DIST_CHECK_ARG(k >= 1, "tensorboard: a histogram needs at least 1 bucket, got %d", k);
    DIST_CHECK_ARG(out && (data || n == 0) && n >= 0,
                   "tensorboard: histogram of %lld values with NULL data or output", (long long)n);
    memset(out, 0, (size_t)k * 3 * sizeof *out);
    if (n == 0) return DIST_OK;
    double lo = data[0], hi = data[0];
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(data[i]))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "tensorboard: histogram value %lld of %lld is %g; only finite "
                              "values have buckets",
                              (long long)i, (long long)n, (double)data[i]);
        if (data[i] < lo) lo = data[i];
        if (data[i] > hi) hi = data[i];
    }
    if (lo == hi) {
        for (int b = 0; b < k; b++) out[3 * b] = out[3 * b + 1] = hi;
        out[3 * (k - 1) + 2] = (double)n;
        return DIST_OK;
    }
    /* TensorFlow's order of operations: width = range / k, index = floor(offset / width), edges
     * from tf.linspace (start + i * delta with delta = range / k), the last edge set to max. */
    double width = (hi - lo) / (double)k;
    for (int64_t i = 0; i < n; i++) {
        double idx = floor(((double)data[i] - lo) / width);
        int b = idx >= (double)(k - 1) ? k - 1 : (int)idx;
        out[3 * b + 2] += 1.0;
    }
    for (int b = 0; b < k; b++) {
        out[3 * b] = b == 0 ? lo : lo + (double)b * width;
        out[3 * b + 1] = b == k - 1 ? hi : lo + (double)(b + 1) * width;
    }
    return DIST_OK;
}

/* SummaryMetadata{1: PluginData{1: "histograms"}} (HistogramPluginData{version 0} is empty) */
static void encode_histogram_metadata(pb_buf *b) {
    pb_tag(b, 1, 2);
    pb_varint(b, 2 + 10);
    pb_bytes(b, 1, "histograms", 10);
}

/* TensorProto{1: DT_DOUBLE (2), 2: TensorShapeProto{2: Dim{1: k}, 2: Dim{1: 3}},
 * 4: tensor_content (k * 3 little-endian doubles)} */
static void encode_histogram_tensor(pb_buf *b, const double *rows, int k) {
    size_t dim_k = 1 + varint_size((uint64_t)k), dim_3 = 2;
    size_t shape_len = 1 + varint_size(dim_k) + dim_k + 1 + varint_size(dim_3) + dim_3;
    pb_tag(b, 1, 0);
    pb_varint(b, 2);
    pb_tag(b, 2, 2);
    pb_varint(b, shape_len);
    pb_tag(b, 2, 2);
    pb_varint(b, dim_k);
    pb_tag(b, 1, 0);
    pb_varint(b, (uint64_t)k);
    pb_tag(b, 2, 2);
    pb_varint(b, dim_3);
    pb_tag(b, 1, 0);
    pb_varint(b, 3);
    pb_tag(b, 4, 2);
    pb_varint(b, (uint64_t)k * 3 * 8);
    for (int i = 0; i < 3 * k; i++) {
        uint64_t bits;
        memcpy(&bits, &rows[i], sizeof bits);
        pb_fixed(b, bits, 8);
    }
}

/* Event{1: wall_time, 2: step, 5: Summary{1: Value{1: tag, 9: metadata, 8: tensor}}} */
static void encode_histogram(pb_buf *b, double wall_time, int64_t step, const char *tag,
                             const double *rows, int k) {
    pb_buf m = {NULL, 0, 0}, t = {NULL, 0, 0};
    encode_histogram_metadata(&m);
    encode_histogram_tensor(&t, rows, k);
    size_t tag_len = strlen(tag);
    size_t value_len = 1 + varint_size(tag_len) + tag_len + 1 + varint_size(m.len) + m.len + 1 +
                       varint_size(t.len) + t.len;
    size_t summary_len = 1 + varint_size(value_len) + value_len;
    pb_double(b, 1, wall_time);
    pb_tag(b, 2, 0);
    pb_varint(b, (uint64_t)step);
    pb_tag(b, 5, 2);
    pb_varint(b, summary_len);
    pb_tag(b, 1, 2);
    pb_varint(b, value_len);
    pb_bytes(b, 1, tag, tag_len);
    pb_tag(b, 9, 2);
    pb_varint(b, m.len);
    encode_histogram_metadata(b);
    pb_tag(b, 8, 2);
    pb_varint(b, t.len);
    encode_histogram_tensor(b, rows, k);
}

dist_status dist_summary_writer_histogram(dist_summary_writer *w, const char *tag,
                                          const float *data, int64_t n, int buckets, int64_t step) {
    DIST_CHECK_ARG(w, "tensorboard: NULL writer");
    DIST_CHECK_ARG(tag && tag[0], "tensorboard: a histogram needs a non-empty tag");
    size_t tag_len = strlen(tag);
    DIST_CHECK_ARG(tag_len < 4096, "tensorboard: tag of %zu bytes is too long", tag_len);
    DIST_CHECK_ARG(buckets >= 1 && buckets <= 65536,
                   "tensorboard: histogram '%s' with %d buckets; 1..65536 are allowed", tag,
                   buckets);
    double *rows = malloc((size_t)buckets * 3 * sizeof *rows);
    if (!rows) return dist_error(DIST_OUT_OF_MEMORY, "tensorboard: out of memory");
    unsigned char *buf = NULL;
    dist_status st = dist_tensorboard_histogram_buckets(data, n, buckets, rows);
    if (st != DIST_OK) {
        dist_error_context(st, "tensorboard: histogram '%s'", tag);
        goto out;
    }
    pb_buf b = {NULL, 0, 0};
    double t = now_seconds();
    encode_histogram(&b, t, step, tag, rows, buckets);
    buf = malloc(b.len);
    if (!buf) {
        st = dist_error(DIST_OUT_OF_MEMORY, "tensorboard: out of memory");
        goto out;
    }
    b = (pb_buf){buf, b.len, 0};
    encode_histogram(&b, t, step, tag, rows, buckets);
    st = write_record(w, buf, b.len);
out:
    free(buf);
    free(rows);
    return st;
}

const char *dist_summary_writer_path(const dist_summary_writer *w) { return w ? w->path : NULL; }

/* mkdir -p */
static dist_status make_dirs(const char *dir) {
    char path[PATH_MAX];
    size_t n = strlen(dir);
    if (n >= sizeof path) return dist_error(DIST_INVALID_ARGUMENT, "tensorboard: log dir too long");
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != '\0') continue;
        char c = path[i];
        path[i] = '\0';
        if (mkdir(path, 0777) != 0 && errno != EEXIST)
            return dist_error_errno(DIST_IO, errno, "tensorboard: creating log dir '%s'", path);
        path[i] = c;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return dist_error(DIST_IO, "tensorboard: log dir '%s' is not a directory", dir);
    return DIST_OK;
}

dist_status dist_summary_writer_create(const char *logdir, dist_summary_writer **out) {
    DIST_CHECK_ARG(logdir && logdir[0] && out, "tensorboard: writer needs a log dir and out");
    *out = NULL;
    DIST_TRY(make_dirs(logdir));
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) strcpy(host, "localhost");
    host[sizeof host - 1] = '\0';
    double t = now_seconds();
    size_t cap = strlen(logdir) + strlen(host) + 64;
    dist_summary_writer *w = calloc(1, sizeof *w);
    char *path = malloc(cap);
    if (!w || !path) {
        free(w);
        free(path);
        return dist_error(DIST_OUT_OF_MEMORY, "tensorboard: out of memory");
    }
    w->path = path;
    w->fd = -1;
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        int k =
            snprintf(path, cap, "%s/events.out.tfevents.%010lld.%s", logdir, (long long)t, host);
        if (attempt > 0) snprintf(path + k, cap - (size_t)k, ".%d", attempt);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        dist_status st = dist_error_errno(DIST_IO, errno, "tensorboard: creating '%s'", path);
        dist_summary_writer_destroy(w);
        return st;
    }
    w->fd = fd;
    /* Event{1: wall_time, 3: file_version} */
    unsigned char buf[64];
    pb_buf b = {buf, sizeof buf, 0};
    pb_double(&b, 1, t);
    pb_bytes(&b, 3, "brain.Event:2", 13);
    dist_status st = write_record(w, buf, b.len);
    if (st != DIST_OK) {
        dist_summary_writer_destroy(w);
        return st;
    }
    *out = w;
    return DIST_OK;
}

void dist_summary_writer_destroy(dist_summary_writer *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w->path);
    free(w);
}
