/* The TCP all-reduce's algorithms (collective/net_allreduce.c) with real processes on
 * 127.0.0.1: each one forced, worlds of 2, 3, 4, 5 and 8 ranks, 1 element to past auto's
 * crossovers, every dtype and op. Every rank computes the expected bits itself from every
 * rank's inputs (a deterministic generator), in the order the algorithm promises: rank order
 * x0 + x1 + ... for direct, doubling and scatter; from the chunk's own rank on for the ring
 * (xc + xc+1 + ..., cyclically). Ranks also report a digest per call, which the parent compares
 * across ranks and algorithms; the same over TLS. Then auto in buckets against one buffer, the
 * setting (options over $DIST_ALLREDUCE_ALGORITHM), ranks that disagree on it, and a rank that
 * never arrives or dies under doubling and scatter-gather (the direct exchange's and the
 * ring's failures are test_net_comm.c's).
 *
 * Children never call ck_assert: they _exit(1) with a message in their report. */
#include "collective/net_comm.h"
#include "collective/net_internal.h"
#include "proc_testutil.h"
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdint.h>

/* ---- the expected bits, written here independently of core/comm.c ---- */

static const dist_dtype k_dtypes[] = {DIST_F32, DIST_F16, DIST_BF16, DIST_I32, DIST_U8, DIST_I64};
#define NDTYPES (sizeof k_dtypes / sizeof k_dtypes[0])
static const dist_reduce_op k_ops[] = {DIST_REDUCE_SUM, DIST_REDUCE_MEAN, DIST_REDUCE_MAX,
                                       DIST_REDUCE_MIN};
static const char *const k_op_names[] = {"SUM", "MEAN", "MAX", "MIN"};
#define NOPS (sizeof k_ops / sizeof k_ops[0])

