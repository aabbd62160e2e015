/* The typed communicators behind core/comm.h: in-process (threads), TCP and shared memory
 * (processes on 127.0.0.1) and hierarchical (processes x threads). Every dtype and op against
 * a reference computed here, integer sums that float would get wrong, f16/bf16 rounding after
 * each step, NaN in MAX, bitwise identical ranks, per-call timeouts naming who did not come,
 * cancel and reset.
 *
 * Process ranks are forked children reporting through files (proc_testutil.h); no backend is
 * ever created (OpenMP does not survive fork): the in-process comms run on host memory. */
#include "collective/hier_comm.h"
#include "collective/local_comm.h"
#include "collective/net_comm.h"
#include "core/comm.h"
#include "proc_testutil.h"
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>

#define NTHREADS_MAX 4

/* ---- threads as the ranks of an in-process communicator ---------------------------------- */

typedef struct rank_job rank_job;
typedef void (*thread_fn)(rank_job *j);
struct rank_job {
    dist_comm *c;
    int local;
    thread_fn fn;
    void *arg;
    dist_status st;
    double seconds;
    char msg[512];
};

static void *thread_main(void *p) {
    rank_job *j = p;
    j->fn(j);
    return NULL;
}

/* Runs fn on local ranks 0..n-1 of c, one thread each, and waits for them. */
static void run_threads(dist_comm *c, int n, thread_fn fn, void *arg, rank_job *jobs) {
    pthread_t th[NTHREADS_MAX];
    for (int r = 0; r < n; r++) {
        jobs[r] = (rank_job){.c = c, .local = r, .fn = fn, .arg = arg, .st = DIST_OK};
        ck_assert_int_eq(pthread_create(&th[r], NULL, thread_main, &jobs[r]), 0);
    }
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
}

static void record(rank_job *j, dist_status st) {
    if (j->st == DIST_OK && st != DIST_OK) {
        j->st = st;
        snprintf(j->msg, sizeof j->msg, "%s", dist_last_error());
    }
}

static dist_comm *in_process(int n, double timeout_s) {
    dist_comm *c = NULL;
    ck_assert_int_eq(dist_comm_create_in_process(n, NULL, timeout_s, &c), DIST_OK);
    ck_assert_str_eq(c->name, "in-process");
    ck_assert_int_eq(c->size, n);
    ck_assert_int_eq(c->local_ranks, n);
    return c;
}

/* ---- the reference: rank order, rounding after each step --------------------------------- */

/* bf16 is the top half of a float32. */
static float bf16_value(uint16_t h) {
    union {
        uint32_t u;
        float f;
    } v = {.u = (uint32_t)h << 16};
    return v.f;
}

/* Round to nearest, ties to even, spelled out (no NaN here). */
static uint16_t bf16_round(float f) {
    union {
        float f;
        uint32_t u;
    } v = {.f = f};
    uint32_t upper = v.u >> 16, lower = v.u & 0xffffu;
    if (lower > 0x8000u || (lower == 0x8000u && (upper & 1u))) upper++;
    return (uint16_t)upper;
}

#define REF_PICK(op, a, b)                                                                         \
    ((op) == DIST_REDUCE_MAX ? ((a) > (b) ? (a) : (b)) : ((a) < (b) ? (a) : (b)))

/* acc = acc (op) x for element i (no NaN here). */
static void ref_step(dist_dtype dt, dist_reduce_op op, void *acc, const void *x, size_t i) {
    bool add = op == DIST_REDUCE_SUM || op == DIST_REDUCE_MEAN;
    switch (dt) {
#define REF_CASE(DT, T)                                                                            \
    case DT: {                                                                                     \
        T a = ((T *)acc)[i], b = ((const T *)x)[i];                                                \
        ((T *)acc)[i] = add ? (T)(a + b) : REF_PICK(op, a, b);                                     \
        break;                                                                                     \
    }
        REF_CASE(DIST_F32, float)
        REF_CASE(DIST_I32, int32_t)
        REF_CASE(DIST_I64, int64_t)
        REF_CASE(DIST_U8, uint8_t)
        REF_CASE(DIST_F16, _Float16)
    case DIST_BF16: {
        float a = bf16_value(((uint16_t *)acc)[i]), b = bf16_value(((const uint16_t *)x)[i]);
        ((uint16_t *)acc)[i] = bf16_round(add ? a + b : REF_PICK(op, a, b));
        break;
    }
    default: ck_abort_msg("dtype %d", (int)dt);
    }
}

