/* The layer ops of the op set (backend/layer_ops.h): each typed entry point builds its op and
 * reaches the backend's kernel through run_op with every argument in its place. A backend of
 * recording kernels (each writes its arguments into `seen`) stands behind run_op, so swapping
 * two arguments in the packing or the unpacking fails here; missing slots and attributes are
 * refused naming them; what a table lacks is unsupported; and the CPU backend runs every layer
 * op, the fusions included, through the same entry. */
#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <string.h>

/* What the last kernel call received. */
static struct {
    const char *kernel;
    const void *p[8];
    float f[2];
    int i[3];
    size_t n;
    dist_dtype dtype;
} seen;

static void saw(const char *k) {
    memset(&seen, 0, sizeof seen);
    seen.kernel = k;
}

static dist_status k_conv(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                          const dist_tensor *w, const dist_tensor *b, dist_tensor *y) {
    saw("conv2d_forward");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = x, seen.p[3] = w, seen.p[4] = b, seen.p[5] = y;
    return DIST_OK;
}
static dist_status k_conv_data(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                               const dist_tensor *w, dist_tensor *dx) {
    saw("conv2d_backward_data");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = dy, seen.p[3] = w, seen.p[4] = dx;
    return DIST_OK;
}
static dist_status k_conv_filter(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                 const dist_tensor *dy, dist_tensor *dw, dist_tensor *db) {
    saw("conv2d_backward_filter");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = x, seen.p[3] = dy, seen.p[4] = dw, seen.p[5] = db;
    return DIST_OK;
}
static dist_status k_pool(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                          dist_tensor *y, void *ws) {
    saw("max_pool2d_forward");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = x, seen.p[3] = y, seen.p[4] = ws;
    return DIST_OK;
}
static dist_status k_pool_back(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                               const dist_tensor *dy, const void *ws, dist_tensor *dx) {
    saw("max_pool2d_backward");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = x, seen.p[3] = dy, seen.p[4] = ws, seen.p[5] = dx;
    return DIST_OK;
}
static dist_status k_cp_fwd(void *ctx, const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                            const dist_tensor *x, const dist_tensor *w, const dist_tensor *b,
                            dist_dtype round_to, int need_dx, dist_tensor *p, void *ws,
                            void *p_bf16, int *done) {
    saw("conv2d_relu_pool_forward");
    seen.p[0] = cd, seen.p[1] = pd, seen.p[2] = x, seen.p[3] = w, seen.p[4] = b, seen.p[5] = p,
    seen.p[6] = ws, seen.p[7] = p_bf16;
    seen.dtype = round_to, seen.i[0] = need_dx;
    *done = 3;
    (void)ctx;
    return DIST_OK;
}
static dist_status k_cp_filter(void *ctx, const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                               const dist_tensor *x, const dist_tensor *dy, const void *ws,
                               dist_tensor *dw, dist_tensor *db, int *done) {
    saw("conv2d_relu_pool_backward_filter");
    seen.p[0] = cd, seen.p[1] = pd, seen.p[2] = x, seen.p[3] = dy, seen.p[4] = ws, seen.p[5] = dw,
    seen.p[6] = db;
    *done = 1;
    (void)ctx;
    return DIST_OK;
}
static dist_status k_cp_back(void *ctx, const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                             const dist_tensor *x, const dist_tensor *w, const dist_tensor *dy,
                             const void *ws, dist_tensor *dx, dist_tensor *dw, dist_tensor *db,
                             int *done) {
    saw("conv2d_relu_pool_backward");
    seen.p[0] = cd, seen.p[1] = x, seen.p[2] = w, seen.p[3] = dy, seen.p[4] = ws, seen.p[5] = dx,
    seen.p[6] = dw, seen.p[7] = db;
    *done = 1;
    (void)ctx, (void)pd;
    return DIST_OK;
}
static dist_status k_matmul(void *ctx, int ta, int tb, float alpha, const dist_tensor *a,
                            const dist_tensor *b, float beta, dist_tensor *c) {
    saw("matmul");
    seen.p[0] = ctx, seen.p[1] = a, seen.p[2] = b, seen.p[3] = c;
    seen.i[0] = ta, seen.i[1] = tb, seen.f[0] = alpha, seen.f[1] = beta;
    return DIST_OK;
}
static dist_status k_matmul_bf16(void *ctx, int ta, int tb, float alpha, const dist_tensor *a,
                                 const dist_tensor *b, float beta, dist_tensor *c,
                                 const dist_bf16_copy *ac, const dist_bf16_copy *bc) {
    saw("matmul_bf16");
    seen.p[0] = ctx, seen.p[1] = a, seen.p[2] = b, seen.p[3] = c, seen.p[4] = ac, seen.p[5] = bc;
    seen.i[0] = ta, seen.i[1] = tb, seen.f[0] = alpha, seen.f[1] = beta;
    return DIST_OK;
}
static dist_status k_bias_add(void *ctx, dist_tensor *y, const dist_tensor *b, int relu) {
    saw("bias_add");
    seen.p[0] = ctx, seen.p[1] = y, seen.p[2] = b, seen.i[0] = relu;
    return DIST_OK;
}
static dist_status k_two(const char *k, void *ctx, const void *a, const void *b) {
    saw(k);
    seen.p[0] = ctx, seen.p[1] = a, seen.p[2] = b;
    return DIST_OK;
}
static dist_status k_bias_grad(void *ctx, const dist_tensor *dy, dist_tensor *db) {
    return k_two("bias_grad", ctx, dy, db);
}
static dist_status k_relu(void *ctx, const dist_tensor *x, dist_tensor *y) {
    return k_two("relu_forward", ctx, x, y);
}
static dist_status k_relu_back(void *ctx, const dist_tensor *y, const dist_tensor *dy,
                               dist_tensor *dx) {
    k_two("relu_backward", ctx, y, dy);
    seen.p[3] = dx;
    return DIST_OK;
}
static dist_status k_xent(void *ctx, const dist_tensor *logits, const dist_tensor *labels,
                          dist_tensor *loss, dist_tensor *probs) {
    k_two("softmax_xent_forward", ctx, logits, labels);
    seen.p[3] = loss, seen.p[4] = probs;
    return DIST_OK;
}
static dist_status k_xent_back(void *ctx, const dist_tensor *probs, const dist_tensor *labels,
                               const dist_tensor *dloss, dist_tensor *dlogits) {
    k_two("softmax_xent_backward", ctx, probs, labels);
    seen.p[3] = dloss, seen.p[4] = dlogits;
    return DIST_OK;
}
static dist_status k_accuracy(void *ctx, const dist_tensor *logits, const dist_tensor *labels,
                              dist_tensor *count) {
    k_two("accuracy_count", ctx, logits, labels);
    seen.p[3] = count;
    return DIST_OK;
}
static dist_status k_layout(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    return k_two("to_layout", ctx, src, dst);
}
static dist_status k_add(void *ctx, const dist_tensor *a, const dist_tensor *b, dist_tensor *out) {
    k_two("add", ctx, a, b);
    seen.p[3] = out;
    return DIST_OK;
}
static dist_status k_scale(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out) {
    k_two("scale", ctx, x, out);
    seen.f[0] = alpha;
    return DIST_OK;
}
static dist_status k_fill(void *ctx, dist_tensor *x, float value) {
    k_two("fill", ctx, x, NULL);
    seen.f[0] = value;
    return DIST_OK;
}
static dist_status k_sum(void *ctx, const dist_tensor *x, dist_tensor *out) {
    return k_two("reduce_sum", ctx, x, out);
}
static dist_status k_adam(void *ctx, const dist_adam_desc *d, float *param, const float *grad,
                          float *m, float *v, size_t n) {
    saw("adam_update");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = param, seen.p[3] = grad, seen.p[4] = m,
    seen.p[5] = v, seen.n = n;
    return DIST_OK;
}
static dist_status k_sgd(void *ctx, const dist_sgd_desc *d, float *param, const float *grad,
                         float *mom, size_t n) {
    saw("sgd_update");
    seen.p[0] = ctx, seen.p[1] = d, seen.p[2] = param, seen.p[3] = grad, seen.p[4] = mom,
    seen.n = n;
    return DIST_OK;
}
static dist_status k_cast(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    return k_two("cast", ctx, src, dst);
}
static dist_status k_round(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y) {
    k_two("round", ctx, x, y);
    seen.dtype = dtype;
    return DIST_OK;
}