static uint32_t mix(uint32_t x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

/* Rank r's element i: floats of both signs from 2^-6 to 2^4 with every bit of the mantissa used
 * (their sums round, so the order of the additions shows in the bits) and never zero (no +0/-0
 * ties for MAX and MIN); integers of both signs, u8 that wrap. */
static void input_element(dist_dtype dt, int r, size_t i, void *out) {
    uint32_t h = mix((uint32_t)i * 2654435761u ^ mix((uint32_t)r + 1u)), g = mix(h);
    float f = (1.0f + (float)(h & 0x7fffff) / 8388608.0f) * ldexpf(1.0f, (int)(g % 10) - 6);
    if (g & 0x100) f = -f;
    switch (dt) {
    case DIST_F32: memcpy(out, &f, 4); break;
    case DIST_F16: {
        _Float16 x = (_Float16)f;
        if (x == 0) x = (_Float16)0.375f;
        memcpy(out, &x, 2);
        break;
    }
    case DIST_BF16: {
        uint32_t u;
        memcpy(&u, &f, 4);
        uint16_t b = (uint16_t)(u >> 16); /* any bf16 is an input; rounding is on the output */
        memcpy(out, &b, 2);
        break;
    }
    case DIST_I32: {
        int32_t v = (int32_t)(h % 2000001u) - 1000000;
        memcpy(out, &v, 4);
        break;
    }
    case DIST_U8: {
        uint8_t v = (uint8_t)(h >> 8);
        memcpy(out, &v, 1);
        break;
    }
    case DIST_I64: {
        int64_t v = ((int64_t)h << 18) - ((int64_t)1 << 49);
        memcpy(out, &v, 8);
        break;
    }
    default: break;
    }
}

static float half_in(dist_dtype dt, uint16_t h) {
    if (dt == DIST_F16) {
        _Float16 x;
        memcpy(&x, &h, 2);
        return (float)x;
    }
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* float to f16 (the C conversion) or bf16 (round to nearest even), after every step */
static uint16_t half_out(dist_dtype dt, float f) {
    if (dt == DIST_F16) {
        _Float16 x = (_Float16)f;
        uint16_t h;
        memcpy(&h, &x, 2);
        return h;
    }
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#define PICK(op, a, b)                                                                             \
    ((op) == DIST_REDUCE_MAX   ? ((a) > (b) ? (a) : (b))                                           \
     : (op) == DIST_REDUCE_MIN ? ((a) < (b) ? (a) : (b))                                           \
                               : (a) + (b))

/* acc = a (op) b for one element: the first operand is the library's accumulator. */
static void step(dist_dtype dt, dist_reduce_op op, void *acc, const void *a, const void *b) {
    switch (dt) {
    case DIST_F32: {
        float x, y, z;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        z = PICK(op, x, y);
        memcpy(acc, &z, 4);
        break;
    }
    case DIST_F16:
    case DIST_BF16: {
        uint16_t x, y;
        memcpy(&x, a, 2);
        memcpy(&y, b, 2);
        float p = half_in(dt, x), q = half_in(dt, y);
        uint16_t z = half_out(dt, PICK(op, p, q));
        memcpy(acc, &z, 2);
        break;
    }
    case DIST_I32: {
        int32_t x, y, z;
        memcpy(&x, a, 4);
        memcpy(&y, b, 4);
        z = PICK(op, x, y);
        memcpy(acc, &z, 4);
        break;
    }
    case DIST_U8: {
        uint8_t x = *(const uint8_t *)a, y = *(const uint8_t *)b;
        *(uint8_t *)acc = (uint8_t)PICK(op, x, y);
        break;
    }
    case DIST_I64: {
        int64_t x, y, z;
        memcpy(&x, a, 8);
        memcpy(&y, b, 8);
        z = PICK(op, x, y);
        memcpy(acc, &z, 8);
        break;
    }
    default: break;
    }
}

static void divide(dist_dtype dt, void *acc, int n) {
    switch (dt) {
    case DIST_F32: {
        float x;
        memcpy(&x, acc, 4);
        x /= (float)n;
        memcpy(acc, &x, 4);
        break;
    }
    case DIST_F16:
    case DIST_BF16: {
        uint16_t h;
        memcpy(&h, acc, 2);
        h = half_out(dt, half_in(dt, h) / (float)n);
        memcpy(acc, &h, 2);
        break;
    }
    case DIST_I32: {
        int32_t x;
        memcpy(&x, acc, 4);
        x /= n;
        memcpy(acc, &x, 4);
        break;
    }
    case DIST_U8: *(uint8_t *)acc = (uint8_t)(*(uint8_t *)acc / n); break;
    case DIST_I64: {
        int64_t x;
        memcpy(&x, acc, 8);
        x /= n;
        memcpy(acc, &x, 8);
        break;
    }
    default: break;
    }
}

typedef enum { ORDER_RANK, ORDER_RING, ORDER_REVERSED } sum_order;

/* The ring's chunk of element i: count / n elements per chunk, the first count % n one more. */
static int ring_chunk(size_t count, int n, size_t i) {
    size_t base = count / (size_t)n, rem = count % (size_t)n, big = rem * (base + 1);
    return i < big ? (int)(i / (base + 1)) : (int)(rem + (i - big) / base);
}

/* The all-reduce of n ranks' inputs (rank r's at in + r * count elements), summed in `order`:
 *   ORDER_RANK      acc = x0; acc = acc (op) x1; ... (direct, doubling, scatter)
 *   ORDER_RING      chunk c: acc = xc; acc = xc+1 (op) acc; ... cyclically (the ring: each rank
 *                   adds what it received to its own input)
 *   ORDER_REVERSED  acc = x(n-1); acc = acc (op) x(n-2); ... (an order no algorithm uses) */
static void expected(dist_dtype dt, dist_reduce_op op, sum_order order, int n, size_t count,
                     const char *in, char *out) {
    size_t es = dist_dtype_size(dt);
    for (size_t i = 0; i < count; i++) {
        unsigned char acc[8];
        int first = order == ORDER_RING       ? ring_chunk(count, n, i)
                    : order == ORDER_REVERSED ? n - 1
                                              : 0;
        memcpy(acc, in + ((size_t)first * count + i) * es, es);
        for (int j = 1; j < n; j++) {
            int r = order == ORDER_REVERSED ? n - 1 - j : (first + j) % n;
            const char *x = in + ((size_t)r * count + i) * es;
            if (order == ORDER_RING)
                step(dt, op, acc, x, acc);
            else
                step(dt, op, acc, acc, x);
        }
        if (op == DIST_REDUCE_MEAN) divide(dt, acc, n);
        memcpy(out + i * es, acc, es);
    }
}

static uint64_t fnv1a(const void *p, size_t len) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
    return h;
}

/* ---- every algorithm, every world ---- */

static const dist_net_allreduce_algorithm k_algos[] = {
    DIST_NET_ALLREDUCE_DIRECT, DIST_NET_ALLREDUCE_DOUBLING, DIST_NET_ALLREDUCE_SCATTER,
    DIST_NET_ALLREDUCE_RING, DIST_NET_ALLREDUCE_AUTO};
#define NALGOS (sizeof k_algos / sizeof k_algos[0])

/* Odd counts, powers of two, fewer elements than ranks, and sizes past auto's crossovers
 * (70001 float32 = 280 KB). */
static const size_t k_counts[] = {1, 2, 3, 5, 8, 31, 257, 1000, 4099, 20011, 70001};
#define NCOUNTS (sizeof k_counts / sizeof k_counts[0])
/* Past one scatter piece (NET_SCATTER_PIECE_BYTES), float32 only. */
#define LARGE_COUNT ((size_t)(NET_SCATTER_PIECE_BYTES / 4) + 4099)

typedef struct algo_case {
    int tls;
    int all_dtypes; /* 0: float32 and bfloat16 only, SUM and MEAN (the TLS run) */
    /* each algorithm's communicator has ports of its own: they are all open at once */
    cluster ports[NALGOS];
} algo_case;

/* The typed communicator (core/comm.h), which carries every dtype. */
static dist_comm *create_with(const cluster *cl, int rank, dist_net_allreduce_algorithm a,
                              int tls) {
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.allreduce_algorithm = a;
    o.tls = tls;
    /* up to 8 processes on 2 cores, beside other tests: 10 s to join ran out once in a clean
     * CI run (rank 0 waiting for 2 ranks still starting); a rank that never comes still fails */
    o.connect_timeout_s = 60;
    o.timeout_s = 60;
    dist_comm *c = NULL;
    dist_status st = dist_comm_create_net(&o, &c);
    CHILD_CHECK(st == DIST_OK, "rank %d create (%s): %s %s", rank, net_allreduce_name(a),
                dist_status_name(st), dist_last_error());
    return c;
}

/* The expected bits of one dtype, op and count, in rank order and in the ring's. */
typedef struct expectation {
    dist_dtype dt;
    dist_reduce_op op;
    size_t count;
    const char *inputs; /* rank r's at inputs + r * count elements */
    char *rank_order, *ring_order;
} expectation;

/* One all-reduce checked against the expected bits; its digest goes to the report. */
static void check_one(dist_comm *comm, dist_net_allreduce_algorithm a, const expectation *e,
                      void *buf) {
    dist_net_comm *c = dist_comm_net_handle(comm);
    int n = dist_net_comm_world(c), rank = dist_net_comm_rank(c);
    size_t es = dist_dtype_size(e->dt), bytes = e->count * es;
    memcpy(buf, e->inputs + (size_t)rank * bytes, bytes);
    dist_net_allreduce_algorithm ran = net_allreduce_pick(c, bytes);
    dist_status st = dist_comm_all_reduce(comm, 0, buf, e->count, e->dt, e->op, 0);
    CHILD_CHECK(st == DIST_OK, "%s %s %s count %zu: %s %s", net_allreduce_name(a),
                dist_dtype_name(e->dt), k_op_names[e->op], e->count, dist_status_name(st),
                dist_last_error());
    bool ring = ran == DIST_NET_ALLREDUCE_RING;
    const char *want = ring ? e->ring_order : e->rank_order;
    if (memcmp(buf, want, bytes) != 0) {
        size_t i = 0;
        while (memcmp((char *)buf + i * es, want + i * es, es) == 0) i++;
        uint64_t g = 0, w = 0;
        memcpy(&g, (char *)buf + i * es, es);
        memcpy(&w, want + i * es, es);
        child_fail("world %d, %s (ran %s), %s %s, count %zu: element %zu has bits 0x%llx, the %s "
                   "order gives 0x%llx",
                   n, net_allreduce_name(a), net_allreduce_name(ran), dist_dtype_name(e->dt),
                   k_op_names[e->op], e->count, i, (unsigned long long)g, ring ? "ring's" : "rank",
                   (unsigned long long)w);
    }
    fprintf(g_out, "%s %s %s %zu %016llx\n", net_allreduce_name(a), dist_dtype_name(e->dt),
            k_op_names[e->op], e->count, (unsigned long long)fnv1a(buf, bytes));
}

/* Every algorithm's communicator is made first, then each case's inputs and expected bits are
 * computed once and every algorithm runs it. */
static void algos_rank(const cluster *cl, int rank, void *arg) {
    const algo_case *ac = arg;
    int n = cl->world;
    size_t cap = LARGE_COUNT * 8;
    void *buf = malloc(cap);
    char *inputs = malloc(cap * (size_t)n), *rank_order = malloc(cap), *ring_order = malloc(cap);
    CHILD_CHECK(buf && inputs && rank_order && ring_order, "out of memory");
    dist_comm *comms[NALGOS] = {NULL};
    for (size_t a = 0; a < NALGOS; a++)
        if (!ac->tls || k_algos[a] != DIST_NET_ALLREDUCE_AUTO)
            comms[a] = create_with(&ac->ports[a], rank, k_algos[a], ac->tls);
    for (size_t d = 0; d < NDTYPES; d++) {
        dist_dtype dt = k_dtypes[d];
        size_t es = dist_dtype_size(dt);
        if (!ac->all_dtypes && dt != DIST_F32 && dt != DIST_BF16) continue;
        for (size_t s = 0; s <= NCOUNTS; s++) {
            bool large = s == NCOUNTS; /* float32 SUM only */
            if (large && (dt != DIST_F32 || !ac->all_dtypes)) continue;
            size_t count = large ? LARGE_COUNT : k_counts[s];
            for (int r = 0; r < n; r++)
                for (size_t i = 0; i < count; i++)
                    input_element(dt, r, i, inputs + ((size_t)r * count + i) * es);
            for (size_t o = 0; o < NOPS; o++) {
                dist_reduce_op op = k_ops[o];
                if ((!ac->all_dtypes && op > DIST_REDUCE_MEAN) || (large && op != DIST_REDUCE_SUM))
                    continue;
                expected(dt, op, ORDER_RANK, n, count, inputs, rank_order);
                expected(dt, op, ORDER_RING, n, count, inputs, ring_order);
                /* the check has teeth: from 3 ranks on these inputs sum to other bits in another
                 * order, reversed or the ring's */
                if (n >= 3 && dt == DIST_F32 && op == DIST_REDUCE_SUM && count >= 1000) {
                    CHILD_CHECK(memcmp(rank_order, ring_order, count * es) != 0,
                                "world %d, count %zu: the ring's order gives the rank order's bits",
                                n, count);
                    expected(dt, op, ORDER_REVERSED, n, count, inputs, ring_order);
                    CHILD_CHECK(memcmp(rank_order, ring_order, count * es) != 0,
                                "world %d, count %zu: the reversed order gives the rank order's "
                                "bits; the inputs cannot tell orders apart",
                                n, count);
                    expected(dt, op, ORDER_RING, n, count, inputs, ring_order);
                }
                expectation e = {dt, op, count, inputs, rank_order, ring_order};
                for (size_t a = 0; a < NALGOS; a++)
                    if (comms[a]) check_one(comms[a], k_algos[a], &e, buf);
            }
        }
    }
    for (size_t a = 0; a < NALGOS; a++) dist_comm_destroy(comms[a]);
    free(buf);
    free(inputs);
    free(rank_order);
    free(ring_order);
}

/* Reports: one line per call, "algorithm dtype op count digest". */
typedef struct digest_line {
    char algo[16], dtype[16], op[8];
    size_t count;
    unsigned long long digest;
} digest_line;

static int parse_lines(const char *r, digest_line *out, int cap) {
    int n = 0;
    for (const char *p = r; p && *p && n < cap;) {
        digest_line *l = &out[n];
        if (sscanf(p, "%15s %15s %7s %zu %llx", l->algo, l->dtype, l->op, &l->count, &l->digest) ==
            5)
            n++;
        p = strchr(p, '\n');
        if (p) p++;
    }
    return n;
}

#define MAX_LINES 2048

/* Ports for every algorithm's communicator, none picked twice, each set with the cluster's
 * fingerprint. */
static void pick_algo_ports(algo_case *ac, const cluster *cl) {
    int world = cl->world;
    for (size_t a = 0; a < NALGOS; a++) {
        ac->ports[a].world = world;
        snprintf(ac->ports[a].fingerprint, sizeof ac->ports[a].fingerprint, "%s", cl->fingerprint);
        for (bool unique = false; !unique;) {
            cluster_pick_ports(&ac->ports[a]);
            unique = true;
            for (size_t b = 0; b < a; b++)
                for (int r = 0; r < world; r++)
                    for (int q = 0; q < world; q++)
                        unique &= strcmp(ac->ports[a].addrs[r], ac->ports[b].addrs[q]) != 0;
            for (int r = 0; r < world; r++)
                for (int q = 0; q < r; q++)
                    unique &= strcmp(ac->ports[a].addrs[r], ac->ports[a].addrs[q]) != 0;
        }
    }
}

/* run_all for algos_rank: a run in which another process took one of the ports is repeated on
 * fresh ports for every algorithm, at most twice. */
static void run_algos(cluster *cl, algo_case *ac) {
    for (int attempt = 0;; attempt++) {
        pick_algo_ports(ac, cl);
        pid_t pids[MAX_RANKS];
        int status[MAX_RANKS], failed = 0, taken = 0;
        for (int r = 0; r < cl->world; r++) pids[r] = spawn(cl, r, algos_rank, ac);
        for (int r = 0; r < cl->world; r++) {
            ck_assert_int_eq(waitpid(pids[r], &status[r], 0), pids[r]);
            if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
            failed++;
            taken |= report_says_port_taken(cl, r);
        }
        if (!failed) return;
        if (taken && attempt < 2) continue;
        abort_with_reports(cl, status, failed);
    }
}

static void check_world(int world, int tls, int all_dtypes) {
    cluster cl;
    cluster_init(&cl, world);
    static algo_case ac;
    ac.tls = tls;
    ac.all_dtypes = all_dtypes;
    run_algos(&cl, &ac);
    for (size_t a = 0; a < NALGOS; a++) cluster_release_ports(&ac.ports[a]);
    static digest_line l0[MAX_LINES], lr[MAX_LINES];
    char *r0 = read_report(&cl, 0, NULL);
    int n0 = parse_lines(r0, l0, MAX_LINES);
    ck_assert_int_gt(n0, 0);
    /* every rank has the same bits, call by call */
    for (int r = 1; r < world; r++) {
        char *rr = read_report(&cl, r, NULL);
        ck_assert_int_eq(parse_lines(rr, lr, MAX_LINES), n0);
        for (int i = 0; i < n0; i++)
            ck_assert_msg(lr[i].digest == l0[i].digest, "world %d: rank %d's %s %s %s %zu differs",
                          world, r, lr[i].algo, lr[i].dtype, lr[i].op, lr[i].count);
        free(rr);
    }
    /* the rank-order algorithms (and auto, which picks among them) agree with each other on
     * every call; the ring agrees with them on 2 ranks, and from 3 on differs somewhere (its order
     * is not rank order) */
    int ring_differs = 0;
    for (int i = 0; i < n0; i++) {
        if (strcmp(l0[i].algo, "direct") != 0) continue;
        for (int j = 0; j < n0; j++) {
            if (j == i || strcmp(l0[j].dtype, l0[i].dtype) || strcmp(l0[j].op, l0[i].op) ||
                l0[j].count != l0[i].count)
                continue;
            bool ring = strcmp(l0[j].algo, "ring") == 0, same = l0[j].digest == l0[i].digest;
            if (ring && world >= 3) {
                ring_differs |= !same;
                continue;
            }
            ck_assert_msg(same, "world %d: %s and direct give other bits for %s %s count %zu",
                          world, l0[j].algo, l0[i].dtype, l0[i].op, l0[i].count);
        }
    }
    if (world >= 3) ck_assert_msg(ring_differs, "world %d: the ring's bits are rank order", world);
    free(r0);
    cluster_cleanup(&cl);
}

START_TEST(test_every_algorithm_on_2_ranks_gives_the_rank_order_bits_for_every_dtype_and_op) {
    check_world(2, 0, 1);
}
END_TEST

START_TEST(test_every_algorithm_on_3_ranks_gives_its_order_bits_for_every_dtype_and_op) {
    check_world(3, 0, 1);
}
END_TEST

START_TEST(test_every_algorithm_on_4_ranks_gives_its_order_bits_for_every_dtype_and_op) {
    check_world(4, 0, 1);
}
END_TEST

START_TEST(test_every_algorithm_on_5_ranks_gives_its_order_bits_for_every_dtype_and_op) {
    check_world(5, 0, 1);
}
END_TEST

START_TEST(test_every_algorithm_on_8_ranks_gives_its_order_bits_for_every_dtype_and_op) {
    check_world(8, 0, 1);
}
END_TEST

START_TEST(test_every_algorithm_over_tls_on_3_ranks_gives_its_order_bits) { check_world(3, 1, 0); }
END_TEST

/* ---- buckets ---- */

/* Bucket sizes in elements: below and above auto's latency-bound limit, odd, then the rest. */
static const size_t k_buckets[] = {1, 7, 1000, 8191, 30011};
#define NBUCKETS (sizeof k_buckets / sizeof k_buckets[0])
#define BUCKETED_COUNT 100003

static void buckets_rank(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.allreduce_algorithm = DIST_NET_ALLREDUCE_AUTO;
    dist_comm *c = NULL;
    CHILD_CHECK(dist_comm_create_net(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    const dist_dtype dts[] = {DIST_F32, DIST_BF16};
    for (int d = 0; d < 2; d++) {
        size_t es = dist_dtype_size(dts[d]);
        char *whole = malloc(BUCKETED_COUNT * es), *parts = malloc(BUCKETED_COUNT * es);
        for (size_t i = 0; i < BUCKETED_COUNT; i++) input_element(dts[d], rank, i, whole + i * es);
        memcpy(parts, whole, BUCKETED_COUNT * es);
        CHILD_CHECK(dist_comm_all_reduce(c, 0, whole, BUCKETED_COUNT, dts[d], DIST_REDUCE_SUM, 0) ==
                        DIST_OK,
                    "whole: %s", dist_last_error());
        size_t at = 0;
        for (size_t b = 0; at < BUCKETED_COUNT; b++) {
            size_t k = b < NBUCKETS ? k_buckets[b] : BUCKETED_COUNT - at;
            CHILD_CHECK(dist_comm_all_reduce(c, 0, parts + at * es, k, dts[d], DIST_REDUCE_SUM,
                                             0) == DIST_OK,
                        "bucket %zu: %s", b, dist_last_error());
            at += k;
        }
        for (size_t i = 0; i < BUCKETED_COUNT; i++)
            CHILD_CHECK(memcmp(whole + i * es, parts + i * es, es) == 0,
                        "world %d, %s: element %zu differs between the buffer and its buckets",
                        cl->world, dist_dtype_name(dts[d]), i);
        free(whole);
        free(parts);
    }
    dist_comm_destroy(c);
}

/* What issue #40's bucketed all-reduce needs: auto's choice changes with the size, not the bits. */
START_TEST(test_auto_all_reduce_in_buckets_of_any_size_gives_the_bits_of_one_buffer_3_and_8_ranks) {
    for (int world = 3; world <= 8; world += 5) {
        cluster cl;
        cluster_init(&cl, world);
        run_all(&cl, buckets_rank, NULL);
        cluster_cleanup(&cl);
    }
}
END_TEST

/* ---- the setting ---- */

START_TEST(test_the_setting_comes_from_the_options_then_the_environment_and_bad_words_are_named) {
    cluster cl;
    cluster_init(&cl, 1);
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_TCP);
    dist_net_comm *c = NULL;
    setenv("DIST_ALLREDUCE_ALGORITHM", "butterfly", 1);
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dist_last_error(), "DIST_ALLREDUCE_ALGORITHM is 'butterfly'") &&
                      strstr(dist_last_error(), "ring, direct, doubling, scatter or auto"),
                  "message: %s", dist_last_error());
    /* an explicit choice wins: the environment is not read */
    o.allreduce_algorithm = DIST_NET_ALLREDUCE_DOUBLING;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_OK);
    ck_assert_int_eq(c->allreduce, DIST_NET_ALLREDUCE_DOUBLING);
    dist_net_comm_destroy(c);
    o.allreduce_algorithm = (dist_net_allreduce_algorithm)99;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "allreduce_algorithm 99"), "message: %s",
                  dist_last_error());
    const char *words[] = {"ring", "direct", "doubling", "scatter", "auto", ""};
    const dist_net_allreduce_algorithm want[] = {
        DIST_NET_ALLREDUCE_RING,    DIST_NET_ALLREDUCE_DIRECT, DIST_NET_ALLREDUCE_DOUBLING,
        DIST_NET_ALLREDUCE_SCATTER, DIST_NET_ALLREDUCE_AUTO,   DIST_NET_ALLREDUCE_AUTO};
    o.allreduce_algorithm = DIST_NET_ALLREDUCE_FROM_ENV;
    for (int i = 0; i < 6; i++) {
        setenv("DIST_ALLREDUCE_ALGORITHM", words[i], 1);
        ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_OK);
        ck_assert_msg(c->allreduce == want[i], "'%s' gave %d", words[i], (int)c->allreduce);
        dist_net_comm_destroy(c);
    }
    unsetenv("DIST_ALLREDUCE_ALGORITHM");
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_OK);
    ck_assert_int_eq(c->allreduce, DIST_NET_ALLREDUCE_AUTO);
    dist_net_comm_destroy(c);
    cluster_cleanup(&cl);
}
END_TEST