static void ref_divide(dist_dtype dt, void *acc, size_t i, int n) {
    switch (dt) {
    case DIST_F32: ((float *)acc)[i] /= (float)n; break;
    case DIST_I32: ((int32_t *)acc)[i] /= n; break;
    case DIST_I64: ((int64_t *)acc)[i] /= n; break;
    case DIST_U8: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / n); break;
    case DIST_F16: ((_Float16 *)acc)[i] = (_Float16)((float)((_Float16 *)acc)[i] / (float)n); break;
    case DIST_BF16:
        ((uint16_t *)acc)[i] = bf16_round(bf16_value(((uint16_t *)acc)[i]) / (float)n);
        break;
    default: break;
    }
}

/* Rank r's element i: small values of either sign (u8: 0..80, so three sum without wrapping),
 * f32 with a fraction so that sums round. */
static void fill(dist_dtype dt, void *buf, size_t n, int r) {
    for (size_t i = 0; i < n; i++) {
        int v = (int)((i * 37 + (size_t)r * 101) % 161) - 80;
        switch (dt) {
        case DIST_F32: ((float *)buf)[i] = (float)v * 0.37f + 0.1f * (float)r; break;
        case DIST_I32: ((int32_t *)buf)[i] = v * 1000 + r; break;
        case DIST_I64: ((int64_t *)buf)[i] = (int64_t)v * 1000000007LL + r; break;
        case DIST_U8: ((uint8_t *)buf)[i] = (uint8_t)(v < 0 ? -v : v); break;
        case DIST_F16: ((_Float16 *)buf)[i] = (_Float16)((float)v * 0.37f + 0.1f * (float)r); break;
        case DIST_BF16:
            ((uint16_t *)buf)[i] = bf16_round((float)v * 0.37f + 0.1f * (float)r);
            break;
        default: break;
        }
    }
}

/* ---- in-process: every dtype x every op ---------------------------------------------------- */

#define MATRIX_N 1001 /* not a multiple of the 3 chunk owners */

typedef struct matrix_arg {
    dist_dtype dt;
    dist_reduce_op op;
    _Alignas(8) unsigned char out[3][MATRIX_N * 8];
} matrix_arg;

static void matrix_rank(rank_job *j) {
    matrix_arg *a = j->arg;
    fill(a->dt, a->out[j->local], MATRIX_N, j->local);
    record(j, dist_comm_all_reduce(j->c, j->local, a->out[j->local], MATRIX_N, a->dt, a->op, 0));
}

START_TEST(test_in_process_every_dtype_and_op_matches_rank_order_reference_on_3_threads) {
    static const dist_reduce_op ops[] = {DIST_REDUCE_SUM, DIST_REDUCE_MEAN, DIST_REDUCE_MAX,
                                         DIST_REDUCE_MIN};
    dist_comm *c = in_process(3, 10);
    static matrix_arg a;
    _Alignas(8) unsigned char want[MATRIX_N * 8];
    _Alignas(8) unsigned char x[MATRIX_N * 8];
    for (int dt = 0; dt < DIST_DTYPE_COUNT; dt++) {
        for (size_t o = 0; o < 4; o++) {
            a.dt = (dist_dtype)dt;
            a.op = ops[o];
            rank_job jobs[3];
            run_threads(c, 3, matrix_rank, &a, jobs);
            for (int r = 0; r < 3; r++)
                ck_assert_msg(jobs[r].st == DIST_OK, "%s op %d: %s", dist_dtype_name(a.dt),
                              (int)a.op, jobs[r].msg);
            fill(a.dt, want, MATRIX_N, 0);
            for (int r = 1; r < 3; r++) {
                fill(a.dt, x, MATRIX_N, r);
                for (size_t i = 0; i < MATRIX_N; i++) ref_step(a.dt, a.op, want, x, i);
            }
            if (a.op == DIST_REDUCE_MEAN)
                for (size_t i = 0; i < MATRIX_N; i++) ref_divide(a.dt, want, i, 3);
            size_t bytes = MATRIX_N * dist_dtype_size(a.dt);
            for (int r = 0; r < 3; r++)
                ck_assert_msg(memcmp(a.out[r], want, bytes) == 0,
                              "%s op %d: rank %d differs from the reference", dist_dtype_name(a.dt),
                              (int)a.op, r);
        }
    }
    dist_comm_destroy(c);
}
END_TEST

/* ---- in-process: the stated values --------------------------------------------------------- */

typedef struct values_arg {
    dist_dtype dt;
    dist_reduce_op op;
    size_t n;
    _Alignas(8) unsigned char in[3][64]; /* each rank's input, replaced by its result */
} values_arg;

static void values_rank(rank_job *j) {
    values_arg *a = j->arg;
    record(j, dist_comm_all_reduce(j->c, j->local, a->in[j->local], a->n, a->dt, a->op, 0));
}

