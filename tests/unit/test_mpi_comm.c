/* The MPI communicator (collective/mpi_comm.h) between two processes.
 *
 * Run plain, as CTest does, the program is the parent:
 *   1. it checks the loader's error when $DIST_MPI_MODULE names a missing file;
 *   2. it starts itself again as `mpiexec -n 2 <this program>` with
 *        OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1  (CI containers run as root)
 *        OMPI_MCA_rmaps_base_oversubscribe=1                        (more ranks than cores)
 *        OMPI_MCA_btl_vader_single_copy_mechanism=none   (unless set: no CMA in containers)
 *      in the environment (other MPIs ignore them), plus LSAN_OPTIONS / ASAN_OPTIONS that
 *      suppress Open MPI's own leaks under AddressSanitizer (mpi_lsan.supp) unless already set,
 *      and passes when mpiexec exits 0 within DIST_TEST_MPI_LIMIT_S and both ranks wrote the
 *      same result digests.
 * Under an MPI launcher (dist_mpi_launched), each rank runs the Check suite below, writes one
 * digest line per result to $DIST_TEST_MPI_DIGESTS.<rank>, and at the end checks that MPI,
 * finalized by the last destroy, refuses a new communicator.
 *
 * Built without MPI (no DIST_TEST_MPIEXEC), it is skipped (77), or fails when
 * DIST_REQUIRE_MPI=1. */
#include "collective/mpi_comm.h"
#include "dist/status.h"
#include "mpi_testutil.h"
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MISSING_MODULE "/nonexistent/libdist-test/libdist_mpi.so"
#define DIST_TEST_MPI_LIMIT_S 240

static dist_comm *g_comm; /* the ranks' communicator, shared by the tests */
static int g_rank;
static FILE *g_digests;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* One line per result: the parent compares the two ranks' files. */
static void record(const char *name, const void *buf, size_t bytes) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < bytes; i++) h = (h ^ ((const unsigned char *)buf)[i]) * 1099511628211ULL;
    fprintf(g_digests, "%s %016llx\n", name, (unsigned long long)h);
}

/* ---- values as doubles: the references are computed exactly, then rounded once ----------- */

static size_t elem_size(dist_dtype t) {
    return t == DIST_I64 ? 8 : t == DIST_U8 ? 1 : t == DIST_F16 || t == DIST_BF16 ? 2 : 4;
}

static uint16_t bf16_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Stores v rounded to nearest even (floats) or converted (integers; U8 wraps modulo 256).
 * Rounding the exact value through double and float first is harmless: each step keeps more
 * than twice the next one's precision plus two bits. */
static void put(dist_dtype t, void *buf, size_t i, double v) {
    switch (t) {
    case DIST_F32: ((float *)buf)[i] = (float)v; break;
    case DIST_F16: ((_Float16 *)buf)[i] = (_Float16)(float)v; break;
    case DIST_BF16: ((uint16_t *)buf)[i] = bf16_from_float((float)v); break;
    case DIST_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DIST_U8: ((uint8_t *)buf)[i] = (uint8_t)(int64_t)v; break;
    case DIST_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

static double get(dist_dtype t, const void *buf, size_t i) {
    switch (t) {
    case DIST_F32: return ((const float *)buf)[i];
    case DIST_F16: return (double)((const _Float16 *)buf)[i];
    case DIST_BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)buf)[i] << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    case DIST_I32: return ((const int32_t *)buf)[i];
    case DIST_U8: return ((const uint8_t *)buf)[i];
    case DIST_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
    }
}

/* Rank r's element i: floats with inexact sums, int32 sums above 2^24 and int64 sums above
 * 2^40 (exact in double), odd negative integer sums (MEAN truncates), u8 sums that wrap. */
static double input(dist_dtype t, int r, size_t i) {
    double sign = i % 3 == 0 ? -1.0 : 1.0;
    switch (t) {
    case DIST_I32: return sign * (300000000.0 + 7.0 * (double)i + r);
    case DIST_I64: return sign * (1099511627776.0 + 7.0 * (double)i + r);
    case DIST_U8: return (double)((200 + 13 * i + 29 * (size_t)r) % 256);
    default: return (r + 1) * 0.37 + (double)i * 0.0131 - 2.5;
    }
}

static int is_float(dist_dtype t) { return t == DIST_F32 || t == DIST_F16 || t == DIST_BF16; }

