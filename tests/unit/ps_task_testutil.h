/* A real ps task on 127.0.0.1 for the parameter-service tests (test_ps_security.c,
 * test_ps_flood.c): a forked child that creates a parameter_server strategy from a TF_CONFIG of
 * a chief, one worker and one ps (task ps/0) and calls dist_strategy_serve, while the test
 * process plays the other tasks by hand (through ps_connect with the token, or as strangers).
 * The ps reports through its file (proc_testutil.h): its warnings as "LOG: ...", then
 * "serve: <status>". Include after proc_testutil.h. */
#ifndef DIST_TEST_PS_TASK_TESTUTIL_H
#define DIST_TEST_PS_TASK_TESTUTIL_H

#include "collective/net_internal.h"
#include "dist/ps.h"
#include "dist/strategy.h"
#include "proc_testutil.h"
#include "ps/ps_cluster.h"
#include "ps/ps_wire.h"
#include "testutil.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#define PS_RANK 2 /* chief 0, worker/0 1, ps/0 2 */
#define OTHER_TOKEN "another-cluster-token-9876543210"

typedef struct ps_task {
    cluster cl; /* ports: chief, worker/0, ps/0; the report folder */
    char spec[3][512];
    double connect_timeout_s; /* the ps's: how long it waits for a chief, or one that left */
    pid_t pid;
    ps_cluster *chief, *worker; /* this process's identities, with the token */
} ps_task;

static pid_t g_ps_pid = -1; /* killed by the teardown when a test fails half-way */

static inline void log_to_report(dist_log_level level, const char *msg, void *user) {
    if (level <= DIST_LOG_WARN) fprintf((FILE *)user, "LOG: %s\n", msg);
    fflush((FILE *)user);
}

static inline void make_spec(ps_task *t, int which, const char *type) {
    snprintf(t->spec[which], sizeof t->spec[which],
             "{\"cluster\": {\"chief\": [\"%s\"], \"worker\": [\"%s\"], \"ps\": [\"%s\"]}, "
             "\"task\": {\"type\": \"%s\", \"index\": 0}}",
             t->cl.addrs[0], t->cl.addrs[1], t->cl.addrs[2], type);
}

static inline void ps_main(const cluster *cl, int rank, void *arg) {
    (void)cl;
    (void)rank;
    const ps_task *t = arg;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    setenv("DIST_CLUSTER_TOKEN", TEST_CLUSTER_TOKEN, 1);
    dist_set_log_callback(log_to_report, DIST_LOG_WARN, g_out);
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_PARAMETER_SERVER;
    o.cluster.spec = t->spec[PS_RANK];
    o.cluster.connect_timeout_s = t->connect_timeout_s;
    dist_strategy *s = NULL;
    dist_status st = dist_strategy_create(&o, &s);
    CHILD_CHECK(st == DIST_OK, "create: %s", dist_last_error());
    st = dist_strategy_serve(s);
    fprintf(g_out, "serve: %s %s\n", dist_status_name(st), st ? dist_last_error() : "");
    dist_strategy_destroy(s);
}

/* The cluster as task `which` resolves it, holding `token`. */
static inline ps_cluster *resolve_as(const ps_task *t, int which, const char *token) {
    setenv("DIST_CLUSTER_TOKEN", token, 1);
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.cluster.spec = t->spec[which];
    ps_cluster *c = NULL;
    dist_status st = ps_cluster_resolve(&o.cluster, &c);
    setenv("DIST_CLUSTER_TOKEN", TEST_CLUSTER_TOKEN, 1);
    ck_assert_msg(st == DIST_OK, "resolve: %s", dist_last_error());
    return c;
}

/* The chief's connection, with the token; waits (10 s at most) for the ps to listen. */
static inline int chief_connect(const ps_task *t) {
    int fd = -1;
    dist_status st = ps_connect(t->chief, PS_RANK, net_now() + 10, &fd);
    ck_assert_msg(st == DIST_OK, "the chief cannot connect: %s", dist_last_error());
    return fd;
}

/* Starts the ps task (waiting connect_timeout_s for its chief, or for one that left) and waits
 * until the chief can connect; fresh ports when another process took one. The probe leaves the
 * chief's connection open in *probe_fd when it is not NULL (else closes it). */
static inline void ps_start(ps_task *t, double connect_timeout_s, int *probe_fd) {
    memset(t, 0, sizeof *t);
    t->connect_timeout_s = connect_timeout_s;
    cluster_init(&t->cl, 3);
    for (int attempt = 0;; attempt++) {
        make_spec(t, 0, "chief");
        make_spec(t, 1, "worker");
        make_spec(t, PS_RANK, "ps");
        t->pid = g_ps_pid = spawn(&t->cl, PS_RANK, ps_main, t);
        t->chief = resolve_as(t, 0, TEST_CLUSTER_TOKEN);
        t->worker = resolve_as(t, 1, TEST_CLUSTER_TOKEN);
        int fd = -1;
        if (ps_connect(t->chief, PS_RANK, net_now() + 10, &fd) == DIST_OK) {
            if (probe_fd)
                *probe_fd = fd;
            else
                net_close(&fd);
            return;
        }
        kill(t->pid, SIGKILL);
        waitpid(t->pid, NULL, 0);
        g_ps_pid = -1;
        ps_cluster_destroy(t->chief);
        ps_cluster_destroy(t->worker);
        char *r = read_report(&t->cl, PS_RANK, NULL);
        ck_assert_msg(strstr(r, "Address already in use") && attempt < 2,
                      "the ps did not start: %s", r);
        free(r);
        cluster_pick_ports(&t->cl);
    }
}

/* Waits (with a deadline) for the ps to exit; its exit status, or -1 when it did not. */
static inline int wait_exit(pid_t pid, double timeout_s) {
    for (double end = now_s() + timeout_s; now_s() < end;) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) return status;
        usleep(10 * 1000);
    }
    return -1;
}

/* ---- frames by hand -------------------------------------------------------------------------- */

static inline double soon(void) { return net_now() + dist_test_timeout_bound(2.0); }

static inline void send_frame(int fd, uint32_t type, uint64_t id, const ps_buf *b) {
    ps_piece p = {b ? b->p : NULL, b ? b->len : 0};
    ck_assert_int_eq(ps_send_frame(fd, type, id, 0, &p, 1, soon(), "ps/0"), DIST_OK);
}

static inline void expect_reply(int fd, uint32_t type, uint64_t id, dist_status want,
                                ps_header *h) {
    ps_header hh;
    dist_status st = ps_recv_reply(fd, type, id, h ? h : &hh, PS_DEFAULT_FRAME_CAP, soon(), "ps/0");
    ck_assert_msg(st == want, "%s #%llu: %s, expected %s (%s)", ps_msg_name(type),
                  (unsigned long long)id, dist_status_name(st), dist_status_name(want),
                  dist_last_error());
}

/* The teardown: the ps of a test that failed half-way. */
static inline void kill_ps(void) {
    unsetenv("DIST_COLLECTIVE_TRANSPORT"); /* a TLS test that failed half-way */
    if (g_ps_pid > 0) {
        kill(g_ps_pid, SIGKILL);
        waitpid(g_ps_pid, NULL, 0);
        g_ps_pid = -1;
    }
}

static inline void no_setup(void) {}

#endif