/* Runs one all-reduce of the values in a on `ranks` threads; every rank's result in a->in. */
static void reduce_on_threads(int ranks, values_arg *a) {
    dist_comm *c = in_process(ranks, 10);
    rank_job jobs[3];
    run_threads(c, ranks, values_rank, a, jobs);
    for (int r = 0; r < ranks; r++) ck_assert_msg(jobs[r].st == DIST_OK, "%s", jobs[r].msg);
    dist_comm_destroy(c);
}

START_TEST(test_in_process_int32_and_int64_sums_above_2_24_are_exact) {
    /* in float, 16777217 is 16777216: + 3 still rounds to 16777220, but + 2 gives 16777218 */
    values_arg a = {.dt = DIST_I32, .op = DIST_REDUCE_SUM, .n = 2};
    int32_t i32[2][2] = {{16777217, 16777217}, {3, 2}};
    for (int r = 0; r < 2; r++) memcpy(a.in[r], i32[r], 8);
    reduce_on_threads(2, &a);
    for (int r = 0; r < 2; r++) {
        int32_t got[2];
        memcpy(got, a.in[r], 8);
        ck_assert_int_eq(got[0], 16777220);
        ck_assert_int_eq(got[1], 16777219);
    }
    values_arg b = {.dt = DIST_I64, .op = DIST_REDUCE_SUM, .n = 1};
    int64_t i64[3] = {(1LL << 40) + 1, (1LL << 40) + 2, -(1LL << 39) + 7};
    for (int r = 0; r < 3; r++) memcpy(b.in[r], &i64[r], 8);
    reduce_on_threads(3, &b);
    for (int r = 0; r < 3; r++) {
        int64_t got;
        memcpy(&got, b.in[r], 8);
        ck_assert_int_eq(got, (1LL << 41) - (1LL << 39) + 10); /* 1649267441674 */
    }
}
END_TEST

START_TEST(test_in_process_mean_of_integers_truncates_toward_zero) {
    values_arg a = {.dt = DIST_I32, .op = DIST_REDUCE_MEAN, .n = 2};
    int32_t v[3][2] = {{7, -7}, {0, 0}, {1, -1}}; /* sums 8 and -8, over 3: 2 and -2 */
    for (int r = 0; r < 3; r++) memcpy(a.in[r], v[r], 8);
    reduce_on_threads(3, &a);
    int32_t got[2];
    memcpy(got, a.in[1], 8);
    ck_assert_int_eq(got[0], 2);
    ck_assert_int_eq(got[1], -2);
    values_arg b = {.dt = DIST_U8, .op = DIST_REDUCE_MEAN, .n = 1};
    b.in[0][0] = 200;
    b.in[1][0] = 55; /* 255 / 2 = 127 */
    reduce_on_threads(2, &b);
    ck_assert_int_eq(b.in[0][0], 127);
}
END_TEST

START_TEST(test_in_process_f16_and_bf16_round_to_nearest_even_after_each_step) {
    /* f16 near 2048 has a spacing of 2: 2048 + 1 is a tie that rounds to 2048, twice, where one
     * rounding of the exact 2050 would keep it */
    values_arg a = {.dt = DIST_F16, .op = DIST_REDUCE_SUM, .n = 2};
    _Float16 h[3][2] = {{2048, 1}, {1, 0.25}, {1, 0.25}};
    for (int r = 0; r < 3; r++) memcpy(a.in[r], h[r], 4);
    reduce_on_threads(3, &a);
    _Float16 got[2];
    memcpy(got, a.in[2], 4);
    ck_assert_float_eq((float)got[0], 2048.0f);
    ck_assert_float_eq((float)got[1], 1.5f);
    /* bf16 near 256 has a spacing of 2: the same ties */
    values_arg b = {.dt = DIST_BF16, .op = DIST_REDUCE_SUM, .n = 2};
    uint16_t bf[3][2] = {{0x4380 /* 256 */, 0x4040 /* 3 */},
                         {0x3f80 /* 1 */, 0x3f80 /* 1 */},
                         {0x3f80 /* 1 */, 0x3f80 /* 1 */}};
    for (int r = 0; r < 3; r++) memcpy(b.in[r], bf[r], 4);
    reduce_on_threads(3, &b);
    uint16_t gotb[2];
    memcpy(gotb, b.in[0], 4);
    ck_assert_float_eq(bf16_value(gotb[0]), 256.0f);
    ck_assert_float_eq(bf16_value(gotb[1]), 5.0f);
    /* MEAN: 3 / 2 in f16 is exact, 1 / 3 rounds to 0x3555 */
    values_arg m = {.dt = DIST_F16, .op = DIST_REDUCE_MEAN, .n = 1};
    _Float16 one = 1, zero = 0;
    memcpy(m.in[0], &one, 2);
    memcpy(m.in[1], &zero, 2);
    memcpy(m.in[2], &zero, 2);
    reduce_on_threads(3, &m);
    uint16_t bits;
    memcpy(&bits, m.in[1], 2);
    ck_assert_uint_eq(bits, 0x3555);
}
END_TEST

