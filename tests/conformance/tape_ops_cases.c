/* Runs every math op of dist/tape.h on fixed inputs on a CPU tape and writes, per case, the
 * inputs, the output, the output gradient fed back and the gradient of every input, as JSON,
 * for tape_ops_conformance.py to recompute with tf.GradientTape.
 *
 * Usage: tape_ops_cases OUT.json
 * Inputs are deterministic pseudo-random values; some cases plant ties (maximum, minimum,
 * reduce_max) and zeros (abs, sigmoid cross-entropy) where TensorFlow's gradient rules pick a
 * side. Exit 2 on a libdist error, 1 on a usage or file error. */
#include <dist/dist.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_IN 3

typedef struct conf_case {
    const char *op;
    int nin;
    int ndim[MAX_IN];
    int64_t shape[MAX_IN][4];
    float lo, hi;
    float lo1, hi1; /* input 1's range when different (hi1 > lo1) */
    int ties;       /* input 1 repeats input 0 at even positions; reduce_max: values in halves */
    int zeros;      /* input `zeros - 1` has an exact zero at its first elements */
    float at;       /* != 0: input 0's elements 2 and 3 are exactly this (a cap's kink) */
    int p[6];       /* op parameters, written to the JSON as "params" */
} conf_case;

static uint64_t g_rng = 20261203;

static float uniform(float lo, float hi) {
    g_rng = g_rng * 6364136223846793005ULL + 1442695040888963407ULL;
    double u = (double)(g_rng >> 11) / 9007199254740992.0;
    return (float)(lo + (hi - lo) * u);
}

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

