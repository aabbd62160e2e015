/* Same-host all-reduce through a shared-memory segment. Rank 0 creates it (its name derives
 * from the fingerprint and rank 0's port), every rank maps it, then rank 0 unlinks it, so
 * nothing outlives the processes. The buffer is reduced in chunks that stay in cache, through
 * two banks used alternately; per chunk (sequence number q, lifetime-monotonic):
 *   1. each rank copies its chunk into its slot of bank q%2 and publishes posted = q;
 *   2. once every rank has posted q (and copied q-2 out of this bank's result), each rank
 *      sums its 1/world share of the chunk over the slots in rank order into the bank's result
 *      and publishes reduced = q;
 *   3. once every rank has reduced q, each copies the result out and publishes copied = q.
 * Each element is summed once, by one rank, so every rank gets the same bits. Counters are C11
 * atomics (release/acquire); a waiter spins, then yields, then naps, and every millisecond
 * checks the TCP mesh for a peer whose process died (EOF), so a dead peer fails the call at
 * once instead of at the timeout. */
#include "collective/net_internal.h"
#include "core/error.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define SHM_MAGIC 0x4c44534d454d3031ull
#define SHM_CHUNK_FLOATS (32u * 1024u) /* 128 KiB per slot */
#define SHM_LINE 64

typedef struct shm_flags {
    _Atomic uint64_t posted, reduced, copied;
    char pad[SHM_LINE - 3 * sizeof(uint64_t)];
} shm_flags;

struct net_shm {
    void *base;
    size_t size;
    shm_flags *flags; /* world entries */
    float *banks;     /* 2 banks of (world slots + 1 result) chunks */
    uint64_t seq;
    char name[96];
};

static size_t bank_floats(int world) { return (size_t)(world + 1) * SHM_CHUNK_FLOATS; }

static size_t segment_size(int world) {
    return SHM_LINE + (size_t)world * sizeof(shm_flags) + 2 * bank_floats(world) * sizeof(float);
}

static dist_status map_segment(net_shm *s, int fd, int world) {
    s->size = segment_size(world);
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return dist_error_errno(DIST_SYSTEM, errno, "shm: mmap '%s'", s->name);
    s->base = p;
    s->flags = (shm_flags *)((char *)p + SHM_LINE);
    s->banks = (float *)((char *)p + SHM_LINE + (size_t)world * sizeof(shm_flags));
    return DIST_OK;
}

void net_shm_destroy(net_shm *s) {
    if (!s) return;
    if (s->base) munmap(s->base, s->size);
    free(s);
}

/* One byte (1: ok) from every rank to every other rank: the setup's agreement step. */
static dist_status agree(dist_net_comm *c, bool ok, double deadline, bool *all_ok) {
    unsigned char mine = ok, theirs[NET_MAX_WORLD];
    net_op ops[2 * NET_MAX_WORLD];
    int k = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        ops[k++] = (net_op){r, true, (char *)&mine, 1, 0};
        ops[k++] = (net_op){r, false, (char *)&theirs[r], 1, 0};
    }
    DIST_TRY(net_xfer(c, ops, k, deadline, "shared-memory setup"));
    *all_ok = ok;
    for (int r = 0; r < c->world; r++)
        if (r != c->rank && !theirs[r]) *all_ok = false;
    return DIST_OK;
}

dist_status net_shm_setup(dist_net_comm *c, double deadline) {
    net_shm *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "shm: out of memory");
    char host[NET_ADDR_CAP];
    int port = 0;
    (void)net_split_address(c->addrs[0], host, sizeof host, &port);
    snprintf(s->name, sizeof s->name, "/libdist-%016llx-%d", (unsigned long long)c->fingerprint,
             port);
    dist_status st = DIST_OK, local = DIST_OK;
    char why[512] = "";
    bool all_ok;
    int fd = -1;
    if (c->rank == 0) {
        shm_unlink(s->name); /* a stale one from a crashed run */
        fd = shm_open(s->name, O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0)
            local = dist_error_errno(DIST_SYSTEM, errno, "shm: create '%s'", s->name);
        else if (ftruncate(fd, (off_t)segment_size(c->world)) < 0)
            local = dist_error_errno(DIST_SYSTEM, errno, "shm: size '%s'", s->name);
        else
            local = map_segment(s, fd, c->world);
        if (local == DIST_OK) *(uint64_t *)s->base = SHM_MAGIC;
        if (local != DIST_OK) snprintf(why, sizeof why, "%s", dist_last_error());
        DIST_TRY_GOTO(agree(c, local == DIST_OK, deadline, &all_ok), st, out); /* created */
    } else {
        DIST_TRY_GOTO(agree(c, true, deadline, &all_ok), st, out);
        if (all_ok) {
            fd = shm_open(s->name, O_RDWR | O_CLOEXEC, 0600);
            if (fd < 0)
                local = dist_error_errno(DIST_SYSTEM, errno, "shm: open '%s'", s->name);
            else
                local = map_segment(s, fd, c->world);
            if (local == DIST_OK && *(uint64_t *)s->base != SHM_MAGIC)
                local = dist_error(DIST_INTERNAL, "shm: '%s' has no header", s->name);
            if (local != DIST_OK) snprintf(why, sizeof why, "%s", dist_last_error());
        }
    }
    if (all_ok) DIST_TRY_GOTO(agree(c, local == DIST_OK, deadline, &all_ok), st, out); /* mapped */
    if (c->rank == 0) shm_unlink(s->name);
    if (!all_ok) {
        st = dist_error(DIST_SYSTEM, "shared memory could not be set up on every rank%s%s",
                        why[0] ? ": " : "", why);
        goto out;
    }
    c->shm = s;
    s = NULL;
