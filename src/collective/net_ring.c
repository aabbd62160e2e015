/* TCP all-reduce, two of its algorithms (net_allreduce.c chooses). Direct exchange: every rank
 * sends its buffer to every other rank and sums all contributions in rank order 0..world-1, so
 * every rank computes the same bits. Ring: reduce-scatter then all-gather, run as one
 * pipelined stream: the chunk received in step g is the chunk sent in step g+1, so each
 * received segment is summed as it arrives and forwarded at once, while the next one is still
 * on the wire. Each chunk's final value is computed by its owner and only copied by the
 * others; chunk c's sum starts at rank c (xc + xc+1 + ... + xc-1, cyclically), so from 3
 * ranks on its bits differ from the rank-order sum of the other algorithms. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

/* Summing granularity: large enough to amortise the loop, small enough that forwarding starts
 * early and the segment is still in cache. */
#define RING_SEG_BYTES (256u * 1024u)

void net_reduce_inputs(const char *const *in, void *data, size_t count, dist_dtype dtype,
                       dist_reduce_op op, int n) {
    size_t esize = dist_dtype_size(dtype), block = NET_REDUCE_BLOCK_BYTES / esize;
    for (size_t lo = 0; lo < count; lo += block) {
        size_t k = count - lo < block ? count - lo : block;
        char *acc = (char *)data + lo * esize;
        memcpy(acc, in[0] + lo * esize, k * esize);
        for (int r = 1; r < n; r++) dist_comm_accumulate(dtype, op, acc, in[r] + lo * esize, k);
        if (op == DIST_REDUCE_MEAN) dist_comm_divide(dtype, acc, k, n);
    }
}

void net_reduce_slots(const char *slots, size_t stride, void *data, size_t count, dist_dtype dtype,
                      dist_reduce_op op, int n) {
    const char *in[NET_MAX_WORLD];
    for (int r = 0; r < n; r++) in[r] = slots + (size_t)r * stride;
    net_reduce_inputs(in, data, count, dtype, op, n);
}

dist_status net_direct_all_reduce(dist_net_comm *c, const net_frame *frame, void *data,
                                  size_t count, dist_dtype dtype, dist_reduce_op op,
                                  double deadline) {
    int n = c->world, me = c->rank;
    size_t bytes = count * dist_dtype_size(dtype);
    DIST_TRY(net_reserve_scratch(c, (size_t)n * bytes));
    char *slots = c->scratch;
    memcpy(slots + (size_t)me * bytes, data, bytes);
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < n; r++) {
        if (r == me) continue;
        ops[k++] = (net_op){r, true, (char *)data, bytes, 0, {0}};
        ops[k++] = (net_op){r, false, slots + (size_t)r * bytes, bytes, 0, {0}};
    }
    DIST_TRY(net_xfer(c, frame, ops, k, deadline, "all-reduce"));
    net_reduce_slots(slots, bytes, data, count, dtype, op, n);
    return DIST_OK;
}

static int mod(int a, int n) { return ((a % n) + n) % n; }

typedef struct ring_plan {
    int n, r, steps;
    size_t count, esize;
} ring_plan;

static size_t chunk_off(const ring_plan *p, int ch) {
    size_t base = p->count / (size_t)p->n, rem = p->count % (size_t)p->n;
    return (size_t)ch * base + ((size_t)ch < rem ? (size_t)ch : rem);
}
static size_t chunk_bytes(const ring_plan *p, int ch) {
    size_t base = p->count / (size_t)p->n, rem = p->count % (size_t)p->n;
    return (base + ((size_t)ch < rem)) * p->esize;
}
static int send_chunk(const ring_plan *p, int g) {
    return g < p->n - 1 ? mod(p->r - g, p->n) : mod(p->r + 1 - (g - (p->n - 1)), p->n);
}
static int recv_chunk(const ring_plan *p, int g) {
    return g < p->n - 1 ? mod(p->r - g - 1, p->n) : mod(p->r - (g - (p->n - 1)), p->n);
}

/* Moves what it can of a frame header to or from rank r. */
static dist_status header_step(dist_net_comm *c, bool send, int r, unsigned char *h, size_t *done,
                               bool *progress) {
    int fd = c->fds[r];
    ssize_t k = send ? net_send_some(fd, h + *done, NET_FRAME_BYTES - *done)
                     : net_recv_some(fd, h + *done, NET_FRAME_BYTES - *done);
    if (k < 0)
        return net_fail_peer(c, DIST_PEER_LOST, r, "all-reduce",
                             errno ? strerror(errno) : "end of stream");
    *done += (size_t)k;
    *progress |= k > 0;
    return DIST_OK;
}

/* The stream to the next rank starts with the frame header; the one from the previous rank is
 * checked before any of its bytes is summed. */
