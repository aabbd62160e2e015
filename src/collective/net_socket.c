/* Sockets with deadlines: listen, connect with retry and back-off, whole sends and receives. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define NET_SOCKET_BUFFER_BYTES (4 << 20)

double net_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

const char *net_peer_desc(const dist_net_comm *c, int r, char *buf, size_t cap) {
    snprintf(buf, cap, "%s at %s", c->names[r], c->addrs[r]);
    return buf;
}

void net_close(int *fd) {
    net_tls_release(*fd);
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

dist_status net_split_address(const char *address, char *host, size_t host_cap, int *port) {
    const char *colon = address ? strrchr(address, ':') : NULL;
    if (!colon || colon == address || (size_t)(colon - address) >= host_cap)
        return dist_error(DIST_INVALID_ARGUMENT, "address '%s': expected host:port",
                          address ? address : "(null)");
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end || end == colon + 1 || p < 0 || p > 65535)
        return dist_error(DIST_INVALID_ARGUMENT, "address '%s': bad port", address);
    memcpy(host, address, (size_t)(colon - address));
    host[colon - address] = 0;
    /* "[::1]" style brackets */
    if (host[0] == '[') {
        size_t n = strlen(host);
        if (n >= 2 && host[n - 1] == ']') {
            memmove(host, host + 1, n - 2);
            host[n - 2] = 0;
        }
    }
    *port = (int)p;
    return DIST_OK;
}

static int set_nonblocking(int fd) {
    int fl = fcntl(fd, F_GETFL, 0);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* 4 MiB each way (the kernel doubles it, within net.core.[rw]mem_max): a 256 KiB segment is
 * never split by a full buffer, and fewer wake-ups per megabyte. */
static void set_buffers(int fd) {
    int buf = NET_SOCKET_BUFFER_BYTES;
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
}

/* A host that vanishes (power, network) sends no FIN: between steps nobody would notice until
 * the next collective's deadline. Keepalive probes after 10 s of silence, every 5 s, 3 unanswered
 * ones: the kernel fails the connection after ~25 s, and the next call fails at once with
 * DIST_PEER_LOST instead of waiting out its timeout. */
static void set_keepalive(int fd) {
    int one = 1, idle = 10, interval = 5, count = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval, sizeof interval);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &count, sizeof count);
}

void net_tune_socket(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    set_keepalive(fd);
    set_buffers(fd);
    set_nonblocking(fd);
}

