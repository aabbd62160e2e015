/* ldc_delay_relay: a TCP relay that adds a fixed one-way delay, for the namespace cluster
 * (tests/cluster/run_cluster.sh). The kernels of these machines have no netem, so latency
 * between the namespaces comes from here: every worker's address in TF_CONFIG is a listener
 * of this relay, which forwards each connection to the real worker after `--delay-us`.
 *
 *   ldc_delay_relay --delay-us D [--ready-file F] LISTEN_IP:PORT=TARGET_IP:PORT ...
 *
 * One thread, epoll. Every read (up to 256 KiB) becomes a chunk stamped with its arrival time
 * plus the delay, queued per direction in arrival order and written once that time has come,
 * so bytes are never reordered and each byte waits the delay once per direction (a round trip
 * through the relay costs 2 D plus the relay's own work). A timerfd wakes the loop at the
 * earliest due chunk (nanosecond resolution). A half-close (FIN) is passed on after the same
 * delay; an error on either side closes both, so a killed worker is seen as a closed
 * connection by its peers, as without the relay. A direction holding more than 64 MiB stops
 * reading until it drains (TCP's flow control then slows the sender). SIGTERM / SIGINT end it.
 * With --ready-file, the file is written once every listener is bound.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

#define READ_BYTES (256 * 1024)
#define MAX_QUEUED ((size_t)64 << 20)
#define MAX_ROUTES 64

typedef struct chunk {
    struct chunk *next;
    uint64_t due_ns;
    size_t len, off;
    char data[];
} chunk;

/* One direction of a relayed connection: bytes read from `from`, written to `to`. */
typedef struct dir {
    int from, to;
    chunk *head, *tail;
    size_t queued;
    int eof;          /* `from` said FIN: shut `to` down for writing once drained and due */
    uint64_t eof_due; /* when the FIN is passed on */
    int shut;         /* passed on */
    int want_out;     /* the last write would block */
} dir;

/* epoll's data points at one of these, so every event says what it is about. */
typedef struct handle {
    int kind; /* 0 listener, 1 pair side 0, 2 pair side 1, 3 timer */
    void *p;
} handle;

typedef struct pair {
    struct pair *next;
    handle h[2];
    int fd[2]; /* 0: the accepted client, 1: the connection to the target */
    int connecting;
    dir d[2];  /* d[0]: client -> target, d[1]: target -> client */
    uint32_t ev[2];
    int dead;
} pair;

typedef struct route {
    int lfd;
    struct sockaddr_in listen, target;
} route;

static volatile sig_atomic_t g_stop;
static uint64_t g_delay_ns;
static int g_ep, g_tfd;
static pair *g_pairs;

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int parse_addr(const char *s, struct sockaddr_in *out) {
    char host[64];
    const char *colon = strrchr(s, ':');
    if (!colon || (size_t)(colon - s) >= sizeof host) return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port <= 0 || port > 65535) return -1;
    memset(out, 0, sizeof *out);
    out->sin_family = AF_INET;
    out->sin_port = htons((uint16_t)port);
    return inet_pton(AF_INET, host, &out->sin_addr) == 1 ? 0 : -1;
}

static void set_nodelay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void free_dir(dir *d) {
    while (d->head) {
        chunk *c = d->head;
        d->head = c->next;
        free(c);
    }
    d->tail = NULL;
    d->queued = 0;
}

static void kill_pair(pair *p) {
    if (p->dead) return;
    p->dead = 1;
    for (int i = 0; i < 2; i++) {
        if (p->fd[i] >= 0) {
            epoll_ctl(g_ep, EPOLL_CTL_DEL, p->fd[i], NULL);
            close(p->fd[i]);
            p->fd[i] = -1;
        }
        free_dir(&p->d[i]);
    }
}

/* Registers what side i waits for: input unless its direction is at EOF or full, output when a
 * write into it would block (or while connecting). */
static void update_interest(pair *p, int i) {
    if (p->dead || p->fd[i] < 0) return;
    dir *in = &p->d[i], *out = &p->d[1 - i];
    uint32_t ev = 0;
    if (!in->eof && in->queued < MAX_QUEUED && !(i == 0 && p->connecting)) ev |= EPOLLIN;
    if (out->want_out || (i == 1 && p->connecting)) ev |= EPOLLOUT;
    if (ev == p->ev[i]) return;
    struct epoll_event e = {.events = ev, .data.ptr = &p->h[i]};
    epoll_ctl(g_ep, EPOLL_CTL_MOD, p->fd[i], &e);
    p->ev[i] = ev;
}

