/* TF_CONFIG read as TensorFlow reads it: TFConfigClusterResolver + multi_worker_util's numbering
 * and messages (the expected values are TensorFlow 2.20's, see tests/conformance/). */
#include "dist/cluster.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHIEF_WORKER_PS                                                                            \
    "\"cluster\": {\"chief\": [\"host0:2222\"], \"worker\": [\"host1:2222\", \"host2:2222\"],"     \
    " \"ps\": [\"host3:2222\", \"host4:2222\"]}"

static dist_cluster *parse_ok(const char *json) {
    dist_cluster *c = NULL;
    dist_status st = dist_cluster_from_tf_config(json, &c);
    ck_assert_msg(st == DIST_OK, "%s: %s", json, dist_last_error());
    return c;
}

static void expect_error(const char *json, const char *message) {
    dist_cluster *c = (dist_cluster *)1;
    ck_assert_int_eq(dist_cluster_from_tf_config(json, &c), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(c);
    ck_assert_str_eq(dist_last_error(), message);
}

START_TEST(test_tf_config_chief_is_id_zero_and_leader) {
    dist_cluster *c =
        parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"chief\", \"index\": 0}}");
    bool has;
    ck_assert_str_eq(dist_cluster_task_type(c), "chief");
    ck_assert_int_eq(dist_cluster_task_id(c), 0);
    ck_assert(dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_worker_count(c, &has), 3);
    ck_assert(has);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, &has), 0);
    ck_assert(has);
    ck_assert_str_eq(dist_cluster_collective_leader(c), "/job:chief/replica:0/task:0");
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_worker_id_counts_chief_first) {
    dist_cluster *c =
        parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": 1}}");
    ck_assert(!dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 3);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 2);
    ck_assert_str_eq(dist_cluster_collective_leader(c), "/job:chief/replica:0/task:0");
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_ps_has_no_worker_count_or_id) {
    dist_cluster *c = parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"ps\", \"index\": 1}}");
    bool has = true;
    ck_assert(!dist_cluster_is_chief(c));
    dist_cluster_worker_count(c, &has);
    ck_assert(!has);
    has = true;
    dist_cluster_id_in_cluster(c, &has);
    ck_assert(!has);
    char *json = NULL;
    ck_assert_int_eq(dist_cluster_to_json(c, &json), DIST_OK);
    ck_assert_str_eq(json, "{\"task_type\":\"ps\",\"task_id\":1,\"is_chief\":false,"
                           "\"worker_count\":null,\"id_in_cluster\":null,"
                           "\"collective_leader\":\"/job:chief/replica:0/task:0\","
                           "\"rpc_layer\":null,\"cluster\":{\"chief\":[\"host0:2222\"],"
                           "\"worker\":[\"host1:2222\",\"host2:2222\"],"
                           "\"ps\":[\"host3:2222\",\"host4:2222\"]}}");
    free(json);
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_without_chief_worker0_is_chief) {
    const char *cluster = "{\"cluster\": {\"worker\": [\"a:1\", \"b:1\", \"c:1\"]}, ";
    char json[256];
    snprintf(json, sizeof json, "%s\"task\": {\"type\": \"worker\", \"index\": 0}}", cluster);
    dist_cluster *c = parse_ok(json);
    ck_assert(dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 3);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 0);
    ck_assert_str_eq(dist_cluster_collective_leader(c), "/job:worker/replica:0/task:0");
    dist_cluster_destroy(c);
    snprintf(json, sizeof json, "%s\"task\": {\"type\": \"worker\", \"index\": 2}}", cluster);
    c = parse_ok(json);
    ck_assert(!dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 2);
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_evaluator_is_its_own_chief) {
    dist_cluster *c = parse_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"], "
                               "\"evaluator\": [\"e:1\"]}, \"task\": {\"type\": \"evaluator\", "
                               "\"index\": 0}}");
    ck_assert(dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 1);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 0);
    ck_assert_str_eq(dist_cluster_collective_leader(c), "");
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_evaluator_may_be_absent_from_the_cluster) {
    dist_cluster *c = parse_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": [\"w:1\"]}, "
                               "\"task\": {\"type\": \"evaluator\", \"index\": 0}}");
    bool has = true;
    ck_assert(dist_cluster_is_chief(c));
    dist_cluster_worker_count(c, &has);
    ck_assert(!has); /* TF: KeyError 'evaluator' */
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 0);
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_sparse_form_in_index_order) {
    dist_cluster *c = parse_ok("{\"cluster\": {\"chief\": [\"c:1\"], \"worker\": {\"3\": \"d:1\", "
                               "\"1\": \"b:1\"}}, \"task\": {\"type\": \"worker\", \"index\": 1}}");
    int index = -1;
    ck_assert_uint_eq(dist_cluster_num_tasks(c, "worker"), 2);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 0, &index), "b:1");
    ck_assert_int_eq(index, 1);
    ck_assert_str_eq(dist_cluster_task_address(c, "worker", 1, &index), "d:1");
    ck_assert_int_eq(index, 3);
    ck_assert_ptr_null(dist_cluster_task_address(c, "worker", 2, NULL));
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 3);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 2);
    dist_cluster_destroy(c);
    /* TF compares the index with the number of tasks, not with the largest index. */
    expect_error("{\"cluster\": {\"worker\": {\"0\": \"a:1\", \"5\": \"f:1\"}}, "
                 "\"task\": {\"type\": \"worker\", \"index\": 5}}",
                 "The `task_id` 5 exceeds the maximum id of worker.");
}
END_TEST