/* What auto picks is a function of bytes and world alone: the same on every rank. */
START_TEST(test_auto_picks_latency_algorithms_for_small_messages_and_rank_order_for_all) {
    dist_net_comm c = {0};
    c.allreduce = DIST_NET_ALLREDUCE_AUTO;
    for (int world = 2; world <= 16; world++) {
        c.world = world;
        for (size_t bytes = 4; bytes <= (64u << 20); bytes *= 4) {
            dist_net_allreduce_algorithm a = net_allreduce_pick(&c, bytes);
            ck_assert_msg(a != DIST_NET_ALLREDUCE_RING && a != DIST_NET_ALLREDUCE_AUTO,
                          "world %d, %zu bytes: %s", world, bytes, net_allreduce_name(a));
            if (bytes <= 1024)
                ck_assert_msg(a == DIST_NET_ALLREDUCE_DOUBLING || a == DIST_NET_ALLREDUCE_DIRECT,
                              "world %d, %zu bytes: %s", world, bytes, net_allreduce_name(a));
            if (bytes >= (16u << 20))
                ck_assert_msg(a == DIST_NET_ALLREDUCE_SCATTER, "world %d, %zu bytes: %s", world,
                              bytes, net_allreduce_name(a));
        }
    }
    c.allreduce = DIST_NET_ALLREDUCE_RING;
    ck_assert_int_eq(net_allreduce_pick(&c, 8), DIST_NET_ALLREDUCE_RING);
}
END_TEST