static dist_status forward(dist_tape *t, const conf_case *c, dist_tensor **in, dist_tensor **y) {
    const char *op = c->op;
    if (!strcmp(op, "add")) return dist_op_add(t, in[0], in[1], y);
    if (!strcmp(op, "sub")) return dist_op_sub(t, in[0], in[1], y);
    if (!strcmp(op, "mul")) return dist_op_mul(t, in[0], in[1], y);
    if (!strcmp(op, "div")) return dist_op_div(t, in[0], in[1], y);
    if (!strcmp(op, "maximum")) return dist_op_maximum(t, in[0], in[1], y);
    if (!strcmp(op, "minimum")) return dist_op_minimum(t, in[0], in[1], y);
    if (!strcmp(op, "neg")) return dist_op_neg(t, in[0], y);
    if (!strcmp(op, "exp")) return dist_op_exp(t, in[0], y);
    if (!strcmp(op, "log")) return dist_op_log(t, in[0], y);
    if (!strcmp(op, "sqrt")) return dist_op_sqrt(t, in[0], y);
    if (!strcmp(op, "square")) return dist_op_square(t, in[0], y);
    if (!strcmp(op, "abs")) return dist_op_abs(t, in[0], y);
    if (!strcmp(op, "sigmoid")) return dist_op_sigmoid(t, in[0], y);
    if (!strcmp(op, "tanh")) return dist_op_tanh(t, in[0], y);
    if (!strcmp(op, "gelu")) return dist_op_gelu(t, in[0], c->p[0], y);
    /* alpha and the cap in hundredths */
    if (!strcmp(op, "elu")) return dist_op_elu(t, in[0], (float)c->p[0] / 100.0f, y);
    if (!strcmp(op, "selu")) return dist_op_selu(t, in[0], y);
    if (!strcmp(op, "softplus")) return dist_op_softplus(t, in[0], y);
    if (!strcmp(op, "softsign")) return dist_op_softsign(t, in[0], y);
    if (!strcmp(op, "leaky_relu")) return dist_op_leaky_relu(t, in[0], (float)c->p[0] / 100.0f, y);
    if (!strcmp(op, "relu6")) return dist_op_relu6(t, in[0], y);
    if (!strcmp(op, "relu_max")) return dist_op_relu_max(t, in[0], (float)c->p[0] / 100.0f, y);
    if (!strcmp(op, "mish")) return dist_op_mish(t, in[0], y);
    if (!strcmp(op, "hard_sigmoid")) return dist_op_hard_sigmoid(t, in[0], c->p[0], y);
    if (!strcmp(op, "hard_silu")) return dist_op_hard_silu(t, in[0], y);
    if (!strcmp(op, "hard_tanh")) return dist_op_hard_tanh(t, in[0], y);
    if (!strcmp(op, "soft_shrink")) return dist_op_soft_shrink(t, in[0], c->p[0] / 100.0f, y);
    if (!strcmp(op, "hard_shrink")) return dist_op_hard_shrink(t, in[0], c->p[0] / 100.0f, y);
    if (!strcmp(op, "sparse_sigmoid")) return dist_op_sparse_sigmoid(t, in[0], y);
    if (!strcmp(op, "sparse_plus")) return dist_op_sparse_plus(t, in[0], y);
    if (!strcmp(op, "log_sigmoid")) return dist_op_log_sigmoid(t, in[0], y);
    if (!strcmp(op, "tanh_shrink")) return dist_op_tanh_shrink(t, in[0], y);
    if (!strcmp(op, "matmul")) return dist_op_matmul(t, in[0], in[1], c->p[0], c->p[1], y);
    if (!strcmp(op, "reshape")) {
        int64_t shape[2] = {-1, c->p[0]};
        return dist_op_reshape(t, in[0], 2, shape, y);
    }
    if (!strcmp(op, "transpose")) return dist_op_transpose(t, in[0], c->p, y);
    if (!strcmp(op, "concat")) {
        const dist_tensor *xs[MAX_IN] = {in[0], in[1], in[2]};
        return dist_op_concat(t, c->nin, xs, c->p[0], y);
    }
    if (!strcmp(op, "slice")) {
        int64_t begin[3] = {c->p[0], c->p[1], c->p[2]}, size[3] = {c->p[3], c->p[4], c->p[5]};
        return dist_op_slice(t, in[0], begin, size, y);
    }
    /* reductions: p = {naxes, keepdims, axes...} */
    if (!strcmp(op, "reduce_sum"))
        return dist_op_reduce_sum_axes(t, in[0], c->p[0], &c->p[2], c->p[1], y);
    if (!strcmp(op, "reduce_mean"))
        return dist_op_reduce_mean_axes(t, in[0], c->p[0], &c->p[2], c->p[1], y);
    if (!strcmp(op, "reduce_max"))
        return dist_op_reduce_max(t, in[0], c->p[0], &c->p[2], c->p[1], y);
    if (!strcmp(op, "softmax")) return dist_op_softmax(t, in[0], y);
    if (!strcmp(op, "log_softmax")) return dist_op_log_softmax(t, in[0], y);
    if (!strcmp(op, "sigmoid_cross_entropy_with_logits"))
        return dist_op_sigmoid_cross_entropy_with_logits(t, in[0], in[1], y);
    if (!strcmp(op, "mean_squared_error")) return dist_op_mean_squared_error(t, in[0], in[1], y);
    fprintf(stderr, "tape_ops_cases: unknown op %s\n", op);
    exit(1);
}

static void write_tensor(FILE *f, int ndim, const int64_t *shape, const float *v) {
    fprintf(f, "{\"shape\": [");
    for (int d = 0; d < ndim; d++) fprintf(f, "%s%lld", d ? ", " : "", (long long)shape[d]);
    fprintf(f, "], \"data\": [");
    int64_t n = numel(ndim, shape);
    for (int64_t i = 0; i < n; i++) fprintf(f, "%s%.9g", i ? ", " : "", (double)v[i]);
    fprintf(f, "]}");
}

static int fail(const conf_case *c, const char *what) {
    fprintf(stderr, "tape_ops_cases: %s: %s: %s\n", c->op, what, dist_last_error());
    return 2;
}

