/* A residual Add with a fused ReLU (ops.h: BINARY and BINARY_GRAD with relu = 1;
 * dist_op_add_activation; a model's Add -> ReLU) gives the bits of the unfused ops: the add,
 * then relu_forward; relu_backward, then the add's gradient (a copy of the masked dy per
 * operand, or its sums over the broadcast axes). The ReLU is exact (a select), so nothing may
 * differ, NaN, infinities, signed zeros and sums that cancel to exactly 0 included. Checked at
 * three levels: the CPU backend's ops (every binary kind, with and without broadcasting, on one
 * and two threads), the tape (equal shapes, equal element counts, broadcasting, x + x, an
 * operand whose gradient accumulates, float32 and a bfloat16 compute precision), and a
 * Functional residual model whose layer graph chooses the fusion against the same model with
 * check numerics on (which runs every layer on its own), over a few SGD steps. */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Deterministic values with both signs in [-2, 2). */
static void fill(float *v, int64_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        v[i] = (float)(s >> 8) * 0x1p-24f * 4.0f - 2.0f;
    }
}

/* b = -a at every seventh element (a + b is exactly +0), and NaN, +-Inf and -0 sprinkled
 * into both operands and dy. */
static void add_edges(float *a, float *b, float *dy, int64_t n, int64_t nb) {
    for (int64_t i = 0; i < n; i++) {
        if (i % 7 == 3 && i < nb) b[i] = -a[i];
        if (i % 13 == 5) a[i] = NAN;
        if (i % 17 == 6) a[i] = INFINITY;
        if (i % 19 == 7) a[i] = -INFINITY;
        if (i % 11 == 2) a[i] = -0.0f;
        if (i % 9 == 4) dy[i] = -0.0f;
        if (i % 23 == 8) dy[i] = NAN;
    }
    if (nb > 2) b[2] = -0.0f;
}

/* Equal bits, signed zeros told apart; any two NaNs match (IEEE leaves the sign of an
 * arithmetic NaN open, and compilers use that in the other kinds' gradients). */
static void expect_same_bits(const float *a, const float *b, int64_t n, const char *what,
                             const char *where) {
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(memcmp(&a[i], &b[i], sizeof *a) == 0 || (isnan(a[i]) && isnan(b[i])),
                      "%s (%s), element %lld: fused %.9g, unfused %.9g", what, where, (long long)i,
                      (double)a[i], (double)b[i]);
}

static dist_tensor view(float *data, int ndim, const int64_t *shape) {
    return dist_tensor_view(data, DIST_F32, ndim, shape);
}

static dist_op bin_op(dist_opcode code, int k, int nin, int nout, int relu) {
    dist_op op;
    memset(&op, 0, sizeof op);
    op.code = code;
    op.k = k;
    op.nin = nin;
    op.nout = nout;
    op.relu = relu;
    return op;
}

static void run_op(dist_backend *be, const dist_op *op, const dist_tensor *const *in,
                   dist_tensor *const *out) {
    ck_assert_msg(dist_backend_run_op(be, op, in, out) == DIST_OK, "%s", dist_last_error());
}

/* ---- the ops ---------------------------------------------------------------------------- */

/* One kind on a of [rows, c] and b of bshape ([rows, c], [c] or [rows, 1]): BINARY (relu = 1)
 * against BINARY then relu_forward; BINARY_GRAD (relu = 1, both gradients and each alone)
 * against relu_backward then BINARY_GRAD. For ADD with nothing broadcast the unfused gradient
 * is the add's own: the masked dy copied to each operand. */