static const dist_layer_kernels recording = {
    .conv2d_forward = k_conv,
    .conv2d_backward_data = k_conv_data,
    .conv2d_backward_filter = k_conv_filter,
    .max_pool2d_forward = k_pool,
    .max_pool2d_backward = k_pool_back,
    .pool_backward_masks_relu = 0,
    .conv2d_relu_pool_forward = k_cp_fwd,
    .conv2d_relu_pool_backward_filter = k_cp_filter,
    .conv2d_relu_pool_backward = k_cp_back,
    .matmul = k_matmul,
    .matmul_bf16 = k_matmul_bf16,
    .bias_add = k_bias_add,
    .bias_grad = k_bias_grad,
    .relu_forward = k_relu,
    .relu_backward = k_relu_back,
    .softmax_xent_forward = k_xent,
    .softmax_xent_backward = k_xent_back,
    .accuracy_count = k_accuracy,
    .to_layout = k_layout,
    .add = k_add,
    .scale = k_scale,
    .fill = k_fill,
    .reduce_sum = k_sum,
    .adam_update = k_adam,
    .sgd_update = k_sgd,
    .cast = k_cast,
    .round = k_round,
};

/* The recording backend: run_op and supports_op over the table, as a real backend's. */
static int rec_supports(void *ctx, const dist_op *op, const dist_tensor *const *in,
                        dist_tensor *const *out) {
    (void)in, (void)out;
    return dist_layer_supports(ctx ? (const dist_layer_kernels *)ctx : &recording, op);
}
static dist_status rec_run(void *ctx, const dist_op *op, const dist_tensor *const *in,
                           dist_tensor *const *out) {
    return dist_layer_run(ctx ? (const dist_layer_kernels *)ctx : &recording, ctx, op, in, out);
}
static const struct dist_backend_i rec_iface = {
    .name = "recording", .supports_op = rec_supports, .run_op = rec_run};

