/* Same-host all-reduce through a shared-memory segment. Rank 0 creates it (its name derives
 * from the fingerprint and rank 0's port), every rank maps it, then rank 0 unlinks it, so
 * nothing outlives the processes. The buffer is reduced in chunks that stay in cache, through
 * two banks used alternately; per chunk (sequence number q, lifetime-monotonic):
 *   1. once every rank is done with the bank's previous use (copied >= q-2), each rank copies
 *      the other ranks' shares of its chunk into its slot of bank q%2 (its own share it reads
 *      from its buffer) and publishes posted = q;
 *   2. once every rank has posted q, each rank reduces its 1/world share of the chunk (whole
 *      cache lines) over the ranks in rank order into the bank's result and into its own
 *      buffer, and publishes reduced = q;
 *   3. once every rank has reduced q, each copies the other shares of the result out and
 *      publishes copied = q.
 * Each element is summed once, by one rank, so every rank gets the same bits. Per rank that
 * is one read of its input and one write of its output in memory, as a memcpy: the memory
 * traffic floor (bench_allreduce compares with memcpy in two processes at once). Buffers up to
 * 64 KiB skip steps 2-3: every rank reduces all slots in rank order (same bits again). Counters are
 * C11 atomics (release/acquire); a waiter spins (about 2 ms when the ranks fit the cores, a few
 * pauses when they do not; core/spin.h), then sleeps on the rank's futex word (woken by its next
 * publish, or after 1 ms), and every millisecond checks the TCP mesh for a peer whose process
 * died (EOF), so a dead peer fails the call at once instead of at the timeout. Sleeping matters
 * on a loaded machine: a spinning waiter takes the core its peer needs. */
#include "collective/net_internal.h"
#include "core/error.h"
#include "core/spin.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__SSE2__)
#include <immintrin.h>
#endif

#define SHM_MAGIC 0x4c44534d454d3031ull
#define SHM_CHUNK_BYTES (256u * 1024u) /* per slot */
#define SHM_LINE 64
#define SHM_SMALL_BYTES (64u * 1024u) /* one wait instead of three */

typedef struct shm_flags {
    _Atomic uint64_t posted, reduced, copied;
    /* futex word: bumped on every publish; waiters > 0 asks the publisher to wake them */
    _Atomic uint32_t event, waiters;
    /* The rank's call (sequence number; bytes | detail << 48), by the parity of its first
     * chunk: written before that chunk's posted, read by the others after it. */
    uint64_t call[2][2];
} shm_flags;
_Static_assert(sizeof(shm_flags) == SHM_LINE, "one cache line of flags per rank");

struct net_shm {
    void *base;
    size_t size;
    shm_flags *flags; /* world entries */
    char *banks;      /* 2 banks of (world slots + 1 result) chunks */
    uint64_t seq;
    char name[96];
};

static size_t bank_bytes(int world) { return (size_t)(world + 1) * SHM_CHUNK_BYTES; }

static size_t segment_size(int world) {
    return SHM_LINE + (size_t)world * sizeof(shm_flags) + 2 * bank_bytes(world);
}

static dist_status map_segment(net_shm *s, int fd, int world) {
    s->size = segment_size(world);
    void *p = mmap(NULL, s->size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) return dist_error_errno(DIST_SYSTEM, errno, "shm: mmap '%s'", s->name);
    s->base = p;
    s->flags = (shm_flags *)((char *)p + SHM_LINE);
    s->banks = (char *)p + SHM_LINE + (size_t)world * sizeof(shm_flags);
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
        ops[k++] = (net_op){r, true, (char *)&mine, 1, 0, {0}};
        ops[k++] = (net_op){r, false, (char *)&theirs[r], 1, 0, {0}};
    }
    net_frame f = net_frame_next(c, NET_FRAME_SETUP, 0, 1);
    DIST_TRY(net_xfer(c, &f, ops, k, deadline, "shared-memory setup"));
    *all_ok = ok;
    for (int r = 0; r < c->world; r++)
        if (r != c->rank && !theirs[r]) *all_ok = false;
    return DIST_OK;
}