/* ---- ranks that disagree, a rank that never arrives, a rank that dies ---- */

static void mark_done(const cluster *cl, int rank) {
    char path[128];
    snprintf(path, sizeof path, "%s/done%d", cl->dir, rank);
    FILE *f = fopen(path, "w");
    if (f) fclose(f);
}

/* Keeps this rank's sockets open until the ranks in `wait` (a bit set) are done, so a rank that
 * failed first is not then lost to the others by its exit. */
static void wait_done(const cluster *cl, unsigned wait) {
    for (double t0 = now_s(); now_s() - t0 < 20;) {
        bool all = true;
        for (int r = 0; r < cl->world; r++) {
            char path[128];
            snprintf(path, sizeof path, "%s/done%d", cl->dir, r);
            if ((wait >> r & 1u) && access(path, F_OK) != 0) all = false;
        }
        if (all) return;
        usleep(5000);
    }
}

/* Rank 0 takes its algorithm from the environment, rank 1 from its options. */
static void disagreeing_rank(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    setenv("DIST_ALLREDUCE_ALGORITHM", "doubling", 1);
    if (rank == 1) o.allreduce_algorithm = DIST_NET_ALLREDUCE_RING;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float x[1000] = {0};
    dist_status st = dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM);
    fprintf(g_out, "%s %s\n", dist_status_name(st), dist_last_error());
    fflush(g_out);
    mark_done(cl, rank);
    wait_done(cl, 3u);
    dist_net_comm_destroy(c);
}

