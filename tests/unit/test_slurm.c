/* The Slurm resolver: hostlist expansion, task placement, ports, and the precedence
 * explicit options > TF_CONFIG > Slurm. */
#include "dist/cluster.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

START_TEST(test_slurm_hostlist_ranges_keep_zero_padding) {
    char **hosts = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_slurm_expand_hostlist("node[01-03,07],gpu5", &hosts, &n), DIST_OK);
    ck_assert_uint_eq(n, 5);
    const char *want[] = {"node01", "node02", "node03", "node07", "gpu5"};
    for (size_t i = 0; i < n; ++i) ck_assert_str_eq(hosts[i], want[i]);
    free(hosts);
}
END_TEST

START_TEST(test_slurm_hostlist_two_bracket_groups_and_suffix) {
    char **hosts = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_slurm_expand_hostlist("r[1-2]n[8-9].ib", &hosts, &n), DIST_OK);
    ck_assert_uint_eq(n, 4);
    ck_assert_str_eq(hosts[0], "r1n8.ib");
    ck_assert_str_eq(hosts[1], "r1n9.ib");
    ck_assert_str_eq(hosts[3], "r2n9.ib");
    free(hosts);
}
END_TEST

START_TEST(test_slurm_hostlist_malformed) {
    char **hosts = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_slurm_expand_hostlist("node[3-1]", &hosts, &n), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_slurm_expand_hostlist("node[1-2", &hosts, &n), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_slurm_expand_hostlist("", &hosts, &n), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_slurm_hostlist_past_the_host_cap_fails_fast) {
    char **hosts = NULL;
    size_t n = 0;
    /* 10^10 hosts if expanded; refused once the cap is passed. */
    ck_assert_int_eq(dist_slurm_expand_hostlist("n[1-100000][1-100000]", &hosts, &n),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "DIST_SLURM_MAX_HOSTS"), "%s", dist_last_error());
    ck_assert_ptr_null(hosts);
    ck_assert_uint_eq(n, 0);
    /* Every group within the cap, the total past it. */
    ck_assert_int_eq(dist_slurm_expand_hostlist("a[1-40000],b[1-40000]", &hosts, &n),
                     DIST_INVALID_ARGUMENT);
    /* Exactly the cap is fine. */
    ck_assert_int_eq(dist_slurm_expand_hostlist("a[1-32768],b[1-32768]", &hosts, &n), DIST_OK);
    ck_assert_uint_eq(n, DIST_SLURM_MAX_HOSTS);
    free(hosts);
    char longname[300];
    memset(longname, 'x', 299);
    longname[299] = '\0';
    ck_assert_int_eq(dist_slurm_expand_hostlist(longname, &hosts, &n), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_slurm_tasks_spread_node_by_node_with_ports) {
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_from_slurm_values(9000, "3", "5", "node[1-2]", NULL, &c),
                     DIST_OK);
    ck_assert_uint_eq(dist_cluster_num_tasks(c, "worker"), 5);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 0, NULL), "node1:9000");
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 2, NULL), "node1:9002");
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 3, NULL), "node2:9000");
    ck_assert_str_eq(dist_cluster_task_type(c), "worker");
    ck_assert_int_eq(dist_cluster_task_id(c), 3);
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 5);
    ck_assert(!dist_cluster_is_chief(c));
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_slurm_tasks_per_node_with_repeat_count) {
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_from_slurm_values(7000, "0", "4", "a,b,c", "1(x2),2", &c),
                     DIST_OK);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 1, NULL), "b:7000");
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 3, NULL), "c:7001");
    ck_assert(dist_cluster_is_chief(c));
    ck_assert_str_eq(dist_cluster_collective_leader(c), "/job:worker/replica:0/task:0");
    dist_cluster_destroy(c);
    ck_assert_int_eq(dist_cluster_from_slurm_values(7000, "0", "5", "a,b,c", "1(x2),2", &c),
                     DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_slurm_bad_values) {
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_from_slurm_values(9000, "4", "4", "n[1-2]", NULL, &c),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_cluster_from_slurm_values(9000, "x", "4", "n[1-2]", NULL, &c),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_cluster_from_slurm_values(0, "0", "4", "n[1-2]", NULL, &c),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_cluster_from_slurm_values(9000, NULL, "4", "n[1-2]", NULL, &c),
                     DIST_NOT_FOUND);
    ck_assert_ptr_null(c);
}
END_TEST

