/* The non-blocking transfer engine: every send and receive of a collective step progresses at
 * once, so two ranks that both send large buffers never deadlock on full socket buffers. A
 * waiter spins briefly on the sockets before sleeping in poll(): a wake-up from poll costs tens
 * of microseconds, which is the whole budget of a small all-reduce. */
#include "collective/net_internal.h"
#include "core/error.h"
#include "core/timeouts.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define NET_FRAME_MAGIC 0x52464c44u /* "DLFR" */

ssize_t net_send_some(int fd, const void *buf, size_t len) {
    if (net_tls_active(fd)) return net_tls_send_some(fd, buf, len);
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -1;
}

ssize_t net_recv_some(int fd, void *buf, size_t len) {
    if (net_tls_active(fd)) return net_tls_recv_some(fd, buf, len);
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
        errno = 0;
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -1;
}

const char *net_frame_kind_name(uint32_t kind) {
    switch (kind) {
    case NET_FRAME_ALL_REDUCE: return "all-reduce";
    case NET_FRAME_BROADCAST: return "broadcast";
    case NET_FRAME_ALL_GATHER: return "all-gather";
    case NET_FRAME_BARRIER: return "barrier";
    case NET_FRAME_SETUP: return "shared-memory setup";
    default: return "unknown collective";
    }
}

void net_frame_encode(const net_frame *f, unsigned char out[NET_FRAME_BYTES]) {
    put32(out, NET_FRAME_MAGIC ^ f->kind);
    put32(out + 4, f->detail);
    put64(out + 8, f->seq);
    put64(out + 16, f->bytes);
}

net_frame net_frame_next(dist_net_comm *c, uint32_t kind, uint32_t detail, uint64_t bytes) {
    return (net_frame){kind, detail, ++c->seq, bytes};
}

/* What a frame's detail says: "float32 SUM by doubling", "root 1". */
static const char *detail_desc(uint32_t kind, uint32_t detail, char *buf, size_t cap) {
    static const char *const ops[] = {"SUM", "MEAN", "MAX", "MIN"};
    if (kind == NET_FRAME_ALL_REDUCE) {
        uint32_t op = (detail >> 8) & 0xff;
        const char *algo = net_allreduce_name(detail >> NET_DETAIL_ALGORITHM_SHIFT);
        snprintf(buf, cap, "%s %s%s%s", dist_dtype_name((dist_dtype)(detail & 0xff)),
                 op < 4 ? ops[op] : "?", algo ? " by " : " over shared memory", algo ? algo : "");
    } else if (kind == NET_FRAME_BROADCAST) {
        snprintf(buf, cap, "root %u", detail);
    } else {
        snprintf(buf, cap, "detail %u", detail);
    }
    return buf;
}

dist_status net_frame_check(dist_net_comm *c, const unsigned char in[NET_FRAME_BYTES],
                            const net_frame *mine, int from) {
    net_frame t = {get32(in) ^ NET_FRAME_MAGIC, get32(in + 4), get64(in + 8), get64(in + 16)};
    if (t.kind == mine->kind && t.detail == mine->detail && t.seq == mine->seq &&
        t.bytes == mine->bytes)
        return DIST_OK;
    char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
    net_peer_desc(c, from, d, sizeof d);
    if (t.kind < NET_FRAME_ALL_REDUCE || t.kind > NET_FRAME_SETUP)
        dist_error(DIST_INVALID_USAGE,
                   "%s sent no frame header during %s #%llu of %s (rank %d): the stream is out "
                   "of step",
                   d, net_frame_kind_name(mine->kind), (unsigned long long)mine->seq,
                   c->names[c->rank], c->rank);
    else {
        char theirs[64], ours[64];
        dist_error(DIST_INVALID_USAGE,
                   "collectives differ between ranks: %s (rank %d) is in %s #%llu with %llu bytes "
                   "per rank (%s), %s (rank %d, this process) in %s #%llu with %llu bytes per "
                   "rank (%s); every rank must make the same calls with the same sizes and the "
                   "same DIST_ALLREDUCE_ALGORITHM",
                   d, from, net_frame_kind_name(t.kind), (unsigned long long)t.seq,
                   (unsigned long long)t.bytes,
                   detail_desc(t.kind, t.detail, theirs, sizeof theirs), c->names[c->rank], c->rank,
                   net_frame_kind_name(mine->kind), (unsigned long long)mine->seq,
                   (unsigned long long)mine->bytes,
                   detail_desc(mine->kind, mine->detail, ours, sizeof ours));
    }
    return net_fail(c, DIST_INVALID_USAGE);
}

