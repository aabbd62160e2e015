/* Unit tests with real processes on 127.0.0.1: a cluster of free ports and a report folder,
 * ranks as forked children that report through a file each (they never call ck_assert: they
 * _exit(1) with a message in their file), and the parent's side that waits and reads. No
 * backend may exist before a fork (OpenMP does not survive it). */
#ifndef DIST_PROC_TESTUTIL_H
#define DIST_PROC_TESTUTIL_H

#include "collective/net_comm.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_RANKS 8
#define TEST_CLUSTER_TOKEN "test-cluster-token-0123456789"

typedef struct cluster {
    int world;
    char addr_buf[MAX_RANKS][32];
    const char *addrs[MAX_RANKS];
    const char *names[MAX_RANKS];
    char dir[64];
    /* unique per cluster (pid and a count): a member of another test's cluster that runs at
     * the same time, on a port this cluster also picked, fails the handshake instead of
     * joining this one (the world size and the token are the same in every test) */
    char fingerprint[64];
    /* the picking sockets, bound to the ports and held (cluster_pick_ports) */
    int held[MAX_RANKS], nheld;
} cluster;

static const char *const k_names[MAX_RANKS] = {"chief/0",  "worker/1", "worker/2", "worker/3",
                                               "worker/4", "worker/5", "worker/6", "worker/7"};

static inline int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

/* Ports from the OS, held (dist_test_hold_port) until the next pick or cluster_cleanup: no
 * other test's cluster or outgoing connection gets them meanwhile. A forked rank holds copies,
 * closed when it exits. run_all still repeats a run whose rank could not listen (a process
 * that bound the port by its number). */
static inline void cluster_release_ports(cluster *cl) {
    for (int i = 0; i < cl->nheld; i++) close(cl->held[i]);
    cl->nheld = 0;
}

static inline void cluster_pick_ports(cluster *cl) {
    cluster_release_ports(cl);
    for (int r = 0; r < cl->world; r++) {
        int port = dist_test_hold_port(&cl->held[cl->nheld++]);
        snprintf(cl->addr_buf[r], sizeof cl->addr_buf[r], "127.0.0.1:%d", port);
        cl->addrs[r] = cl->addr_buf[r];
        cl->names[r] = k_names[r];
    }
}

static inline void cluster_init(cluster *cl, int world) {
    memset(cl, 0, sizeof *cl);
    cl->world = world;
    static unsigned clusters_made;
    snprintf(cl->fingerprint, sizeof cl->fingerprint, "test-cluster-%ld-%u", (long)getpid(),
             clusters_made++);
    cluster_pick_ports(cl);
    snprintf(cl->dir, sizeof cl->dir, "/tmp/dist_net_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(cl->dir));
}

static inline void cluster_cleanup(cluster *cl) {
    cluster_release_ports(cl);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", cl->dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* Options for rank `rank` of the cluster: 30 s to join and 30 s per collective (a test that
 * wants a timeout sets its own). On a loaded 2-core CI machine a join of 3 ranks ran out of
 * 10 s, and once a rank of 3 made no progress in an all-reduce for 10 s while its peers waited
 * on it: the failures name the rank, but a stalled host is not what these tests test. */
static inline dist_net_comm_options cluster_options(const cluster *cl, int rank,
                                                    dist_net_transport t) {
    dist_net_comm_options o = DIST_NET_COMM_OPTIONS_INIT;
    o.rank = rank;
    o.world = cl->world;
    o.addresses = cl->addrs;
    o.task_names = cl->names;
    o.fingerprint = cl->fingerprint;
    o.token = TEST_CLUSTER_TOKEN;
    o.connect_timeout_s = 30;
    o.timeout_s = 30;
    o.transport = t;
    return o;
}

/* ---- the child's side ---- */

static FILE *g_out; /* the child's report file */

static inline FILE *open_report(const cluster *cl, const char *tag, int rank) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s%d", cl->dir, tag, rank);
    return fopen(path, "wb");
}

static inline void child_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static inline void child_fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(g_out, "FAIL: ");
    vfprintf(g_out, fmt, ap);
    va_end(ap);
    fclose(g_out);
    _exit(1);
}

#define CHILD_CHECK(cond, ...)                                                                     \
    do {                                                                                           \
        if (!(cond)) child_fail(__VA_ARGS__);                                                      \
    } while (0)

static inline void child_done(void) {
    fclose(g_out);
    _exit(0);
}

/* A member that must not join: creating with o fails with `want`; the error goes to the
 * report. */