START_TEST(test_tf_config_string_index_is_int) {
    dist_cluster *c =
        parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": \"1\"}}");
    ck_assert_int_eq(dist_cluster_task_id(c), 1);
    ck_assert_int_eq(dist_cluster_id_in_cluster(c, NULL), 2);
    dist_cluster_destroy(c);
    c = parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": \" 1 \"}}");
    ck_assert_int_eq(dist_cluster_task_id(c), 1);
    dist_cluster_destroy(c);
    expect_error("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": \"abc\"}}",
                 "invalid literal for int() with base 10: 'abc'");
}
END_TEST

START_TEST(test_tf_config_rpc_layer_and_job_order) {
    dist_cluster *c =
        parse_ok("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": 0},"
                 " \"rpc_layer\": \"grpc\"}");
    ck_assert_str_eq(dist_cluster_rpc_layer(c), "grpc");
    ck_assert_uint_eq(dist_cluster_num_jobs(c), 3);
    ck_assert_str_eq(dist_cluster_job_name(c, 0), "chief");
    ck_assert_str_eq(dist_cluster_job_name(c, 2), "ps");
    ck_assert_str_eq(dist_cluster_task_address(c, "ps", 1, NULL), "host4:2222");
    dist_cluster_destroy(c);
}
END_TEST

START_TEST(test_tf_config_unset_or_empty_is_local) {
    unsetenv("TF_CONFIG");
    dist_cluster *c = parse_ok(NULL);
    ck_assert(dist_cluster_is_empty(c));
    ck_assert_ptr_null(dist_cluster_task_type(c));
    ck_assert_int_eq(dist_cluster_task_id(c), -1);
    ck_assert(dist_cluster_is_chief(c));
    ck_assert_int_eq(dist_cluster_worker_count(c, NULL), 1);
    ck_assert_str_eq(dist_cluster_collective_leader(c), "");
    char *json = NULL;
    ck_assert_int_eq(dist_cluster_to_json(c, &json), DIST_OK);
    ck_assert_str_eq(json, "{\"task_type\":null,\"task_id\":null,\"is_chief\":true,"
                           "\"worker_count\":1,\"id_in_cluster\":0,\"collective_leader\":\"\","
                           "\"rpc_layer\":null,\"cluster\":{}}");
    free(json);
    dist_cluster_destroy(c);
    setenv("TF_CONFIG", "", 1);
    c = parse_ok(NULL);
    ck_assert(dist_cluster_is_empty(c));
    dist_cluster_destroy(c);
    setenv("TF_CONFIG",
           "{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}",
           1);
    c = parse_ok(NULL);
    ck_assert_uint_eq(dist_cluster_num_tasks(c, "worker"), 1);
    dist_cluster_destroy(c);
    unsetenv("TF_CONFIG");
}
END_TEST