static void check_ops(dist_backend *be, int kind, int64_t rows, int64_t c, int bnd,
                      const int64_t *bshape) {
    int64_t n = rows * c, as[2] = {rows, c}, nb = 1;
    for (int d = 0; d < bnd; d++) nb *= bshape[d];
    char where[96];
    snprintf(where, sizeof where, "kind %d, a [%lld, %lld], b of %lld elements", kind,
             (long long)rows, (long long)c, (long long)nb);
    float *a = malloc((size_t)n * 4), *b = malloc((size_t)nb * 4), *dy = malloc((size_t)n * 4);
    float *y1 = malloc((size_t)n * 4), *y2 = malloc((size_t)n * 4), *dz = malloc((size_t)n * 4);
    float *da1 = malloc((size_t)n * 4), *da2 = malloc((size_t)n * 4);
    float *db1 = malloc((size_t)nb * 4), *db2 = malloc((size_t)nb * 4);
    ck_assert(a && b && dy && y1 && y2 && dz && da1 && da2 && db1 && db2);
    fill(a, n, 1);
    fill(b, nb, 2);
    fill(dy, n, 3);
    add_edges(a, b, dy, n, nb);
    dist_tensor ta = view(a, 2, as), tb = view(b, bnd, bshape), tdy = view(dy, 2, as),
                ty1 = view(y1, 2, as), ty2 = view(y2, 2, as), tdz = view(dz, 2, as),
                tda1 = view(da1, 2, as), tda2 = view(da2, 2, as), tdb1 = view(db1, bnd, bshape),
                tdb2 = view(db2, bnd, bshape);
    const dist_tensor *in[2] = {&ta, &tb};
    dist_op op = bin_op(DIST_OPC_BINARY, kind, 2, 1, 1);
    dist_tensor *o1[1] = {&ty1}, *o2[1] = {&ty2};
    run_op(be, &op, in, o1);
    op.relu = 0;
    run_op(be, &op, in, o2);
    ck_assert_int_eq(dist_be_relu_forward(be->iface, be->ctx, &ty2, &ty2), DIST_OK);
    expect_same_bits(y1, y2, n, "y", where);
    /* the unfused gradients: the mask, then the op's (ADD unbroadcast: a copy each) */
    ck_assert_int_eq(dist_be_relu_backward(be->iface, be->ctx, &ty2, &tdy, &tdz), DIST_OK);
    if (kind == DIST_BIN_ADD && nb == n) {
        memcpy(da2, dz, (size_t)n * 4);
        memcpy(db2, dz, (size_t)n * 4);
    } else {
        const dist_tensor *gin[3] = {&ta, &tb, &tdz};
        dist_tensor *gout[2] = {&tda2, &tdb2};
        op = bin_op(DIST_OPC_BINARY_GRAD, kind, 3, 2, 0);
        run_op(be, &op, gin, gout);
    }
    const dist_tensor *gin[4] = {&ta, &tb, &tdy, &ty1};
    op = bin_op(DIST_OPC_BINARY_GRAD, kind, 4, 2, 1);
    for (int outs = 3; outs >= 1; outs--) { /* both, then da alone, then db alone */
        memset(da1, 0x7f, (size_t)n * 4);
        memset(db1, 0x7f, (size_t)nb * 4);
        dist_tensor *gout[2] = {outs & 1 ? &tda1 : NULL, outs & 2 ? &tdb1 : NULL};
        run_op(be, &op, gin, gout);
        if (outs & 1) expect_same_bits(da1, da2, n, "da", where);
        if (outs & 2) expect_same_bits(db1, db2, nb, "db", where);
    }
    free(a), free(b), free(dy), free(y1), free(y2), free(dz), free(da1), free(da2), free(db1),
        free(db2);
}

START_TEST(test_fused_binary_ops_equal_the_op_then_relu_bits) {
    /* 1 row, a few, and enough elements to split over the threads */
    static const int64_t rows[3] = {1, 7, 2100}, c = 16;
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        for (int kind = 0; kind < DIST_BIN_COUNT; kind++)
            for (int r = 0; r < 3; r++) {
                int64_t same[2] = {rows[r], c}, last[1] = {c}, column[2] = {rows[r], 1};
                check_ops(be, kind, rows[r], c, 2, same);
                check_ops(be, kind, rows[r], c, 1, last);
                check_ops(be, kind, rows[r], c, 2, column);
            }
        dist_backend_destroy(be);
    }
}
END_TEST

