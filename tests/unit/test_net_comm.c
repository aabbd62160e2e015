/* The cross-process communicator with real processes on 127.0.0.1: all-reduce over TCP and
 * shared memory (exact sums, bitwise identical ranks, odd sizes), broadcast, all-gather,
 * barrier, the store, refused strangers, and the failures (killed, stopped, absent rank).
 *
 * Every rank is a forked child that reports through a file; no backend is ever created here
 * (OpenMP does not survive fork). Children never call ck_assert: they _exit(1) with a
 * message in their file, and the parent asserts. */
#include "collective/net_comm.h"
#include "collective/net_internal.h"
#include "proc_testutil.h"
#include "testutil.h"

#include <signal.h>

static dist_net_comm *child_create(const cluster *cl, int rank, dist_net_transport t) {
    dist_net_comm_options o = cluster_options(cl, rank, t);
    dist_net_comm *c = NULL;
    dist_status st = dist_net_comm_create(&o, &c);
    CHILD_CHECK(st == DIST_OK, "rank %d create: %s %s", rank, dist_status_name(st),
                dist_last_error());
    return c;
}

/* Collected WARN messages (the log callback). */
static void log_to_report(dist_log_level level, const char *msg, void *user) {
    if (level <= DIST_LOG_WARN) fprintf((FILE *)user, "LOG: %s\n", msg);
    fflush((FILE *)user);
}

/* ---- all-reduce ---- */

static const size_t k_sizes[] = {1, 1000, 1024, 262144 + 3};
#define NSIZES (sizeof k_sizes / sizeof k_sizes[0])

/* Exact inputs: rank r holds (r + 1) / 2 + i % 7, so the sum over W ranks is
 * W (W + 1) / 4 + W (i % 7), exact in float. Inexact ones: 0.1 (r + 1) + 1e-3 i, whose sums
 * round, so equality across ranks shows one summation order. */
static void allreduce_rank(const cluster *cl, int rank, void *arg) {
    dist_net_comm *c = child_create(cl, rank, *(dist_net_transport *)arg);
    fprintf(g_out, "%s\n", dist_net_comm_transport_name(c));
    for (size_t s = 0; s < NSIZES; s++) {
        size_t n = k_sizes[s];
        float *exact = malloc(n * sizeof *exact), *inexact = malloc(n * sizeof *inexact);
        for (size_t i = 0; i < n; i++) {
            exact[i] = (float)(rank + 1) * 0.5f + (float)(i % 7);
            inexact[i] = 0.1f * (float)(rank + 1) + 1e-3f * (float)i;
        }
        dist_status st = dist_net_comm_all_reduce(c, exact, n, DIST_REDUCE_SUM);
        CHILD_CHECK(st == DIST_OK, "all-reduce %zu: %s", n, dist_last_error());
        st = dist_net_comm_all_reduce(c, inexact, n, DIST_REDUCE_SUM);
        CHILD_CHECK(st == DIST_OK, "all-reduce %zu: %s", n, dist_last_error());
        float w = (float)cl->world;
        for (size_t i = 0; i < n; i++)
            CHILD_CHECK(exact[i] == w * (w + 1) / 4 + w * (float)(i % 7),
                        "size %zu: element %zu is %g", n, i, (double)exact[i]);
        fwrite(inexact, sizeof *inexact, n, g_out);
        free(exact);
        free(inexact);
    }
    float mean[3] = {(float)rank, 1.0f, -2.0f * (float)rank};
    CHILD_CHECK(dist_net_comm_all_reduce(c, mean, 3, DIST_REDUCE_MEAN) == DIST_OK, "mean: %s",
                dist_last_error());
    float w = (float)cl->world;
    CHILD_CHECK(mean[0] == (w - 1) / 2 && mean[1] == 1.0f && mean[2] == -(w - 1), "mean: %g %g %g",
                (double)mean[0], (double)mean[1], (double)mean[2]);
    dist_net_comm_destroy(c);
}