static inline void child_create_fails(const dist_net_comm_options *o, dist_status want,
                                      const char *who) {
    dist_net_comm *c = NULL;
    dist_status st = dist_net_comm_create(o, &c);
    CHILD_CHECK(st == want, "%s: %s, expected %s", who, dist_status_name(st),
                dist_status_name(want));
    fprintf(g_out, "%s\n", dist_last_error());
}

/* ---- the parent's side ---- */

typedef void (*rank_fn)(const cluster *cl, int rank, void *arg);

static inline pid_t spawn(const cluster *cl, int rank, rank_fn fn, void *arg) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        g_out = open_report(cl, "out", rank);
        if (!g_out) _exit(2);
        fn(cl, rank, arg);
        child_done();
    }
    return pid;
}

/* The report of `rank` (malloc'ed, NUL-terminated) and its size. */
static inline char *read_report(const cluster *cl, int rank, size_t *len) {
    char path[128];
    snprintf(path, sizeof path, "%s/out%d", cl->dir, rank);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "no report from rank %d", rank);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    ck_assert_int_eq(fread(b, 1, (size_t)n, f), (size_t)n);
    b[n] = 0;
    fclose(f);
    if (len) *len = (size_t)n;
    return b;
}

/* The part of a report worth quoting in a failure: from its "FAIL: " line when it has one (a
 * report may hold binary results before it), else its start. */
static inline const char *report_failure(const char *r, size_t len) {
    const char *f = memmem(r, len, "FAIL: ", 6);
    return f ? f : r;
}

/* Waits for the child; fails the test with its report when it did not exit 0. */
static inline void expect_exit_ok(const cluster *cl, pid_t pid, int rank) {
    int status = 0;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        size_t len = 0;
        char *r = read_report(cl, rank, &len);
        ck_abort_msg("rank %d exited with status 0x%x: %.400s", rank, status,
                     report_failure(r, len));
    }
}

/* Whether rank's report says that it could not listen because its port was taken. */
static inline int report_says_port_taken(const cluster *cl, int rank) {
    char *r = read_report(cl, rank, NULL);
    int taken = strstr(r, "Address already in use") != NULL;
    free(r);
    return taken;
}

/* Fails the test with the report of every rank whose status is not a clean exit (the first
 * to fail is often waiting for the one that went wrong). */
static inline void abort_with_reports(const cluster *cl, const int *status, int failed) {
    char msg[3584]; /* Check's message limit is 4 KiB */
    size_t used = 0;
    for (int r = 0; r < cl->world && used + 1 < sizeof msg; r++) {
        if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
        size_t len = 0;
        char *rep = read_report(cl, r, &len);
        int k = snprintf(msg + used, sizeof msg - used, "%srank %d exited with status 0x%x: %.400s",
                         used ? " | " : "", r, status[r], report_failure(rep, len));
        free(rep);
        if (k < 0) break;
        used += (size_t)k < sizeof msg - used ? (size_t)k : sizeof msg - used - 1;
    }
    ck_abort_msg("%d of %d ranks failed: %s", failed, cl->world, msg);
}

/* Runs fn on every rank and fails the test with the reports of the ranks that did not exit 0
 * (abort_with_reports). A run in which a rank's port was taken by another process (EADDRINUSE)
 * is repeated on fresh ports, at most twice: the port race, not the code under test. */
static inline void run_all(cluster *cl, rank_fn fn, void *arg) {
    for (int attempt = 0;; attempt++) {
        pid_t pids[MAX_RANKS];
        int status[MAX_RANKS], failed = 0, taken = 0;
        for (int r = 0; r < cl->world; r++) pids[r] = spawn(cl, r, fn, arg);
        for (int r = 0; r < cl->world; r++) {
            ck_assert_int_eq(waitpid(pids[r], &status[r], 0), pids[r]);
            if (WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0) continue;
            failed++;
            taken |= report_says_port_taken(cl, r);
        }
        if (!failed) return;
        if (taken && attempt < 2) {
            cluster_pick_ports(cl);
            continue;
        }
        abort_with_reports(cl, status, failed);
    }
}

/* Rank 0 (rank0), then `intruder` to its end (reporting as rank `world`), then ranks
 * 1..world-1 (rest); waits for all of them. */
static inline void run_with_intruder(const cluster *cl, rank_fn rank0, rank_fn rest,
                                     rank_fn intruder, void *arg) {
    pid_t pids[MAX_RANKS];
    pids[0] = spawn(cl, 0, rank0, arg);
    pid_t pi = spawn(cl, cl->world, intruder, arg);
    expect_exit_ok(cl, pi, cl->world);
    for (int r = 1; r < cl->world; r++) pids[r] = spawn(cl, r, rest, arg);
    for (int r = cl->world - 1; r >= 0; r--) expect_exit_ok(cl, pids[r], r);
}

static inline double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#endif