START_TEST(test_ranks_that_disagree_on_the_algorithm_fail_naming_both_and_both_algorithms) {
    cluster cl;
    cluster_init(&cl, 2);
    run_all(&cl, disagreeing_rank, NULL);
    for (int r = 0; r < 2; r++) {
        char *rep = read_report(&cl, r, NULL);
        ck_assert_msg(strncmp(rep, "DIST_INVALID_USAGE", 18) == 0, "rank %d: %s", r, rep);
        ck_assert_msg(strstr(rep, "chief/0") && strstr(rep, "worker/1") &&
                          strstr(rep, "float32 SUM by doubling") &&
                          strstr(rep, "float32 SUM by ring") &&
                          strstr(rep, "DIST_ALLREDUCE_ALGORITHM"),
                      "rank %d: %s", r, rep);
        free(rep);
    }
    cluster_cleanup(&cl);
}
END_TEST

typedef struct absent_case {
    dist_net_allreduce_algorithm algo;
    bool killed; /* rank 2 dies after joining; else it stays but never calls */
} absent_case;

#define ABSENT_TIMEOUT_S 0.5

static void absent_case_rank(const cluster *cl, int rank, void *arg) {
    const absent_case *ac = arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.allreduce_algorithm = ac->algo;
    o.timeout_s = ac->killed ? 30 : ABSENT_TIMEOUT_S;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    if (rank == 2) {
        if (ac->killed) {
            fclose(g_out);
            raise(SIGKILL);
        }
        wait_done(cl, 3u);
        dist_net_comm_destroy(c);
        return;
    }
    float x[1000] = {0};
    double t0 = now_s();
    dist_status st = dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM);
    double dt = now_s() - t0;
    fprintf(g_out, "%s %.3f %s\n", dist_status_name(st), dt, dist_last_error());
    /* the communicator stays failed */
    fprintf(g_out, "again %s\n",
            dist_status_name(dist_net_comm_all_reduce(c, x, 1, DIST_REDUCE_SUM)));
    fflush(g_out);
    mark_done(cl, rank);
    wait_done(cl, 3u);
    dist_net_comm_destroy(c);
}