START_TEST(test_a_fused_add_keeps_a_negative_zero_gradient_as_the_copy_does) {
    dist_backend *be = dist_test_cpu_backend(1);
    float a[2] = {1.0f, -1.0f}, b[2] = {0.5f, 0.25f}, y[2], dy[2] = {-0.0f, 3.0f}, da[2], db[2];
    int64_t s[1] = {2};
    dist_tensor ta = view(a, 1, s), tb = view(b, 1, s), ty = view(y, 1, s), tdy = view(dy, 1, s),
                tda = view(da, 1, s), tdb = view(db, 1, s);
    const dist_tensor *in[2] = {&ta, &tb};
    dist_tensor *out[1] = {&ty};
    dist_op op = bin_op(DIST_OPC_BINARY, DIST_BIN_ADD, 2, 1, 1);
    run_op(be, &op, in, out);
    ck_assert(y[0] == 1.5f && y[1] == 0.0f && !signbit(y[1]));
    const dist_tensor *gin[4] = {&ta, &tb, &tdy, &ty};
    dist_tensor *gout[2] = {&tda, &tdb};
    op = bin_op(DIST_OPC_BINARY_GRAD, DIST_BIN_ADD, 4, 2, 1);
    run_op(be, &op, gin, gout);
    /* y > 0 passes dy's -0 as it is; y = 0 masks 3 to +0 */
    ck_assert(da[0] == 0.0f && signbit(da[0]) && db[0] == 0.0f && signbit(db[0]));
    ck_assert(da[1] == 0.0f && !signbit(da[1]) && db[1] == 0.0f && !signbit(db[1]));
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_a_fused_binary_gradient_without_y_is_refused_naming_the_slot) {
    dist_backend *be = dist_test_cpu_backend(1);
    float a[4] = {0}, b[4] = {0}, dy[4] = {0}, da[4], db[4];
    int64_t s[1] = {4};
    dist_tensor ta = view(a, 1, s), tb = view(b, 1, s), tdy = view(dy, 1, s), tda = view(da, 1, s),
                tdb = view(db, 1, s);
    const dist_tensor *in[4] = {&ta, &tb, &tdy, NULL};
    dist_tensor *out[2] = {&tda, &tdb};
    dist_op op = bin_op(DIST_OPC_BINARY_GRAD, DIST_BIN_ADD, 4, 2, 1);
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 3 is required"));
    op.nin = 3;
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 3 is required"));
    dist_backend_destroy(be);
}
END_TEST

/* ---- the tape ------------------------------------------------------------------------------ */

enum { TAPE_SAME, TAPE_SAME_COUNT, TAPE_BROADCAST, TAPE_SELF, TAPE_ACCUMULATES, TAPE_CASES };

typedef struct tape_result {
    float y[512], da[512], db[512], dw[512];
} tape_result;

/* loss = sum(relu(a + b) * w) on a [rows, 8], fused with dist_op_add_activation or
 * dist_op_add then dist_op_relu, at the given compute precision. b is [rows, 8] (SAME, and
 * SELF: a + a), [8 * rows] (SAME_COUNT: dist_op_add's equal element counts) or [8]
 * (BROADCAST); ACCUMULATES adds sum(a * w) so that a's gradient has two parts. */
static void tape_run(dist_backend *be, int fused, int which, dist_dtype precision, int64_t rows,
                     tape_result *r) {
    const int64_t c = 8, n = rows * c, as[2] = {rows, c};
    int64_t bs[2] = {rows, c};
    int bnd = 2;
    if (which == TAPE_SAME_COUNT) bnd = 1, bs[0] = n;
    if (which == TAPE_BROADCAST) bnd = 1, bs[0] = c;
    int64_t nb = bnd == 2 ? n : bs[0];
    dist_tensor *a, *b, *w, *ga, *gb, *gw;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, as, &a), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, bnd, bs, &b), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, as, &w), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, as, &ga), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, bnd, bs, &gb), DIST_OK);
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, as, &gw), DIST_OK);
    fill(a->data, n, 31);
    fill(b->data, nb, 32);
    fill(w->data, n, 33);
    float *av = a->data, *bv = b->data;
    for (int64_t i = 0; i < nb; i += 5) bv[i] = -av[i]; /* sums of exactly 0 */
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, precision), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, a), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, b), DIST_OK);
    ck_assert_int_eq(dist_tape_watch(t, w), DIST_OK);
    const dist_tensor *rhs = which == TAPE_SELF ? a : b;
    dist_tensor *y, *p, *loss;
    dist_status st;
    if (fused) {
        st = dist_op_add_activation(t, a, rhs, DIST_ACT_RELU, &y);
    } else {
        st = dist_op_add(t, a, rhs, &y);
        if (st == DIST_OK) st = dist_op_relu(t, y, &y);
    }
    ck_assert_msg(st == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_op_mul(t, y, w, &p), DIST_OK);
    ck_assert_int_eq(dist_op_reduce_sum(t, p, &loss), DIST_OK);
    if (which == TAPE_ACCUMULATES) {
        dist_tensor *q, *s;
        ck_assert_int_eq(dist_op_mul(t, a, w, &q), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, q, &s), DIST_OK);
        ck_assert_int_eq(dist_op_add(t, loss, s, &loss), DIST_OK);
    }
    dist_tensor *src[3] = {a, b, w}, *dst[3] = {ga, gb, gw};
    ck_assert_msg(dist_tape_gradient(t, loss, 3, src, dst) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_tensor_numel(y), n);
    memcpy(r->y, y->data, (size_t)n * 4);
    memcpy(r->da, ga->data, (size_t)n * 4);
    memcpy(r->db, gb->data, (size_t)nb * 4);
    memcpy(r->dw, gw->data, (size_t)n * 4);
    dist_tape_destroy(t);
    dist_tensor *all[6] = {a, b, w, ga, gb, gw};
    for (int i = 0; i < 6; i++) dist_backend_free_tensor(be, all[i]);
}

