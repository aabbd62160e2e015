/* mirrored over several GPUs (NCCL): a replica that fails before its all-reduce must not hang
 * the others, whose NCCL kernel waits for it on the device. Their wait gives up a few seconds
 * after the failure (DIST_PEER_LOST), run() returns the failing replica's own error, the
 * strategy then refuses further steps at once, and destroying it returns.
 *
 * Needs two GPUs; exits 77 (skipped) with fewer. */
#include "dist/dist.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OK(call) ck_assert_msg((call) == DIST_OK, "%s: %s", #call, dist_last_error())

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct state {
    dist_model *model;
    dist_optimizer *opt;
    int fail_replica; /* -1: none */
} state;

/* The classifier step, except that one replica fails after its forward pass, before the
 * all-reduce of the gradients. */
static dist_status step(dist_replica_ctx *rc, const dist_element *in, void *user,
                        dist_element *out) {
    state *s = user;
    dist_classifier_step cs = {s->model, s->opt, 0, NULL};
    if (dist_replica_id_in_sync_group(rc) == s->fail_replica) {
        dist_status st = dist_classifier_eval_step(rc, in, &cs, out); /* the forward pass */
        if (st != DIST_OK) return st;
        return dist_error_for_test(DIST_INVALID_ARGUMENT, "replica 1 fails on purpose");
    }
    return dist_classifier_train_step(rc, in, &cs, out);
}

START_TEST(test_a_replica_failing_before_the_all_reduce_does_not_hang_the_others) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "gpu:0,gpu:1";
    dist_strategy *s;
    OK(dist_strategy_create(&so, &s));
    ck_assert_str_eq(dist_strategy_cross_device_name(s), "nccl");
    state st = {NULL, NULL, -1};
    int64_t shape[3] = {28, 28, 1};
    OK(dist_strategy_scope_enter(s));
    OK(dist_model_create_mnist_cnn(&st.model));
    OK(dist_model_build(st.model, 3, shape, 7));
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    OK(dist_optimizer_create_adam(&ao, &st.opt));
    OK(dist_strategy_scope_exit(s));

    /* a global batch of 64 random images with labels, split over the two replicas */
    int64_t xs[4] = {64, 28, 28, 1}, ys[1] = {64};
    dist_tensor *x, *y;
    OK(dist_tensor_create(DIST_F32, 4, xs, &x));
    OK(dist_tensor_create(DIST_I32, 1, ys, &y));
    uint64_t rng = 42;
    for (int64_t i = 0; i < 64 * 784; i++) ((float *)x->data)[i] = dist_test_uniform(&rng, 0, 1);
    for (int64_t i = 0; i < 64; i++) ((int32_t *)y->data)[i] = (int32_t)(i % 10);
    dist_tensor *parts[2] = {x, y};
    dist_dataset *ds, *b;
    OK(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    OK(dist_dataset_batch(ds, 64, 0, &b));
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    OK(dist_strategy_distribute_dataset(s, b, &dds));
    OK(dist_distributed_dataset_iterator(dds, &it));
    dist_per_replica_element e;
    int end;
    OK(dist_distributed_iterator_next(it, &e, &end));

    dist_per_replica out;
    OK(dist_strategy_run(s, step, &st, &e, &out)); /* both replicas well: a normal step */
    st.fail_replica = 1;
    double t0 = now_s();
    dist_status r = dist_strategy_run(s, step, &st, &e, &out);
    double took = now_s() - t0;
    printf("  the failed step returned %s after %.1f s: %s\n", dist_status_name(r), took,
           dist_last_error());
    ck_assert_int_eq(r, DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "replica 1") != NULL, "message: %s", dist_last_error());
    ck_assert_msg(took < 60, "the other replica waited %.0f s", took);
    /* the devices stay stuck in the broken collective: the next step fails at once */
    st.fail_replica = -1;
    t0 = now_s();
    ck_assert_int_ne(dist_strategy_run(s, step, &st, &e, &out), DIST_OK);
    ck_assert_msg(now_s() - t0 < 30, "the step after the failure took %.0f s", now_s() - t0);

    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(b);
    dist_dataset_destroy(ds);
    dist_tensor_destroy(x);
    dist_tensor_destroy(y);
    dist_optimizer_destroy(st.opt);
    dist_model_destroy(st.model);
    t0 = now_s();
    dist_strategy_destroy(s); /* must return */
    printf("  destroyed in %.1f s\n", now_s() - t0);
}
END_TEST

int main(void) {
    setenv("CK_FORK", "no", 1); /* a CUDA context cannot cross fork() */
    int gpus = dist_device_count(DIST_DEVICE_CUDA);
    if (gpus < 2) {
        char why[96];
        snprintf(why, sizeof why, "test_cuda_mirrored: %d GPU(s) visible, 2 needed", gpus);
        return dist_test_skip_without_gpu(2, why);
    }
    Suite *s = suite_create("cuda_mirrored");
    TCase *tc = tcase_create("failures");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_a_replica_failing_before_the_all_reduce_does_not_hang_the_others);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
