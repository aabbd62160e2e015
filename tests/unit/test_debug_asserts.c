/* tf.debugging's assertions on a tape: each passes where TensorFlow's passes and fails with
 * TensorFlow 2.20's text where it fails (the expected strings are what tf.debugging printed for
 * the same values), and inside a strategy's step they fail that step, naming the replica and
 * the step. */
#include "dist/strategy.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

static dist_backend *g_be;

static dist_tensor *upload(dist_tape *t, dist_dtype dtype, int ndim, const int64_t *shape,
                           const void *data) {
    dist_tensor host = dist_tensor_view((void *)data, dtype, ndim, shape), *out = NULL;
    ck_assert_int_eq(dist_tape_upload(t, &host, &out), DIST_OK);
    return out;
}

START_TEST(test_assert_less_and_equal_fail_with_tensorflows_text) {
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    const int64_t four[1] = {4};
    const float xv[4] = {1, 2, 3, 4}, yv[4] = {0, 5, 0, 1}, big[4] = {10, 10, 10, 10};
    dist_tensor *x = upload(t, DIST_F32, 1, four, xv), *y = upload(t, DIST_F32, 1, four, yv);
    dist_tensor *z = upload(t, DIST_F32, 1, four, big);
    ck_assert_int_eq(dist_debug_assert_less(t, x, z, "fine"), DIST_OK);
    ck_assert_int_eq(dist_debug_assert_equal(t, x, x, NULL), DIST_OK);
    ck_assert_int_eq(dist_debug_assert_less(t, x, y, "lr too big"), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "lr too big\n"
                                        "Condition x < y did not hold.\n"
                                        "Indices of first 3 different values:\n"
                                        "[[0]\n [2]\n [3]]\n"
                                        "Corresponding x values:\n[1. 3. 4.]\n"
                                        "Corresponding y values:\n[0. 0. 1.]\n"
                                        "First 3 elements of x:\n[1. 2. 3.]\n"
                                        "First 3 elements of y:\n[0. 5. 0.]");
    ck_assert_int_eq(dist_debug_assert_equal(t, x, y, "mismatch"), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "mismatch\n"
                                        "Condition x == y did not hold.\n"
                                        "Indices of first 3 different values:\n"
                                        "[[0]\n [1]\n [2]]\n"
                                        "Corresponding x values:\n[1. 2. 3.]\n"
                                        "Corresponding y values:\n[0. 5. 0.]\n"
                                        "First 3 elements of x:\n[1. 2. 3.]\n"
                                        "First 3 elements of y:\n[0. 5. 0.]");
    /* integers, a scalar against a tensor, a 2-D index */
    const int64_t two_by_two[2] = {2, 2};
    const int32_t iv[4] = {1, 2, 3, 4}, limit = 4;
    dist_tensor *xi = upload(t, DIST_I32, 2, two_by_two, iv),
                *lim = upload(t, DIST_I32, 0, NULL, &limit);
    ck_assert_int_eq(dist_debug_assert_less(t, xi, lim, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "Condition x < y did not hold.\n"
                                        "Indices of first 1 different values:\n"
                                        "[[1 1]]\n"
                                        "Corresponding x values:\n[4]\n"
                                        "Corresponding y values:\n[4]\n"
                                        "First 3 elements of x:\n[1 2 3]\n"
                                        "First 3 elements of y:\n[4]");
    /* shapes that do not go together */
    const int64_t three[1] = {3};
    dist_tensor *x3 = upload(t, DIST_F32, 1, three, xv);
    ck_assert_int_eq(dist_debug_assert_equal(t, x, x3, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "have 4 and 3 values"));
    dist_tape_destroy(t);
}
END_TEST

START_TEST(test_assert_all_finite_and_shape_fail_with_tensorflows_text) {
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(g_be, &t), DIST_OK);
    const int64_t two[1] = {2}, four[1] = {4};
    const float finite[2] = {1, 2}, nan_[2] = {1, NAN}, inf_[2] = {1, INFINITY},
                both[2] = {INFINITY, NAN};
    ck_assert_int_eq(dist_debug_assert_all_finite(t, upload(t, DIST_F32, 1, two, finite), "x"),
                     DIST_OK);
    ck_assert_int_eq(
        dist_debug_assert_all_finite(t, upload(t, DIST_F32, 1, two, nan_), "bad grads"),
        DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "bad grads : Tensor had NaN values");
    ck_assert_int_eq(
        dist_debug_assert_all_finite(t, upload(t, DIST_F32, 1, two, inf_), "bad grads"),
        DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "bad grads : Tensor had Inf values");
    ck_assert_int_eq(dist_debug_assert_all_finite(t, upload(t, DIST_F32, 1, two, both), "g"),
                     DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "g : Tensor had NaN values"); /* NaN named first */
    const float v4[4] = {0};
    dist_tensor *x = upload(t, DIST_F32, 1, four, v4);
    const int64_t want3[1] = {3}, any[1] = {-1}, want4[1] = {4};
    ck_assert_int_eq(dist_debug_assert_shape(t, x, 1, want4, NULL), DIST_OK);
    ck_assert_int_eq(dist_debug_assert_shape(t, x, 1, any, NULL), DIST_OK);
    ck_assert_int_eq(dist_debug_assert_shape(t, x, 1, want3, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "Specified explicitly.  Tensor shape=(4,) dtype=float32 "
                                        "dimension 0 must have size 3.  Received size 4, shape "
                                        "(4,)");
    const int64_t two_three[2] = {2, 3}, want_n4[2] = {-1, 4};
    const float v6[6] = {0};
    ck_assert_int_eq(
        dist_debug_assert_shape(t, upload(t, DIST_F32, 2, two_three, v6), 2, want_n4, "m"),
        DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "m.  Specified explicitly.  Tensor shape=(2, 3) "
                                        "dtype=float32 dimension 1 must have size 4.  Received "
                                        "size 3, shape (2, 3)");
    ck_assert_int_eq(dist_debug_assert_shape(t, x, 2, want_n4, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "must have rank 2.  Received rank 1"));
    dist_tape_destroy(t);
}
END_TEST

/* Replica r asserts its value r + step < 3: fine at step 1 on both replicas, fails at step 2
 * on replica 1 (1 + 2 = 3). */
static dist_status asserting_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                  dist_element *out) {
    (void)in, (void)out;
    int *step = user;
    float v = (float)(dist_replica_id_in_sync_group(rc) + *step), three = 3;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor hv = dist_tensor_view(&v, DIST_F32, 0, NULL);
    dist_tensor h3 = dist_tensor_view(&three, DIST_F32, 0, NULL);
    dist_tensor *dv = NULL, *d3 = NULL;
    DIST_TRY_TEST(dist_tape_upload(t, &hv, &dv));
    DIST_TRY_TEST(dist_tape_upload(t, &h3, &d3));
    return dist_debug_assert_less(t, dv, d3, "the value ran away");
}

START_TEST(test_an_assertion_fails_the_step_naming_replica_and_step) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_MIRRORED;
    o.devices = "cpu:0,cpu:1";
    o.threads_per_replica = 1;
    dist_strategy *s = NULL;
    ck_assert_int_eq(dist_strategy_create(&o, &s), DIST_OK);
    int step = 1;
    ck_assert_int_eq(dist_strategy_run(s, asserting_step, &step, NULL, NULL), DIST_OK);
    step = 2;
    ck_assert_int_eq(dist_strategy_run(s, asserting_step, &step, NULL, NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_msg(strncmp(dist_last_error(),
                          "replica 1: step 2: the value ran away\nCondition x "
                          "< y did not hold.",
                          64) == 0,
                  "%s", dist_last_error());
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    if (dist_backend_create(&o, &g_be) != DIST_OK) return 1;
    Suite *s = suite_create("debug_asserts");
    TCase *tc = tcase_create("debug_asserts");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_assert_less_and_equal_fail_with_tensorflows_text);
    tcase_add_test(tc, test_assert_all_finite_and_shape_fail_with_tensorflows_text);
    tcase_add_test(tc, test_an_assertion_fails_the_step_naming_replica_and_step);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    dist_backend_destroy(g_be);
    return rc;
}