START_TEST(test_add_activation_equals_add_then_relu_on_the_tape) {
    static const dist_dtype precisions[2] = {DIST_F32, DIST_BF16};
    static const int64_t rows[2] = {1, 64};
    dist_backend *be = dist_test_cpu_backend(2);
    for (int p = 0; p < 2; p++)
        for (int which = 0; which < TAPE_CASES; which++)
            for (int r = 0; r < 2; r++) {
                tape_result *f = calloc(1, sizeof *f), *u = calloc(1, sizeof *u);
                ck_assert(f && u);
                tape_run(be, 1, which, precisions[p], rows[r], f);
                tape_run(be, 0, which, precisions[p], rows[r], u);
                int64_t n = rows[r] * 8, nb = which == TAPE_BROADCAST ? 8 : n;
                char where[64];
                snprintf(where, sizeof where, "case %d, precision %s, %lld rows", which,
                         dist_dtype_name(precisions[p]), (long long)rows[r]);
                expect_same_bits(f->y, u->y, n, "y", where);
                expect_same_bits(f->da, u->da, n, "da", where);
                expect_same_bits(f->db, u->db, nb, "db", where);
                expect_same_bits(f->dw, u->dw, n, "dw", where);
                /* the ReLU did something: zeros and positive values both */
                int64_t zeros = 0;
                for (int64_t i = 0; i < n; i++) zeros += f->y[i] == 0.0f;
                ck_assert_msg(n < 16 || (zeros > 0 && zeros < n), "%s: %lld zeros of %lld", where,
                              (long long)zeros, (long long)n);
                free(f), free(u);
            }
    dist_backend_destroy(be);
}
END_TEST

START_TEST(test_add_activation_refuses_other_activations) {
    dist_backend *be = dist_test_cpu_backend(1);
    int64_t s[2] = {2, 3};
    dist_tensor *x;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, s, &x), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    dist_tensor *y;
    ck_assert_int_eq(dist_op_add_activation(t, x, x, DIST_ACT_TANH, &y), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "activation 3"));
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x);
    dist_backend_destroy(be);
}
END_TEST

/* ---- a model's layer graph ----------------------------------------------------------------- */

enum { MODEL_BATCH = 9, MODEL_STEPS = 3, MODEL_MAX_PARAMS = 1024 };

/* A Functional residual model on [6] inputs:
 *   0 Dense(8)               <- input
 *   1 Dense(8, relu)         <- 0
 *   2 Dense(8)               <- 1
 *   3 Add                    <- 0, 2
 *   4 ReLU                   <- 3      (fused with 3)
 *   5 Dense(8)               <- 4
 *   6 Add                    <- 4, 5, 0 (three inputs)
 *   7 Activation("relu")     <- 6      (fused with 6)
 *   8 Dense(2)               <- 7
 * MODEL_STEPS steps of SGD (w -= 0.1 g on the host) on mean(y * y); each step's loss and the
 * weights after them, and an inference call's logits. check_numerics runs every layer on its
 * own. *fused_calls: the steps' add_relu ops (the op profile). */
