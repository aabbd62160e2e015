/* The parameter-server wire protocol (src/ps/ps_wire.c) and the requests of the parameter
 * service (src/ps/ps_server.c), without a cluster:
 *
 *   1. the input as a payload: the bounded reader (ps_get_*) and ps_get_tensor, as a worker
 *      reads a closure's arguments;
 *   2. the input as a byte stream on a socketpair: ps_recv_header with the real cap, then the
 *      payload by ps_recv_payload or in parts (ps_rx_part/skip/end), or ps_recv_reply, frame
 *      after frame until the stream ends;
 *   3. the same stream served by the parameter service's own request loop (serve_one: create,
 *      pull, push, save, restore, stats, shutdown), on a service with three variables whose
 *      optimizer kernels are stand-ins.
 *
 * Input: one byte (bit 0: a worker sends the stream, else the chief; bit 1: keep the CRCs as
 * given, else the harness writes the right one into each whole frame), then the stream (its
 * first 64 KiB); part 1 reads the whole input.
 *
 * The service's request parsers are static: ps_server.c is compiled into this file, and what it
 * needs from the layers that the fuzz build leaves out (the listener, the acceptor, the
 * backend) is stubbed below; none of it is reached from serve_one. Replies go to the other end
 * of the socketpair, where a thread drains them. */
#include "../src/ps/ps_server.c"
#include "backend/layer_ops.h"
#include "core/crc32c.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- what ps_server.c links against outside the fuzz build ---- */

dist_status ps_listen(const ps_cluster *cl, int *fd_out) {
    (void)cl;
    *fd_out = -1;
    return dist_error(DIST_UNAVAILABLE, "fuzz: no listener");
}
dist_status ps_acceptor_start(const ps_cluster *cl, int listen_fd, ps_accept_fn accept,
                              ps_room_fn room, void *user, ps_acceptor **out) {
    (void)cl, (void)listen_fd, (void)accept, (void)room, (void)user;
    *out = NULL;
    return dist_error(DIST_UNAVAILABLE, "fuzz: no acceptor");
}
void ps_acceptor_stop(ps_acceptor *a) { (void)a; }
const char *ps_task_name(const ps_cluster *cl, int rank) {
    (void)cl;
    return rank == 0 ? "chief/0" : "worker/0";
}
const char *ps_task_desc(const ps_cluster *cl, int rank, char *buf, size_t cap) {
    snprintf(buf, cap, "%s at fuzz", ps_task_name(cl, rank));
    return buf;
}
dist_status dist_backend_create(const dist_backend_options *o, dist_backend **out) {
    (void)o;
    *out = NULL;
    return dist_error(DIST_UNAVAILABLE, "fuzz: no backend");
}
void dist_backend_destroy(dist_backend *b) { (void)b; }

/* Stand-ins for the optimizer kernels: they touch every element the service hands them. */
static dist_status fake_adam(void *ctx, const dist_adam_desc *d, float *param, const float *grad,
                             float *m, float *v, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        m[i] = d->beta1 * m[i] + grad[i];
        v[i] = d->beta2 * v[i] + grad[i] * grad[i];
        param[i] -= d->lr * m[i];
    }
    return DIST_OK;
}
static dist_status fake_sgd(void *ctx, const dist_sgd_desc *d, float *param, const float *grad,
                            float *momentum, size_t n) {
    (void)ctx;
    for (size_t i = 0; i < n; i++) {
        float g = grad[i] * d->grad_scale;
        if (momentum) g = momentum[i] = d->momentum * momentum[i] + g;
        param[i] -= d->lr * g;
    }
    return DIST_OK;
}
static const dist_layer_kernels fake_kernels = {.adam_update = fake_adam, .sgd_update = fake_sgd};
static int fake_supports(void *ctx, const dist_op *op, const dist_tensor *const *in,
                         dist_tensor *const *out) {
    (void)ctx, (void)in, (void)out;
    return dist_layer_supports(&fake_kernels, op);
}
static dist_status fake_run(void *ctx, const dist_op *op, const dist_tensor *const *in,
                            dist_tensor *const *out) {
    return dist_layer_run(&fake_kernels, ctx, op, in, out);
}
static const struct dist_backend_i fake_iface = {.supports_op = fake_supports, .run_op = fake_run};

/* ---- the harness ---- */

#define STREAM_CAP (64u * 1024u) /* below a socketpair's buffer: one write, no thread needed */

typedef struct drain {
    int fd;
    const uint8_t *data;
    size_t size;
} drain;

/* Writes the stream, ends it, and reads replies until the service closes its end. */
static void *drain_main(void *arg) {
    drain *d = arg;
    size_t off = 0;
    while (off < d->size) {
        ssize_t k = write(d->fd, d->data + off, d->size - off);
        if (k <= 0) break;
        off += (size_t)k;
    }
    shutdown(d->fd, SHUT_WR);
    unsigned char sink[4096];
    while (read(d->fd, sink, sizeof sink) > 0) {
    }
    return NULL;
}

/* fds[0] is read with the library's deadlines (non-blocking); a thread feeds fds[1]. */
static int open_stream(const uint8_t *data, size_t size, drain *d, pthread_t *t) {
    int fds[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) abort();
    fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
    *d = (drain){fds[1], data, size < STREAM_CAP ? size : STREAM_CAP};
    if (pthread_create(t, NULL, drain_main, d) != 0) abort();
    return fds[0];
}