dist_status net_ring_all_reduce(dist_net_comm *c, const net_frame *frame, void *data, size_t count,
                                dist_dtype dtype, dist_reduce_op op, double deadline) {
    size_t esize = dist_dtype_size(dtype);
    ring_plan p = {c->world, c->rank, 2 * (c->world - 1), count, esize};
    int next = (c->rank + 1) % c->world, prev = (c->rank + c->world - 1) % c->world;
    int nfd = c->fds[next], pfd = c->fds[prev];
    /* reduce-scatter receives into a segment-sized buffer that stays in cache */
    DIST_TRY(net_reserve_scratch(c, RING_SEG_BYTES + sizeof(int64_t)));
    char *scratch = (char *)c->scratch;
    char *base = (char *)data;
    int sg = 0, rg = 0;
    size_t sp = 0, rp = 0, pp = 0, hs = 0, hr = 0;
    unsigned char shdr[NET_FRAME_BYTES], rhdr[NET_FRAME_BYTES];
    net_frame_encode(frame, shdr);
    double spin_until = net_now() + c->spin_s;
    while (sg < p.steps || rg < p.steps) {
        bool progress = false, send_wait = false;
        if (hs < NET_FRAME_BYTES) DIST_TRY(header_step(c, true, next, shdr, &hs, &progress));
        if (hr < NET_FRAME_BYTES) {
            DIST_TRY(header_step(c, false, prev, rhdr, &hr, &progress));
            if (hr == NET_FRAME_BYTES) DIST_TRY(net_frame_check(c, rhdr, frame, prev));
        }
        /* send: step sg may forward what step sg-1 has received and processed */
        while (hs == NET_FRAME_BYTES && sg < p.steps) {
            int ch = send_chunk(&p, sg);
            size_t clen = chunk_bytes(&p, ch);
            size_t limit = sg == 0 || sg - 1 < rg ? clen : pp;
            if (sp == clen) {
                sg++;
                sp = 0;
                progress = true;
                continue;
            }
            if (sp >= limit) break;
            ssize_t k = net_send_some(nfd, base + chunk_off(&p, ch) * esize + sp, limit - sp);
            if (k < 0)
                return net_fail_peer(c, DIST_PEER_LOST, next, "all-reduce",
                                     errno ? strerror(errno) : "end of stream");
            if (k == 0) {
                send_wait = true;
                break;
            }
            sp += (size_t)k;
            progress = true;
        }
        /* receive, and sum (reduce-scatter) or keep in place (all-gather) */
        while (hr == NET_FRAME_BYTES && rg < p.steps) {
            int ch = recv_chunk(&p, rg);
            size_t clen = chunk_bytes(&p, ch);
            bool reduce = rg < p.n - 1;
            if (pp == clen) {
                rg++;
                rp = pp = 0;
                progress = true;
                continue;
            }
            size_t held = rp - pp; /* received, not yet summed (reduce-scatter) */
            char *dst = reduce ? scratch + held : base + chunk_off(&p, ch) * esize + rp;
            size_t want = clen - rp;
            if (reduce && want > RING_SEG_BYTES - held) want = RING_SEG_BYTES - held;
            ssize_t k = want ? net_recv_some(pfd, dst, want) : 0;
            if (k < 0)
                return net_fail_peer(c, DIST_PEER_LOST, prev, "all-reduce",
                                     errno ? strerror(errno) : "end of stream");
            rp += (size_t)k;
            progress |= k > 0;
            if (!reduce) {
                pp = rp;
            } else if (rp - pp >= RING_SEG_BYTES || rp == clen) {
                size_t nf = (rp - pp) / esize;
                char *acc = base + chunk_off(&p, ch) * esize + pp;
                dist_comm_accumulate(dtype, op, acc, scratch, nf);
                /* the owner's last step makes the final value: MEAN divides there, once */
                if (op == DIST_REDUCE_MEAN && rg == p.n - 2) dist_comm_divide(dtype, acc, nf, p.n);
                pp += nf * esize;
                memmove(scratch, scratch + nf * esize, rp - pp);
            }
            if (k == 0 && pp != clen) break;
        }
        if (sg == p.steps && rg == p.steps) break;
        double now = net_now();
        if (progress) {
            c->moved_at = now;
            spin_until = now + c->spin_s;
            continue;
        }
        if (now < spin_until) continue;
        bool want_recv = rg < p.steps, want_send = send_wait || hs < NET_FRAME_BYTES;
        if (now >= deadline) {
            /* how far the ring got with the peer it waits on, and since when nothing moved */
            const size_t head = want_recv ? hr : hs, body = want_recv ? rp : sp;
            const int step = want_recv ? rg : sg;
            const size_t len = chunk_bytes(&p, want_recv ? recv_chunk(&p, rg) : send_chunk(&p, sg));
            char got[192];
            snprintf(got, sizeof got,
                     "it %s %zu of %zu %sbytes of ring step %d of %d; nothing moved for %.2f s",
                     want_recv ? "sent" : "took", head < NET_FRAME_BYTES ? head : body,
                     head < NET_FRAME_BYTES ? (size_t)NET_FRAME_BYTES : len,
                     head < NET_FRAME_BYTES ? "header " : "", step + 1, p.steps, now - c->moved_at);
            return net_fail_peer(c, DIST_TIMEOUT, want_recv ? prev : next, "all-reduce", got);
        }
        struct pollfd pf[2];
        int np = 0;
        if (want_recv) pf[np++] = (struct pollfd){pfd, POLLIN, 0};
        if (want_send) {
            if (np && pfd == nfd)
                pf[0].events |= POLLOUT;
            else
                pf[np++] = (struct pollfd){nfd, POLLOUT, 0};
        }
        /* a send held back only by the pipeline (nothing to forward yet) waits for input */
        double left = deadline - now;
        poll(pf, (nfds_t)np, left > 0.1 ? 100 : (int)(left * 1000.0) + 1);
        spin_until = net_now() + c->spin_s;
    }
    return DIST_OK;
}
