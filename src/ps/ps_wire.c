/* Frames of the parameter-server protocol (ps_wire.h). */
#include "ps/ps_wire.h"

#include "collective/net_internal.h"
#include "core/crc32c.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *ps_msg_name(uint32_t type) {
    static const char *const names[PS_MSG_COUNT] = {
        "?", "create", "pull", "push", "save", "restore", "shutdown", "exec", "dataset", "stats"};
    type &= ~(uint32_t)PS_MSG_REPLY;
    return type > 0 && type < PS_MSG_COUNT ? names[type] : "unknown";
}

/* ---- payloads ---- */

void ps_buf_free(ps_buf *b) {
    free(b->p);
    *b = (ps_buf){0};
}

void ps_buf_reset(ps_buf *b) {
    b->len = 0;
    b->failed = false;
}

void ps_put_bytes(ps_buf *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        unsigned char *q = realloc(b->p, cap);
        if (!q) {
            b->failed = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
}

void ps_put_u32(ps_buf *b, uint32_t v) {
    unsigned char x[4];
    put32(x, v);
    ps_put_bytes(b, x, 4);
}

void ps_put_u64(ps_buf *b, uint64_t v) {
    unsigned char x[8];
    put64(x, v);
    ps_put_bytes(b, x, 8);
}

void ps_put_f32(ps_buf *b, float v) {
    uint32_t u;
    memcpy(&u, &v, 4);
    ps_put_u32(b, u);
}

void ps_put_str(ps_buf *b, const char *s) {
    size_t n = strlen(s);
    ps_put_u32(b, (uint32_t)n);
    ps_put_bytes(b, s, n);
}

const void *ps_get_bytes(ps_reader *r, size_t n) {
    if (r->failed || n > r->len - r->pos) {
        r->failed = true;
        return NULL;
    }
    const void *p = r->p + r->pos;
    r->pos += n;
    return p;
}

uint32_t ps_get_u32(ps_reader *r) {
    const unsigned char *p = ps_get_bytes(r, 4);
    return p ? get32(p) : 0;
}

uint64_t ps_get_u64(ps_reader *r) {
    const unsigned char *p = ps_get_bytes(r, 8);
    return p ? get64(p) : 0;
}

float ps_get_f32(ps_reader *r) {
    uint32_t u = ps_get_u32(r);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

void ps_get_str(ps_reader *r, char *out, size_t cap) {
    uint32_t n = ps_get_u32(r);
    const char *p = n < cap ? ps_get_bytes(r, n) : NULL;
    if (!p) {
        r->failed = true;
        if (cap) out[0] = 0;
        return;
    }
    memcpy(out, p, n);
    out[n] = 0;
}

/* ---- frames ---- */

dist_status ps_send_frame(int fd, uint32_t type, uint64_t id, uint32_t status,
                          const ps_piece *pieces, int count, double deadline, const char *who) {
    uint64_t len = 0;
    uint32_t crc = 0;
    for (int i = 0; i < count; i++) {
        len += pieces[i].n;
        crc = dist_crc32c_extend(crc, pieces[i].p, pieces[i].n);
    }
    unsigned char h[PS_HEADER_BYTES] = {0};
    put32(h, PS_MAGIC);
    h[4] = PS_WIRE_VERSION & 0xff;
    h[5] = PS_WIRE_VERSION >> 8;
    h[6] = (unsigned char)(type & 0xff);
    h[7] = (unsigned char)(type >> 8);
    put64(h + 8, id);
    put32(h + 16, status);
    put32(h + 20, crc);
    put64(h + 24, len);
    DIST_TRY(net_send_all(fd, h, sizeof h, deadline, who));
    for (int i = 0; i < count; i++)
        if (pieces[i].n) DIST_TRY(net_send_all(fd, pieces[i].p, pieces[i].n, deadline, who));
    return DIST_OK;
}

dist_status ps_send_error(int fd, uint32_t type, uint64_t id, dist_status status, double deadline,
                          const char *who) {
    const char *msg = dist_last_error();
    ps_piece p = {msg, strlen(msg)};
    return ps_send_frame(fd, type | PS_MSG_REPLY, id, (uint32_t)status, &p, 1, deadline, who);
}

dist_status ps_recv_header(int fd, ps_header *h, uint64_t cap, double deadline, const char *who) {
    int ready = net_wait_fd(fd, POLLIN, deadline);
    if (ready == 0) return dist_error(DIST_TIMEOUT, "%s: no message within the deadline", who);
    unsigned char b[PS_HEADER_BYTES];
    dist_status st = net_recv_all(fd, b, 1, deadline, who);
    if (st == DIST_OK)
        st = net_recv_all(fd, b + 1, sizeof b - 1, net_now() + PS_FRAME_STALL_S, who);
    if (st != DIST_OK) return st;
    uint32_t version = (uint32_t)b[4] | (uint32_t)b[5] << 8;
    h->type = (uint16_t)(b[6] | b[7] << 8);
    h->id = get64(b + 8);
    h->status = get32(b + 16);
    h->crc = get32(b + 20);
    h->length = get64(b + 24);
    if (get32(b) != PS_MAGIC)
        return dist_error(DIST_FORMAT, "%s: not a parameter-server frame (bad magic 0x%08x)", who,
                          get32(b));
    if (version != PS_WIRE_VERSION)
        return dist_error(DIST_FORMAT, "%s: protocol version %u (this process speaks %d)", who,
                          version, PS_WIRE_VERSION);
    uint32_t base = h->type & ~(uint32_t)PS_MSG_REPLY;
    if (base == 0 || base >= PS_MSG_COUNT || (h->type & ~(uint32_t)(PS_MSG_REPLY | 0xff)))
        return dist_error(DIST_FORMAT, "%s: unknown message type %u", who, h->type);
    if (h->length > cap)
        return dist_error(DIST_FORMAT,
                          "%s: a %s frame of %llu bytes, over the limit of %llu bytes: refused "
                          "before reading it",
                          who, ps_msg_name(h->type), (unsigned long long)h->length,
                          (unsigned long long)cap);
    return DIST_OK;
}

void ps_rx_begin(ps_rx *rx, int fd, const ps_header *h, const char *who) {
    *rx = (ps_rx){.fd = fd, .h = h, .left = h->length, .crc = 0, .who = who};
}

dist_status ps_rx_part(ps_rx *rx, void *dst, size_t n) {
    if (n > rx->left)
        return dist_error(DIST_FORMAT, "%s: a %s frame of %llu bytes is shorter than its contents",
                          rx->who, ps_msg_name(rx->h->type), (unsigned long long)rx->h->length);
    if (n == 0) return DIST_OK;
    DIST_TRY(net_recv_all(rx->fd, dst, n, net_now() + PS_FRAME_STALL_S, rx->who));
    rx->crc = dist_crc32c_extend(rx->crc, dst, n);
    rx->left -= n;
    return DIST_OK;
}

dist_status ps_rx_skip(ps_rx *rx, size_t n) {
    unsigned char b[4096];
    while (n) {
        size_t k = n < sizeof b ? n : sizeof b;
        DIST_TRY(ps_rx_part(rx, b, k));
        n -= k;
    }
    return DIST_OK;
}

dist_status ps_rx_end(ps_rx *rx) {
    if (rx->left)
        return dist_error(DIST_FORMAT, "%s: %llu unexpected bytes at the end of a %s frame",
                          rx->who, (unsigned long long)rx->left, ps_msg_name(rx->h->type));
    if (rx->crc != rx->h->crc)
        return dist_error(DIST_FORMAT,
                          "%s: a %s frame fails its checksum (crc32c 0x%08x, header says 0x%08x)",
                          rx->who, ps_msg_name(rx->h->type), rx->crc, rx->h->crc);
    return DIST_OK;
}

dist_status ps_recv_payload(int fd, const ps_header *h, unsigned char **out, const char *who) {
    *out = NULL;
    unsigned char *b = malloc(h->length ? (size_t)h->length : 1);
    if (!b)
        return dist_error(DIST_OUT_OF_MEMORY, "%s: out of memory for a %llu-byte frame", who,
                          (unsigned long long)h->length);
    ps_rx rx;
    ps_rx_begin(&rx, fd, h, who);
    dist_status st = ps_rx_part(&rx, b, (size_t)h->length);
    if (st == DIST_OK) st = ps_rx_end(&rx);
    if (st != DIST_OK) {
        free(b);
        return st;
    }
    *out = b;
    return DIST_OK;
}

dist_status ps_recv_reply(int fd, uint32_t type, uint64_t id, ps_header *h, uint64_t cap,
                          double deadline, const char *who) {
    DIST_TRY(ps_recv_header(fd, h, cap, deadline, who));
    if (h->type != (type | PS_MSG_REPLY) || h->id != id)
        return dist_error(DIST_FORMAT, "%s: expected the reply to %s #%llu, got %s #%llu", who,
                          ps_msg_name(type), (unsigned long long)id, ps_msg_name(h->type),
                          (unsigned long long)h->id);
    if (h->status == DIST_OK) return DIST_OK;
    if (h->length > 4096)
        return dist_error(DIST_FORMAT, "%s: an error reply of %llu bytes", who,
                          (unsigned long long)h->length);
    char msg[4097];
    ps_rx rx;
    ps_rx_begin(&rx, fd, h, who);
    DIST_TRY(ps_rx_part(&rx, msg, (size_t)h->length));
    DIST_TRY(ps_rx_end(&rx));
    msg[h->length] = 0;
    dist_status st = h->status < DIST_STATUS_COUNT ? (dist_status)h->status : DIST_INTERNAL;
    return dist_error(st, "%s: %s", who, msg);
}

/* ---- tensors ---- */

void ps_put_tensor(ps_buf *b, const dist_tensor *t) {
    ps_put_u32(b, (uint32_t)t->dtype);
    ps_put_u32(b, (uint32_t)t->ndim);
    for (int i = 0; i < t->ndim; i++) ps_put_u64(b, (uint64_t)t->shape[i]);
    ps_put_bytes(b, t->data, dist_tensor_bytes(t));
}

dist_status ps_get_tensor(ps_reader *r, dist_tensor **out) {
    *out = NULL;
    uint32_t dtype = ps_get_u32(r), ndim = ps_get_u32(r);
    if (r->failed || dtype >= DIST_DTYPE_COUNT || ndim > DIST_MAX_DIMS)
        return dist_error(DIST_FORMAT, "a tensor with dtype %u and rank %u", dtype, ndim);
    int64_t shape[DIST_MAX_DIMS];
    uint64_t bytes = dist_dtype_size((dist_dtype)dtype);
    for (uint32_t i = 0; i < ndim; i++) {
        uint64_t d = ps_get_u64(r);
        if (r->failed || d > (uint64_t)INT64_MAX || (d && bytes > (r->len - r->pos) / d))
            return dist_error(DIST_FORMAT, "a tensor whose shape does not fit its message");
        shape[i] = (int64_t)d;
        bytes *= d;
    }
    if (bytes > r->len - r->pos)
        return dist_error(DIST_FORMAT, "a tensor of %llu bytes with %zu left in its message",
                          (unsigned long long)bytes, r->len - r->pos);
    dist_tensor *t = NULL;
    DIST_TRY(dist_tensor_create((dist_dtype)dtype, (int)ndim, shape, &t));
    memcpy(t->data, ps_get_bytes(r, (size_t)bytes), (size_t)bytes);
    *out = t;
    return DIST_OK;
}
