/* A ps task under a flood of connections, and a ps task whose chief has gone, with a real ps
 * task on 127.0.0.1: a forked child that creates a parameter_server strategy from a TF_CONFIG
 * of a chief, one worker and one ps (task ps/0) and calls dist_strategy_serve
 * (ps_task_testutil.h, shared with test_ps_security.c). This process plays the others:
 * strangers, members with the token that open hundreds of connections, and the chief. */
#include "collective/net_internal.h"
#include "dist/ps.h"
#include "dist/strategy.h"
#include "proc_testutil.h"
#include "ps/ps_cluster.h"
#include "ps/ps_server.h"
#include "ps/ps_wire.h"
#include "ps_task_testutil.h"
#include "testutil.h"

#include <dirent.h>
#include <signal.h>
#include <sys/prctl.h>
#include <time.h>

/* ---- frames by hand ----------------------------------------------------------------------------
 */

/* The chief creates a variable, pushes SGD (lr 0.5) to it and pulls it back: the ps serves. */
static void chief_round_trip(int fd) {
    const float v[4] = {1.0f, -2.0f, 3.5f, 0.25f}, g[4] = {2.0f, 4.0f, -1.0f, 0.5f};
    ps_buf b = {0};
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_str(&b, "dense/bias");
    ps_put_u64(&b, 4);
    for (int i = 0; i < 4; i++) ps_put_f32(&b, v[i]);
    send_frame(fd, PS_MSG_CREATE, 1, &b);
    expect_reply(fd, PS_MSG_CREATE, 1, DIST_OK, NULL);
    ps_buf_reset(&b);
    ps_rule r = {.kind = PS_RULE_SGD, .lr = 0.5f, .grad_scale = 1.0f};
    unsigned char e[PS_RULE_BYTES];
    ps_rule_encode(&r, e);
    ps_put_bytes(&b, e, sizeof e);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    ps_put_u64(&b, 4);
    for (int i = 0; i < 4; i++) ps_put_f32(&b, g[i]);
    send_frame(fd, PS_MSG_PUSH, 2, &b);
    expect_reply(fd, PS_MSG_PUSH, 2, DIST_OK, NULL);
    ps_buf_reset(&b);
    ps_put_u32(&b, 1);
    ps_put_u32(&b, 0);
    send_frame(fd, PS_MSG_PULL, 3, &b);
    ps_buf_free(&b);
    ps_header h;
    expect_reply(fd, PS_MSG_PULL, 3, DIST_OK, &h);
    unsigned char *p = NULL;
    ck_assert_int_eq(ps_recv_payload(fd, &h, &p, "ps/0"), DIST_OK);
    ps_reader rd = {p, (size_t)h.length, 0, false};
    ck_assert_uint_eq(ps_get_u32(&rd), 1);
    ck_assert_uint_eq(ps_get_u64(&rd), 4);
    float got[4];
    memcpy(got, ps_get_bytes(&rd, 16), 16);
    free(p);
    const float want[4] = {0.0f, -4.0f, 4.0f, 0.0f};
    ck_assert_mem_eq(got, want, sizeof want);
}

/* The chief shuts the ps down; dist_strategy_serve returns DIST_OK and the child exits 0. */
static void ps_stop(ps_task *t) {
    int fd = chief_connect(t);
    send_frame(fd, PS_MSG_SHUTDOWN, 91, NULL);
    expect_reply(fd, PS_MSG_SHUTDOWN, 91, DIST_OK, NULL);
    net_close(&fd);
    int status = wait_exit(t->pid, dist_test_timeout_bound(5.0));
    char *r = read_report(&t->cl, PS_RANK, NULL);
    ck_assert_msg(status == 0, "the ps exited with 0x%x: %.600s", status, r);
    ck_assert_msg(strstr(r, "serve: DIST_OK"), "%.600s", r);
    free(r);
    g_ps_pid = -1;
}

static void ps_cleanup(ps_task *t) {
    ps_cluster_destroy(t->chief);
    ps_cluster_destroy(t->worker);
    cluster_cleanup(&t->cl);
}