/* A listening socket bound to `a`; an errno on failure. */
static int listen_on(const struct sockaddr *a, socklen_t alen, int family, int *fd_out) {
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return errno;
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Accepted sockets inherit the buffer sizes, which must be set before listen() for the
     * window to be negotiated with them. */
    set_buffers(fd);
    if (family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    if (bind(fd, a, alen) < 0 || listen(fd, 128) < 0 || set_nonblocking(fd) < 0) {
        int e = errno;
        close(fd);
        return e;
    }
    *fd_out = fd;
    return 0;
}

/* Every interface (IPv6 dual stack, else IPv4). */
static int listen_any(int port, int *fd_out) {
    struct sockaddr_in6 a6 = {0};
    a6.sin6_family = AF_INET6;
    a6.sin6_addr = in6addr_any;
    a6.sin6_port = htons((uint16_t)port);
    if (listen_on((struct sockaddr *)&a6, sizeof a6, AF_INET6, fd_out) == 0) return 0;
    struct sockaddr_in a4 = {0};
    a4.sin_family = AF_INET;
    a4.sin_addr.s_addr = htonl(INADDR_ANY);
    a4.sin_port = htons((uint16_t)port);
    return listen_on((struct sockaddr *)&a4, sizeof a4, AF_INET, fd_out);
}

bool net_is_loopback_name(const char *host) {
    return strcmp(host, "localhost") == 0 || strncmp(host, "127.", 4) == 0 ||
           strcmp(host, "::1") == 0;
}

static bool is_loopback_addr(const struct sockaddr *a) {
    if (a->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->sa_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(x) || (IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127);
    }
    return false;
}

dist_status net_listen(const char *host, int port, bool loopback_ok, int *fd_out) {
    *fd_out = -1;
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {0}, *res = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(host, port_s, &hints, &res);
    if (g != 0)
        return dist_error(DIST_UNAVAILABLE,
                          "cannot listen on %s:%d: host '%s' does not resolve "
                          "(%s)",
                          host, port, host, gai_strerror(g));
    int e = EADDRNOTAVAIL;
    bool loopback = false;
    for (struct addrinfo *ai = res; ai && e; ai = ai->ai_next) {
        if (is_loopback_addr(ai->ai_addr) && !loopback_ok) {
            loopback = true;
            continue;
        }
        e = listen_on(ai->ai_addr, ai->ai_addrlen, ai->ai_family, fd_out);
    }
    freeaddrinfo(res);
    if (e == EADDRNOTAVAIL) {
        /* a name that is not an address of this machine (NAT, a Kubernetes service), or is
         * loopback only here: every interface, and the handshake keeps strangers out */
        e = listen_any(port, fd_out);
        if (!e)
            dist_log(DIST_LOG_WARN, "net_comm: '%s' %s; listening on port %d of every interface",
                     host,
                     loopback ? "resolves to a loopback address here while other workers are on "
                                "other hosts"
                              : "is not an address of this machine",
                     port);
    }
    if (e) return dist_error_errno(DIST_UNAVAILABLE, e, "cannot listen on %s:%d", host, port);
    return DIST_OK;
}

int net_wait_fd(int fd, short events, double deadline) {
    if ((events & POLLIN) && net_tls_pending(fd)) return 1;
    for (;;) {
        double left = deadline - net_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int ms = left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
        int rc = poll(&p, 1, ms);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return -1;
    }
}

static bool retryable(int e) {
    return e == ECONNREFUSED || e == ETIMEDOUT || e == EHOSTUNREACH || e == ENETUNREACH ||
           e == ECONNRESET || e == EAGAIN || e == EINTR || e == ECONNABORTED || e == EADDRNOTAVAIL;
}

/* One attempt: 0 connected, else an errno. */
static int connect_once(const struct addrinfo *ai, double deadline, int *fd_out) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) return errno;
    set_buffers(fd);
    set_nonblocking(fd);
    int e = 0;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
        e = errno;
        if (e == EINPROGRESS) {
            /* a last attempt at the deadline still gets its answer (a refusal is instant) */
            double floor = net_now() + 0.05;
            int w = net_wait_fd(fd, POLLOUT, deadline > floor ? deadline : floor);
            if (w <= 0) {
                e = w == 0 ? ETIMEDOUT : errno;
            } else {
                socklen_t l = sizeof e;
                if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &l) < 0) e = errno;
            }
        }
    }
    if (e) {
        close(fd);
        return e;
    }
    net_tune_socket(fd);
    *fd_out = fd;
    return 0;
}

