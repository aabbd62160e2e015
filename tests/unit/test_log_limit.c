/* core/log_limit.c: refusals that a peer causes at will are logged a few in full, then counted
 * into at most one summary line per interval. Time is the caller's, so these tests give it. */
#include "core/log_limit.h"
#include "dist/status.h"
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static char g_lines[64][1024];
static int g_nlines;

static void capture(dist_log_level level, const char *msg, void *user) {
    (void)user;
    if (level <= DIST_LOG_WARN && g_nlines < 64)
        snprintf(g_lines[g_nlines++], sizeof g_lines[0], "%s", msg);
}

static void start_capture(void) {
    g_nlines = 0;
    dist_set_log_callback(capture, DIST_LOG_WARN, NULL);
}

START_TEST(test_a_flood_logs_five_in_full_then_one_summary_per_10_s_with_its_count) {
    start_capture();
    dist_log_limit l;
    dist_log_limit_init(&l, 10.0, 5, "ps/0: refused", "connections");
    int full = 0;
    /* 1,000 refusals in 10 s, each from its own port of one host */
    for (int i = 0; i < 1000; i++) {
        char peer[32];
        snprintf(peer, sizeof peer, "127.0.0.1:%d", 40000 + i);
        full += dist_log_limit_admit(&l, 100.0 + i * 0.00999, peer, "bad token");
    }
    ck_assert_int_eq(full, 5);
    ck_assert_int_eq(g_nlines, 0);
    dist_log_limit_tick(&l, 109.0, false); /* the interval is not over */
    ck_assert_int_eq(g_nlines, 0);
    dist_log_limit_tick(&l, 110.0, false);
    ck_assert_int_eq(g_nlines, 1);
    ck_assert_str_eq(g_lines[0], "ps/0: refused 995 more connections in the last 10 s: 995 from "
                                 "127.0.0.1: bad token");
    /* the flood goes on: no line in full, one summary at the end of the next interval */
    for (int i = 0; i < 300; i++)
        ck_assert(!dist_log_limit_admit(&l, 110.5 + i * 0.01, "127.0.0.1:1", "bad token"));
    dist_log_limit_tick(&l, 115.0, false);
    ck_assert_int_eq(g_nlines, 1);
    dist_log_limit_tick(&l, 120.0, false);
    ck_assert_int_eq(g_nlines, 2);
    ck_assert_str_eq(g_lines[1], "ps/0: refused 300 more connections in the last 10 s: 300 from "
                                 "127.0.0.1: bad token");
    dist_log_limit_destroy(&l);
    ck_assert_int_eq(g_nlines, 2); /* nothing counted since */
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
}
END_TEST

START_TEST(test_a_quiet_interval_ends_the_flood_and_the_next_refusal_is_logged_in_full) {
    start_capture();
    dist_log_limit l;
    dist_log_limit_init(&l, 10.0, 2, "rank 0: refused", "connections");
    ck_assert(dist_log_limit_admit(&l, 5.0, "10.0.0.7:1", "bad magic"));
    ck_assert(dist_log_limit_admit(&l, 5.1, "10.0.0.7:2", "bad magic"));
    ck_assert(!dist_log_limit_admit(&l, 5.2, "10.0.0.7:3", "bad magic"));
    dist_log_limit_tick(&l, 15.0, false); /* the summary of 1 */
    dist_log_limit_tick(&l, 25.0, false); /* a window without refusals */
    ck_assert_int_eq(g_nlines, 1);
    ck_assert(dist_log_limit_admit(&l, 26.0, "10.0.0.7:4", "bad magic"));
    dist_log_limit_destroy(&l);
    ck_assert_int_eq(g_nlines, 1);
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
}
END_TEST

START_TEST(test_a_summary_names_four_sources_and_counts_the_rest_and_can_be_forced) {
    start_capture();
    dist_log_limit l;
    dist_log_limit_init(&l, 10.0, 0, "rank 2: refused", "connections");
    const char *why[3] = {"bad magic", "authentication failed", "rank out of range"};
    for (int i = 0; i < 12; i++) {
        char peer[32];
        snprintf(peer, sizeof peer, "10.0.0.%d:%d", i % 2, 1000 + i);
        ck_assert(!dist_log_limit_admit(&l, 1.0 + i * 0.1, peer, why[i % 3]));
    }
    /* the pairs by first appearance: .0 magic, .1 auth, .0 rank, .1 magic; then 4 others */
    dist_log_limit_tick(&l, 2.1, true); /* before the interval ends: forced (as at the end) */
    ck_assert_int_eq(g_nlines, 1);
    dist_log_limit_destroy(&l);
    ck_assert_int_eq(g_nlines, 1);
    ck_assert_str_eq(g_lines[0],
                     "rank 2: refused 12 more connections in the last 1 s: 2 from 10.0.0.0: bad "
                     "magic; 2 from 10.0.0.1: authentication failed; 2 from 10.0.0.0: rank out "
                     "of range; 2 from 10.0.0.1: bad magic; 4 from other sources or for other "
                     "reasons");
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
}
END_TEST

int main(void) {
    Suite *s = suite_create("log_limit");
    TCase *tc = tcase_create("log_limit");
    tcase_add_test(tc, test_a_flood_logs_five_in_full_then_one_summary_per_10_s_with_its_count);
    tcase_add_test(tc, test_a_quiet_interval_ends_the_flood_and_the_next_refusal_is_logged_in_full);
    tcase_add_test(tc, test_a_summary_names_four_sources_and_counts_the_rest_and_can_be_forced);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