/* Lines of the report that contain `text`. */
static int report_lines_with(const ps_task *t, const char *text) {
    char *r = read_report(&t->cl, PS_RANK, NULL);
    int n = 0;
    for (char *line = r; line && *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        if (strstr(line, text)) n++;
        line = end ? end + 1 : NULL;
    }
    free(r);
    return n;
}

/* Threads of a process, from /proc/PID/task. */
static int thread_count(pid_t pid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

/* ---- item 6: a flood of refused connections ------------------------------------------------- */

/* For 10 s (at most 3,000 connections, a few ms apart) strangers connect: a handshake with
 * another token, garbage bytes, a member's handshake that claims a rank out of range. Each is
 * refused; the ps logs a few in full and then one summary per 10 s (it logged one line per
 * refusal: 1,207 lines from one probe run), and keeps serving its chief. */
START_TEST(test_a_10_s_flood_of_refused_connections_logs_at_most_20_lines_and_the_ps_serves) {
    ps_task t;
    ps_start(&t, 60, NULL);
    ps_cluster *stranger = resolve_as(&t, 0, OTHER_TOKEN);
    int refused = 0;
    double end = now_s() + 10.0;
    for (int i = 0; i < 3000 && now_s() < end; i++) {
        int fd = -1;
        dist_status st;
        if (i % 3 == 0) { /* another token */
            st = ps_connect_once(stranger, PS_RANK, soon(), &fd);
        } else if (i % 3 == 1) { /* bytes that are not a hello */
            st = net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0);
            ck_assert_int_eq(st, DIST_OK);
            (void)net_send_all(fd, "GET / HTTP/1.0\r\n\r\nxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
                               NET_HELLO_BYTES, soon(), "ps/0");
            unsigned char b;
            st = net_recv_all(fd, &b, 1, soon(), "ps/0");
        } else { /* the token, but rank 9 of a cluster of 3 */
            st = net_connect_retry(t.cl.addrs[PS_RANK], soon(), "ps/0", &fd, NULL, 0);
            ck_assert_int_eq(st, DIST_OK);
            t.worker->auth->rank = 9;
            st = net_hello_connect(t.worker->auth, fd, NET_KIND_PS, PS_RANK, soon());
            t.worker->auth->rank = 1;
        }
        ck_assert_msg(st != DIST_OK, "connection %d was accepted", i);
        refused++;
        net_close(&fd);
        usleep(3000);
    }
    ps_cluster_destroy(stranger);
    ck_assert_int_ge(refused, 300);
    /* the flood has not hurt the job */
    int fd = chief_connect(&t);
    chief_round_trip(fd);
    net_close(&fd);
    ps_stop(&t); /* the ps logs what is still counted as it closes its listener */
    int lines = report_lines_with(&t, "refused");
    int summaries = report_lines_with(&t, "more connections in the last");
    char *r = read_report(&t.cl, PS_RANK, NULL);
    ck_assert_msg(lines <= 20 && summaries >= 1,
                  "%d refusals logged in %d lines (%d summaries): %.1500s", refused, lines,
                  summaries, r);
    /* the summaries account for every refusal and say why */
    ck_assert_msg(strstr(r, "authentication failed") && strstr(r, "bad magic") &&
                      strstr(r, "rank out of range"),
                  "%.1500s", r);
    free(r);
    ps_cleanup(&t);
}
END_TEST

/* ---- item 8: hundreds of connections from a token holder ------------------------------------ */

/* A member opens 300 connections as worker/0 and holds them: each had a thread on the ps (305
 * threads). Past the ps's cap for one task they are refused as busy, its threads stay few, the
 * refusals are logged a few lines in all, and the chief, another task, is served meanwhile. */
