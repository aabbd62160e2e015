/* Device names: libdist's own and TensorFlow's DeviceSpec forms, one parser
 * (dist_device_spec_parse; dist_device_parse is its device alone), and clear refusals. The
 * accepted forms are those tf.DeviceSpec.from_string reads: parts split at '/', empty parts
 * skipped, job:NAME, replica:N, task:N, device:TYPE:N and the legacy TYPE:N. */
#include "dist/tensor.h"
#include "testutil.h"

#include <string.h>

static dist_device_spec parse_ok(const char *text) {
    dist_device_spec s;
    dist_status st = dist_device_spec_parse(text, &s);
    ck_assert_msg(st == DIST_OK, "'%s' refused: %s", text, dist_last_error());
    return s;
}

static void expect_device(const char *text, dist_device_kind kind, int index) {
    dist_device_spec s = parse_ok(text);
    ck_assert_msg(s.device.kind == kind && s.device.index == index,
                  "'%s' parsed as kind %d index %d", text, (int)s.device.kind, s.device.index);
    dist_device d = {DIST_DEVICE_CPU, -1};
    ck_assert_int_eq(dist_device_parse(text, &d), DIST_OK);
    ck_assert_int_eq(d.kind, kind);
    ck_assert_int_eq(d.index, index);
}

static void expect_refused(const char *text, const char *words) {
    dist_device d;
    ck_assert_msg(dist_device_parse(text, &d) == DIST_INVALID_ARGUMENT, "'%s' accepted", text);
    ck_assert_msg(strstr(dist_last_error(), words), "'%s': message '%s' lacks '%s'", text,
                  dist_last_error(), words);
}

START_TEST(test_libdist_names_keep_working) {
    expect_device("cpu:0", DIST_DEVICE_CPU, 0);
    expect_device("cpu:3", DIST_DEVICE_CPU, 3);
    expect_device("gpu:1", DIST_DEVICE_CUDA, 1);
    expect_device("cuda:2", DIST_DEVICE_CUDA, 2);
}
END_TEST

START_TEST(test_tensorflow_short_forms_in_any_case) {
    expect_device("/gpu:0", DIST_DEVICE_CUDA, 0);
    expect_device("GPU:0", DIST_DEVICE_CUDA, 0);
    expect_device("/GPU:1", DIST_DEVICE_CUDA, 1);
    expect_device("/CPU:0", DIST_DEVICE_CPU, 0);
    expect_device("/cpu:0", DIST_DEVICE_CPU, 0);
    expect_device("Gpu:2", DIST_DEVICE_CUDA, 2);
}
END_TEST

START_TEST(test_tensorflow_device_prefix_forms) {
    expect_device("/device:GPU:0", DIST_DEVICE_CUDA, 0);
    expect_device("/device:CPU:0", DIST_DEVICE_CPU, 0);
    expect_device("device:gpu:3", DIST_DEVICE_CUDA, 3);
    expect_device("/device:cpu:1", DIST_DEVICE_CPU, 1);
}
END_TEST

START_TEST(test_fully_qualified_names_give_job_replica_and_task) {
    dist_device_spec s = parse_ok("/job:worker/task:1/device:CPU:0");
    ck_assert_str_eq(s.job, "worker");
    ck_assert_int_eq(s.task, 1);
    ck_assert_int_eq(s.replica, -1);
    ck_assert_int_eq(s.device.kind, DIST_DEVICE_CPU);
    ck_assert_int_eq(s.device.index, 0);
    s = parse_ok("/job:localhost/replica:0/task:0/device:GPU:1");
    ck_assert_str_eq(s.job, "localhost");
    ck_assert_int_eq(s.replica, 0);
    ck_assert_int_eq(s.task, 0);
    ck_assert_int_eq(s.device.kind, DIST_DEVICE_CUDA);
    ck_assert_int_eq(s.device.index, 1);
    /* TensorFlow's legacy device part after a job, and parts in another order */
    s = parse_ok("/job:ps_2/task:3/cpu:0");
    ck_assert_str_eq(s.job, "ps_2");
    ck_assert_int_eq(s.task, 3);
    s = parse_ok("/device:GPU:0/job:chief");
    ck_assert_str_eq(s.job, "chief");
    s = parse_ok("gpu:0");
    ck_assert_str_eq(s.job, "");
    ck_assert_int_eq(s.task, -1);
    expect_device("/job:worker//task:1/device:GPU:2/", DIST_DEVICE_CUDA, 2); /* empty parts */
}
END_TEST

START_TEST(test_partial_and_malformed_names_are_refused_naming_the_part) {
    expect_refused("", "names no device");
    expect_refused("/job:worker/task:1", "names no device");
    expect_refused("cpu", "needs an index");
    expect_refused("/GPU", "needs an index");
    expect_refused("/device:GPU:*", "index '*'");
    expect_refused("/device:GPU", "needs an index");
    expect_refused("device", "needs a type");
    expect_refused("/device:TPU:0", "device type 'TPU'");
    expect_refused("tpu:0", "unknown part 'tpu:0'");
    expect_refused("gpu:x", "index 'x'");
    expect_refused("gpu:-1", "index '-1'");
    expect_refused("gpu:0x", "index '0x'");
    expect_refused("cpu:4097", "index '4097'");
    expect_refused("gpu:0:1", "unknown part");
    expect_refused("/device:GPU:0:1", "too many ':'");
    expect_refused("/cpu:0/gpu:1", "names two devices");
    expect_refused("/job:1worker/cpu:0", "not a job name");
    expect_refused("/job:/cpu:0", "not a job name");
    expect_refused("/task:one/cpu:0", "'task:one'");
    expect_refused("/task:1/task:2/cpu:0", "once");
    expect_refused("/host:0/cpu:0", "unknown part 'host:0'");
    dist_device d;
    ck_assert_int_eq(dist_device_parse(NULL, &d), DIST_INVALID_ARGUMENT);
}
END_TEST

int main(void) {
    Suite *s = suite_create("device_spec");
    TCase *tc = tcase_create("device_spec");
    tcase_add_test(tc, test_libdist_names_keep_working);
    tcase_add_test(tc, test_tensorflow_short_forms_in_any_case);
    tcase_add_test(tc, test_tensorflow_device_prefix_forms);
    tcase_add_test(tc, test_fully_qualified_names_give_job_replica_and_task);
    tcase_add_test(tc, test_partial_and_malformed_names_are_refused_naming_the_part);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