static int run_case(dist_tape *t, const conf_case *c, FILE *f, int first) {
    dist_tape_reset(t);
    float *host[MAX_IN];
    dist_tensor *in[MAX_IN], *grads[MAX_IN];
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel(c->ndim[i], c->shape[i]);
        host[i] = malloc((size_t)(n ? n : 1) * sizeof(float));
        for (int64_t j = 0; j < n; j++) {
            float v = i == 1 && c->hi1 > c->lo1 ? uniform(c->lo1, c->hi1) : uniform(c->lo, c->hi);
            if (c->ties && !strcmp(c->op, "reduce_max")) v = (float)(int)(v * 2.0f) / 2.0f;
            if (c->ties && i == 1 && j % 2 == 0 && j < numel(c->ndim[0], c->shape[0]))
                v = host[0][j];
            if (c->zeros == i + 1 && j < 2) v = 0.0f;
            if (c->at != 0 && i == 0 && (j == 2 || j == 3)) v = c->at;
            host[i][j] = v;
        }
        dist_tensor h = dist_tensor_view(host[i], DIST_F32, c->ndim[i], c->shape[i]);
        if (dist_tape_upload(t, &h, &in[i]) || dist_tape_watch(t, in[i])) return fail(c, "upload");
    }
    dist_tensor *y;
    if (forward(t, c, in, &y)) return fail(c, "forward");
    int64_t ny = numel(y->ndim, y->shape);
    float *yv = malloc((size_t)(ny ? ny : 1) * sizeof(float));
    float *seed = malloc((size_t)(ny ? ny : 1) * sizeof(float));
    if (dist_tape_download(t, y, yv, (size_t)ny * sizeof(float))) return fail(c, "download");
    for (int64_t j = 0; j < ny; j++) seed[j] = uniform(-1.0f, 1.0f);
    dist_tensor sh = dist_tensor_view(seed, DIST_F32, y->ndim, y->shape), *sd;
    if (dist_tape_upload(t, &sh, &sd)) return fail(c, "upload seed");
    for (int i = 0; i < c->nin; i++)
        if (dist_tape_alloc(t, DIST_F32, c->ndim[i], c->shape[i], &grads[i]))
            return fail(c, "alloc");
    if (dist_tape_gradient_with(t, y, sd, c->nin, in, grads)) return fail(c, "gradient");

    fprintf(f, "%s  {\"op\": \"%s\", \"params\": [", first ? "" : ",\n", c->op);
    for (int k = 0; k < 6; k++) fprintf(f, "%s%d", k ? ", " : "", c->p[k]);
    fprintf(f, "],\n   \"inputs\": [");
    for (int i = 0; i < c->nin; i++) {
        fprintf(f, "%s", i ? ", " : "");
        write_tensor(f, c->ndim[i], c->shape[i], host[i]);
    }
    fprintf(f, "],\n   \"output\": ");
    write_tensor(f, y->ndim, y->shape, yv);
    fprintf(f, ",\n   \"seed\": ");
    write_tensor(f, y->ndim, y->shape, seed);
    fprintf(f, ",\n   \"grads\": [");
    for (int i = 0; i < c->nin; i++) {
        int64_t n = numel(c->ndim[i], c->shape[i]);
        float *g = malloc((size_t)(n ? n : 1) * sizeof(float));
        if (dist_tape_download(t, grads[i], g, (size_t)n * sizeof(float)))
            return fail(c, "download gradient");
        fprintf(f, "%s", i ? ", " : "");
        write_tensor(f, c->ndim[i], c->shape[i], g);
        free(g);
    }
    fprintf(f, "]}");
    for (int i = 0; i < c->nin; i++) free(host[i]);
    free(yv);
    free(seed);
    return 0;
}

#define ONE(name, n0, d0, d1, d2) .op = name, .nin = 1, .ndim = {n0}, .shape = {{d0, d1, d2}}
#define TWO(name, n0, a0, a1, a2, n1, b0, b1, b2)                                                  \
    .op = name, .nin = 2, .ndim = {n0, n1}, .shape = {{a0, a1, a2}, {b0, b1, b2}}