/* ---- the tests: every rank runs each ------------------------------------------------------ */

START_TEST(test_the_communicator_spans_the_world_with_one_rank_per_process) {
    int rank = -1, size = 0;
    ck_assert_int_eq(dist_mpi_world(&rank, &size), DIST_OK);
    ck_assert_int_eq(size, 2);
    ck_assert_int_eq(g_comm->size, 2);
    ck_assert_int_eq(g_comm->first_rank, rank);
    ck_assert_int_eq(g_comm->local_ranks, 1);
    ck_assert_int_eq(g_comm->device_memory, 0);
    ck_assert_str_eq(g_comm->name, "mpi");
    ck_assert(dist_mpi_launched());
}
END_TEST

START_TEST(test_all_reduce_of_every_dtype_and_op_equals_the_exactly_rounded_reference) {
    const size_t n = 999;
    _Alignas(8) unsigned char got[999 * 8], other[999 * 8], want[999 * 8];
    for (int t = 0; t < DIST_DTYPE_COUNT; t++) {
        for (int op = DIST_REDUCE_SUM; op <= DIST_REDUCE_MIN; op++) {
            dist_dtype dt = (dist_dtype)t;
            for (size_t i = 0; i < n; i++) {
                put(dt, got, i, input(dt, g_rank, i));
                put(dt, other, i, input(dt, 1 - g_rank, i));
            }
            for (size_t i = 0; i < n; i++) {
                double a = get(dt, got, i), b = get(dt, other, i);
                if (op == DIST_REDUCE_MAX) {
                    put(dt, want, i, fmax(a, b));
                } else if (op == DIST_REDUCE_MIN) {
                    put(dt, want, i, fmin(a, b));
                } else {
                    put(dt, want, i, a + b);
                    if (op == DIST_REDUCE_MEAN) {
                        double s = get(dt, want, i) / 2;
                        put(dt, want, i, is_float(dt) ? s : trunc(s));
                    }
                }
            }
            ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, got, n, dt, (dist_reduce_op)op, 0),
                             DIST_OK);
            for (size_t i = 0; i < n; i++)
                ck_assert_msg(
                    memcmp(got + i * elem_size(dt), want + i * elem_size(dt), elem_size(dt)) == 0,
                    "dtype %d op %d element %zu: got %.17g, want %.17g", t, op, i, get(dt, got, i),
                    get(dt, want, i));
            char name[32];
            snprintf(name, sizeof name, "all_reduce.%d.%d", t, op);
            record(name, got, n * elem_size(dt));
        }
    }
}
END_TEST

START_TEST(test_int32_sum_above_2_to_the_24_is_exact) {
    int32_t x[2] = {g_rank == 0 ? 16777217 : 1, g_rank == 0 ? 1000000001 : 1000000000};
    ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, x, 2, DIST_I32, DIST_REDUCE_SUM, 0), DIST_OK);
    ck_assert_int_eq(x[0], 16777218);
    ck_assert_int_eq(x[1], 2000000001);
    int64_t y = g_rank == 0 ? 9007199254740993LL : 2; /* 2^53 + 1: not a double */
    ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, &y, 1, DIST_I64, DIST_REDUCE_SUM, 0), DIST_OK);
    ck_assert(y == 9007199254740995LL);
    record("int_sum", x, sizeof x);
}
END_TEST

START_TEST(test_integer_mean_truncates_toward_zero) {
    int32_t a = g_rank == 0 ? -3 : -4;   /* -7 / 2 */
    int64_t b = g_rank == 0 ? 5 : 4;     /* 9 / 2 */
    uint8_t c = g_rank == 0 ? 255 : 254; /* (509 mod 256) / 2 = 253 / 2 */
    ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, &a, 1, DIST_I32, DIST_REDUCE_MEAN, 0),
                     DIST_OK);
    ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, &b, 1, DIST_I64, DIST_REDUCE_MEAN, 0),
                     DIST_OK);
    ck_assert_int_eq(dist_comm_all_reduce(g_comm, 0, &c, 1, DIST_U8, DIST_REDUCE_MEAN, 0), DIST_OK);
    ck_assert_int_eq(a, -3);
    ck_assert_int_eq(b, 4);
    ck_assert_int_eq(c, 126);
}
END_TEST