dist_status net_connect_retry(const char *address, double deadline, const char *who, int *fd_out,
                              char *why, size_t why_cap) {
    *fd_out = -1;
    char why_buf[NET_ADDR_CAP + 96] = "";
    if (!why) {
        why = why_buf;
        why_cap = sizeof why_buf;
    }
    why[0] = 0;
    char host[NET_ADDR_CAP], port_s[16];
    int port;
    DIST_TRY(net_split_address(address, host, sizeof host, &port));
    snprintf(port_s, sizeof port_s, "%d", port);
    double backoff = 0.010;
    int last = 0;
    for (;;) {
        struct addrinfo hints = {0}, *res = NULL;
        hints.ai_socktype = SOCK_STREAM;
        hints.ai_family = AF_UNSPEC;
        int g = getaddrinfo(host, port_s, &hints, &res);
        if (g == 0) {
            for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
                last = connect_once(ai, deadline, fd_out);
                if (last == 0) break;
            }
            freeaddrinfo(res);
            if (last == 0) return DIST_OK;
            snprintf(why, why_cap, "%s", strerror(last));
            if (!retryable(last)) {
                return dist_error_errno(DIST_UNAVAILABLE, last, "connecting to %s", who);
            }
        } else if (g != EAI_AGAIN && g != EAI_NONAME
#ifdef EAI_NODATA
                   && g != EAI_NODATA
#endif
        ) {
            return dist_error(DIST_UNAVAILABLE, "connecting to %s: host '%s' does not resolve (%s)",
                              who, host, gai_strerror(g));
        } else {
            snprintf(why, why_cap, "host '%s' does not resolve (%s)", host, gai_strerror(g));
        }
        double left = deadline - net_now();
        if (left <= 0) break;
        double nap = backoff < left ? backoff : left;
        struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 1.0 ? 1.0 : backoff * 2;
    }
    return dist_error(DIST_TIMEOUT, "%s did not answer in time (last error: %s)", who,
                      why[0] ? why : "none");
}

dist_status net_accept(int listen_fd, double deadline, int *fd_out, char *peer, size_t peer_cap) {
    *fd_out = -1;
    for (;;) {
        struct sockaddr_storage ss;
        socklen_t l = sizeof ss;
        int fd = accept4(listen_fd, (struct sockaddr *)&ss, &l, SOCK_CLOEXEC);
        if (fd >= 0) {
            char h[NI_MAXHOST] = "?", p[NI_MAXSERV] = "?";
            getnameinfo((struct sockaddr *)&ss, l, h, sizeof h, p, sizeof p,
                        NI_NUMERICHOST | NI_NUMERICSERV);
            const char *hs = strncmp(h, "::ffff:", 7) == 0 ? h + 7 : h;
            snprintf(peer, peer_cap, "%s:%s", hs, p);
            net_tune_socket(fd);
            *fd_out = fd;
            return DIST_OK;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED)
            return dist_error_errno(DIST_SYSTEM, errno, "accept");
        int w = net_wait_fd(listen_fd, POLLIN, deadline);
        if (w == 0) return DIST_OK;
        if (w < 0) return dist_error_errno(DIST_SYSTEM, errno, "poll on the listener");
    }
}

/* A connection that failed: in TLS, a refusal after the handshake (a client certificate
 * that the peer does not trust is judged after the client has finished) is final. */
static dist_status lost(int fd, const char *who) {
    if (errno == EPROTO && net_tls_active(fd))
        return dist_error(DIST_UNAVAILABLE,
                          "%s: the TLS session failed (%s): every task must run with "
                          "--transport tls and the same cluster token, or certificates from "
                          "the same --tls-ca",
                          who, net_tls_last_reason());
    return dist_error(DIST_PEER_LOST, "%s: connection lost", who);
}

dist_status net_send_all(int fd, const void *buf, size_t len, double deadline, const char *who) {
    const char *p = buf;
    while (len) {
        ssize_t n = net_send_some(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0) return lost(fd, who);
        int w = net_wait_fd(fd, POLLOUT, deadline);
        if (w == 0) return dist_error(DIST_TIMEOUT, "%s: no answer in time", who);
        if (w < 0) return dist_error_errno(DIST_SYSTEM, errno, "%s: poll", who);
    }
    return DIST_OK;
}

dist_status net_recv_all(int fd, void *buf, size_t len, double deadline, const char *who) {
    char *p = buf;
    while (len) {
        ssize_t n = net_recv_some(fd, p, len);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0) return lost(fd, who);
        int w = net_wait_fd(fd, POLLIN, deadline);
        if (w == 0) return dist_error(DIST_TIMEOUT, "%s: no answer in time", who);
        if (w < 0) return dist_error_errno(DIST_SYSTEM, errno, "%s: poll", who);
    }
    return DIST_OK;
}
