/* Driver for keras_sync_bn.py: a model from Keras JSON with its .weights.h5, built under a
 * mirrored strategy of two CPU replicas, runs one training step (no optimizer) on a global batch
 * of N examples: replica k takes examples [k N/2, (k + 1) N/2), and its loss is the sum of its
 * sparse softmax cross-entropies divided by N (tf.nn.compute_average_loss). Writes each
 * replica's logits, each replica's gradients (before any all-reduce, every variable in model
 * order, moving statistics included as zeros) and each replica's variables after the step.
 *
 * usage: keras_sync_bn MODEL.json WEIGHTS.h5 INPUTS.f32 LABELS.i32 N H W C OUT_PREFIX
 *   writes OUT_PREFIX.logits.f32 ([2][N/2][outputs]), .grads.f32 ([2][params]) and
 *   .vars.f32 ([2][params]). */
#include "conf_file.h"

#include <dist/nn.h>
#include <dist/replica.h>
#include <dist/strategy.h>
#include <dist/tape.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what) {
    fprintf(stderr, "keras_sync_bn: %s: %s\n", what, dist_last_error());
    return 1;
}

typedef struct step_args {
    dist_model *m;
    const float *x;
    const int32_t *y;
    int64_t n, h, w, c;
} step_args;

static dist_status step(dist_replica_ctx *rc, const dist_element *in, void *user,
                        dist_element *out) {
    (void)in;
    step_args *a = user;
    dist_tape *t = dist_replica_tape(rc);
    int64_t half = a->n / 2, k = dist_replica_id_in_sync_group(rc), per = a->h * a->w * a->c;
    int64_t xs[4] = {half, a->h, a->w, a->c};
    dist_tensor hx = dist_tensor_view((void *)(a->x + k * half * per), DIST_F32, 4, xs);
    dist_tensor hy = dist_tensor_view((void *)(a->y + k * half), DIST_I32, 1, &half);
    dist_tensor *x, *y, *logits, *per_example, *loss;
    dist_status st;
    if ((st = dist_tape_upload(t, &hx, &x)) || (st = dist_tape_upload(t, &hy, &y)) ||
        (st = dist_model_call(a->m, t, x, &logits)) ||
        (st = dist_op_sparse_softmax_cross_entropy(t, logits, y, &per_example)) ||
        (st = dist_compute_average_loss(t, per_example, a->n, &loss)) ||
        (st = dist_model_compute_gradients(a->m, t, loss)))
        return st;
    out->count = 1;
    out->items[0] = logits;
    return DIST_OK;
}

static int write_file(const char *prefix, const char *suffix, const void *a, const void *b,
                      size_t bytes) {
    char path[1024];
    snprintf(path, sizeof path, "%s%s", prefix, suffix);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(a, 1, bytes, f) != bytes || fwrite(b, 1, bytes, f) != bytes || fclose(f)) {
        perror(path);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 10) {
        fprintf(stderr,
                "usage: %s MODEL.json WEIGHTS.h5 INPUTS.f32 LABELS.i32 N H W C OUT_PREFIX\n",
                argv[0]);
        return 2;
    }
    size_t json_len = 0, in_len = 0, lab_len = 0;
    char *json = conf_slurp(argv[1], &json_len);
    step_args a = {NULL,
                   conf_slurp(argv[3], &in_len),
                   conf_slurp(argv[4], &lab_len),
                   atoll(argv[5]),
                   atoll(argv[6]),
                   atoll(argv[7]),
                   atoll(argv[8])};
    if (!json || !a.x || !a.y || a.n <= 0 || a.n % 2 || lab_len != (size_t)a.n * sizeof(int32_t) ||
        in_len != (size_t)(a.n * a.h * a.w * a.c) * sizeof(float)) {
        fprintf(stderr, "keras_sync_bn: cannot read the model, or the inputs do not match N "
                        "(even), H, W, C\n");
        return 1;
    }
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    dist_strategy *s = NULL;
    if (dist_strategy_create(&so, &s)) return fail("strategy");
    if (dist_strategy_scope_enter(s)) return fail("scope");
    if (dist_model_from_keras_json(json, 0, &a.m)) return fail("JSON");
    if (dist_strategy_scope_exit(s)) return fail("scope");
    if (dist_model_load_keras_weights(a.m, argv[2])) return fail("loading weights");
    dist_per_replica res;
    if (dist_strategy_run(s, step, &a, NULL, &res)) return fail("step");
    size_t np = (size_t)dist_model_num_params(a.m);
    const dist_tensor *l0 = res.values[0][0], *l1 = res.values[1][0];
    if (write_file(argv[9], ".logits.f32", l0->data, l1->data,
                   (size_t)dist_tensor_numel(l0) * sizeof(float)) ||
        write_file(argv[9], ".grads.f32", dist_model_grads(a.m, 0)->data,
                   dist_model_grads(a.m, 1)->data, np * sizeof(float)) ||
        write_file(argv[9], ".vars.f32", dist_model_params(a.m, 0)->data,
                   dist_model_params(a.m, 1)->data, np * sizeof(float)))
        return 1;
    dist_model_destroy(a.m);
    dist_strategy_destroy(s);
    free(json);
    free((void *)a.x);
    free((void *)a.y);
    return 0;
}