dist_status net_shm_setup(dist_net_comm *c, bool required, double deadline) {
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
        /* every rank saw the same agreement, so they all fall back (or fail) together */
        if (!required) {
            dist_log(DIST_LOG_WARN, "net_comm rank %d: shared memory unavailable, using TCP%s%s",
                     c->rank, why[0] ? ": " : "", why);
            goto out;
        }
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

/* Copies the result out. Above a few MiB the destination will not be read again soon, so
 * streaming stores skip reading each line before writing it (a third of the memory traffic,
 * which bounds this transport). */
#define SHM_STREAM_MIN_BYTES (4u << 20)
static void copy_out(char *dst, const char *src, size_t n, bool stream) {
#if defined(__SSE2__)
    if (stream) {
        size_t i = 0;
        while (i < n && ((uintptr_t)(dst + i) & 15)) {
            dst[i] = src[i];
            i++;
        }
        for (; i + 64 <= n; i += 64) {
            _mm_stream_si128((__m128i *)(dst + i), _mm_loadu_si128((const __m128i *)(src + i)));
            _mm_stream_si128((__m128i *)(dst + i + 16),
                             _mm_loadu_si128((const __m128i *)(src + i + 16)));
            _mm_stream_si128((__m128i *)(dst + i + 32),
                             _mm_loadu_si128((const __m128i *)(src + i + 32)));
            _mm_stream_si128((__m128i *)(dst + i + 48),
                             _mm_loadu_si128((const __m128i *)(src + i + 48)));
        }
        memcpy(dst + i, src + i, n - i);
        return;
    }
#endif
    (void)stream;
    memcpy(dst, src, n);
}

/* A peer whose socket reports EOF or an error has died, unless it already published what this
 * wait needs (its counter at `which` reached q): a peer that finished its last collective may
 * close its end while a slower rank still waits for another rank's counter. */
static dist_status check_peers(dist_net_comm *c, size_t which, uint64_t q) {
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
        if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            int err = errno;
            _Atomic uint64_t *ctr = (_Atomic uint64_t *)((char *)&c->shm->flags[who[i]] + which);
            if (atomic_load_explicit(ctr, memory_order_acquire) >= q) continue;
            return net_fail_peer(c, DIST_PEER_LOST, who[i], "all-reduce",
                                 k == 0 ? "end of stream" : strerror(err));
        }
    }
    return DIST_OK;
}

static void publish(shm_flags *f, _Atomic uint64_t *ctr, uint64_t q) {
    atomic_store_explicit(ctr, q, memory_order_release);
    atomic_fetch_add_explicit(&f->event, 1, memory_order_seq_cst);
    if (atomic_load_explicit(&f->waiters, memory_order_seq_cst))
        syscall(SYS_futex, (uint32_t *)&f->event, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0);
}

/* Sleeps until rank f publishes something (or 1 ms passes). */
static void sleep_on(shm_flags *f, _Atomic uint64_t *ctr, uint64_t q) {
    uint32_t seen = atomic_load_explicit(&f->event, memory_order_seq_cst);
    atomic_fetch_add_explicit(&f->waiters, 1, memory_order_seq_cst);
    if (atomic_load_explicit(ctr, memory_order_acquire) < q) {
        struct timespec ts = {0, 1000000};
        syscall(SYS_futex, (uint32_t *)&f->event, FUTEX_WAIT, seen, &ts, NULL, 0);
    }
    atomic_fetch_sub_explicit(&f->waiters, 1, memory_order_seq_cst);
}