static void check_absent(absent_case ac) {
    cluster cl;
    cluster_init(&cl, 3);
    pid_t p[3];
    for (int r = 0; r < 3; r++) p[r] = spawn(&cl, r, absent_case_rank, &ac);
    expect_exit_ok(&cl, p[0], 0);
    expect_exit_ok(&cl, p[1], 1);
    int status = 0;
    ck_assert_int_eq(waitpid(p[2], &status, 0), p[2]);
    const char *want = ac.killed ? "DIST_PEER_LOST" : "DIST_TIMEOUT";
    double bound = ac.killed ? 3.0 : dist_test_timeout_bound(ABSENT_TIMEOUT_S);
    for (int r = 0; r < 2; r++) {
        char *rep = read_report(&cl, r, NULL), status_name[32] = "", again[32] = "";
        double dt = -1;
        ck_assert_int_eq(sscanf(rep, "%31s %lf", status_name, &dt), 2);
        ck_assert_msg(strcmp(status_name, want) == 0, "%s, rank %d: %s",
                      net_allreduce_name(ac.algo), r, rep);
        ck_assert_msg(dt < bound, "%s, rank %d took %.3f s: %s", net_allreduce_name(ac.algo), r, dt,
                      rep);
        ck_assert_msg(strstr(rep, "worker/2 at 127.0.0.1:"), "%s, rank %d does not name rank 2: %s",
                      net_allreduce_name(ac.algo), r, rep);
        /* and how far into which call this rank was, which tells a late rank from a waiting one */
        ck_assert_msg(strstr(rep, "s into all-reduce #1)"), "%s, rank %d: %s",
                      net_allreduce_name(ac.algo), r, rep);
        const char *a = strstr(rep, "again ");
        ck_assert_ptr_nonnull(a);
        sscanf(a + 6, "%31s", again);
        ck_assert_str_eq(again, want);
        free(rep);
    }
    cluster_cleanup(&cl);
}