static void close_stream(int fd, drain *d, pthread_t t) {
    close(fd);
    pthread_join(t, NULL);
    close(d->fd);
}

static void fuzz_payload(const uint8_t *data, size_t size) {
    ps_reader r = {data, size, 0, false};
    char name[64];
    (void)ps_get_u32(&r);
    ps_get_str(&r, name, sizeof name);
    uint32_t n = ps_get_u32(&r) % 9;
    for (uint32_t i = 0; i < n && !r.failed; i++) {
        dist_tensor *t = NULL;
        if (ps_get_tensor(&r, &t) != DIST_OK) break;
        /* a tensor that was read is whole: write it back and compare */
        ps_buf b = {0};
        ps_put_tensor(&b, t);
        size_t bytes = dist_tensor_bytes(t);
        if (!b.failed && memcmp(b.p + b.len - bytes, t->data, bytes) != 0) abort();
        ps_buf_free(&b);
        dist_tensor_destroy(t);
    }
}

static void fuzz_frames(const uint8_t *data, size_t size) {
    drain d;
    pthread_t t;
    int fd = open_stream(data, size, &d, &t);
    for (int i = 0; i < 64; i++) {
        ps_header h;
        if (ps_recv_header(fd, &h, PS_DEFAULT_FRAME_CAP, net_now() + 1, "fuzz") != DIST_OK) break;
        dist_status st;
        if (h.type & PS_MSG_REPLY) {
            /* a reply to (its own type, id 1): errors carry their message */
            if (h.status) {
                st = h.length <= 4096 ? DIST_OK : DIST_FORMAT;
                unsigned char msg[4096];
                ps_rx rx;
                ps_rx_begin(&rx, fd, &h, "fuzz");
                if (st == DIST_OK) st = ps_rx_part(&rx, msg, (size_t)h.length);
                if (st == DIST_OK) st = ps_rx_end(&rx);
            } else {
                unsigned char *p = NULL;
                st = ps_recv_payload(fd, &h, &p, "fuzz");
                if (st == DIST_OK) fuzz_payload(p, (size_t)h.length);
                free(p);
            }
        } else if (h.type == PS_MSG_PUSH) {
            /* in parts, as the service reads a push: a head, then skips of the sizes it names */
            ps_rx rx;
            ps_rx_begin(&rx, fd, &h, "fuzz");
            unsigned char head[8];
            st = ps_rx_part(&rx, head, sizeof head);
            for (int k = 0; k < 2 && st == DIST_OK; k++)
                st = ps_rx_skip(&rx, get32(head + 4 * k) % (rx.left + 1));
            if (st == DIST_OK) st = ps_rx_skip(&rx, (size_t)rx.left);
            if (st == DIST_OK) st = ps_rx_end(&rx);
        } else {
            unsigned char *p = NULL;
            st = ps_recv_payload(fd, &h, &p, "fuzz");
            free(p);
        }
        if (st == DIST_PEER_LOST || st == DIST_TIMEOUT) break;
    }
    close_stream(fd, &d, t);
}

static void fuzz_service(int rank, const uint8_t *data, size_t size) {
    static dist_backend be = {.iface = &fake_iface};
    static ps_cluster cl = {.num_workers = 1, .num_ps = 1, .world = 3, .rank = 2};
    ps_server *s = calloc(1, sizeof *s);
    if (!s) abort();
    s->cl = &cl;
    s->be = &be;
    s->listen_fd = -1;
    pthread_rwlock_init(&s->table_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    const float w[4] = {1, 2, 3, 4};
    if (install(s, 0, "w", 4, w) != DIST_OK || install(s, 1, "b", 1, w) != DIST_OK ||
        install(s, 5, "empty", 0, w) != DIST_OK)
        abort();
    ps_conn c = {.srv = s, .rank = rank};
    snprintf(c.who, sizeof c.who, "%s", ps_task_name(&cl, c.rank));
    drain d;
    pthread_t t;
    c.fd = open_stream(data, size, &d, &t);
    for (int i = 0; i < 64; i++) {
        ps_header h;
        if (ps_recv_header(c.fd, &h, PS_DEFAULT_FRAME_CAP, net_now() + 1, c.who) != DIST_OK) break;
        bool stop = false;
        if (serve_one(&c, &h, &stop) != DIST_OK || stop) break;
    }
    close_stream(c.fd, &d, t);
    ps_buf_free(&c.out);
    free(c.scratch);
    ps_server_destroy(s);
}

/* A right CRC is out of the fuzzer's reach: each frame whose payload is all there gets one. */
static void fix_crcs(uint8_t *p, size_t size) {
    for (size_t off = 0; size - off >= PS_HEADER_BYTES;) {
        uint64_t len = get64(p + off + 24);
        if (len > size - off - PS_HEADER_BYTES) return;
        put32(p + off + 20, dist_crc32c_extend(0, p + off + PS_HEADER_BYTES, (size_t)len));
        off += PS_HEADER_BYTES + (size_t)len;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_payload(data, size);
    if (size == 0) return 0;
    /* the first byte: bit 0 a worker sends the stream (else the chief), bit 1 CRCs as given */
    uint8_t *stream = malloc(size);
    if (!stream) abort();
    memcpy(stream, data + 1, size - 1);
    if (!(data[0] & 2)) fix_crcs(stream, size - 1);
    fuzz_frames(stream, size - 1);
    fuzz_service(data[0] & 1, stream, size - 1);
    free(stream);
    return 0;
}