/* The frame header, then the payload, in as few system calls as the kernel allows (over TLS,
 * one record for the header, then the payload's). */
static ssize_t op_some(int fd, net_op *o) {
    if (o->done < NET_FRAME_BYTES && net_tls_active(fd))
        return o->is_send ? net_send_some(fd, o->hdr + o->done, NET_FRAME_BYTES - o->done)
                          : net_recv_some(fd, o->hdr + o->done, NET_FRAME_BYTES - o->done);
    if (o->done >= NET_FRAME_BYTES) {
        size_t at = o->done - NET_FRAME_BYTES;
        return o->is_send ? net_send_some(fd, o->buf + at, o->len - at)
                          : net_recv_some(fd, o->buf + at, o->len - at);
    }
    struct iovec iov[2] = {{o->hdr + o->done, NET_FRAME_BYTES - o->done}, {o->buf, o->len}};
    struct msghdr m = {0};
    m.msg_iov = iov;
    m.msg_iovlen = o->len ? 2 : 1;
    ssize_t n =
        o->is_send ? sendmsg(fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT) : recvmsg(fd, &m, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0 && !o->is_send) {
        errno = 0;
        return -1;
    }
    if (n == 0 || errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -1;
}

dist_status net_fail(dist_net_comm *c, dist_status st) {
    if (c->failed == DIST_OK) {
        c->failed = st;
        snprintf(c->failed_msg, sizeof c->failed_msg, "%s", dist_last_error());
    }
    return st;
}

/* How long a rank that saw a peer leave waits for the peer's abort record: the record is
 * published before the peer closes, so a peer that failed has it in the store already; a peer
 * that was killed never writes one, and this is the delay before it is named itself. */
#define NET_ABORT_WAIT_S DIST_ABORT_RECORD_WAIT_S
#define NET_ABORT_CAP 768

dist_status net_fail_peer(dist_net_comm *c, dist_status st, int r, const char *what,
                          const char *detail) {
    char d[NET_NAME_CAP + NET_ADDR_CAP + 8], root[NET_ABORT_CAP];
    net_peer_desc(c, r, d, sizeof d);
    root[0] = '\0';
    /* a peer that closed may have failed first: its record names the worker really lost */
    if (c->failed == DIST_OK && c->abort_lookup)
        c->abort_lookup(c, r, st == DIST_PEER_LOST ? NET_ABORT_WAIT_S : 0.0, root, sizeof root);
    /* how far into the call this rank was: a rank that came late tells itself from one that
     * waited, and a stalled process from a silent peer */
    char when[NET_NAME_CAP + 96];
    /* named, not "this rank": a relayed record carries the publishing rank's own */
    snprintf(when, sizeof when, "%s was %.2f s into %s #%llu", c->names[c->rank],
             net_now() - c->call_start, what, (unsigned long long)c->seq);
    if (root[0])
        dist_error(st, "%s (reported by %s, which then left the %s; %s)", root, d, what, when);
    else if (st == DIST_TIMEOUT)
        dist_error(st, "%s: no answer within %g s during %s (%s%s%s)", d, c->call_timeout_s, what,
                   detail && detail[0] ? detail : "", detail && detail[0] ? "; " : "", when);
    else
        dist_error(st, "%s: connection lost during %s%s%s (%s)", d, what,
                   detail && detail[0] ? ": " : "", detail ? detail : "", when);
    if (c->failed == DIST_OK) {
        /* this rank's record before it leaves: the root failure (not who relayed it) */
        char msg[NET_ABORT_CAP];
        snprintf(msg, sizeof msg, "%s", dist_last_error());
        const char *rec = root[0] ? root : msg;
        if (c->abort_publish) c->abort_publish(c, rec);
        dist_error(st, "%s", msg); /* publishing may not change the message */
    }
    return net_fail(c, st);
}

dist_status net_reserve_scratch(dist_net_comm *c, size_t bytes) {
    if (bytes <= c->scratch_cap) return DIST_OK;
    void *p = realloc(c->scratch, bytes);
    if (!p) return dist_error(DIST_OUT_OF_MEMORY, "net_comm: scratch of %zu bytes", bytes);
    c->scratch = p;
    c->scratch_cap = bytes;
    return DIST_OK;
}

dist_status net_xfer(dist_net_comm *c, const net_frame *frame, net_op *ops, int n, double deadline,
                     const char *what) {
    struct pollfd pf[2 * NET_MAX_WORLD];
    double spin_until = net_now() + c->spin_s;
    unsigned char hdr[NET_FRAME_BYTES];
    net_frame_encode(frame, hdr);
    for (int i = 0; i < n; i++) {
        ops[i].done = 0;
        if (ops[i].is_send) memcpy(ops[i].hdr, hdr, NET_FRAME_BYTES);
    }
    for (;;) {
        bool progress = false, all = true;
        for (int i = 0; i < n; i++) {
            net_op *o = &ops[i];
            if (o->done == NET_FRAME_BYTES + o->len) continue;
            size_t before = o->done;
            ssize_t k = op_some(c->fds[o->peer], o);
            if (k < 0)
                return net_fail_peer(c, DIST_PEER_LOST, o->peer, what,
                                     errno ? strerror(errno) : "end of stream");
            o->done += (size_t)k;
            if (!o->is_send && before < NET_FRAME_BYTES && o->done >= NET_FRAME_BYTES)
                DIST_TRY(net_frame_check(c, o->hdr, frame, o->peer));
            progress |= k > 0;
            all &= o->done == NET_FRAME_BYTES + o->len;
        }
        double now = net_now();
        if (progress) c->moved_at = now;
        if (all) return DIST_OK;
        if (progress) {
            spin_until = now + c->spin_s;
            continue;
        }
        if (now < spin_until) continue;
        if (now >= deadline) {
            int at = -1;
            for (int i = 0; i < n && at < 0; i++)
                if (!ops[i].is_send && ops[i].done < NET_FRAME_BYTES + ops[i].len) at = i;
            for (int i = 0; i < n && at < 0; i++)
                if (ops[i].done < NET_FRAME_BYTES + ops[i].len) at = i;
            /* how much of this step's message came (or went), and since when nothing moved */
            char got[128];
            snprintf(got, sizeof got, "%s %zu of %zu bytes; nothing moved for %.2f s",
                     ops[at].is_send ? "it took" : "it sent", ops[at].done,
                     NET_FRAME_BYTES + ops[at].len, now - c->moved_at);
            return net_fail_peer(c, DIST_TIMEOUT, ops[at].peer, what, got);
        }
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (ops[i].done == NET_FRAME_BYTES + ops[i].len) continue;
            pf[np++] = (struct pollfd){c->fds[ops[i].peer], ops[i].is_send ? POLLOUT : POLLIN, 0};
        }
        double left = deadline - now;
        int ms = left > 0.1 ? 100 : (int)(left * 1000.0) + 1;
        poll(pf, (nfds_t)np, ms);
        spin_until = net_now() + c->spin_s;
    }
}