static void read_side(pair *p, int i, uint64_t now) {
    static char buf[READ_BYTES];
    dir *d = &p->d[i];
    if (d->eof) return; /* EPOLLHUP after the FIN: nothing more to read */
    ssize_t n = recv(p->fd[i], buf, sizeof buf, 0);
    if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) return;
        kill_pair(p); /* reset: the other side sees its connection closed */
        return;
    }
    if (n == 0) {
        d->eof = 1;
        d->eof_due = now + g_delay_ns;
        return;
    }
    chunk *c = malloc(sizeof *c + (size_t)n);
    if (!c) {
        fprintf(stderr, "ldc_delay_relay: out of memory queueing %zd bytes\n", n);
        kill_pair(p);
        return;
    }
    c->next = NULL;
    c->due_ns = now + g_delay_ns;
    c->len = (size_t)n;
    c->off = 0;
    memcpy(c->data, buf, (size_t)n);
    if (d->tail) d->tail->next = c;
    else d->head = c;
    d->tail = c;
    d->queued += (size_t)n;
}

/* Writes the due chunks of direction d; returns the next due time it waits for (0: none). */
static uint64_t flush_dir(pair *p, dir *d, uint64_t now) {
    d->want_out = 0;
    while (d->head && d->head->due_ns <= now) {
        chunk *c = d->head;
        ssize_t n = send(d->to, c->data + c->off, c->len - c->off, MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                d->want_out = 1;
                return 0;
            }
            kill_pair(p);
            return 0;
        }
        c->off += (size_t)n;
        d->queued -= (size_t)n;
        if (c->off < c->len) {
            d->want_out = 1;
            return 0;
        }
        d->head = c->next;
        if (!d->head) d->tail = NULL;
        free(c);
    }
    if (d->head) return d->head->due_ns;
    if (d->eof && !d->shut) {
        if (d->eof_due > now) return d->eof_due;
        shutdown(d->to, SHUT_WR);
        d->shut = 1;
    }
    return 0;
}

static void accept_all(route *r) {
    for (;;) {
        int c = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) return;
        int t = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (t < 0) {
            close(c);
            return;
        }
        set_nodelay(c);
        set_nodelay(t);
        int rc = connect(t, (struct sockaddr *)&r->target, sizeof r->target);
        if (rc < 0 && errno != EINPROGRESS) {
            close(c);
            close(t);
            continue;
        }
        pair *p = calloc(1, sizeof *p);
        if (!p) {
            close(c);
            close(t);
            continue;
        }
        p->fd[0] = c;
        p->fd[1] = t;
        p->connecting = rc < 0;
        p->d[0].from = c;
        p->d[0].to = t;
        p->d[1].from = t;
        p->d[1].to = c;
        for (int i = 0; i < 2; i++) {
            p->h[i].kind = 1 + i;
            p->h[i].p = p;
            struct epoll_event e = {.events = 0, .data.ptr = &p->h[i]};
            epoll_ctl(g_ep, EPOLL_CTL_ADD, p->fd[i], &e);
        }
        p->next = g_pairs;
        g_pairs = p;
        update_interest(p, 0);
        update_interest(p, 1);
    }
}