START_TEST(test_nan_on_one_rank_wins_max_and_min_in_every_float_dtype) {
    const dist_dtype floats[] = {DIST_F32, DIST_F16, DIST_BF16};
    for (int k = 0; k < 3; k++) {
        for (int op = DIST_REDUCE_MAX; op <= DIST_REDUCE_MIN; op++) {
            _Alignas(8) unsigned char x[2 * 8];
            put(floats[k], x, 0, g_rank == 0 ? NAN : 1.0);
            put(floats[k], x, 1, g_rank == 0 ? 2.0 : 3.0);
            ck_assert_int_eq(
                dist_comm_all_reduce(g_comm, 0, x, 2, floats[k], (dist_reduce_op)op, 0), DIST_OK);
            ck_assert_msg(isnan(get(floats[k], x, 0)), "dtype %d op %d: NaN lost", (int)floats[k],
                          op);
            ck_assert(get(floats[k], x, 1) == (op == DIST_REDUCE_MAX ? 3.0 : 2.0));
        }
    }
}
END_TEST

START_TEST(test_all_gather_puts_each_rank_in_rank_order) {
    int32_t in[3] = {g_rank * 10, g_rank * 10 + 1, g_rank * 10 + 2}, out[6] = {0};
    ck_assert_int_eq(dist_comm_all_gather(g_comm, 0, in, out, 3, DIST_I32, 0), DIST_OK);
    const int32_t want[6] = {0, 1, 2, 10, 11, 12};
    ck_assert_mem_eq(out, want, sizeof want);
    /* in place: the input is this rank's slot of the output */
    _Float16 h[4] = {0};
    h[2 * g_rank] = (_Float16)(g_rank + 0.5f);
    h[2 * g_rank + 1] = (_Float16)(g_rank - 0.25f);
    ck_assert_int_eq(dist_comm_all_gather(g_comm, 0, h + 2 * g_rank, h, 2, DIST_F16, 0), DIST_OK);
    ck_assert(h[0] == (_Float16)0.5f && h[1] == (_Float16)-0.25f);
    ck_assert(h[2] == (_Float16)1.5f && h[3] == (_Float16)0.75f);
    record("all_gather", out, sizeof out);
}
END_TEST

START_TEST(test_broadcast_from_rank_1_reaches_rank_0) {
    float f[5];
    int64_t q[3];
    for (int i = 0; i < 5; i++) f[i] = (float)(g_rank * 100 + i) + 0.5f;
    for (int i = 0; i < 3; i++) q[i] = (int64_t)g_rank << 40 | i;
    ck_assert_int_eq(dist_comm_broadcast(g_comm, 0, f, 5, DIST_F32, 1, 0), DIST_OK);
    ck_assert_int_eq(dist_comm_broadcast(g_comm, 0, q, 3, DIST_I64, 1, 0), DIST_OK);
    for (int i = 0; i < 5; i++) ck_assert(f[i] == (float)(100 + i) + 0.5f);
    for (int i = 0; i < 3; i++) ck_assert(q[i] == ((int64_t)1 << 40 | i));
    record("broadcast", f, sizeof f);
}
END_TEST

START_TEST(test_barrier_completes) { ck_assert_int_eq(dist_comm_barrier(g_comm, 0, 10), DIST_OK); }
END_TEST

/* A call that must fail "at once": well before the call's own timeout, and within what the
 * test harness allows for no wait at all (dist_test_timeout_bound(0), scaled for slow
 * builds). */
static double at_once_bound(double call_timeout_s) {
    double b = dist_test_timeout_bound(0);
    return b < call_timeout_s / 2 ? b : call_timeout_s / 2;
}

/* Rank 1 makes the barrier a second later than rank 0 waits: rank 0 times out after 0.5 s,
 * naming the call and the timeout, and its communicator refuses later calls at once. Rank 1's
 * late barrier then completes the request rank 0 left behind (rank 0 keeps MPI progressing in
 * the next barrier), so both communicators can be freed and MPI finalized. */