START_TEST(test_a_rank_that_never_arrives_times_out_the_others_naming_it_doubling_and_scatter) {
    check_absent((absent_case){DIST_NET_ALLREDUCE_DOUBLING, false});
    check_absent((absent_case){DIST_NET_ALLREDUCE_SCATTER, false});
}
END_TEST

START_TEST(test_a_killed_rank_fails_the_others_with_peer_lost_naming_it_doubling_and_scatter) {
    check_absent((absent_case){DIST_NET_ALLREDUCE_DOUBLING, true});
    check_absent((absent_case){DIST_NET_ALLREDUCE_SCATTER, true});
}
END_TEST

/* 8 ranks, the last killed after joining; each survivor leaves as soon as its all-reduce fails
 * (destroys its communicator, as a training process exits), so most survivors see a partner
 * leave rather than the killed rank itself: every one of them must still name the killed rank
 * (the partners' abort records), within 3 s. */
typedef struct lost_case {
    dist_net_allreduce_algorithm algo;
} lost_case;

static void lost_rank(const cluster *cl, int rank, void *arg) {
    const lost_case *lc = arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.allreduce_algorithm = lc->algo;
    o.timeout_s = 30;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    if (rank == cl->world - 1) {
        fclose(g_out);
        raise(SIGKILL);
    }
    float x[1000] = {0};
    double t0 = now_s();
    dist_status st = dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM);
    double dt = now_s() - t0;
    dist_net_comm_destroy(c); /* leaves at once */
    fprintf(g_out, "%s %.3f %s\n", dist_status_name(st), dt, dist_last_error());
    fflush(g_out);
}