START_TEST(test_tf_config_task_type_not_in_cluster) {
    expect_error(
        "{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"ps\", \"index\": 0}}",
        "`task_type` 'ps' not found in cluster_spec.");
}
END_TEST

START_TEST(test_tf_config_more_than_one_chief) {
    expect_error("{\"cluster\": {\"chief\": [\"c:1\", \"d:1\"], \"worker\": [\"a:1\"]}, "
                 "\"task\": {\"type\": \"worker\", \"index\": 0}}",
                 "There must be at most one 'chief' job.");
}
END_TEST

START_TEST(test_tf_config_more_than_one_evaluator) {
    expect_error("{\"cluster\": {\"worker\": [\"a:1\"], \"evaluator\": [\"e:1\", \"f:1\"]}, "
                 "\"task\": {\"type\": \"evaluator\", \"index\": 0}}",
                 "There must be at most one 'evaluator' job.");
}
END_TEST

START_TEST(test_tf_config_index_out_of_range) {
    expect_error("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": 2}}",
                 "The `task_id` 2 exceeds the maximum id of worker.");
}
END_TEST

START_TEST(test_tf_config_negative_index) {
    expect_error("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\", \"index\": -1}}",
                 "The `task_id` -1 is negative.");
}
END_TEST

START_TEST(test_tf_config_cluster_without_task) {
    const char *msg =
        "When `cluster_spec` is given, you must also specify `task_type` and `task_id`.";
    expect_error("{" CHIEF_WORKER_PS "}", msg);
    expect_error("{" CHIEF_WORKER_PS ", \"task\": {\"type\": \"worker\"}}", msg);
}
END_TEST

START_TEST(test_tf_config_other_job_names_are_refused) {
    expect_error("{\"cluster\": {\"master\": [\"m:1\"], \"worker\": [\"a:1\"]}, "
                 "\"task\": {\"type\": \"worker\", \"index\": 0}}",
                 "Disallowed task type found in cluster spec. Allowed types are ('chief', "
                 "'worker', 'evaluator', 'ps', None) and the cluster spec is "
                 "ClusterSpec({'master': ['m:1'], 'worker': ['a:1']}).");
    expect_error(
        "{\"cluster\": {\"worker\": [\"a:1\"]}, \"task\": {\"type\": \"master\", \"index\": 0}}",
        "Unrecognized task_type: master, valid task types are: ('chief', 'worker', "
        "'evaluator', 'ps', None)");
}
END_TEST

START_TEST(test_tf_config_too_long_or_with_too_many_tasks_is_refused) {
    dist_cluster *c = NULL;
    size_t n = (1u << 20) + 64;
    char *big = malloc(n + 1);
    int k = snprintf(big, n + 1, "{\"cluster\":{\"worker\":[\"a:1\"]},\"x\":\"");
    memset(big + k, 'y', n - (size_t)k - 2);
    strcpy(big + n - 2, "\"}");
    ck_assert_int_eq(dist_cluster_from_tf_config(big, &c), DIST_FORMAT);
    ck_assert_msg(strstr(dist_last_error(), "longer than"), "%s", dist_last_error());
    /* 65537 tasks, each "h:1", in one job. */
    char *p = big + sprintf(big, "{\"cluster\":{\"worker\":[");
    for (int i = 0; i <= 65536; i++) p += sprintf(p, "%s\"h:1\"", i ? "," : "");
    strcpy(p, "]}}");
    ck_assert_int_eq(dist_cluster_from_tf_config(big, &c), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "more than 65536 tasks"), "%s", dist_last_error());
    ck_assert_ptr_null(c);
    free(big);
}
END_TEST