START_TEST(test_a_rank_that_does_not_arrive_times_the_others_out_after_the_timeout) {
    dist_comm *c = NULL;
    ck_assert_int_eq(dist_comm_create_mpi(30, &c), DIST_OK);
    if (g_rank == 0) {
        double t0 = now_s();
        const double timeout_s = 0.5;
        dist_status st = dist_comm_barrier(c, 0, timeout_s);
        double waited = now_s() - t0;
        ck_assert_msg(st == DIST_TIMEOUT, "got %s", dist_status_name(st));
        ck_assert_msg(waited >= 0.9 * timeout_s && waited < dist_test_timeout_bound(timeout_s),
                      "gave up after %.3f s", waited);
        const char *msg = dist_last_error();
        ck_assert_msg(strstr(msg, "barrier") && strstr(msg, "0.5 s"), "message: %s", msg);
        int32_t x = 1;
        const double call_timeout_s = 10;
        t0 = now_s();
        st = dist_comm_all_reduce(c, 0, &x, 1, DIST_I32, DIST_REDUCE_SUM, call_timeout_s);
        ck_assert_msg(st == DIST_TIMEOUT, "got %s", dist_status_name(st));
        ck_assert_msg(now_s() - t0 < at_once_bound(call_timeout_s),
                      "a failed communicator waited %.3f s of its %g s", now_s() - t0,
                      call_timeout_s);
        ck_assert_msg(strstr(dist_last_error(), "failed earlier"), "%s", dist_last_error());
    } else {
        usleep(1000 * 1000);
        ck_assert_int_eq(dist_comm_barrier(c, 0, 30), DIST_OK);
    }
    ck_assert_int_eq(dist_comm_barrier(g_comm, 0, 30), DIST_OK);
    dist_comm_destroy(c);
}
END_TEST

START_TEST(test_a_cancelled_communicator_fails_with_peer_lost_at_once) {
    dist_comm *c = NULL;
    ck_assert_int_eq(dist_comm_create_mpi(30, &c), DIST_OK);
    if (g_rank == 0) {
        dist_comm_cancel(c, 0);
        const double call_timeout_s = 10;
        double t0 = now_s();
        dist_status st = dist_comm_barrier(c, 0, call_timeout_s);
        ck_assert_msg(st == DIST_PEER_LOST, "got %s", dist_status_name(st));
        ck_assert_msg(now_s() - t0 < at_once_bound(call_timeout_s),
                      "a cancelled communicator waited %.3f s of its %g s", now_s() - t0,
                      call_timeout_s);
    }
    dist_comm_destroy(c);
}
END_TEST

