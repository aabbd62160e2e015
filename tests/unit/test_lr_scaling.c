/* dist_scale_learning_rate: TensorFlow's advice to scale the learning rate with the global
 * batch, linearly or by the square root, and its refusals. */
#include "dist/optim.h"
#include "testutil.h"

#include <math.h>
#include <string.h>

START_TEST(test_linear_scaling_multiplies_by_the_batch_ratio) {
    float lr;
    ck_assert_int_eq(dist_scale_learning_rate(0.1f, 256, 1024, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_OK);
    ck_assert_float_eq(lr, 0.4f);
    ck_assert_int_eq(dist_scale_learning_rate(0.001f, 64, 32, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_OK);
    ck_assert_float_eq(lr, 0.0005f);
}
END_TEST

START_TEST(test_sqrt_scaling_multiplies_by_the_root_of_the_ratio) {
    float lr;
    ck_assert_int_eq(dist_scale_learning_rate(0.001f, 64, 256, DIST_LR_SCALING_SQRT, &lr), DIST_OK);
    ck_assert_float_eq(lr, 0.002f);
    ck_assert_int_eq(dist_scale_learning_rate(0.01f, 64, 128, DIST_LR_SCALING_SQRT, &lr), DIST_OK);
    ck_assert_float_eq(lr, (float)(0.01f * sqrt(2.0)));
}
END_TEST

START_TEST(test_no_scaling_and_an_equal_batch_keep_the_rate) {
    float lr;
    ck_assert_int_eq(dist_scale_learning_rate(0.003f, 64, 512, DIST_LR_SCALING_NONE, &lr), DIST_OK);
    ck_assert_float_eq(lr, 0.003f);
    ck_assert_int_eq(dist_scale_learning_rate(0.003f, 64, 64, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_OK);
    ck_assert_float_eq(lr, 0.003f);
}
END_TEST

START_TEST(test_bad_arguments_are_refused_with_the_value) {
    float lr = -1.0f;
    ck_assert_int_eq(dist_scale_learning_rate(0.0f, 64, 128, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "base learning rate"));
    ck_assert_int_eq(dist_scale_learning_rate(NAN, 64, 128, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_scale_learning_rate(0.1f, 0, 128, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "base batch 0"));
    ck_assert_int_eq(dist_scale_learning_rate(0.1f, 64, -2, DIST_LR_SCALING_SQRT, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "global batch -2"));
    ck_assert_int_eq(dist_scale_learning_rate(0.1f, 64, 128, (dist_lr_scaling)7, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_scale_learning_rate(3e38f, 1, 1000, DIST_LR_SCALING_LINEAR, &lr),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "overflows"));
    ck_assert_float_eq(lr, -1.0f); /* untouched on error */
}
END_TEST

START_TEST(test_rule_names_parse_and_print) {
    dist_lr_scaling r;
    ck_assert_int_eq(dist_lr_scaling_parse("linear", &r), DIST_OK);
    ck_assert_int_eq(r, DIST_LR_SCALING_LINEAR);
    ck_assert_int_eq(dist_lr_scaling_parse("sqrt", &r), DIST_OK);
    ck_assert_int_eq(r, DIST_LR_SCALING_SQRT);
    ck_assert_int_eq(dist_lr_scaling_parse("none", &r), DIST_OK);
    ck_assert_int_eq(r, DIST_LR_SCALING_NONE);
    ck_assert_int_eq(dist_lr_scaling_parse("Linear2", &r), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'Linear2'"));
    ck_assert_str_eq(dist_lr_scaling_name(DIST_LR_SCALING_SQRT), "sqrt");
    ck_assert_str_eq(dist_lr_scaling_name((dist_lr_scaling)9), "unknown");
}
END_TEST

int main(void) {
    Suite *s = suite_create("lr_scaling");
    TCase *tc = tcase_create("lr_scaling");
    tcase_add_test(tc, test_linear_scaling_multiplies_by_the_batch_ratio);
    tcase_add_test(tc, test_sqrt_scaling_multiplies_by_the_root_of_the_ratio);
    tcase_add_test(tc, test_no_scaling_and_an_equal_batch_keep_the_rate);
    tcase_add_test(tc, test_bad_arguments_are_refused_with_the_value);
    tcase_add_test(tc, test_rule_names_parse_and_print);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