int main(int argc, char **argv) {
    route routes[MAX_ROUTES];
    int nroutes = 0;
    const char *ready = NULL;
    long delay_us = -1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--delay-us") == 0 && i + 1 < argc) {
            char *end;
            delay_us = strtol(argv[++i], &end, 10);
            if (*end || delay_us < 0 || delay_us > 10000000) {
                fprintf(stderr, "ldc_delay_relay: --delay-us takes 0 to 10000000, got '%s'\n",
                        argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--ready-file") == 0 && i + 1 < argc) {
            ready = argv[++i];
        } else {
            char spec[160];
            char *eq;
            if (strlen(argv[i]) >= sizeof spec || !(eq = strchr(strcpy(spec, argv[i]), '='))) {
                fprintf(stderr, "ldc_delay_relay: '%s' is not LISTEN_IP:PORT=TARGET_IP:PORT\n",
                        argv[i]);
                return 2;
            }
            *eq = '\0';
            if (nroutes == MAX_ROUTES) {
                fprintf(stderr, "ldc_delay_relay: at most %d routes\n", MAX_ROUTES);
                return 2;
            }
            route *r = &routes[nroutes];
            if (parse_addr(spec, &r->listen) || parse_addr(eq + 1, &r->target)) {
                fprintf(stderr, "ldc_delay_relay: '%s' is not LISTEN_IP:PORT=TARGET_IP:PORT\n",
                        argv[i]);
                return 2;
            }
            nroutes++;
        }
    }
    if (delay_us < 0 || nroutes == 0) {
        fprintf(stderr, "usage: ldc_delay_relay --delay-us D [--ready-file F] "
                        "LISTEN_IP:PORT=TARGET_IP:PORT ...\n");
        return 2;
    }
    g_delay_ns = (uint64_t)delay_us * 1000u;
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    g_ep = epoll_create1(EPOLL_CLOEXEC);
    g_tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (g_ep < 0 || g_tfd < 0) {
        perror("ldc_delay_relay: epoll/timerfd");
        return 1;
    }
    handle timer_h = {.kind = 3, .p = NULL};
    struct epoll_event te = {.events = EPOLLIN, .data.ptr = &timer_h};
    epoll_ctl(g_ep, EPOLL_CTL_ADD, g_tfd, &te);
    handle route_h[MAX_ROUTES];
    for (int i = 0; i < nroutes; i++) {
        route *r = &routes[i];
        r->lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(r->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (r->lfd < 0 || bind(r->lfd, (struct sockaddr *)&r->listen, sizeof r->listen) < 0 ||
            listen(r->lfd, 256) < 0) {
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &r->listen.sin_addr, a, sizeof a);
            fprintf(stderr, "ldc_delay_relay: cannot listen on %s:%d: %s\n", a,
                    ntohs(r->listen.sin_port), strerror(errno));
            return 1;
        }
        route_h[i].kind = 0;
        route_h[i].p = r;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = &route_h[i]};
        epoll_ctl(g_ep, EPOLL_CTL_ADD, r->lfd, &e);
    }
    if (ready) {
        FILE *f = fopen(ready, "w");
        if (!f) {
            fprintf(stderr, "ldc_delay_relay: cannot write %s: %s\n", ready, strerror(errno));
            return 1;
        }
        fprintf(f, "%d\n", (int)getpid());
        fclose(f);
    }

    struct epoll_event evs[128];
    while (!g_stop) {
        int n = epoll_wait(g_ep, evs, 128, -1);
        if (n < 0 && errno != EINTR) {
            perror("ldc_delay_relay: epoll_wait");
            return 1;
        }
        uint64_t now = now_ns();
        for (int k = 0; k < n; k++) {
            handle *h = evs[k].data.ptr;
            if (h->kind == 0) {
                accept_all(h->p);
            } else if (h->kind == 3) {
                uint64_t expirations;
                if (read(g_tfd, &expirations, sizeof expirations) < 0 && errno != EAGAIN)
                    perror("ldc_delay_relay: timerfd");
            } else {
                pair *p = h->p;
                int i = h->kind - 1;
                if (p->dead) continue;
                if (i == 1 && p->connecting && (evs[k].events & (EPOLLOUT | EPOLLERR))) {
                    int err = 0;
                    socklen_t len = sizeof err;
                    getsockopt(p->fd[1], SOL_SOCKET, SO_ERROR, &err, &len);
                    if (err) {
                        kill_pair(p);
                        continue;
                    }
                    p->connecting = 0;
                }
                if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_side(p, i, now);
            }
        }
        /* Write what is due, find the next due time, register what each side waits for, and
         * free the pairs that are done (both directions shut, or killed). */
        uint64_t next = 0;
        now = now_ns();
        pair **link = &g_pairs;
        while (*link) {
            pair *p = *link;
            if (!p->dead && !p->connecting)
                for (int i = 0; i < 2; i++) {
                    uint64_t due = flush_dir(p, &p->d[i], now);
                    if (due && (!next || due < next)) next = due;
                    if (p->dead) break;
                }
            if (!p->dead && p->d[0].shut && p->d[1].shut) kill_pair(p);
            if (p->dead) {
                *link = p->next;
                free(p);
                continue;
            }
            link = &p->next;
        }
        for (pair *p = g_pairs; p; p = p->next) {
            update_interest(p, 0);
            update_interest(p, 1);
        }
        struct itimerspec its = {{0, 0}, {0, 0}};
        if (next) {
            its.it_value.tv_sec = (time_t)(next / 1000000000u);
            its.it_value.tv_nsec = (long)(next % 1000000000u);
        }
        timerfd_settime(g_tfd, TFD_TIMER_ABSTIME, &its, NULL);
    }
    return 0;
}