static int run_rank(void) {
    int size = 0;
    if (dist_mpi_world(&g_rank, &size) != DIST_OK) {
        fprintf(stderr, "%s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    char path[512];
    const char *base = getenv("DIST_TEST_MPI_DIGESTS");
    snprintf(path, sizeof path, "%s.%d", base ? base : "/dev/null", g_rank);
    g_digests = fopen(base ? path : "/dev/null", "w");
    if (!g_digests || dist_comm_create_mpi(60, &g_comm) != DIST_OK) {
        fprintf(stderr, "rank %d: %s\n", g_rank, dist_last_error());
        return EXIT_FAILURE;
    }
    Suite *s = suite_create("mpi_comm");
    TCase *tc = tcase_create("two_ranks");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_the_communicator_spans_the_world_with_one_rank_per_process);
    tcase_add_test(tc, test_all_reduce_of_every_dtype_and_op_equals_the_exactly_rounded_reference);
    tcase_add_test(tc, test_int32_sum_above_2_to_the_24_is_exact);
    tcase_add_test(tc, test_integer_mean_truncates_toward_zero);
    tcase_add_test(tc, test_nan_on_one_rank_wins_max_and_min_in_every_float_dtype);
    tcase_add_test(tc, test_all_gather_puts_each_rank_in_rank_order);
    tcase_add_test(tc, test_broadcast_from_rank_1_reaches_rank_0);
    tcase_add_test(tc, test_barrier_completes);
    tcase_add_test(tc, test_a_rank_that_does_not_arrive_times_the_others_out_after_the_timeout);
    tcase_add_test(tc, test_a_cancelled_communicator_fails_with_peer_lost_at_once);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    fclose(g_digests);
    /* The last destroy finalizes MPI; MPI cannot start again in this process. */
    dist_comm_destroy(g_comm);
    dist_comm *again = NULL;
    dist_status st = dist_comm_create_mpi(1, &again);
    if (st != DIST_UNSUPPORTED || !strstr(dist_last_error(), "one MPI job per process")) {
        fprintf(stderr, "rank %d: a create after MPI_Finalize gave %s: %s\n", g_rank,
                dist_status_name(st), dist_last_error());
        rc = EXIT_FAILURE;
    }
    return rc;
}

/* ---- the parent ------------------------------------------------------------------------------ */

#ifdef DIST_TEST_MPIEXEC
static int check_missing_module(void) {
    dist_comm *c = (dist_comm *)0x1;
    dist_status st = dist_comm_create_mpi(1, &c);
    const char *msg = dist_last_error();
    if (st != DIST_UNSUPPORTED || c != NULL || !strstr(msg, MISSING_MODULE) ||
        !strstr(msg, "$DIST_MPI_MODULE") || !strstr(msg, "No such file")) {
        fprintf(stderr, "missing module: got %s, '%s'\n", dist_status_name(st), msg);
        return 0;
    }
    int rank, size;
    return dist_mpi_world(&rank, &size) == DIST_UNSUPPORTED &&
           strstr(dist_last_error(), MISSING_MODULE);
}

static int read_file(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = 0;
    return (int)n;
}

static int launch_ranks(void) {
    char digests[] = "/tmp/test_mpi_comm.XXXXXX";
    int fd = mkstemp(digests);
    if (fd < 0) return 0;
    close(fd);
    setenv("DIST_TEST_MPI_DIGESTS", digests, 1);
    dist_test_mpi_environment();
    char self[4096];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len <= 0) return 0;
    self[len] = 0;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0); /* a stuck launch is killed with its ranks */
        execl(DIST_TEST_MPIEXEC, DIST_TEST_MPIEXEC, "-n", "2", self, (char *)NULL);
        perror("exec " DIST_TEST_MPIEXEC);
        _exit(127);
    }
    int status = 0;
    double deadline = now_s() + DIST_TEST_MPI_LIMIT_S;
    while (waitpid(pid, &status, WNOHANG) == 0) {
        if (now_s() > deadline) {
            fprintf(stderr, "mpiexec did not finish in %d s: killed\n", DIST_TEST_MPI_LIMIT_S);
            kill(-pid, SIGKILL);
            waitpid(pid, &status, 0);
            return 0;
        }
        usleep(50 * 1000);
    }
    int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) fprintf(stderr, "%s -n 2 %s: exit status %d\n", DIST_TEST_MPIEXEC, self, status);
    static char a[1 << 16], b[1 << 16];
    char path[600];
    snprintf(path, sizeof path, "%s.0", digests);
    int na = read_file(path, a, sizeof a);
    unlink(path);
    snprintf(path, sizeof path, "%s.1", digests);
    int nb = read_file(path, b, sizeof b);
    unlink(path);
    unlink(digests);
    if (ok && (na <= 0 || na != nb || strcmp(a, b) != 0)) {
        fprintf(stderr, "the ranks' results differ:\nrank 0:\n%s\nrank 1:\n%s\n", a, b);
        ok = 0;
    }
    if (ok)
        printf("2 ranks under %s: all passed; results bitwise identical (%d digest bytes)\n",
               DIST_TEST_MPIEXEC, na);
    return ok;
}
#endif

int main(void) {
    setenv("CK_FORK", "no", 1);
    if (dist_mpi_launched()) return run_rank();
#ifndef DIST_TEST_MPIEXEC
    const char *req = getenv("DIST_REQUIRE_MPI");
    if (req && strcmp(req, "1") == 0) {
        fprintf(stderr, "DIST_REQUIRE_MPI=1, but libdist was built without MPI (or no mpiexec)\n");
        return EXIT_FAILURE;
    }
    printf("libdist was built without MPI (or CMake found no mpiexec): skipped\n");
    return 77;
#else
    /* This process never loads the module otherwise: the missing path is only its own. */
    const char *module = getenv("DIST_MPI_MODULE");
    char saved[4096] = "";
    if (module) snprintf(saved, sizeof saved, "%s", module);
    setenv("DIST_MPI_MODULE", MISSING_MODULE, 1);
    int ok = check_missing_module();
    if (!ok) fprintf(stderr, "FAIL: the missing module's error\n");
    if (module)
        setenv("DIST_MPI_MODULE", saved, 1);
    else
        unsetenv("DIST_MPI_MODULE");
    ok &= launch_ranks();
    return ok ? EXIT_SUCCESS : EXIT_FAILURE;
#endif
}
