/* The op profile (dist_op_profile_start in dist/tape.h): a step of dense -> gelu -> add ->
 * mean on a tape, profiled, gives one entry per op kind with its forward and backward calls
 * (a unary op named by its function, not its family), times that add up to no more than the
 * step's, largest first; a step after dist_op_profile_stop adds nothing, and start clears the
 * table. Two threads profiling at once add up (calls doubled). */
#include "testutil.h"

#include <dist/dist.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* one step: reset, forward, gradient of the two variables */
static void *step(void *arg) {
    dist_backend *be = arg;
    dist_tape *t = NULL;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tensor *x = NULL, *w = NULL, *b = NULL, *gw = NULL, *gb = NULL;
    int64_t xs[2] = {64, 128}, ws[2] = {128, 256}, bs[1] = {256};
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &w), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, bs, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, ws, &gw), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 1, bs, &gb), DIST_OK);
    float *xv = x->data, *wv = w->data, *bv = b->data;
    for (int i = 0; i < 64 * 128; i++) xv[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    for (int i = 0; i < 128 * 256; i++) wv[i] = (float)((i * 53) % 97) / 970.0f - 0.05f;
    for (int i = 0; i < 256; i++) bv[i] = 0.01f * (float)(i % 7);
    dist_tape_reset(t);
    ck_assert_int_eq(dist_tape_watch(t, w), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    dist_tensor *h = NULL, *g = NULL, *s = NULL, *loss = NULL;
    ck_assert_int_eq(dist_op_dense(t, x, w, b, DIST_ACT_NONE, &h), DIST_OK);
    ck_assert_int_eq(dist_op_gelu(t, h, 0, &g), DIST_OK);
    ck_assert_int_eq(dist_op_add(t, g, h, &s), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_mean(t, s, &loss), DIST_OK);
    dist_tensor *src[2] = {w, b}, *grads[2] = {gw, gb};
    ck_assert_msg(dist_tape_gradient(t, loss, 2, src, grads) == DIST_OK, "%s", dist_last_error());
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x), dist_backend_free_tensor(be, w),
        dist_backend_free_tensor(be, b);
    dist_backend_free_tensor(be, gw), dist_backend_free_tensor(be, gb);
    return NULL;
}

static const dist_op_profile_entry *find(const dist_op_profile_entry *e, int n, const char *op) {
    for (int i = 0; i < n; i++)
        if (strcmp(e[i].op, op) == 0) return &e[i];
    return NULL;
}

START_TEST(test_a_profiled_step_names_each_op_with_its_calls_and_times) {
    dist_backend *be = dist_test_cpu_backend(1);
    dist_op_profile_start();
    double t0 = now_s();
    step(be);
    double wall = now_s() - t0;
    dist_op_profile_stop();
    dist_op_profile_entry e[16];
    int n = dist_op_profile_read(e, 16);
    ck_assert_int_ge(n, 4);
    ck_assert_int_le(n, 16);
    const char *ops[4] = {"dense", "gelu", "add", "reduce"};
    double sum = 0;
    for (int i = 0; i < n; i++) {
        sum += e[i].forward_s + e[i].backward_s;
        if (i) /* largest first */
            ck_assert(e[i - 1].forward_s + e[i - 1].backward_s >= e[i].forward_s + e[i].backward_s);
    }
    for (int k = 0; k < 4; k++) {
        const dist_op_profile_entry *p = find(e, n, ops[k]);
        ck_assert_msg(p, "no entry for %s (first: %s)", ops[k], e[0].op);
        ck_assert_msg(p->forward_calls == 1 && p->backward_calls == 1,
                      "%s: %lld forward / %lld backward calls", ops[k], (long long)p->forward_calls,
                      (long long)p->backward_calls);
        ck_assert_msg(p->forward_s >= 0 && p->backward_s > 0, "%s: %g / %g s", ops[k], p->forward_s,
                      p->backward_s);
    }
    ck_assert_ptr_null(find(e, n, "unary"));
    ck_assert_msg(sum <= wall, "the ops' %g s exceed the step's %g s", sum, wall);
    /* stopped: a further step adds nothing */
    step(be);
    dist_op_profile_entry e2[16];
    ck_assert_int_eq(dist_op_profile_read(e2, 16), n);
    ck_assert_int_eq(find(e2, n, "dense")->forward_calls, 1);
    /* started again: cleared, then two threads add up */
    dist_op_profile_start();
    ck_assert_int_eq(dist_op_profile_read(NULL, 0), 0);
    dist_backend *be2 = dist_test_cpu_backend(1);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, step, be2), 0);
    step(be);
    pthread_join(th, NULL);
    dist_op_profile_stop();
    n = dist_op_profile_read(e, 16);
    for (int k = 0; k < 4; k++) {
        const dist_op_profile_entry *p = find(e, n, ops[k]);
        ck_assert_msg(p && p->forward_calls == 2 && p->backward_calls == 2, "%s after two threads",
                      ops[k]);
    }
    dist_backend_destroy(be2);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("op_profile");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_a_profiled_step_names_each_op_with_its_calls_and_times);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