#define CTX ((void *)&recording)

START_TEST(test_every_entry_point_reaches_its_kernel_with_its_arguments_in_place) {
    dist_tensor t[6];
    memset(t, 0, sizeof t);
    dist_conv2d_desc cd = {.stride_h = 1};
    dist_pool2d_desc pd = {.window_h = 2};
    char ws[4], aux[4];
    int done = -1;

    ck_assert_int_eq(dist_be_conv2d_forward(&rec_iface, CTX, &cd, &t[0], &t[1], &t[2], &t[3]),
                     DIST_OK);
    ck_assert_str_eq(seen.kernel, "conv2d_forward");
    ck_assert(seen.p[0] == CTX && seen.p[1] == &cd && seen.p[2] == &t[0] && seen.p[3] == &t[1] &&
              seen.p[4] == &t[2] && seen.p[5] == &t[3]);
    ck_assert_int_eq(dist_be_conv2d_forward(&rec_iface, CTX, &cd, &t[0], &t[1], NULL, &t[3]),
                     DIST_OK); /* the bias is optional */
    ck_assert(seen.p[4] == NULL);
    ck_assert_int_eq(dist_be_conv2d_backward_data(&rec_iface, CTX, &cd, &t[0], &t[1], &t[2]),
                     DIST_OK);
    ck_assert(seen.p[1] == &cd && seen.p[2] == &t[0] && seen.p[3] == &t[1] && seen.p[4] == &t[2]);
    ck_assert_int_eq(
        dist_be_conv2d_backward_filter(&rec_iface, CTX, &cd, &t[0], &t[1], &t[2], &t[3]), DIST_OK);
    ck_assert(seen.p[2] == &t[0] && seen.p[3] == &t[1] && seen.p[4] == &t[2] && seen.p[5] == &t[3]);
    ck_assert_int_eq(dist_be_max_pool2d_forward(&rec_iface, CTX, &pd, &t[0], &t[1], ws), DIST_OK);
    ck_assert(seen.p[1] == &pd && seen.p[2] == &t[0] && seen.p[3] == &t[1] && seen.p[4] == ws);
    ck_assert_int_eq(dist_be_max_pool2d_backward(&rec_iface, CTX, &pd, &t[0], &t[1], ws, &t[2]),
                     DIST_OK);
    ck_assert(seen.p[2] == &t[0] && seen.p[3] == &t[1] && seen.p[4] == ws && seen.p[5] == &t[2]);

    ck_assert_int_eq(dist_be_conv2d_relu_pool_forward(&rec_iface, CTX, &cd, &pd, &t[0], &t[1],
                                                      &t[2], DIST_BF16, 1, &t[3], ws, aux, &done),
                     DIST_OK);
    ck_assert_str_eq(seen.kernel, "conv2d_relu_pool_forward");
    ck_assert(seen.p[0] == &cd && seen.p[1] == &pd && seen.p[2] == &t[0] && seen.p[3] == &t[1] &&
              seen.p[4] == &t[2] && seen.p[5] == &t[3] && seen.p[6] == ws && seen.p[7] == aux);
    ck_assert_int_eq(seen.dtype, DIST_BF16);
    ck_assert_int_eq(seen.i[0], 1);
    ck_assert_int_eq(done, 3);
    ck_assert_int_eq(dist_be_conv2d_relu_pool_backward_filter(&rec_iface, CTX, &cd, &pd, &t[0],
                                                              &t[1], ws, &t[2], &t[3], &done),
                     DIST_OK);
    ck_assert(seen.p[2] == &t[0] && seen.p[3] == &t[1] && seen.p[4] == ws && seen.p[5] == &t[2] &&
              seen.p[6] == &t[3]);
    ck_assert_int_eq(dist_be_conv2d_relu_pool_backward(&rec_iface, CTX, &cd, &pd, &t[0], &t[1],
                                                       &t[2], ws, &t[3], &t[4], &t[5], &done),
                     DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2] && seen.p[4] == ws &&
              seen.p[5] == &t[3] && seen.p[6] == &t[4] && seen.p[7] == &t[5]);

    ck_assert_int_eq(dist_be_matmul(&rec_iface, CTX, 1, 0, 0.5f, &t[0], &t[1], 2.0f, &t[2]),
                     DIST_OK);
    ck_assert_str_eq(seen.kernel, "matmul");
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2]);
    ck_assert(seen.i[0] == 1 && seen.i[1] == 0 && seen.f[0] == 0.5f && seen.f[1] == 2.0f);
    unsigned ready = 0;
    dist_bf16_copy ca = {aux, &ready, 1}, cb = {ws, &ready, 2};
    ck_assert_int_eq(
        dist_be_matmul_bf16(&rec_iface, CTX, 0, 1, 1.0f, &t[0], &t[1], 0.0f, &t[2], &ca, &cb),
        DIST_OK);
    ck_assert_str_eq(seen.kernel, "matmul_bf16");
    ck_assert(seen.i[0] == 0 && seen.i[1] == 1 && seen.p[4] == &ca && seen.p[5] == &cb);

    ck_assert_int_eq(dist_be_bias_add(&rec_iface, CTX, &t[0], &t[1], 1), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.i[0] == 1);
    ck_assert_int_eq(dist_be_bias_grad(&rec_iface, CTX, &t[0], &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1]);
    ck_assert_int_eq(dist_be_relu_forward(&rec_iface, CTX, &t[0], &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1]);
    ck_assert_int_eq(dist_be_relu_backward(&rec_iface, CTX, &t[0], &t[1], &t[2]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2]);
    ck_assert_int_eq(dist_be_softmax_xent_forward(&rec_iface, CTX, &t[0], &t[1], &t[2], &t[3]),
                     DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2] && seen.p[4] == &t[3]);
    ck_assert_int_eq(dist_be_softmax_xent_backward(&rec_iface, CTX, &t[0], &t[1], &t[2], &t[3]),
                     DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2] && seen.p[4] == &t[3]);
    ck_assert_int_eq(dist_be_accuracy_count(&rec_iface, CTX, &t[0], &t[1], &t[2]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[2]);
    ck_assert_int_eq(dist_be_to_layout(&rec_iface, CTX, &t[0], &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1]);
    ck_assert_int_eq(dist_be_add(&rec_iface, CTX, &t[0], &t[1], &t[0]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.p[3] == &t[0]);
    ck_assert_int_eq(dist_be_scale(&rec_iface, CTX, &t[0], 0.25f, &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.f[0] == 0.25f);
    ck_assert_int_eq(dist_be_fill(&rec_iface, CTX, &t[0], -3.0f), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.f[0] == -3.0f);
    ck_assert_int_eq(dist_be_reduce_sum(&rec_iface, CTX, &t[0], &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1]);
    ck_assert_int_eq(dist_be_cast(&rec_iface, CTX, &t[0], &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1]);
    ck_assert_int_eq(dist_be_round(&rec_iface, CTX, &t[0], DIST_F16, &t[1]), DIST_OK);
    ck_assert(seen.p[1] == &t[0] && seen.p[2] == &t[1] && seen.dtype == DIST_F16);

    float p[5], g[5], m[5], v[5];
    dist_adam_desc ad = {.lr = 0.1f};
    dist_sgd_desc sd = {.lr = 0.1f};
    ck_assert_int_eq(dist_be_adam_update(&rec_iface, CTX, &ad, p, g, m, v, 5), DIST_OK);
    ck_assert(seen.p[1] == &ad && seen.p[2] == p && seen.p[3] == g && seen.p[4] == m &&
              seen.p[5] == v && seen.n == 5);
    ck_assert_int_eq(dist_be_sgd_update(&rec_iface, CTX, &sd, p, g, NULL, 5), DIST_OK);
    ck_assert(seen.p[1] == &sd && seen.p[2] == p && seen.p[3] == g && seen.p[4] == NULL &&
              seen.n == 5); /* plain SGD: no momentum buffer */
}
END_TEST

START_TEST(test_missing_slots_and_attributes_are_named_and_run_nothing) {
    dist_tensor t[3];
    memset(t, 0, sizeof t);
    dist_conv2d_desc cd = {0};
    seen.kernel = NULL;
    ck_assert_int_eq(dist_be_conv2d_forward(&rec_iface, CTX, NULL, &t[0], &t[1], NULL, &t[2]),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "conv attribute"));
    ck_assert_int_eq(dist_be_conv2d_forward(&rec_iface, CTX, &cd, &t[0], NULL, NULL, &t[2]),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 1"));
    ck_assert_int_eq(dist_be_max_pool2d_forward(&rec_iface, CTX, NULL, &t[0], &t[1], NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_be_relu_forward(&rec_iface, CTX, &t[0], NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "output 0"));
    ck_assert_int_eq(
        dist_be_adam_update(&rec_iface, CTX, NULL, (float *)&t, (float *)&t, NULL, NULL, 1),
        DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "adam"));
    ck_assert_ptr_null(seen.kernel);
    /* an op code outside the layer ops */
    const dist_op other = {.code = DIST_OPC_UNARY};
    ck_assert_int_eq(dist_layer_run(&recording, CTX, &other, NULL, NULL), DIST_UNSUPPORTED);
    ck_assert(!dist_layer_supports(&recording, &other));
}
END_TEST

START_TEST(test_a_table_without_a_kernel_says_so_and_matmul_bf16_falls_back) {
    dist_layer_kernels some = recording;
    some.conv2d_relu_pool_forward = NULL;
    some.matmul_bf16 = NULL;
    ck_assert(!dist_be_supports_code(&rec_iface, &some, DIST_OPC_CONV2D_RELU_MAX_POOL));
    ck_assert(dist_be_supports_code(&rec_iface, &some, DIST_OPC_CONV2D_RELU_MAX_POOL_GRAD));
    dist_tensor t[4];
    memset(t, 0, sizeof t);
    dist_conv2d_desc cd = {0};
    dist_pool2d_desc pd = {0};
    int done = -1;
    char ws[1];
    ck_assert_int_eq(dist_be_conv2d_relu_pool_forward(&rec_iface, &some, &cd, &pd, &t[0], &t[1],
                                                      NULL, DIST_F32, 0, &t[2], ws, NULL, &done),
                     DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "conv2d_relu_max_pool2d"));
    /* a bfloat16 product without a bfloat16 kernel: the float32 one, as the tape always did */
    ck_assert_int_eq(
        dist_be_matmul_bf16(&rec_iface, &some, 0, 0, 1.0f, &t[0], &t[1], 0.0f, &t[2], NULL, NULL),
        DIST_OK);
    ck_assert_str_eq(seen.kernel, "matmul");
    /* the pool's folded ReLU mask: only where the table honours it */
    dist_pool2d_desc masked = {.relu_mask = 1};
    const dist_op mask_op = {.code = DIST_OPC_MAX_POOL2D_GRAD, .max_pool = &masked};
    ck_assert(!dist_be_supports(&rec_iface, CTX, &mask_op));
    some.pool_backward_masks_relu = 1;
    ck_assert(dist_be_supports(&rec_iface, &some, &mask_op));
}
END_TEST

START_TEST(test_the_cpu_backend_runs_every_layer_op_through_run_op) {
    dist_backend *be = dist_test_cpu_backend(1);
    for (int c = DIST_OPC_LAYER_FIRST; c < DIST_OPC_COUNT; c++) {
        const dist_op op = {.code = (dist_opcode)c};
        ck_assert_msg(dist_backend_supports_op(be, &op, NULL, NULL), "%s (code %d)",
                      dist_op_name(&op), c);
    }
    /* a real product through the generic entry: [[1, 2], [3, 4]] @ [[5], [6]] = [[17], [39]] */
    float a[4] = {1, 2, 3, 4}, b[2] = {5, 6}, c[2] = {-1, -1};
    int64_t sa[2] = {2, 2}, sb[2] = {2, 1};
    dist_tensor ta = dist_tensor_view(a, DIST_F32, 2, sa),
                tb = dist_tensor_view(b, DIST_F32, 2, sb),
                tc = dist_tensor_view(c, DIST_F32, 2, sb);
    const dist_op mm = {.code = DIST_OPC_MATMUL, .nin = 2, .nout = 1, .f = {1.0f, 0.0f}};
    const dist_tensor *in[2] = {&ta, &tb};
    dist_tensor *out[1] = {&tc};
    ck_assert_int_eq(dist_backend_run_op(be, &mm, in, out), DIST_OK);
    ck_assert(c[0] == 17.0f && c[1] == 39.0f);
    /* transposed a, alpha 2, accumulated into c (beta 1): 2 * [[1*5 + 3*6], [2*5 + 4*6]] + c */
    const dist_op mmt = {
        .code = DIST_OPC_MATMUL, .k = DIST_MM_TRANSPOSE_A, .nin = 2, .nout = 1, .f = {2.0f, 1.0f}};
    ck_assert_int_eq(dist_backend_run_op(be, &mmt, in, out), DIST_OK);
    ck_assert_msg(c[0] == 17.0f + 46.0f && c[1] == 39.0f + 68.0f, "%g %g", (double)c[0],
                  (double)c[1]);
    dist_backend_destroy(be);
}
END_TEST

int main(void) {
    Suite *s = suite_create("layer_ops");
    TCase *tc = tcase_create("layer_ops");
    tcase_add_test(tc, test_every_entry_point_reaches_its_kernel_with_its_arguments_in_place);
    tcase_add_test(tc, test_missing_slots_and_attributes_are_named_and_run_nothing);
    tcase_add_test(tc, test_a_table_without_a_kernel_says_so_and_matmul_bf16_falls_back);
    tcase_add_test(tc, test_the_cpu_backend_runs_every_layer_op_through_run_op);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