START_TEST(test_in_process_max_min_and_nan_propagates_through_max) {
    values_arg a = {.dt = DIST_F32, .op = DIST_REDUCE_MAX, .n = 3};
    float v[3][3] = {{1, -5, 2}, {-5, 3, NAN}, {3, 1, 7}};
    for (int r = 0; r < 3; r++) memcpy(a.in[r], v[r], sizeof v[r]);
    values_arg b = a;
    b.op = DIST_REDUCE_MIN;
    reduce_on_threads(3, &a);
    reduce_on_threads(3, &b);
    float mx[3], mn[3];
    memcpy(mx, a.in[0], sizeof mx);
    memcpy(mn, b.in[2], sizeof mn);
    ck_assert_float_eq(mx[0], 3.0f);
    ck_assert_float_eq(mx[1], 3.0f);
    ck_assert_msg(isnan(mx[2]), "MAX of 2, NaN, 7 is %g", (double)mx[2]);
    ck_assert_float_eq(mn[0], -5.0f);
    ck_assert_float_eq(mn[1], -5.0f);
    ck_assert_msg(isnan(mn[2]), "MIN of 2, NaN, 7 is %g", (double)mn[2]);
    values_arg c = {.dt = DIST_I64, .op = DIST_REDUCE_MIN, .n = 1};
    int64_t w[2] = {-(1LL << 40), 5};
    for (int r = 0; r < 2; r++) memcpy(c.in[r], &w[r], 8);
    reduce_on_threads(2, &c);
    int64_t got;
    memcpy(&got, c.in[1], 8);
    ck_assert_int_eq(got, -(1LL << 40));
}
END_TEST

/* ---- in-process: gather, broadcast, failures ------------------------------------------------ */

static void gather_bcast_rank(rank_job *j) {
    int64_t in[2] = {j->local * 10, j->local * 10 + 1}, *out = (int64_t *)j->arg + j->local * 8;
    record(j, dist_comm_all_gather(j->c, j->local, in, out, 2, DIST_I64, 0));
    int32_t b = j->local == 2 ? 777 : -1;
    record(j, dist_comm_broadcast(j->c, j->local, &b, 1, DIST_I32, 2, 0));
    out[6] = b;
    record(j, dist_comm_barrier(j->c, j->local, 0));
}

START_TEST(test_in_process_all_gather_in_rank_order_and_broadcast_from_root) {
    dist_comm *c = in_process(3, 10);
    int64_t out[3][8];
    rank_job jobs[3];
    run_threads(c, 3, gather_bcast_rank, out, jobs);
    for (int r = 0; r < 3; r++) {
        ck_assert_msg(jobs[r].st == DIST_OK, "%s", jobs[r].msg);
        int64_t want[6] = {0, 1, 10, 11, 20, 21};
        ck_assert_mem_eq(out[r], want, sizeof want);
        ck_assert_int_eq(out[r][6], 777);
    }
    dist_comm_destroy(c);
}
END_TEST

/* Rank 1 passes fewer elements than the others: every rank fails with a message naming it,
 * and no rank's buffer is written (the in-place path writes into the others' buffers, so the
 * check must come first on every rank). */
typedef struct mismatch_arg {
    float buf[3][64];
} mismatch_arg;

static void mismatch_rank(rank_job *j) {
    mismatch_arg *a = j->arg;
    for (int i = 0; i < 64; i++) a->buf[j->local][i] = (float)(j->local * 100 + i);
    size_t n = j->local == 1 ? 40 : 64;
    record(j,
           dist_comm_all_reduce(j->c, j->local, a->buf[j->local], n, DIST_F32, DIST_REDUCE_SUM, 0));
}

START_TEST(test_in_process_count_mismatch_fails_every_rank_and_writes_nothing) {
    dist_comm *c = in_process(3, 10);
    static mismatch_arg a;
    rank_job jobs[3];
    run_threads(c, 3, mismatch_rank, &a, jobs);
    for (int r = 0; r < 3; r++) {
        ck_assert_int_eq(jobs[r].st, DIST_INVALID_ARGUMENT);
        ck_assert_msg(strstr(jobs[r].msg, "replica 1 passes 40 float32") != NULL, "%s",
                      jobs[r].msg);
        for (int i = 0; i < 64; i++) ck_assert(a.buf[r][i] == (float)(r * 100 + i));
    }
    dist_comm_destroy(c);
}
END_TEST