static void check_allreduce(int world, dist_net_transport t, const char *want_transport) {
    cluster cl;
    cluster_init(&cl, world);
    run_all(&cl, allreduce_rank, &t);
    size_t len0;
    char *r0 = read_report(&cl, 0, &len0);
    size_t name_len = strlen(want_transport) + 1;
    ck_assert_msg(strncmp(r0, want_transport, strlen(want_transport)) == 0, "transport: %.8s", r0);
    size_t total = 0;
    for (size_t s = 0; s < NSIZES; s++) total += k_sizes[s];
    ck_assert_uint_eq(len0, name_len + total * sizeof(float));
    for (int r = 1; r < world; r++) {
        size_t len;
        char *rr = read_report(&cl, r, &len);
        ck_assert_uint_eq(len, len0);
        ck_assert_msg(memcmp(rr, r0, len0) == 0, "rank %d's sums differ from rank 0's bits", r);
        free(rr);
    }
    /* and they are the sums, up to rounding */
    const float *got = (const float *)(r0 + name_len);
    float first = got[0], want = 0;
    for (int r = 0; r < world; r++) want += 0.1f * (float)(r + 1);
    ck_assert_float_eq_tol(first, want, 1e-5);
    free(r0);
    cluster_cleanup(&cl);
}

START_TEST(test_net_all_reduce_tcp_2_3_and_4_ranks_exact_and_bitwise_identical) {
    check_allreduce(2, DIST_NET_TCP, "tcp");
    check_allreduce(3, DIST_NET_TCP, "tcp");
    check_allreduce(4, DIST_NET_TCP, "tcp");
}
END_TEST

START_TEST(test_net_all_reduce_shm_2_and_3_ranks_exact_and_bitwise_identical) {
    check_allreduce(2, DIST_NET_SHM, "shm");
    check_allreduce(3, DIST_NET_SHM, "shm");
}
END_TEST

START_TEST(test_net_auto_transport_on_one_host_is_shm) { check_allreduce(2, DIST_NET_AUTO, "shm"); }
END_TEST

/* ---- broadcast, all-gather, barrier, store ---- */

static void collectives_rank(const cluster *cl, int rank, void *arg) {
    dist_net_comm *c = child_create(cl, rank, DIST_NET_AUTO);
    CHILD_CHECK(dist_net_comm_rank(c) == rank && dist_net_comm_world(c) == 3, "rank/world");
    enum { B = 100003 };
    unsigned char *b = malloc(B);
    for (int i = 0; i < B; i++) b[i] = rank == 1 ? (unsigned char)(i * 7 + 1) : 0;
    CHILD_CHECK(dist_net_comm_broadcast(c, b, B, 1) == DIST_OK, "broadcast: %s", dist_last_error());
    for (int i = 0; i < B; i++)
        CHILD_CHECK(b[i] == (unsigned char)(i * 7 + 1), "broadcast byte %d is %d", i, b[i]);
    free(b);

    int in[2] = {10 * rank, 10 * rank + 1}, out[6] = {0};
    CHILD_CHECK(dist_net_comm_all_gather(c, in, sizeof in, out) == DIST_OK, "all-gather: %s",
                dist_last_error());
    const int want[6] = {0, 1, 10, 11, 20, 21};
    for (int i = 0; i < 6; i++)
        CHILD_CHECK(out[i] == want[i], "all-gather [%d] = %d, want %d", i, out[i], want[i]);

    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier: %s", dist_last_error());

    if (rank == 0)
        CHILD_CHECK(dist_net_comm_store_set(c, "nccl-id", "abc123", 7) == DIST_OK, "set: %s",
                    dist_last_error());
    char v[16] = "";
    size_t len = 0;
    dist_status st = dist_net_comm_store_get(c, "nccl-id", v, sizeof v, &len);
    CHILD_CHECK(st == DIST_OK && len == 7 && strcmp(v, "abc123") == 0, "get: %s '%s' %zu",
                dist_last_error(), v, len);
    st = dist_net_comm_store_get(c, "nccl-id", v, 3, &len);
    CHILD_CHECK(st == DIST_INVALID_ARGUMENT && len == 7, "small cap: %s", dist_status_name(st));
    /* still in step after the refused get */
    CHILD_CHECK(dist_net_comm_barrier(c) == DIST_OK, "barrier 2: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

START_TEST(test_net_broadcast_all_gather_barrier_and_store_on_3_ranks) {
    cluster cl;
    cluster_init(&cl, 3);
    run_all(&cl, collectives_rank, NULL);
    cluster_cleanup(&cl);
}
END_TEST

START_TEST(test_net_store_get_of_a_key_never_set_times_out) {
    cluster cl;
    cluster_init(&cl, 1);
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_AUTO);
    o.timeout_s = 0.2;
    dist_net_comm *c = NULL;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_OK);
    float x = 3;
    ck_assert_int_eq(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_MEAN), DIST_OK);
    ck_assert_float_eq(x, 3.0f);
    ck_assert_int_eq(dist_net_comm_store_set(c, "a", "1", 1), DIST_OK);
    char v[4];
    size_t len;
    ck_assert_int_eq(dist_net_comm_store_get(c, "a", v, sizeof v, &len), DIST_OK);
    ck_assert_uint_eq(len, 1);
    ck_assert_int_eq(dist_net_comm_store_get(c, "b", v, sizeof v, &len), DIST_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'b'"));
    dist_net_comm_destroy(c);
    cluster_cleanup(&cl);
}
END_TEST