out:
    if (fd >= 0) close(fd);
    net_shm_destroy(s);
    return st;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* A peer whose socket reports EOF or an error has died. */
static dist_status check_peers(dist_net_comm *c) {
    struct pollfd pf[NET_MAX_WORLD];
    int who[NET_MAX_WORLD], n = 0;
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        pf[n] = (struct pollfd){c->fds[r], POLLIN, 0};
        who[n++] = r;
    }
    if (poll(pf, (nfds_t)n, 0) <= 0) return DIST_OK;
    for (int i = 0; i < n; i++) {
        if (!pf[i].revents) continue;
        char b;
        ssize_t k = recv(pf[i].fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return net_fail_peer(c, DIST_PEER_LOST, who[i], "all-reduce",
                                 k == 0 ? "end of stream" : strerror(errno));
    }
    return DIST_OK;
}

/* Waits until every rank's counter (offset `which` in shm_flags) reaches q. */
static dist_status wait_all(dist_net_comm *c, size_t which, uint64_t q, double deadline) {
    net_shm *s = c->shm;
    unsigned spins = 0;
    double started = 0, next_check = 0;
    for (int r = 0; r < c->world;) {
        _Atomic uint64_t *ctr = (_Atomic uint64_t *)((char *)&s->flags[r] + which);
        if (atomic_load_explicit(ctr, memory_order_acquire) >= q) {
            r++;
            continue;
        }
        spins++;
        if (spins < 4000) {
            cpu_relax();
            continue;
        }
        double now = net_now();
        if (started == 0) started = now;
        if (now >= next_check) {
            DIST_TRY(check_peers(c));
            if (now >= deadline) return net_fail_peer(c, DIST_TIMEOUT, r, "all-reduce", NULL);
            next_check = now + 1e-3;
        }
        if (now - started < 2e-3) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
    return DIST_OK;
}

dist_status net_shm_all_reduce(dist_net_comm *c, float *data, size_t count, bool mean,
                               double deadline) {
    net_shm *s = c->shm;
    int n = c->world, me = c->rank;
    size_t bank_n = bank_floats(n);
    for (size_t off = 0; off < count; off += SHM_CHUNK_FLOATS) {
        size_t len = count - off < SHM_CHUNK_FLOATS ? count - off : SHM_CHUNK_FLOATS;
        uint64_t q = ++s->seq;
        float *bank = s->banks + (q & 1) * bank_n;
        float *result = bank + (size_t)n * SHM_CHUNK_FLOATS;
        memcpy(bank + (size_t)me * SHM_CHUNK_FLOATS, data + off, len * sizeof(float));
        atomic_store_explicit(&s->flags[me].posted, q, memory_order_release);
        DIST_TRY(wait_all(c, offsetof(shm_flags, posted), q, deadline));
        if (q > 2) DIST_TRY(wait_all(c, offsetof(shm_flags, copied), q - 2, deadline));
        size_t share = (len + (size_t)n - 1) / (size_t)n;
        share = (share + 15) & ~(size_t)15;
        size_t lo = (size_t)me * share, hi = lo + share < len ? lo + share : len;
        if (lo < hi) {
            const float *s0 = bank, *s1 = bank + SHM_CHUNK_FLOATS;
            for (size_t i = lo; i < hi; i++) result[i] = s0[i] + s1[i];
            for (int r = 2; r < n; r++) {
                const float *sr = bank + (size_t)r * SHM_CHUNK_FLOATS;
                for (size_t i = lo; i < hi; i++) result[i] += sr[i];
            }
            if (mean)
                for (size_t i = lo; i < hi; i++) result[i] /= (float)n;
        }
        atomic_store_explicit(&s->flags[me].reduced, q, memory_order_release);
        DIST_TRY(wait_all(c, offsetof(shm_flags, reduced), q, deadline));
        memcpy(data + off, result, len * sizeof(float));
        atomic_store_explicit(&s->flags[me].copied, q, memory_order_release);
    }
    return DIST_OK;
}