/* Found by fuzz_slurm ("1\n21021\n41": 21,021 tasks on one node took over 10 s, each task
 * inserted by a linear search): a job of DIST_SLURM_MAX_TASKS tasks builds quickly, and more is
 * refused before any task is built, whether SLURM_NTASKS or the tasks per node say so. */
START_TEST(test_slurm_a_job_of_the_task_cap_builds_fast_and_more_is_refused) {
    dist_cluster *c = NULL;
    char many[32];
    snprintf(many, sizeof many, "%d", DIST_SLURM_MAX_TASKS);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(dist_cluster_from_slurm_values(1000, "7", many, "n[1-2]", NULL, &c), DIST_OK);
    ck_assert_uint_eq(dist_cluster_num_tasks(c, "worker"), DIST_SLURM_MAX_TASKS);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ck_assert_msg(took < dist_test_timeout_bound(1.0), "took %.1f s", took);
    dist_cluster_destroy(c);
    snprintf(many, sizeof many, "%d", DIST_SLURM_MAX_TASKS + 1);
    ck_assert_int_eq(dist_cluster_from_slurm_values(1000, "0", many, "n[1-2]", NULL, &c),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(
        dist_cluster_from_slurm_values(1000, "0", NULL, "n[1-2]", "9223372036854775807(x2)", &c),
        DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "DIST_SLURM_MAX_TASKS"), "%s", dist_last_error());
}
END_TEST

START_TEST(test_slurm_from_environment_and_precedence) {
    unsetenv("TF_CONFIG");
    unsetenv("SLURM_TASKS_PER_NODE");
    unsetenv("SLURM_STEP_TASKS_PER_NODE");
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "2", 1);
    setenv("SLURM_JOB_NODELIST", "gpu[07-08]", 1);
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_from_slurm(8888, &c), DIST_OK);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 1, NULL), "gpu08:8888");
    dist_cluster_destroy(c);

    /* Slurm when TF_CONFIG is unset. */
    ck_assert_int_eq(dist_cluster_resolve(NULL, &c), DIST_OK);
    ck_assert_int_eq(dist_cluster_task_id(c), 1);
    ck_assert_uint_eq(dist_cluster_num_tasks(c, "worker"), 2);
    dist_cluster_destroy(c);

    /* TF_CONFIG over Slurm. */
    setenv("TF_CONFIG",
           "{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}",
           1);
    ck_assert_int_eq(dist_cluster_resolve(NULL, &c), DIST_OK);
    ck_assert_str_eq(dist_cluster_task_type(c), "chief");
    dist_cluster_destroy(c);

    /* Explicit options over both. */
    dist_cluster_options o = DIST_CLUSTER_OPTIONS_INIT;
    o.tf_config = "{\"cluster\": {\"worker\": [\"x:1\", \"y:1\", \"z:1\"]}, \"task\": {\"type\": "
                  "\"worker\", \"index\": 0}}";
    o.task_id = 2;
    ck_assert_int_eq(dist_cluster_resolve(&o, &c), DIST_OK);
    ck_assert_int_eq(dist_cluster_task_id(c), 2);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 2, NULL), "z:1");
    dist_cluster_destroy(c);

    unsetenv("TF_CONFIG");
    unsetenv("SLURM_PROCID");
    unsetenv("SLURM_NTASKS");
    unsetenv("SLURM_JOB_NODELIST");
    ck_assert_int_eq(dist_cluster_resolve(NULL, &c), DIST_OK);
    ck_assert(dist_cluster_is_empty(c));
    dist_cluster_destroy(c);
}
END_TEST

static Suite *slurm_suite(void) {
    Suite *s = suite_create("slurm");
    TCase *tc = tcase_create("resolver");
    tcase_add_test(tc, test_slurm_hostlist_ranges_keep_zero_padding);
    tcase_add_test(tc, test_slurm_hostlist_two_bracket_groups_and_suffix);
    tcase_add_test(tc, test_slurm_hostlist_malformed);
    tcase_add_test(tc, test_slurm_hostlist_past_the_host_cap_fails_fast);
    tcase_add_test(tc, test_slurm_a_job_of_the_task_cap_builds_fast_and_more_is_refused);
    tcase_add_test(tc, test_slurm_tasks_spread_node_by_node_with_ports);
    tcase_add_test(tc, test_slurm_tasks_per_node_with_repeat_count);
    tcase_add_test(tc, test_slurm_bad_values);
    tcase_add_test(tc, test_slurm_from_environment_and_precedence);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(slurm_suite()); }