/* Waits until every rank's counter (offset `which` in shm_flags) reaches q. */
static dist_status wait_all(dist_net_comm *c, size_t which, uint64_t q, double deadline) {
    net_shm *s = c->shm;
    /* spin first (core/spin.h): ~2 ms when the ranks fit the cores, a few pauses otherwise */
    dist_spin sp;
    dist_spin_start(&sp, c->spin_s > 0 ? DIST_SPIN_LONG_NS : 0);
    int spinning = 1;
    double next_check = 0;
    for (int r = 0; r < c->world;) {
        _Atomic uint64_t *ctr = (_Atomic uint64_t *)((char *)&s->flags[r] + which);
        if (atomic_load_explicit(ctr, memory_order_acquire) >= q) {
            r++;
            continue;
        }
        if (spinning && (spinning = dist_spin_again(&sp))) continue;
        double now = net_now();
        if (now >= next_check) {
            DIST_TRY(check_peers(c, which, q));
            if (now >= deadline) {
                char got[96];
                snprintf(got, sizeof got, "its step counter %llu, awaited %llu",
                         (unsigned long long)atomic_load_explicit(ctr, memory_order_acquire),
                         (unsigned long long)q);
                return net_fail_peer(c, DIST_TIMEOUT, r, "all-reduce", got);
            }
            next_check = now + 1e-3;
        }
        sleep_on(&s->flags[r], ctr, q);
    }
    return DIST_OK;
}

/* Before the first chunk q of a call is posted: the call, for the others to check. */
static void post_call(net_shm *s, int me, uint64_t q, const net_frame *f) {
    s->flags[me].call[q & 1][0] = f->seq;
    s->flags[me].call[q & 1][1] = f->bytes | (uint64_t)f->detail << 48;
}

/* Once every rank has posted q: every rank's call is this one (else the communicator fails,
 * naming the rank and both sizes). */
static dist_status check_calls(dist_net_comm *c, uint64_t q, const net_frame *f) {
    for (int r = 0; r < c->world; r++) {
        if (r == c->rank) continue;
        const uint64_t *w = c->shm->flags[r].call[q & 1];
        net_frame t = {f->kind, (uint32_t)(w[1] >> 48), w[0], w[1] & ((1ull << 48) - 1)};
        unsigned char b[NET_FRAME_BYTES];
        net_frame_encode(&t, b);
        DIST_TRY(net_frame_check(c, b, f, r));
    }
    return DIST_OK;
}

/* Small buffers: one chunk, one wait. Every rank reduces all slots itself, in rank order (the
 * same bits everywhere), and publishes copied = q once it has read them. */
static dist_status small_all_reduce(dist_net_comm *c, const net_frame *f, void *data, size_t count,
                                    dist_dtype dtype, dist_reduce_op op, double deadline) {
    net_shm *s = c->shm;
    int n = c->world, me = c->rank;
    uint64_t q = ++s->seq;
    char *bank = s->banks + (q & 1) * bank_bytes(n);
    if (q > 2) DIST_TRY(wait_all(c, offsetof(shm_flags, copied), q - 2, deadline));
    memcpy(bank + (size_t)me * SHM_CHUNK_BYTES, data, count * dist_dtype_size(dtype));
    post_call(s, me, q, f);
    publish(&s->flags[me], &s->flags[me].posted, q);
    DIST_TRY(wait_all(c, offsetof(shm_flags, posted), q, deadline));
    DIST_TRY(check_calls(c, q, f));
    net_reduce_slots(bank, SHM_CHUNK_BYTES, data, count, dtype, op, n);
    publish(&s->flags[me], &s->flags[me].copied, q);
    return DIST_OK;
}

/* Reduces bytes [lo, hi) of the chunk over the ranks into both `mine` and the shared result.
 * Rank me's values are its own buffer's (only the other shares went into its slot). The order
 * is rank order, so the bits equal every rank's own reduction of the slots; rank 0 folds the
 * others straight into its own buffer. So does rank 1 of two for SUM and MEAN: a + b == b + a
 * to the bit (but for which NaN's payload NaN + NaN keeps), and it saves a copy. Not for MAX
 * and MIN, where +0 and -0 compare equal and the order picks one. */