static void check_lost(dist_net_allreduce_algorithm algo) {
    cluster cl;
    cluster_init(&cl, 8);
    lost_case lc = {algo};
    pid_t p[8];
    for (int r = 0; r < 8; r++) p[r] = spawn(&cl, r, lost_rank, &lc);
    for (int r = 0; r < 7; r++) expect_exit_ok(&cl, p[r], r);
    int status = 0;
    ck_assert_int_eq(waitpid(p[7], &status, 0), p[7]);
    for (int r = 0; r < 7; r++) {
        char *rep = read_report(&cl, r, NULL), status_name[32] = "";
        double dt = -1;
        ck_assert_int_eq(sscanf(rep, "%31s %lf", status_name, &dt), 2);
        ck_assert_msg(strcmp(status_name, "DIST_PEER_LOST") == 0, "%s, rank %d: %s",
                      net_allreduce_name(algo), r, rep);
        ck_assert_msg(dt < 3.0, "%s, rank %d took %.3f s: %s", net_allreduce_name(algo), r, dt,
                      rep);
        ck_assert_msg(strstr(rep, "worker/7 at 127.0.0.1:"), "%s, rank %d does not name rank 7: %s",
                      net_allreduce_name(algo), r, rep);
        free(rep);
    }
    cluster_cleanup(&cl);
}

START_TEST(test_every_survivor_of_8_names_the_killed_rank_though_partners_leave_first) {
    check_lost(DIST_NET_ALLREDUCE_DOUBLING);
    check_lost(DIST_NET_ALLREDUCE_SCATTER);
    check_lost(DIST_NET_ALLREDUCE_RING);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL);
    Suite *s = suite_create("net_allreduce_algos");
    TCase *tc = tcase_create("processes");
    tcase_set_timeout(tc, 300);
    tcase_add_test(
        tc, test_every_algorithm_on_2_ranks_gives_the_rank_order_bits_for_every_dtype_and_op);
    tcase_add_test(tc, test_every_algorithm_on_3_ranks_gives_its_order_bits_for_every_dtype_and_op);
    tcase_add_test(tc, test_every_algorithm_on_4_ranks_gives_its_order_bits_for_every_dtype_and_op);
    tcase_add_test(tc, test_every_algorithm_on_5_ranks_gives_its_order_bits_for_every_dtype_and_op);
    tcase_add_test(tc, test_every_algorithm_on_8_ranks_gives_its_order_bits_for_every_dtype_and_op);
    tcase_add_test(tc, test_every_algorithm_over_tls_on_3_ranks_gives_its_order_bits);
    tcase_add_test(
        tc, test_auto_all_reduce_in_buckets_of_any_size_gives_the_bits_of_one_buffer_3_and_8_ranks);
    tcase_add_test(
        tc, test_the_setting_comes_from_the_options_then_the_environment_and_bad_words_are_named);
    tcase_add_test(tc,
                   test_auto_picks_latency_algorithms_for_small_messages_and_rank_order_for_all);
    tcase_add_test(tc,
                   test_ranks_that_disagree_on_the_algorithm_fail_naming_both_and_both_algorithms);
    tcase_add_test(
        tc, test_a_rank_that_never_arrives_times_out_the_others_naming_it_doubling_and_scatter);
    tcase_add_test(
        tc, test_a_killed_rank_fails_the_others_with_peer_lost_naming_it_doubling_and_scatter);
    tcase_add_test(tc, test_every_survivor_of_8_names_the_killed_rank_though_partners_leave_first);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