START_TEST(test_300_connections_from_one_task_are_refused_past_the_cap_and_threads_stay_few) {
    ps_task t;
    ps_start(&t, 60, NULL);
    int before = thread_count(t.pid);
    int fds[300], accepted = 0, busy = 0;
    for (int i = 0; i < 300; i++) {
        fds[i] = -1;
        dist_status st = ps_connect_once(t.worker, PS_RANK, soon(), &fds[i]);
        if (st == DIST_OK)
            accepted++;
        else if (st == DIST_PEER_LOST && strstr(dist_last_error(), "too many connections"))
            busy++;
        else
            ck_abort_msg("connection %d: %s: %s", i, dist_status_name(st), dist_last_error());
    }
    usleep(200 * 1000); /* the accepted connections' threads have started */
    int during = thread_count(t.pid);
    ck_assert_msg(accepted >= 1 && accepted <= 8 && busy == 300 - accepted,
                  "%d accepted, %d refused as busy", accepted, busy);
    ck_assert_msg(during <= before + 8, "%d threads before, %d with 300 connections", before,
                  during);
    /* every accepted connection is served */
    for (int i = 0; i < 300; i++)
        if (fds[i] >= 0) {
            send_frame(fds[i], PS_MSG_STATS, 7, NULL);
            expect_reply(fds[i], PS_MSG_STATS, 7, DIST_OK, NULL);
        }
    /* the chief is another task: served while worker/0's connections are held */
    int fd = chief_connect(&t);
    chief_round_trip(fd);
    net_close(&fd);
    for (int i = 0; i < 300; i++) net_close(&fds[i]);
    /* the cap frees as connections close: worker/0 is served again */
    fd = -1;
    ck_assert_int_eq(ps_connect(t.worker, PS_RANK, soon(), &fd), DIST_OK);
    send_frame(fd, PS_MSG_STATS, 8, NULL);
    expect_reply(fd, PS_MSG_STATS, 8, DIST_OK, NULL);
    net_close(&fd);
    ps_stop(&t);
    int lines = report_lines_with(&t, "too many connections");
    ck_assert_msg(lines >= 1 && lines <= 10, "%d lines about %d busy refusals", lines, busy);
    ps_cleanup(&t);
}
END_TEST

/* ---- item 10: a chief that has gone -----------------------------------------------------------
 */

/* The chief connected, then closed every connection without shutting the ps down (it failed,
 * or gave up on a ps that was SIGSTOPped and has since been woken): it will not come back, so
 * the ps exits by itself once the connect timeout (3 s here) has passed, naming the chief. A
 * chief that holds its connection is waited for however long it is quiet. */
START_TEST(test_a_ps_whose_chief_left_without_shutdown_exits_after_the_connect_timeout) {
    ps_task t;
    int fd = -1;
    ps_start(&t, 3, &fd);
    /* held for twice the timeout: the ps waits */
    ck_assert_int_eq(wait_exit(t.pid, 6.0), -1);
    chief_round_trip(fd);
    double left = now_s();
    net_close(&fd);
    int status = wait_exit(t.pid, dist_test_timeout_bound(3.0 + 10.0));
    double took = now_s() - left;
    char *r = read_report(&t.cl, PS_RANK, NULL);
    ck_assert_msg(status == 0, "the ps did not exit by itself (0x%x, %.1f s): %.600s", status, took,
                  r);
    g_ps_pid = -1;
    ck_assert_msg(took >= 2.5, "the ps left %.1f s after the chief, before the timeout", took);
    ck_assert_msg(strstr(r, "serve: DIST_UNAVAILABLE") &&
                      strstr(r, "chief (chief/0 at 127.0.0.1:") &&
                      strstr(r, "connect timeout (3 s)") && strstr(r, "exiting"),
                  "%.600s", r);
    free(r);
    ps_cleanup(&t);
}
END_TEST

int main(void) {
    signal(SIGPIPE, SIG_DFL); /* the library must not need SIGPIPE ignored */
    setenv("DIST_CLUSTER_TOKEN", TEST_CLUSTER_TOKEN, 1);
    Suite *s = suite_create("ps_flood");
    TCase *tc = tcase_create("flood");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, no_setup, kill_ps);
    tcase_add_test(
        tc, test_a_10_s_flood_of_refused_connections_logs_at_most_20_lines_and_the_ps_serves);
    tcase_add_test(
        tc, test_300_connections_from_one_task_are_refused_past_the_cap_and_threads_stay_few);
    tcase_add_test(tc, test_a_ps_whose_chief_left_without_shutdown_exits_after_the_connect_timeout);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