static void model_steps(int check_numerics, dist_dtype_policy policy, float *losses, float *weights,
                        float *infer, int64_t *nparams, int64_t *fused_calls) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create("residual", &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
    ck_assert_int_eq(dist_model_add_relu(m), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 8, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_add_merge(m, DIST_MERGE_ADD), DIST_OK);
    ck_assert_int_eq(dist_model_add_activation(m, DIST_ACT_RELU), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 2, DIST_ACT_NONE), DIST_OK);
    const int add1[2] = {0, 2}, add2[3] = {4, 5, 0};
    ck_assert_int_eq(dist_model_set_inputs(m, 3, 2, add1), DIST_OK);
    ck_assert_int_eq(dist_model_set_inputs(m, 6, 3, add2), DIST_OK);
    int64_t in_shape[1] = {6};
    ck_assert_msg(dist_model_build(m, 1, in_shape, 7) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_set_check_numerics(m, check_numerics), DIST_OK);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, policy), DIST_OK);
    *nparams = dist_model_num_params(m);
    ck_assert(*nparams <= MODEL_MAX_PARAMS);
    int64_t xs[2] = {MODEL_BATCH, 6};
    dist_backend *be = dist_model_backend(m, 0);
    dist_tensor *x;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, xs, &x), DIST_OK);
    fill(x->data, MODEL_BATCH * 6, 21);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    float *w = malloc(MODEL_MAX_PARAMS * sizeof *w);
    ck_assert(w);
    dist_op_profile_start();
    for (int step = 0; step < MODEL_STEPS; step++) {
        dist_tape_reset(t);
        dist_tensor *y, *yy, *loss;
        ck_assert_msg(dist_model_call(m, t, x, &y) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(dist_op_mul(t, y, y, &yy), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_mean(t, yy, &loss), DIST_OK);
        ck_assert_msg(dist_model_compute_gradients(m, t, loss) == DIST_OK, "%s", dist_last_error());
        losses[step] = *(const float *)loss->data;
        const float *g = dist_model_grads(m, 0)->data;
        ck_assert_int_eq(dist_model_get_weights(m, 0, w, *nparams), DIST_OK);
        for (int64_t i = 0; i < *nparams; i++) w[i] -= 0.1f * g[i];
        ck_assert_int_eq(dist_model_set_weights(m, w, *nparams), DIST_OK);
    }
    dist_op_profile_stop();
    dist_op_profile_entry rows[64];
    int nrows = dist_op_profile_read(rows, 64);
    *fused_calls = 0;
    for (int i = 0; i < nrows && i < 64; i++)
        if (strcmp(rows[i].op, "add_relu") == 0) *fused_calls = rows[i].forward_calls;
    ck_assert_int_eq(dist_model_get_weights(m, 0, weights, *nparams), DIST_OK);
    dist_tape_reset(t);
    dist_tape_set_recording(t, 0);
    dist_tensor *y;
    ck_assert_msg(dist_model_call(m, t, x, &y) == DIST_OK, "%s", dist_last_error());
    memcpy(infer, y->data, MODEL_BATCH * 2 * sizeof(float));
    free(w);
    dist_tape_destroy(t);
    dist_backend_free_tensor(be, x);
    dist_model_destroy(m);
}

START_TEST(test_a_residual_model_with_fused_adds_equals_its_layers_run_one_by_one) {
    /* float32, and the mixed policies (the layers' outputs stored at the compute precision) */
    static const dist_dtype_policy policies[3] = {DIST_POLICY_FLOAT32, DIST_POLICY_MIXED_BFLOAT16,
                                                  DIST_POLICY_MIXED_FLOAT16};
    for (int p = 0; p < 3; p++) {
        float l1[MODEL_STEPS], l2[MODEL_STEPS], i1[2 * MODEL_BATCH], i2[2 * MODEL_BATCH];
        float *w1 = malloc(MODEL_MAX_PARAMS * 4), *w2 = malloc(MODEL_MAX_PARAMS * 4);
        ck_assert(w1 && w2);
        int64_t n1, n2, fused1, fused2;
        model_steps(0, policies[p], l1, w1, i1, &n1, &fused1);
        model_steps(1, policies[p], l2, w2, i2, &n2, &fused2);
        ck_assert_int_eq(n1, n2);
        /* two fused adds a step, and none with check numerics */
        ck_assert_int_eq(fused1, 2 * MODEL_STEPS);
        ck_assert_int_eq(fused2, 0);
        expect_same_bits(l1, l2, MODEL_STEPS, "losses", dist_dtype_policy_name(policies[p]));
        expect_same_bits(w1, w2, n1, "weights", dist_dtype_policy_name(policies[p]));
        expect_same_bits(i1, i2, 2 * MODEL_BATCH, "inference logits",
                         dist_dtype_policy_name(policies[p]));
        ck_assert_msg(l1[MODEL_STEPS - 1] != l1[0], "the steps changed nothing");
        free(w1), free(w2);
    }
}
END_TEST

int main(void) {
    Suite *s = suite_create("add_relu_fusion");
    TCase *tc = tcase_create("add_relu_fusion");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_fused_binary_ops_equal_the_op_then_relu_bits);
    tcase_add_test(tc, test_a_fused_add_keeps_a_negative_zero_gradient_as_the_copy_does);
    tcase_add_test(tc, test_a_fused_binary_gradient_without_y_is_refused_naming_the_slot);
    tcase_add_test(tc, test_add_activation_equals_add_then_relu_on_the_tape);
    tcase_add_test(tc, test_add_activation_refuses_other_activations);
    tcase_add_test(tc, test_a_residual_model_with_fused_adds_equals_its_layers_run_one_by_one);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