static void absent_rank2(rank_job *j) {
    if (j->local == 2) return; /* never arrives */
    int32_t x = 1;
    double t0 = now_s();
    record(j, dist_comm_all_reduce(j->c, j->local, &x, 1, DIST_I32, DIST_REDUCE_SUM, 0.5));
    j->seconds = now_s() - t0;
}

START_TEST(test_in_process_rank_that_never_arrives_times_out_within_the_call_timeout_naming_it) {
    dist_comm *c = in_process(3, 30); /* the comm's default is far longer than the call's */
    rank_job jobs[3];
    run_threads(c, 3, absent_rank2, NULL, jobs);
    /* the first to time out reports it; the other is released with it or times out too */
    int timeouts = 0;
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(jobs[r].st == DIST_TIMEOUT || jobs[r].st == DIST_PEER_LOST, "rank %d: %s", r,
                      jobs[r].msg);
        ck_assert_double_lt(jobs[r].seconds, 2.0);
        if (jobs[r].st != DIST_TIMEOUT) continue;
        timeouts++;
        ck_assert_double_ge(jobs[r].seconds, 0.45);
        ck_assert_msg(strstr(jobs[r].msg, "(replica 2) did not arrive within 0.5 s"), "%s",
                      jobs[r].msg);
    }
    ck_assert_int_ge(timeouts, 1);
    dist_comm_destroy(c);
}
END_TEST

static void cancelling_rank1(rank_job *j) {
    int32_t x = 5;
    if (j->local == 1) {
        dist_comm_cancel(j->c, 1);
        return;
    }
    record(j, dist_comm_all_reduce(j->c, j->local, &x, 1, DIST_I32, DIST_REDUCE_SUM, 5));
}

static void sum_of_fives(rank_job *j) {
    int32_t x = 5;
    record(j, dist_comm_all_reduce(j->c, j->local, &x, 1, DIST_I32, DIST_REDUCE_SUM, 5));
    if (x != 15) record(j, dist_error_for_test(DIST_INTERNAL, "sum is not 15"));
}

START_TEST(test_in_process_cancel_fails_the_others_with_peer_lost_and_reset_makes_it_usable) {
    dist_comm *c = in_process(3, 30);
    rank_job jobs[3];
    run_threads(c, 3, cancelling_rank1, NULL, jobs);
    for (int r = 0; r < 3; r += 2) {
        ck_assert_msg(jobs[r].st == DIST_PEER_LOST, "rank %d: %s", r, jobs[r].msg);
        ck_assert_msg(strstr(jobs[r].msg, "replica 1 failed"), "%s", jobs[r].msg);
    }
    /* still failed until reset */
    run_threads(c, 3, sum_of_fives, NULL, jobs);
    ck_assert_int_eq(jobs[0].st, DIST_PEER_LOST);
    dist_comm_reset(c);
    run_threads(c, 3, sum_of_fives, NULL, jobs);
    for (int r = 0; r < 3; r++) ck_assert_msg(jobs[r].st == DIST_OK, "rank %d: %s", r, jobs[r].msg);
    dist_comm_destroy(c);
}
END_TEST

/* ---- processes: TCP and shm ---------------------------------------------------------------- */

static dist_comm *child_comm(const cluster *cl, int rank, dist_net_transport t, double timeout_s) {
    dist_net_comm_options o = cluster_options(cl, rank, t);
    o.timeout_s = timeout_s;
    dist_comm *c = NULL;
    dist_status st = dist_comm_create_net(&o, &c);
    CHILD_CHECK(st == DIST_OK, "rank %d create: %s", rank, dist_last_error());
    CHILD_CHECK(dist_comm_net_handle(c) != NULL, "no net handle");
    return c;
}

static uint64_t fnv(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ULL;
    return h;
}

#define BIG_N 1000000
static const size_t k_counts[] = {10, BIG_N}; /* TCP: direct exchange, ring; shm: small, chunked */

/* Rank r (of W) holds: i32 16777217 on rank 0 and 2 on rank 1 (0 elsewhere), plus i % 1000
 * (float makes 16777217 + 2 into 16777218); i64 2^40 + i + r; f32 inexact values. Checks the exact
 * sums and writes a hash of every result: equal reports on every rank mean bitwise identical
 * results. */