/* ---- strangers ---- */

static void logging_rank0(const cluster *cl, int rank, void *arg) {
    dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    dist_net_comm *c = child_create(cl, rank, DIST_NET_TCP);
    float x = 1;
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK && x == 3.0f,
                "all-reduce with the real rank 1: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

static void real_rank1(const cluster *cl, int rank, void *arg) {
    dist_net_comm *c = child_create(cl, rank, DIST_NET_TCP);
    float x = 2;
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK && x == 3.0f,
                "all-reduce: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

static void impostor(const cluster *cl, int rank, void *arg) {
    dist_net_comm_options o = cluster_options(cl, 1, DIST_NET_TCP);
    o.fingerprint = "another-job";
    child_create_fails(&o, DIST_UNAVAILABLE, "impostor");
}

/* Speaks protocol version 2 to rank 0, as rank 1. */
static void old_peer(const cluster *cl, int rank, void *arg) {
    int fd;
    dist_status st = net_connect_retry(cl->addrs[0], net_now() + 10, "rank 0", &fd, NULL, 0);
    CHILD_CHECK(st == DIST_OK, "connect: %s", dist_last_error());
    unsigned char b[NET_HELLO_BYTES] = {0};
    put32(b, NET_HELLO_MAGIC);
    put32(b + 4, DIST_NET_PROTOCOL_VERSION + 1);
    put32(b + 8, NET_KIND_STORE);
    put32(b + 12, 1);
    CHILD_CHECK(net_send_all(fd, b, sizeof b, net_now() + 5, "rank 0") == DIST_OK, "send");
    CHILD_CHECK(net_recv_all(fd, b, NET_CHALLENGE_BYTES, net_now() + 5, "rank 0") == DIST_OK,
                "answer");
    CHILD_CHECK(get32(b) == NET_HELLO_MAGIC && get32(b + 8) != 0, "not refused (status %u)",
                get32(b + 8));
    /* and then closed */
    CHILD_CHECK(net_recv_all(fd, b, 1, net_now() + 5, "rank 0") == DIST_PEER_LOST, "not closed");
    close(fd);
}

/* want_told: what the stranger's own error says (NULL: it reports nothing). */
static void check_stranger_refused(rank_fn stranger, const char *want_log, const char *want_told) {
    cluster cl;
    cluster_init(&cl, 2);
    run_with_intruder(&cl, logging_rank0, real_rank1, stranger, NULL); /* it reports as "out2" */
    char *log = read_report(&cl, 0, NULL);
    ck_assert_msg(strstr(log, "LOG: ") && strstr(log, want_log), "rank 0 logged: %s", log);
    ck_assert_msg(strstr(log, "127.0.0.1:"), "the log names no address: %s", log);
    free(log);
    if (want_told) {
        char *s = read_report(&cl, 2, NULL);
        ck_assert_msg(strstr(s, want_told), "the stranger was told: %s", s);
        free(s);
    }
    cluster_cleanup(&cl);
}

START_TEST(test_net_wrong_fingerprint_is_refused_and_logged_and_the_real_rank_joins) {
    check_stranger_refused(impostor, "authentication failed",
                           "refused this process (rank 1): authentication failed");
}
END_TEST

START_TEST(test_net_other_protocol_version_is_refused_and_logged) {
    check_stranger_refused(old_peer, "other protocol version", NULL);
}
END_TEST

/* A second process claiming rank 1 while the real one is connected. */

static bool report_has(const cluster *cl, const char *file, const char *text) {
    char path[128], buf[4096] = "";
    snprintf(path, sizeof path, "%s/%s", cl->dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return strstr(buf, text) != NULL;
}

/* The duplicate's connect timeout: it finds no listener and gives up after it. */
#define DUPLICATE_CONNECT_S 1.0

/* Waits until `file` says `text`, at most limit_s. */
static bool wait_report(const cluster *cl, const char *file, const char *text, double limit_s) {
    for (double t0 = now_s(); now_s() - t0 < limit_s;) {
        if (report_has(cl, file, text)) return true;
        usleep(10000);
    }
    return false;
}

static void holding_rank(const cluster *cl, int rank, void *arg) {
    if (rank == 0) dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    dist_net_comm *c = child_create(cl, rank, DIST_NET_TCP);
    fprintf(g_out, "joined\n");
    fflush(g_out);
    /* the other rank joins within the connect timeout, then the duplicate runs out its own */
    double connect_s = cluster_options(cl, rank, DIST_NET_TCP).connect_timeout_s;
    CHILD_CHECK(
        wait_report(cl, "go", "go", dist_test_timeout_bound(connect_s + DUPLICATE_CONNECT_S)),
        "no go");
    float x = (float)rank + 1;
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK && x == 3.0f,
                "all-reduce after the duplicate: %s", dist_last_error());
    dist_net_comm_destroy(c);
}

static void duplicate_rank1(const cluster *cl, int rank, void *arg) {
    dist_net_comm_options o = cluster_options(cl, 1, DIST_NET_TCP);
    o.connect_timeout_s = DUPLICATE_CONNECT_S;
    child_create_fails(&o, DIST_TIMEOUT, "duplicate");
}

/* Once the mesh is complete every listener is closed: even a process with the token and the
 * cluster spec finds no port to knock on. */
START_TEST(test_net_after_the_mesh_forms_a_late_duplicate_finds_every_port_closed) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, holding_rank, NULL), p1 = spawn(&cl, 1, holding_rank, NULL);
    double join_s =
        dist_test_timeout_bound(cluster_options(&cl, 0, DIST_NET_TCP).connect_timeout_s);
    ck_assert(wait_report(&cl, "out0", "joined", join_s) &&
              wait_report(&cl, "out1", "joined", join_s));
    pid_t pd = spawn(&cl, 2, duplicate_rank1, NULL);
    expect_exit_ok(&cl, pd, 2);
    char path[128];
    snprintf(path, sizeof path, "%s/go", cl.dir);
    FILE *f = fopen(path, "w");
    fputs("go", f);
    fclose(f);
    expect_exit_ok(&cl, p0, 0);
    expect_exit_ok(&cl, p1, 1);
    ck_assert_msg(report_has(&cl, "out2", "Connection refused"), "the duplicate found a listener");
    cluster_cleanup(&cl);
}
END_TEST

