/* The non-blocking transfer engine: every send and receive of a collective step progresses at
 * once, so two ranks that both send large buffers never deadlock on full socket buffers. A
 * waiter spins briefly on the sockets before sleeping in poll(): a wake-up from poll costs tens
 * of microseconds, which is the whole budget of a small all-reduce. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

ssize_t net_send_some(int fd, const void *buf, size_t len) {
    ssize_t n = send(fd, buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -1;
}

ssize_t net_recv_some(int fd, void *buf, size_t len) {
    ssize_t n = recv(fd, buf, len, MSG_DONTWAIT);
    if (n > 0) return n;
    if (n == 0) {
        errno = 0;
        return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
    return -1;
}

dist_status net_fail(dist_net_comm *c, dist_status st) {
    if (c->failed == DIST_OK) {
        c->failed = st;
        snprintf(c->failed_msg, sizeof c->failed_msg, "%s", dist_last_error());
    }
    return st;
}

dist_status net_fail_peer(dist_net_comm *c, dist_status st, int r, const char *what,
                          const char *detail) {
    char d[NET_NAME_CAP + NET_ADDR_CAP + 8];
    net_peer_desc(c, r, d, sizeof d);
    if (st == DIST_TIMEOUT)
        dist_error(st, "%s: no answer within %g s during %s", d, c->call_timeout_s, what);
    else
        dist_error(st, "%s: connection lost during %s%s%s", d, what,
                   detail && detail[0] ? ": " : "", detail ? detail : "");
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

dist_status net_xfer(dist_net_comm *c, net_op *ops, int n, double deadline, const char *what) {
    struct pollfd pf[2 * NET_MAX_WORLD];
    double spin_until = net_now() + c->spin_s;
    for (;;) {
        bool progress = false, all = true;
        for (int i = 0; i < n; i++) {
            net_op *o = &ops[i];
            if (o->done == o->len) continue;
            int fd = c->fds[o->peer];
            ssize_t k = o->is_send ? net_send_some(fd, o->buf + o->done, o->len - o->done)
                                   : net_recv_some(fd, o->buf + o->done, o->len - o->done);
            if (k < 0)
                return net_fail_peer(c, DIST_PEER_LOST, o->peer, what,
                                     errno ? strerror(errno) : "end of stream");
            o->done += (size_t)k;
            progress |= k > 0;
            all &= o->done == o->len;
        }
        if (all) return DIST_OK;
        double now = net_now();
        if (progress) {
            spin_until = now + c->spin_s;
            continue;
        }
        if (now < spin_until) continue;
        if (now >= deadline) {
            int who = -1;
            for (int i = 0; i < n && who < 0; i++)
                if (!ops[i].is_send && ops[i].done < ops[i].len) who = ops[i].peer;
            for (int i = 0; i < n && who < 0; i++)
                if (ops[i].done < ops[i].len) who = ops[i].peer;
            return net_fail_peer(c, DIST_TIMEOUT, who, what, NULL);
        }
        int np = 0;
        for (int i = 0; i < n; i++) {
            if (ops[i].done == ops[i].len) continue;
            pf[np++] = (struct pollfd){c->fds[ops[i].peer], ops[i].is_send ? POLLOUT : POLLIN, 0};
        }
        double left = deadline - now;
        int ms = left > 0.1 ? 100 : (int)(left * 1000.0) + 1;
        poll(pf, (nfds_t)np, ms);
        spin_until = net_now() + c->spin_s;
    }
}