static void net_rank(const cluster *cl, int rank, void *arg) {
    dist_comm *c = child_comm(cl, rank, *(dist_net_transport *)arg, 10);
    fprintf(g_out, "%s size %d\n", c->name, c->size);
    CHILD_CHECK(c->first_rank == rank && c->local_ranks == 1, "first rank %d", c->first_rank);
    int64_t W = cl->world;
    for (size_t s = 0; s < 2; s++) {
        size_t n = k_counts[s];
        int32_t *i32 = malloc(n * 4);
        int64_t *i64 = malloc(n * 8);
        float *f32 = malloc(n * 4), *mx = malloc(n * 4);
        int32_t *mean = malloc(n * 4);
        for (size_t i = 0; i < n; i++) {
            i32[i] = (rank == 0 ? 16777217 : rank == 1 ? 2 : 0) + (int32_t)(i % 1000);
            i64[i] = (1LL << 40) + (int64_t)i + rank;
            f32[i] = 0.1f * (float)(rank + 1) + 1e-3f * (float)(i % 1000);
            mx[i] = (float)((i * 7 + (size_t)rank * 13) % 101) - 50.0f;
            mean[i] = rank == 0 ? -7 : (int32_t)(i % 3);
        }
        if (rank == 1) mx[n / 2] = NAN;
        CHILD_CHECK(dist_comm_all_reduce(c, 0, i32, n, DIST_I32, DIST_REDUCE_SUM, 0) == DIST_OK,
                    "i32 %zu: %s", n, dist_last_error());
        CHILD_CHECK(dist_comm_all_reduce(c, 0, i64, n, DIST_I64, DIST_REDUCE_SUM, 0) == DIST_OK,
                    "i64 %zu: %s", n, dist_last_error());
        CHILD_CHECK(dist_comm_all_reduce(c, 0, f32, n, DIST_F32, DIST_REDUCE_SUM, 0) == DIST_OK,
                    "f32 %zu: %s", n, dist_last_error());
        CHILD_CHECK(dist_comm_all_reduce(c, 0, mx, n, DIST_F32, DIST_REDUCE_MAX, 0) == DIST_OK,
                    "max %zu: %s", n, dist_last_error());
        CHILD_CHECK(dist_comm_all_reduce(c, 0, mean, n, DIST_I32, DIST_REDUCE_MEAN, 0) == DIST_OK,
                    "mean %zu: %s", n, dist_last_error());
        for (size_t i = 0; i < n; i++) {
            int64_t k = (int64_t)(i % 1000);
            CHILD_CHECK(i32[i] == 16777219 + W * k, "n %zu: i32[%zu] = %d", n, i, i32[i]);
            CHILD_CHECK(i64[i] == W * ((1LL << 40) + (int64_t)i) + W * (W - 1) / 2,
                        "n %zu: i64[%zu] = %lld", n, i, (long long)i64[i]);
            float want_mx = -1e9f;
            for (int r = 0; r < W; r++) {
                float v = (float)((i * 7 + (size_t)r * 13) % 101) - 50.0f;
                want_mx = v > want_mx ? v : want_mx;
            }
            if (i == n / 2)
                CHILD_CHECK(isnan(mx[i]), "n %zu: MAX with a NaN is %g", n, (double)mx[i]);
            else
                CHILD_CHECK(mx[i] == want_mx, "n %zu: max[%zu] = %g", n, i, (double)mx[i]);
            /* -7 + (W - 1) (i % 3) over W, truncated toward zero */
            CHILD_CHECK(mean[i] == (int32_t)((-7 + (W - 1) * (int64_t)(i % 3)) / W),
                        "n %zu: mean[%zu] = %d", n, i, mean[i]);
        }
        float want0 = 0;
        for (int r = 0; r < W; r++) want0 += 0.1f * (float)(r + 1);
        CHILD_CHECK(fabsf(f32[0] - want0) < 1e-5f, "f32[0] = %g", (double)f32[0]);
        fprintf(g_out, "n %zu f32 %016llx\n", n, (unsigned long long)fnv(f32, n * 4));
        free(i32);
        free(i64);
        free(f32);
        free(mx);
        free(mean);
    }
    dist_comm_destroy(c);
}

/* Runs net_rank on `world` processes; the reports (name, result hashes) must be equal. */
static void check_net(int world, dist_net_transport t, const char *want_name) {
    cluster cl;
    cluster_init(&cl, world);
    run_all(&cl, net_rank, &t);
    char *r0 = read_report(&cl, 0, NULL);
    char want[32];
    snprintf(want, sizeof want, "%s size %d\n", want_name, world);
    ck_assert_msg(strncmp(r0, want, strlen(want)) == 0, "report: %s", r0);
    ck_assert_msg(strstr(r0, "n 1000000 f32"), "report: %s", r0);
    for (int r = 1; r < world; r++) {
        char *rr = read_report(&cl, r, NULL);
        ck_assert_msg(strcmp(rr, r0) == 0, "rank %d: %s\nrank 0: %s", r, rr, r0);
        free(rr);
    }
    free(r0);
    cluster_cleanup(&cl);
}