/* ---- failures ---- */

typedef struct failure_case {
    dist_net_transport transport;
    int signal; /* what rank 1 does to itself after the first all-reduce */
    double timeout_s;
    dist_net_allreduce_algorithm algo; /* TCP's (auto by default) */
} failure_case;

static void failing_rank1(const cluster *cl, int rank, void *arg) {
    const failure_case *fc = arg;
    dist_net_comm_options o = cluster_options(cl, rank, fc->transport);
    o.timeout_s = fc->timeout_s;
    o.allreduce_algorithm = fc->algo;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float x[1000] = {0};
    CHILD_CHECK(dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM) == DIST_OK, "first: %s",
                dist_last_error());
    fclose(g_out);
    raise(fc->signal);
    _exit(0);
}

static void surviving_rank0(const cluster *cl, int rank, void *arg) {
    const failure_case *fc = arg;
    dist_net_comm_options o = cluster_options(cl, rank, fc->transport);
    o.timeout_s = fc->timeout_s;
    o.allreduce_algorithm = fc->algo;
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float x[1000] = {0};
    CHILD_CHECK(dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM) == DIST_OK, "first: %s",
                dist_last_error());
    double t0 = now_s();
    dist_status st = dist_net_comm_all_reduce(c, x, 1000, DIST_REDUCE_SUM);
    double dt = now_s() - t0;
    fprintf(g_out, "%s %.3f %s\n", dist_status_name(st), dt, dist_last_error());
    /* the communicator stays failed */
    dist_status again = dist_net_comm_barrier(c);
    fprintf(g_out, "again %s\n", dist_status_name(again));
    dist_net_comm_destroy(c);
}