static void reduce_share(const char *bank, char *mine, char *result, int n, int me, size_t lo,
                         size_t hi, dist_dtype dtype, dist_reduce_op op) {
    size_t esize = dist_dtype_size(dtype);
    bool in_mine = me == 0 || (n == 2 && (op == DIST_REDUCE_SUM || op == DIST_REDUCE_MEAN));
    for (size_t b = lo; b < hi; b += NET_REDUCE_BLOCK_BYTES) {
        size_t bytes = hi - b < NET_REDUCE_BLOCK_BYTES ? hi - b : NET_REDUCE_BLOCK_BYTES,
               count = bytes / esize;
        char *acc = in_mine ? mine + b : result + b;
        if (!in_mine) memcpy(acc, bank + b, bytes);
        for (int r = in_mine ? 0 : 1; r < n; r++) {
            if (in_mine && r == me) continue;
            const char *src = r == me ? mine + b : bank + (size_t)r * SHM_CHUNK_BYTES + b;
            dist_comm_accumulate(dtype, op, acc, src, count);
        }
        if (op == DIST_REDUCE_MEAN) dist_comm_divide(dtype, acc, count, n);
        memcpy(in_mine ? result + b : mine + b, acc, bytes);
    }
}

dist_status net_shm_all_reduce(dist_net_comm *c, const net_frame *f, void *data, size_t count,
                               dist_dtype dtype, dist_reduce_op op, double deadline) {
    size_t esize = dist_dtype_size(dtype);
    if (count * esize <= SHM_SMALL_BYTES)
        return small_all_reduce(c, f, data, count, dtype, op, deadline);
    net_shm *s = c->shm;
    int n = c->world, me = c->rank;
    size_t bank_n = bank_bytes(n), chunk_elems = SHM_CHUNK_BYTES / esize;
    bool stream = count * esize >= SHM_STREAM_MIN_BYTES;
    for (size_t off = 0; off < count; off += chunk_elems) {
        size_t len = (count - off < chunk_elems ? count - off : chunk_elems) * esize;
        uint64_t q = ++s->seq;
        char *bank = s->banks + (q & 1) * bank_n;
        char *result = bank + (size_t)n * SHM_CHUNK_BYTES;
        /* everyone is done with this bank's last use (slots and result) */
        if (q > 2) DIST_TRY(wait_all(c, offsetof(shm_flags, copied), q - 2, deadline));
        /* this rank's share of the chunk, in bytes: whole elements, whole cache lines */
        size_t share = (len + (size_t)n - 1) / (size_t)n;
        share = (share + SHM_LINE - 1) & ~(size_t)(SHM_LINE - 1);
        size_t lo = (size_t)me * share < len ? (size_t)me * share : len;
        size_t hi = lo + share < len ? lo + share : len;
        /* Only the other ranks' shares go into the slot: this rank reads its own share from
         * its buffer, and writes the result straight back into it. */
        char *slot = bank + (size_t)me * SHM_CHUNK_BYTES, *mine = (char *)data + off * esize;
        memcpy(slot, mine, lo);
        memcpy(slot + hi, mine + hi, len - hi);
        if (off == 0) post_call(s, me, q, f);
        publish(&s->flags[me], &s->flags[me].posted, q);
        DIST_TRY(wait_all(c, offsetof(shm_flags, posted), q, deadline));
        if (off == 0) DIST_TRY(check_calls(c, q, f));
        if (lo < hi) reduce_share(bank, mine, result, n, me, lo, hi, dtype, op);
        publish(&s->flags[me], &s->flags[me].reduced, q);
        DIST_TRY(wait_all(c, offsetof(shm_flags, reduced), q, deadline));
        copy_out(mine, result, lo, stream);
        copy_out(mine + hi, result + hi, len - hi, stream);
        publish(&s->flags[me], &s->flags[me].copied, q);
    }
#if defined(__SSE2__)
    if (stream) _mm_sfence();
#endif
    return DIST_OK;
}