START_TEST(
    test_tcp_and_shm_typed_sums_exact_max_nan_mean_truncates_bitwise_identical_2_and_3_ranks) {
    static const struct {
        dist_net_transport t;
        const char *name;
    } cases[] = {{DIST_NET_TCP, "tcp"}, {DIST_NET_SHM, "shm"}};
    for (size_t k = 0; k < 2; k++)
        for (int world = 2; world <= 3; world++) check_net(world, cases[k].t, cases[k].name);
}
END_TEST

/* Rank 1 joins and never calls; rank 0's all-reduce with a 0.5 s call timeout (the comm's is
 * 30 s) gives up naming it. */
static void late_rank(const cluster *cl, int rank, void *arg) {
    dist_comm *c = child_comm(cl, rank, *(dist_net_transport *)arg, 30);
    if (rank == 1) {
        sleep(3);
    } else {
        int32_t x[10] = {0};
        double t0 = now_s();
        dist_status st = dist_comm_all_reduce(c, 0, x, 10, DIST_I32, DIST_REDUCE_SUM, 0.5);
        fprintf(g_out, "%s %.3f %s\n", dist_status_name(st), now_s() - t0, dist_last_error());
    }
    dist_comm_destroy(c);
}

START_TEST(test_tcp_and_shm_rank_that_never_arrives_times_out_within_the_call_timeout_naming_it) {
    dist_net_transport ts[2] = {DIST_NET_TCP, DIST_NET_SHM};
    for (int k = 0; k < 2; k++) {
        cluster cl;
        cluster_init(&cl, 2);
        pid_t p0 = spawn(&cl, 0, late_rank, &ts[k]);
        pid_t p1 = spawn(&cl, 1, late_rank, &ts[k]);
        expect_exit_ok(&cl, p0, 0);
        kill(p1, SIGKILL);
        waitpid(p1, NULL, 0);
        char *r = read_report(&cl, 0, NULL);
        char status[32] = "";
        double dt = -1;
        ck_assert_int_eq(sscanf(r, "%31s %lf", status, &dt), 2);
        ck_assert_msg(strcmp(status, "DIST_TIMEOUT") == 0, "transport %d: %s", k, r);
        ck_assert_msg(dt >= 0.45 && dt < dist_test_timeout_bound(0.5), "took %.3f s: %s", dt, r);
        ck_assert_msg(strstr(r, "worker/1 at 127.0.0.1:"), "does not name the peer: %s", r);
        ck_assert_msg(strstr(r, "within 0.5 s"), "does not give the call's timeout: %s", r);
        free(r);
        cluster_cleanup(&cl);
    }
}
END_TEST

/* ---- processes x threads: hierarchical ------------------------------------------------------ */

typedef struct hier_out {
    int32_t gather[8];
    int32_t bcast;
    int32_t mean_i32;
    float mean_f32;
    int32_t sum_i32;
    int64_t sum_i64;
    int32_t max_i32;
} hier_out;

static void hier_local(rank_job *j) {
    hier_out *o = (hier_out *)j->arg + j->local;
    int g = j->c->first_rank + j->local;
    int32_t in[2] = {g * 10, g * 10 + 1};
    record(j, dist_comm_all_gather(j->c, j->local, in, o->gather, 2, DIST_I32, 0));
    o->bcast = g == 3 ? 777 : -1;
    record(j, dist_comm_broadcast(j->c, j->local, &o->bcast, 1, DIST_I32, 3, 0));
    o->mean_i32 = g + 1; /* 10 / 4 */
    record(j, dist_comm_all_reduce(j->c, j->local, &o->mean_i32, 1, DIST_I32, DIST_REDUCE_MEAN, 0));
    o->mean_f32 = (float)(g + 1);
    record(j, dist_comm_all_reduce(j->c, j->local, &o->mean_f32, 1, DIST_F32, DIST_REDUCE_MEAN, 0));
    o->sum_i32 = g == 0 ? 16777217 : g == 3 ? 2 : 0;
    record(j, dist_comm_all_reduce(j->c, j->local, &o->sum_i32, 1, DIST_I32, DIST_REDUCE_SUM, 0));
    o->sum_i64 = (1LL << 40) + g;
    record(j, dist_comm_all_reduce(j->c, j->local, &o->sum_i64, 1, DIST_I64, DIST_REDUCE_SUM, 0));
    o->max_i32 = g == 2 ? 99 : g;
    record(j, dist_comm_all_reduce(j->c, j->local, &o->max_i32, 1, DIST_I32, DIST_REDUCE_MAX, 0));
    record(j, dist_comm_barrier(j->c, j->local, 0));
}