/* max_s: how soon the survivor must fail; a timeout case passes dist_test_timeout_bound; a
 * message the report must hold, or NULL. */
static void check_failure_saying(failure_case fc, const char *want_status, double max_s,
                                 const char *says) {
    cluster cl;
    cluster_init(&cl, 2);
    pid_t p0 = spawn(&cl, 0, surviving_rank0, &fc);
    pid_t p1 = spawn(&cl, 1, failing_rank1, &fc);
    expect_exit_ok(&cl, p0, 0);
    kill(p1, SIGKILL);
    waitpid(p1, NULL, 0);
    char *r = read_report(&cl, 0, NULL);
    char status[32] = "", again[32] = "";
    double dt = -1;
    ck_assert_int_eq(sscanf(r, "%31s %lf", status, &dt), 2);
    ck_assert_msg(strcmp(status, want_status) == 0, "got: %s", r);
    ck_assert_msg(dt < max_s, "took %.3f s: %s", dt, r);
    ck_assert_msg(strstr(r, "worker/1 at 127.0.0.1:"), "does not name the peer: %s", r);
    ck_assert_msg(!says || strstr(r, says), "does not say '%s': %s", says, r);
    const char *a = strstr(r, "again ");
    ck_assert_ptr_nonnull(a);
    sscanf(a + 6, "%31s", again);
    ck_assert_str_eq(again, want_status);
    free(r);
    cluster_cleanup(&cl);
}

static void check_failure(failure_case fc, const char *want_status, double max_s) {
    check_failure_saying(fc, want_status, max_s, NULL);
}

START_TEST(test_net_killed_rank_fails_the_survivor_with_peer_lost_tcp_and_shm) {
    check_failure((failure_case){DIST_NET_TCP, SIGKILL, 30, DIST_NET_ALLREDUCE_AUTO},
                  "DIST_PEER_LOST", 3.0);
    check_failure((failure_case){DIST_NET_SHM, SIGKILL, 30, DIST_NET_ALLREDUCE_AUTO},
                  "DIST_PEER_LOST", 3.0);
}
END_TEST

START_TEST(test_net_stopped_rank_fails_the_survivor_with_timeout_tcp_and_shm) {
    const double bound = dist_test_timeout_bound(1.0);
    check_failure((failure_case){DIST_NET_TCP, SIGSTOP, 1.0, DIST_NET_ALLREDUCE_AUTO},
                  "DIST_TIMEOUT", bound);
    check_failure((failure_case){DIST_NET_SHM, SIGSTOP, 1.0, DIST_NET_ALLREDUCE_AUTO},
                  "DIST_TIMEOUT", bound);
    /* the ring, chosen explicitly, says how far it got with the silent peer */
    check_failure_saying((failure_case){DIST_NET_TCP, SIGSTOP, 1.0, DIST_NET_ALLREDUCE_RING},
                         "DIST_TIMEOUT", bound, "of ring step 1 of 2; nothing moved for");
}
END_TEST

START_TEST(test_net_rank_that_never_joins_times_out_naming_it) {
    cluster cl;
    cluster_init(&cl, 2);
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_AUTO);
    o.connect_timeout_s = 0.5;
    dist_net_comm *c = NULL;
    double t0 = now_s();
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_TIMEOUT);
    ck_assert_ptr_null(c);
    ck_assert_double_lt(now_s() - t0, dist_test_timeout_bound(o.connect_timeout_s));
    char want[96];
    snprintf(want, sizeof want, "worker/1 at %s did not join within 0.5 s", cl.addrs[1]);
    ck_assert_msg(strstr(dist_last_error(), want), "message: %s", dist_last_error());
    /* and a worker whose chief never comes */
    o = cluster_options(&cl, 1, DIST_NET_AUTO);
    o.connect_timeout_s = 0.5;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_TIMEOUT);
    ck_assert_msg(strstr(dist_last_error(), "chief/0 at 127.0.0.1:"), "message: %s",
                  dist_last_error());
    cluster_cleanup(&cl);
}
END_TEST