START_TEST(test_tf_config_malformed_json_is_a_format_error) {
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_from_tf_config("{\"cluster\": ", &c), DIST_FORMAT);
    ck_assert_ptr_null(c);
}
END_TEST

START_TEST(test_tf_config_resolve_options_override_the_task) {
    setenv("TF_CONFIG",
           "{\"cluster\": {\"worker\": [\"a:1\", \"b:1\"]}, \"task\": {\"type\": \"worker\", "
           "\"index\": 0}}",
           1);
    dist_cluster_options o = DIST_CLUSTER_OPTIONS_INIT;
    o.task_id = 1;
    o.rpc_layer = "grpc";
    dist_cluster *c = NULL;
    ck_assert_int_eq(dist_cluster_resolve(&o, &c), DIST_OK);
    ck_assert_int_eq(dist_cluster_task_id(c), 1);
    ck_assert(!dist_cluster_is_chief(c));
    ck_assert_str_eq(dist_cluster_rpc_layer(c), "grpc");
    dist_cluster_destroy(c);
    o = (dist_cluster_options)DIST_CLUSTER_OPTIONS_INIT;
    o.tf_config =
        "{\"cluster\": {\"chief\": [\"c:1\"]}, \"task\": {\"type\": \"chief\", \"index\": 0}}";
    ck_assert_int_eq(dist_cluster_resolve(&o, &c), DIST_OK);
    ck_assert_str_eq(dist_cluster_task_type(c), "chief");
    dist_cluster_destroy(c);
    unsetenv("TF_CONFIG");
}
END_TEST

static Suite *tf_config_suite(void) {
    Suite *s = suite_create("tf_config");
    TCase *tc = tcase_create("numbering");
    tcase_add_test(tc, test_tf_config_chief_is_id_zero_and_leader);
    tcase_add_test(tc, test_tf_config_worker_id_counts_chief_first);
    tcase_add_test(tc, test_tf_config_ps_has_no_worker_count_or_id);
    tcase_add_test(tc, test_tf_config_without_chief_worker0_is_chief);
    tcase_add_test(tc, test_tf_config_evaluator_is_its_own_chief);
    tcase_add_test(tc, test_tf_config_evaluator_may_be_absent_from_the_cluster);
    tcase_add_test(tc, test_tf_config_sparse_form_in_index_order);
    tcase_add_test(tc, test_tf_config_string_index_is_int);
    tcase_add_test(tc, test_tf_config_rpc_layer_and_job_order);
    tcase_add_test(tc, test_tf_config_unset_or_empty_is_local);
    tcase_add_test(tc, test_tf_config_resolve_options_override_the_task);
    suite_add_tcase(s, tc);
    TCase *errors = tcase_create("validation");
    tcase_add_test(errors, test_tf_config_task_type_not_in_cluster);
    tcase_add_test(errors, test_tf_config_more_than_one_chief);
    tcase_add_test(errors, test_tf_config_more_than_one_evaluator);
    tcase_add_test(errors, test_tf_config_index_out_of_range);
    tcase_add_test(errors, test_tf_config_negative_index);
    tcase_add_test(errors, test_tf_config_cluster_without_task);
    tcase_add_test(errors, test_tf_config_other_job_names_are_refused);
    tcase_add_test(errors, test_tf_config_malformed_json_is_a_format_error);
    tcase_add_test(errors, test_tf_config_too_long_or_with_too_many_tasks_is_refused);
    suite_add_tcase(s, errors);
    return s;
}

int main(void) { return dist_test_run(tf_config_suite()); }