static void hier_rank(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_comm *inner = NULL, *c = NULL;
    CHILD_CHECK(dist_comm_create_in_process(2, NULL, 10, &inner) == DIST_OK, "%s",
                dist_last_error());
    dist_comm *outer = child_comm(cl, rank, DIST_NET_TCP, 10);
    CHILD_CHECK(dist_comm_create_hierarchical(inner, outer, NULL, &c) == DIST_OK, "%s",
                dist_last_error());
    fprintf(g_out, "%s size %d local %d\n", c->name, c->size, c->local_ranks);
    CHILD_CHECK(c->first_rank == rank * 2, "first rank %d", c->first_rank);
    hier_out out[2];
    rank_job jobs[2];
    run_threads(c, 2, hier_local, out, jobs);
    for (int l = 0; l < 2; l++) {
        CHILD_CHECK(jobs[l].st == DIST_OK, "local %d: %s", l, jobs[l].msg);
        const hier_out *o = &out[l];
        fprintf(g_out, "gather");
        for (int i = 0; i < 8; i++) fprintf(g_out, " %d", o->gather[i]);
        fprintf(g_out, "\nbcast %d mean %d %.9g sum %d %lld max %d\n", o->bcast, o->mean_i32,
                (double)o->mean_f32, o->sum_i32, (long long)o->sum_i64, o->max_i32);
    }
    dist_comm_destroy(c);
}

START_TEST(
    test_hierarchical_2_processes_x_2_threads_global_rank_order_root_on_other_worker_mean_over_4) {
    cluster cl;
    cluster_init(&cl, 2);
    run_all(&cl, hier_rank, NULL);
    const char *line = "gather 0 1 10 11 20 21 30 31\n"
                       "bcast 777 mean 2 2.5 sum 16777219 4398046511110 max 99\n";
    char want[512];
    snprintf(want, sizeof want, "in-process+tcp size 4 local 2\n%s%s", line, line);
    for (int r = 0; r < 2; r++) {
        char *rr = read_report(&cl, r, NULL);
        ck_assert_str_eq(rr, want);
        free(rr);
    }
    cluster_cleanup(&cl);
}
END_TEST

START_TEST(test_hierarchical_create_takes_ownership_and_refuses_an_outer_with_local_ranks) {
    dist_comm *inner = NULL, *outer = NULL, *c = NULL;
    ck_assert_int_eq(dist_comm_create_in_process(2, NULL, 10, &inner), DIST_OK);
    ck_assert_int_eq(dist_comm_create_in_process(2, NULL, 10, &outer), DIST_OK);
    /* both are freed by the failed create (a leak here shows under the sanitizers) */
    ck_assert_int_eq(dist_comm_create_hierarchical(inner, outer, NULL, &c), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    ck_assert_msg(strstr(dist_last_error(), "one rank per process"), "%s", dist_last_error());
    ck_assert_ptr_null(dist_comm_net_handle(NULL));
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL);
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("in_process");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc,
                   test_in_process_every_dtype_and_op_matches_rank_order_reference_on_3_threads);
    tcase_add_test(tc, test_in_process_int32_and_int64_sums_above_2_24_are_exact);
    tcase_add_test(tc, test_in_process_mean_of_integers_truncates_toward_zero);
    tcase_add_test(tc, test_in_process_f16_and_bf16_round_to_nearest_even_after_each_step);
    tcase_add_test(tc, test_in_process_max_min_and_nan_propagates_through_max);
    tcase_add_test(tc, test_in_process_all_gather_in_rank_order_and_broadcast_from_root);
    tcase_add_test(tc, test_in_process_count_mismatch_fails_every_rank_and_writes_nothing);
    tcase_add_test(
        tc, test_in_process_rank_that_never_arrives_times_out_within_the_call_timeout_naming_it);
    tcase_add_test(
        tc, test_in_process_cancel_fails_the_others_with_peer_lost_and_reset_makes_it_usable);
    tcase_add_test(tc,
                   test_hierarchical_create_takes_ownership_and_refuses_an_outer_with_local_ranks);
    suite_add_tcase(s, tc);
    TCase *tp = tcase_create("processes");
    tcase_set_timeout(tp, 120);
    tcase_add_test(
        tp,
        test_tcp_and_shm_typed_sums_exact_max_nan_mean_truncates_bitwise_identical_2_and_3_ranks);
    tcase_add_test(
        tp, test_tcp_and_shm_rank_that_never_arrives_times_out_within_the_call_timeout_naming_it);
    tcase_add_test(
        tp,
        test_hierarchical_2_processes_x_2_threads_global_rank_order_root_on_other_worker_mean_over_4);
    suite_add_tcase(s, tp);
    return dist_test_run(s);
}