static const conf_case cases[] = {
    {TWO("add", 3, 2, 3, 4, 1, 4, 0, 0), -2, 2},
    {TWO("add", 2, 3, 4, 0, 2, 3, 4, 0), -2, 2},
    {TWO("sub", 3, 2, 1, 4, 2, 3, 1, 0), -2, 2},
    {TWO("mul", 2, 3, 4, 0, 0, 0, 0, 0), -2, 2},
    {TWO("mul", 2, 3, 4, 0, 2, 1, 4, 0), -2, 2},
    {TWO("div", 2, 3, 4, 0, 2, 3, 4, 0), 0.5f, 2},
    {TWO("div", 2, 3, 4, 0, 1, 4, 0, 0), 0.5f, 2},
    {TWO("maximum", 2, 3, 4, 0, 2, 3, 4, 0), -2, 2, .ties = 1},
    {TWO("maximum", 2, 3, 4, 0, 2, 1, 4, 0), -2, 2},
    {TWO("minimum", 2, 3, 4, 0, 2, 3, 4, 0), -2, 2, .ties = 1},
    {TWO("minimum", 2, 3, 4, 0, 0, 0, 0, 0), -2, 2},
    {ONE("neg", 2, 3, 4, 0), -2, 2},
    {ONE("exp", 2, 3, 4, 0), -2, 2},
    {ONE("log", 2, 3, 4, 0), 0.1f, 3},
    {ONE("sqrt", 2, 3, 4, 0), 0.1f, 3},
    {ONE("square", 2, 3, 4, 0), -2, 2},
    {ONE("abs", 2, 3, 4, 0), -2, 2, .zeros = 1},
    {ONE("sigmoid", 2, 3, 4, 0), -4, 4},
    {ONE("tanh", 2, 3, 4, 0), -3, 3},
    {ONE("gelu", 2, 3, 4, 0), -3, 3, .p = {0}},
    {ONE("gelu", 2, 3, 4, 0), -3, 3, .p = {1}},
    {ONE("elu", 2, 3, 4, 0), -3, 3, .p = {100}, .zeros = 1},
    {ONE("elu", 2, 3, 4, 0), -3, 3, .p = {50}, .zeros = 1},
    {ONE("selu", 2, 3, 4, 0), -3, 3, .zeros = 1},
    {ONE("softplus", 2, 5, 8, 0), -20, 20}, /* both sides of +-13.94 */
    {ONE("softsign", 2, 3, 4, 0), -4, 4},
    {ONE("leaky_relu", 2, 3, 4, 0), -3, 3, .p = {20}, .zeros = 1},
    {ONE("leaky_relu", 2, 3, 4, 0), -3, 3, .p = {-150}},
    {ONE("relu6", 2, 4, 5, 0), -3, 9, .zeros = 1, .at = 6.0f},
    {ONE("relu_max", 2, 4, 5, 0), -2, 4, .p = {250}, .zeros = 1, .at = 2.5f},
    {ONE("mish", 2, 3, 4, 0), -5, 5},
    /* hard_sigmoid, Keras 3's (p 0) at x + 3 = 0 and 6, tf_keras's (p 1) at 0.2 x + 0.5 = 0
     * and 1 (exact in float32 at x = -2.5 and 2.5) */
    {ONE("hard_sigmoid", 2, 4, 5, 0), -5, 5, .p = {0}, .at = -3.0f},
    {ONE("hard_sigmoid", 2, 4, 5, 0), -5, 5, .p = {0}, .at = 3.0f},
    {ONE("hard_sigmoid", 2, 4, 5, 0), -5, 5, .p = {1}, .at = -2.5f},
    {ONE("hard_sigmoid", 2, 4, 5, 0), -5, 5, .p = {1}, .at = 2.5f},
    {ONE("hard_silu", 2, 4, 5, 0), -5, 5, .at = -3.0f},
    {ONE("hard_silu", 2, 4, 5, 0), -5, 5, .at = 3.0f},
    /* Keras 3's piecewise activations on their kinks (the shrinks' threshold in hundredths) */
    {ONE("hard_tanh", 2, 4, 5, 0), -3, 3, .at = -1.0f},
    {ONE("hard_tanh", 2, 4, 5, 0), -3, 3, .at = 1.0f},
    {ONE("soft_shrink", 2, 4, 5, 0), -2, 2, .p = {50}, .at = 0.5f},
    {ONE("soft_shrink", 2, 4, 5, 0), -2, 2, .p = {50}, .at = -0.5f},
    {ONE("soft_shrink", 2, 4, 5, 0), -3, 3, .p = {125}, .at = 1.25f},
    {ONE("hard_shrink", 2, 4, 5, 0), -2, 2, .p = {50}, .at = 0.5f},
    {ONE("hard_shrink", 2, 4, 5, 0), -2, 2, .p = {50}, .at = -0.5f},
    {ONE("sparse_sigmoid", 2, 4, 5, 0), -3, 3, .at = -1.0f},
    {ONE("sparse_sigmoid", 2, 4, 5, 0), -3, 3, .at = 1.0f},
    {ONE("sparse_plus", 2, 4, 5, 0), -3, 3, .at = -1.0f},
    {ONE("sparse_plus", 2, 4, 5, 0), -3, 3, .at = 1.0f},
    {ONE("log_sigmoid", 2, 5, 8, 0), -20, 20},
    {ONE("tanh_shrink", 2, 3, 4, 0), -3, 3},
    {TWO("matmul", 2, 3, 4, 0, 2, 4, 5, 0), -1, 1, .p = {0, 0}},
    {TWO("matmul", 2, 4, 3, 0, 2, 4, 5, 0), -1, 1, .p = {1, 0}},
    {TWO("matmul", 2, 3, 4, 0, 2, 5, 4, 0), -1, 1, .p = {0, 1}},
    {TWO("matmul", 2, 4, 3, 0, 2, 5, 4, 0), -1, 1, .p = {1, 1}},
    {ONE("reshape", 3, 2, 3, 4), -1, 1, .p = {6}},
    {ONE("transpose", 3, 2, 3, 4), -1, 1, .p = {2, 0, 1}},
    {.op = "concat",
     .nin = 3,
     .ndim = {3, 3, 3},
     .shape = {{2, 1, 3}, {2, 2, 3}, {2, 3, 3}},
     -1,
     1,
     .p = {1}},
    {.op = "concat", .nin = 2, .ndim = {2, 2}, .shape = {{2, 3}, {2, 1}}, -1, 1, .p = {-1}},
    {ONE("slice", 3, 4, 3, 5), -1, 1, .p = {1, 0, 2, 2, -1, 2}},
    {ONE("reduce_sum", 3, 2, 3, 4), -1, 1, .p = {1, 0, 1}},
    {ONE("reduce_sum", 2, 3, 4, 0), -1, 1, .p = {0, 0}},
    {ONE("reduce_mean", 3, 2, 3, 4), -1, 1, .p = {2, 1, 0, -1}},
    {ONE("reduce_mean", 2, 3, 4, 0), -1, 1, .p = {0, 1}},
    {ONE("reduce_max", 3, 2, 3, 4), -2, 2, .ties = 1, .p = {1, 0, 1}},
    {ONE("reduce_max", 3, 2, 3, 4), -2, 2, .ties = 1, .p = {2, 1, 0, 2}},
    {ONE("reduce_max", 2, 3, 4, 0), -1, 1, .p = {0, 0}},
    {ONE("softmax", 3, 2, 2, 5), -3, 3},
    {ONE("log_softmax", 3, 2, 2, 5), -3, 3},
    {TWO("sigmoid_cross_entropy_with_logits", 2, 3, 4, 0, 2, 3, 4, 0), 0, 1, -4, 4, .zeros = 2},
    {TWO("mean_squared_error", 2, 3, 4, 0, 2, 3, 4, 0), -2, 2},
    {TWO("mean_squared_error", 3, 2, 3, 4, 3, 2, 3, 4), -2, 2},
};

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: %s OUT.json\n", argv[0]);
        return 1;
    }
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    dist_backend *be;
    dist_tape *t;
    if (dist_backend_create(&bo, &be) || dist_tape_create(be, &t)) {
        fprintf(stderr, "tape_ops_cases: %s\n", dist_last_error());
        return 2;
    }
    FILE *f = fopen(argv[1], "w");
    if (!f) return perror(argv[1]), 1;
    fprintf(f, "[\n");
    int n = (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n; i++) {
        int rc = run_case(t, &cases[i], f, i == 0);
        if (rc) return rc;
    }
    fprintf(f, "\n]\n");
    if (fclose(f)) return perror(argv[1]), 1;
    dist_tape_destroy(t);
    dist_backend_destroy(be);
    printf("tape_ops_cases: %d cases written to %s\n", n, argv[1]);
    return 0;
}