START_TEST(test_net_own_port_taken_is_unavailable_naming_it) {
    cluster cl;
    cluster_init(&cl, 2);
    int busy = -1;
    int port = atoi(strchr(cl.addrs[0], ':') + 1);
    ck_assert_int_eq(net_listen("127.0.0.1", port, true, &busy), DIST_OK);
    /* SO_REUSEADDR does not let two listeners share a port */
    dist_net_comm_options o = cluster_options(&cl, 0, DIST_NET_AUTO);
    o.connect_timeout_s = 0.5;
    dist_net_comm *c = NULL;
    ck_assert_int_eq(dist_net_comm_create(&o, &c), DIST_UNAVAILABLE);
    char want[16];
    snprintf(want, sizeof want, "%d", port);
    ck_assert_msg(strstr(dist_last_error(), want), "message: %s", dist_last_error());
    close(busy);
    cluster_cleanup(&cl);
}
END_TEST

static void barrier_rank(const cluster *cl, int rank, void *arg) {
    (void)arg;
    dist_net_comm_options o = cluster_options(cl, rank, DIST_NET_TCP);
    o.connect_timeout_s = 1; /* a run with a taken port ends soon */
    dist_net_comm *c = NULL;
    CHILD_CHECK(dist_net_comm_create(&o, &c) == DIST_OK, "create: %s", dist_last_error());
    float x = 1;
    CHILD_CHECK(dist_net_comm_all_reduce(c, &x, 1, DIST_REDUCE_SUM) == DIST_OK, "%s",
                dist_last_error());
    CHILD_CHECK(x == (float)cl->world, "sum %g", (double)x);
    dist_net_comm_destroy(c);
}

START_TEST(test_run_all_repeats_a_run_whose_port_another_process_took) {
    cluster cl;
    cluster_init(&cl, 2);
    int busy = -1;
    char taken[32];
    snprintf(taken, sizeof taken, "%s", cl.addrs[1]);
    ck_assert_int_eq(net_listen("127.0.0.1", atoi(strchr(taken, ':') + 1), true, &busy), DIST_OK);
    run_all(&cl, barrier_rank, NULL);
    ck_assert_str_ne(cl.addrs[1], taken); /* the second run had fresh ports */
    close(busy);
    cluster_cleanup(&cl);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
    Suite *s = suite_create("net_comm");
    TCase *tc = tcase_create("processes");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_net_all_reduce_tcp_2_3_and_4_ranks_exact_and_bitwise_identical);
    tcase_add_test(tc, test_net_all_reduce_shm_2_and_3_ranks_exact_and_bitwise_identical);
    tcase_add_test(tc, test_net_auto_transport_on_one_host_is_shm);
    tcase_add_test(tc, test_net_broadcast_all_gather_barrier_and_store_on_3_ranks);
    tcase_add_test(tc, test_net_store_get_of_a_key_never_set_times_out);
    tcase_add_test(tc, test_net_wrong_fingerprint_is_refused_and_logged_and_the_real_rank_joins);
    tcase_add_test(tc, test_net_other_protocol_version_is_refused_and_logged);
    tcase_add_test(tc, test_net_after_the_mesh_forms_a_late_duplicate_finds_every_port_closed);
    tcase_add_test(tc, test_net_killed_rank_fails_the_survivor_with_peer_lost_tcp_and_shm);
    tcase_add_test(tc, test_net_stopped_rank_fails_the_survivor_with_timeout_tcp_and_shm);
    tcase_add_test(tc, test_net_rank_that_never_joins_times_out_naming_it);
    tcase_add_test(tc, test_net_own_port_taken_is_unavailable_naming_it);
    tcase_add_test(tc, test_run_all_repeats_a_run_whose_port_another_process_took);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
