/* The op set (backend/ops.h) on the CUDA backend against the CPU backend, opcode by opcode.
 *
 * Each op gets the same inputs on both backends and must agree with the CPU element by element
 * within a relative tolerance of 1e-5 (plus 1e-7 of the output's largest magnitude, for
 * elements that cancel to near zero); the dropout mask must agree bit for bit, with the CPU and
 * with dist_op_hash32 itself. GPU outputs are poisoned with NaN bytes first, so an element a
 * kernel forgets to write fails the comparison.
 *
 * Without a GPU the program exits 77 (skipped), or fails where DIST_REQUIRE_GPU says there is
 * one (tests/gpu/check.sh). Check runs in no-fork mode: a CUDA context does not survive fork(). */
#include "backend/backend.h"
#include "backend/ops_dispatch.h"
#include "dist/backend.h"
#include "testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *g_cpu, *g_gpu;
static uint64_t g_rng = 0x0b5e7c0da5ULL;

#define REL_TOL 1e-5
#define SCALE_TOL 1e-7

/* One input or output of an op: nd = -1 for a NULL slot; values random in [lo, hi) unless v,
 * rounded to multiples of q where q > 0 (long sums of them are exact in any order). */
typedef struct spec {
    int nd;
    int64_t shape[DIST_MAX_DIMS];
    float lo, hi;
    const float *v;
    float q;
} spec;

#define NONE ((spec){.nd = -1})

static int64_t spec_numel(const spec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->nd; d++) n *= s->shape[d];
    return n;
}

static dist_tensor *alloc_on(dist_backend *be, const spec *s) {
    dist_tensor *t = NULL;
    dist_status st = dist_backend_alloc_tensor(be, DIST_F32, s->nd, s->shape, &t);
    ck_assert_msg(st == DIST_OK, "alloc: %s", dist_last_error());
    return t;
}

static void upload(dist_backend *be, dist_tensor *t, const float *v) {
    dist_status st = dist_backend_from_host(be, v, dist_tensor_bytes(t), t);
    ck_assert_msg(st == DIST_OK, "upload: %s", dist_last_error());
}

static float *download(dist_backend *be, const dist_tensor *t) {
    int64_t n = dist_tensor_numel(t);
    float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    dist_status st = dist_backend_to_host(be, t, v, dist_tensor_bytes(t));
    ck_assert_msg(st == DIST_OK, "download: %s", dist_last_error());
    return v;
}

/* The outputs of one op run on both backends, as host floats (NULL for a NULL slot). */
typedef struct both {
    int nout;
    int64_t n[3];
    float *cpu[3], *gpu[3];
} both;

static both run_both(const dist_op *op, const spec *in, const spec *out) {
    dist_tensor *ic[DIST_OP_MAX_IN] = {0}, *ig[DIST_OP_MAX_IN] = {0}, *oc[3] = {0}, *og[3] = {0};
    for (int i = 0; i < op->nin; i++) {
        if (in[i].nd < 0) continue;
        int64_t n = spec_numel(&in[i]);
        float *v = malloc((size_t)(n ? n : 1) * sizeof *v);
        for (int64_t j = 0; j < n; j++) {
            v[j] = in[i].v ? in[i].v[j] : dist_test_uniform(&g_rng, in[i].lo, in[i].hi);
            if (in[i].q > 0) v[j] = roundf(v[j] / in[i].q) * in[i].q;
        }
        ic[i] = alloc_on(g_cpu, &in[i]);
        ig[i] = alloc_on(g_gpu, &in[i]);
        upload(g_cpu, ic[i], v);
        upload(g_gpu, ig[i], v);
        free(v);
    }
    for (int i = 0; i < op->nout; i++) {
        if (out[i].nd < 0) continue;
        int64_t n = spec_numel(&out[i]);
        float *nan = malloc((size_t)(n ? n : 1) * sizeof *nan);
        memset(nan, 0xff, (size_t)(n ? n : 1) * sizeof *nan);
        oc[i] = alloc_on(g_cpu, &out[i]);
        og[i] = alloc_on(g_gpu, &out[i]);
        upload(g_cpu, oc[i], nan);
        upload(g_gpu, og[i], nan);
        free(nan);
    }
    const char *name = dist_op_name(op);
    dist_status st = dist_backend_run_op(g_cpu, op, (const dist_tensor *const *)ic, oc);
    ck_assert_msg(st == DIST_OK, "%s (code %d, kind %d) on the CPU: %s", name, (int)op->code, op->k,
                  dist_last_error());
    st = dist_backend_run_op(g_gpu, op, (const dist_tensor *const *)ig, og);
    ck_assert_msg(st == DIST_OK, "%s (code %d, kind %d) on the GPU: %s", name, (int)op->code, op->k,
                  dist_last_error());
    both r = {.nout = op->nout};
    for (int i = 0; i < op->nout; i++) {
        if (!oc[i]) continue;
        r.n[i] = dist_tensor_numel(oc[i]);
        r.cpu[i] = download(g_cpu, oc[i]);
        r.gpu[i] = download(g_gpu, og[i]);
    }
    for (int i = 0; i < op->nin; i++) {
        dist_backend_free_tensor(g_cpu, ic[i]);
        dist_backend_free_tensor(g_gpu, ig[i]);
    }
    for (int i = 0; i < op->nout; i++) {
        dist_backend_free_tensor(g_cpu, oc[i]);
        dist_backend_free_tensor(g_gpu, og[i]);
    }
    return r;
}

static void both_free(both *r) {
    for (int i = 0; i < 3; i++) {
        free(r->cpu[i]);
        free(r->gpu[i]);
    }
}

/* Every output element within REL_TOL of the CPU's (NaN where the CPU has NaN). */
static void expect_close(const char *what, const dist_op *op, const both *r) {
    for (int i = 0; i < r->nout; i++) {
        if (!r->cpu[i]) continue;
        double scale = 0.0;
        for (int64_t j = 0; j < r->n[i]; j++)
            if (isfinite(r->cpu[i][j]) && fabs(r->cpu[i][j]) > scale) scale = fabs(r->cpu[i][j]);
        for (int64_t j = 0; j < r->n[i]; j++) {
            double c = r->cpu[i][j], g = r->gpu[i][j];
            int ok = isnan(c) ? isnan(g)
                              : (c == g || fabs(g - c) <= REL_TOL * fabs(c) + SCALE_TOL * scale);
            ck_assert_msg(ok, "%s: %s (kind %d), output %d element %lld: GPU %.9g, CPU %.9g", what,
                          dist_op_name(op), op->k, i, (long long)j, g, c);
        }
    }
}

/* Runs op on both and compares; the outputs are freed. */
static void check_op(const char *what, const dist_op *op, const spec *in, const spec *out) {
    both r = run_both(op, in, out);
    expect_close(what, op, &r);
    both_free(&r);
}

/* ---- elementwise -------------------------------------------------------------------------- */

START_TEST(test_unary_and_its_gradient_match_cpu_for_every_kind) {
    for (int i = 0; i <= DIST_UN_COUNT; i++) { /* the last: HARD_SIGMOID's Keras 3 form */
        const int k = i == DIST_UN_COUNT ? DIST_UN_HARD_SIGMOID : i;
        int positive = k == DIST_UN_LOG || k == DIST_UN_SQRT;
        float lo = positive ? 0.05f : -4.0f, hi = 4.0f;
        /* the parameters of ELU (alpha), LEAKY_RELU (alpha), RELU_MAX (the cap, inclusive),
         * HARD_SIGMOID (1: tf_keras's form, 0: Keras 3's) */
        const float p0 = k == DIST_UN_ELU            ? 0.7f
                         : k == DIST_UN_LEAKY_RELU   ? 0.2f
                         : k == DIST_UN_HARD_SIGMOID ? (i == k ? 1.0f : 0.0f)
                                                     : 1.5f;
        const float p1 = k == DIST_UN_RELU_MAX ? 1.0f : 0.0f;
        dist_op op = {.code = DIST_OPC_UNARY, .k = k, .nin = 1, .nout = 1, .f = {p0, p1}};
        spec x = {3, {3, 5, 7}, lo, hi, NULL, 0}, y = {3, {3, 5, 7}, 0, 0, NULL, 0};
        check_op("unary", &op, &x, &y);
        dist_op g = {.code = DIST_OPC_UNARY_GRAD, .k = k, .nin = 3, .nout = 1, .f = {p0, p1}};
        spec gin[3] = {x, {3, {3, 5, 7}, 0.1f, 0.9f, NULL, 0}, {3, {3, 5, 7}, -1, 1, NULL, 0}};
        check_op("unary_grad", &g, gin, &y);
    }
}
END_TEST

/* a [4, 1, 6] with b [5, 1]; a [7, 3] with a scalar b; equal shapes; a [1] against b [50, 60]
 * (3000 elements summed into da: the block-per-output path; quarters, so that the sums are
 * exact in any order) */
static const spec bin_cases[][3] = {
    {{3, {4, 1, 6}, -2, 2, NULL, 0}, {2, {5, 1}, 0.5f, 2, NULL, 0}, {3, {4, 5, 6}, 0, 0, NULL, 0}},
    {{2, {7, 3}, -2, 2, NULL, 0}, {0, {0}, 0.5f, 2, NULL, 0}, {2, {7, 3}, 0, 0, NULL, 0}},
    {{2, {3, 4}, -2, 2, NULL, 0}, {2, {3, 4}, 0.5f, 2, NULL, 0}, {2, {3, 4}, 0, 0, NULL, 0}},
    {{1, {1}, -2, 2, NULL, 0.25f},
     {2, {50, 60}, 0.5f, 2, NULL, 0.25f},
     {2, {50, 60}, 0, 0, NULL, 0.25f}},
};

START_TEST(test_binary_broadcasts_and_its_gradient_sums_like_cpu) {
    for (int k = 0; k < DIST_BIN_COUNT; k++) {
        for (size_t c = 0; c < sizeof bin_cases / sizeof bin_cases[0]; c++) {
            const spec *s = bin_cases[c];
            dist_op op = {.code = DIST_OPC_BINARY, .k = k, .nin = 2, .nout = 1};
            check_op("binary", &op, s, &s[2]);
            dist_op g = {.code = DIST_OPC_BINARY_GRAD, .k = k, .nin = 3, .nout = 2};
            spec dy = s[2];
            dy.lo = 0.5f, dy.hi = 1.0f; /* one sign: the long sums do not cancel */
            spec gin[3] = {s[0], s[1], dy}, gout[2] = {s[0], s[1]};
            check_op("binary_grad", &g, gin, gout);
            spec only_db[2] = {NONE, s[1]};
            check_op("binary_grad (db only)", &g, gin, only_db);
        }
    }
}
END_TEST

/* relu = 1: the ReLU of the op forward, and the gradients of dy masked by y (in[3]: values of
 * both signs and zeros) backward, broadcast or not; ADD unbroadcast is the one-pass kernel */
START_TEST(test_binary_with_a_fused_relu_matches_cpu_both_ways) {
    for (int k = 0; k < DIST_BIN_COUNT; k++) {
        for (size_t c = 0; c < sizeof bin_cases / sizeof bin_cases[0]; c++) {
            const spec *s = bin_cases[c];
            dist_op op = {.code = DIST_OPC_BINARY, .k = k, .nin = 2, .nout = 1, .relu = 1};
            check_op("binary (relu)", &op, s, &s[2]);
            dist_op g = {.code = DIST_OPC_BINARY_GRAD, .k = k, .nin = 4, .nout = 2, .relu = 1};
            spec dy = s[2], y = s[2];
            dy.lo = 0.5f, dy.hi = 1.0f;
            y.lo = -1.0f, y.hi = 1.0f, y.q = 0.5f; /* -1, -0.5, 0, 0.5, 1: the mask's edge */
            spec gin[4] = {s[0], s[1], dy, y}, gout[2] = {s[0], s[1]};
            check_op("binary_grad (relu)", &g, gin, gout);
            spec only_da[2] = {s[0], NONE};
            check_op("binary_grad (relu, da only)", &g, gin, only_da);
        }
    }
}
END_TEST

/* ---- reductions and shapes ---------------------------------------------------------------- */

START_TEST(test_reduce_and_its_gradient_match_cpu_over_axis_masks) {
    /* values on a grid of 0.5: reduce_max has ties to split its gradient over */
    float xv[120];
    for (int i = 0; i < 120; i++) xv[i] = 0.5f * (float)((int)dist_test_uniform(&g_rng, -4, 4));
    const int masks[] = {5, 2, 7, 0, 1, 4};
    for (int k = DIST_RED_SUM; k <= DIST_RED_MAX; k++) {
        for (size_t m = 0; m < sizeof masks / sizeof masks[0]; m++) {
            spec x = {3, {4, 5, 6}, 0, 0, xv, 0}, y = {3, {4, 5, 6}, 0, 0, NULL, 0};
            for (int d = 0; d < 3; d++)
                if (masks[m] & (1 << d)) y.shape[d] = 1;
            dist_op op = {.code = DIST_OPC_REDUCE, .k = k, .mask = masks[m], .nin = 1, .nout = 1};
            both fwd = run_both(&op, &x, &y);
            expect_close("reduce", &op, &fwd);
            spec yv = y;
            yv.v = fwd.cpu[0];
            spec dy = {y.nd, {0}, -1, 1, NULL, 0};
            memcpy(dy.shape, y.shape, sizeof dy.shape);
            dist_op g = {
                .code = DIST_OPC_REDUCE_GRAD, .k = k, .mask = masks[m], .nin = 3, .nout = 1};
            spec gin[3] = {x, yv, dy}, dx = {3, {4, 5, 6}, 0, 0, NULL, 0};
            check_op("reduce_grad", &g, gin, &dx);
            both_free(&fwd);
        }
        /* 3000 quarters per output: the block-per-output path, exact in any order */
        dist_op op = {.code = DIST_OPC_REDUCE, .k = k, .mask = 2, .nin = 1, .nout = 1};
        spec x = {2, {3, 3000}, -1, 1, NULL, 0.25f}, y = {2, {3, 1}, 0, 0, NULL, 0};
        check_op("reduce (long rows)", &op, &x, &y);
    }
}
END_TEST

START_TEST(test_transpose_slice_pad_concat_match_cpu) {
    dist_op t = {.code = DIST_OPC_TRANSPOSE, .nin = 1, .nout = 1, .v = {2, 0, 3, 1}};
    spec x4 = {4, {2, 3, 4, 5}, -1, 1, NULL, 0}, y4 = {4, {4, 2, 5, 3}, 0, 0, NULL, 0};
    check_op("transpose", &t, &x4, &y4);

    dist_op s = {.code = DIST_OPC_SLICE, .nin = 1, .nout = 1, .v = {1, 2, 3}};
    spec big = {3, {5, 6, 7}, -1, 1, NULL, 0}, box = {3, {3, 2, 4}, -1, 1, NULL, 0};
    check_op("slice", &s, &big, &box);
    dist_op p = {.code = DIST_OPC_PAD, .nin = 1, .nout = 1, .v = {1, 2, 3}};
    check_op("pad", &p, &box, &big);

    spec parts[3] = {{3, {2, 3, 4}, -1, 1, NULL, 0},
                     {3, {2, 1, 4}, -1, 1, NULL, 0},
                     {3, {2, 5, 4}, -1, 1, NULL, 0}};
    dist_op c = {.code = DIST_OPC_CONCAT, .axis = 1, .nin = 3, .nout = 1};
    spec out = {3, {2, 9, 4}, 0, 0, NULL, 0};
    check_op("concat (axis 1)", &c, parts, &out);
    spec rows[2] = {{2, {3, 4}, -1, 1, NULL, 0}, {2, {2, 4}, -1, 1, NULL, 0}};
    dist_op c0 = {.code = DIST_OPC_CONCAT, .axis = 0, .nin = 2, .nout = 1};
    spec out0 = {2, {5, 4}, 0, 0, NULL, 0};
    check_op("concat (axis 0)", &c0, rows, &out0);
    spec cols[2] = {{2, {3, 4}, -1, 1, NULL, 0}, {2, {3, 2}, -1, 1, NULL, 0}};
    dist_op c1 = {.code = DIST_OPC_CONCAT, .axis = 1, .nin = 2, .nout = 1};
    spec out1 = {2, {3, 6}, 0, 0, NULL, 0};
    check_op("concat (last axis)", &c1, cols, &out1);
}
END_TEST

/* ---- pooling ------------------------------------------------------------------------------ */

START_TEST(test_avg_pool_same_and_valid_and_gradient_match_cpu) {
    /* SAME, 3x2 window, stride 2: pads top 1, bottom 1, left 0, right 1 */
    dist_op same = {.code = DIST_OPC_AVG_POOL2D, .nin = 1, .nout = 1};
    same.pool.window_h = 3, same.pool.window_w = 2, same.pool.stride_h = 2, same.pool.stride_w = 2;
    same.pool.pad_top = 1, same.pool.pad_bottom = 1, same.pool.pad_left = 0,
    same.pool.pad_right = 1;
    spec x = {4, {2, 7, 9, 3}, -1, 1, NULL, 0}, y = {4, {2, 4, 5, 3}, -1, 1, NULL, 0};
    check_op("avg_pool2d (same)", &same, &x, &y);
    dist_op gs = same;
    gs.code = DIST_OPC_AVG_POOL2D_GRAD;
    check_op("avg_pool2d grad (same)", &gs, &y, &x);

    /* VALID, 2x2 window, stride 1: overlapping windows */
    dist_op valid = {.code = DIST_OPC_AVG_POOL2D, .nin = 1, .nout = 1};
    valid.pool.window_h = valid.pool.window_w = 2, valid.pool.stride_h = valid.pool.stride_w = 1;
    spec x2 = {4, {3, 5, 6, 2}, -1, 1, NULL, 0}, y2 = {4, {3, 4, 5, 2}, -1, 1, NULL, 0};
    check_op("avg_pool2d (valid)", &valid, &x2, &y2);
    dist_op gv = valid;
    gv.code = DIST_OPC_AVG_POOL2D_GRAD;
    check_op("avg_pool2d grad (valid)", &gv, &y2, &x2);
}
END_TEST

/* ---- softmax and losses ------------------------------------------------------------------- */

START_TEST(test_softmax_log_softmax_and_gradients_match_cpu) {
    const int64_t widths[] = {10, 70, 1};
    for (int k = 0; k < 2; k++) {
        for (size_t w = 0; w < 3; w++) {
            spec x = {2, {6, widths[w]}, -5, 5, NULL, 0}, y = {2, {6, widths[w]}, 0, 0, NULL, 0};
            dist_op op = {.code = DIST_OPC_SOFTMAX, .k = k, .nin = 1, .nout = 1};
            both fwd = run_both(&op, &x, &y);
            expect_close("softmax", &op, &fwd);
            spec yv = y, dy = {2, {6, widths[w]}, -1, 1, NULL, 0};
            yv.v = fwd.cpu[0];
            dist_op g = {.code = DIST_OPC_SOFTMAX_GRAD, .k = k, .nin = 2, .nout = 1};
            spec gin[2] = {yv, dy};
            check_op("softmax_grad", &g, gin, &y);
            both_free(&fwd);
        }
    }
}
END_TEST

START_TEST(test_sigmoid_xent_and_mse_with_gradients_match_cpu) {
    spec z = {2, {8, 5}, 0, 1, NULL, 0}, x = {2, {8, 5}, -6, 6, NULL, 0},
         l = {2, {8, 5}, 0, 0, NULL, 0};
    dist_op f = {.code = DIST_OPC_SIGMOID_XENT, .nin = 2, .nout = 1};
    spec fin[2] = {z, x};
    check_op("sigmoid_xent", &f, fin, &l);
    dist_op g = {.code = DIST_OPC_SIGMOID_XENT_GRAD, .nin = 3, .nout = 2};
    spec gin[3] = {z, x, {2, {8, 5}, -1, 1, NULL, 0}}, gout[2] = {l, l}, dx_only[2] = {NONE, l};
    check_op("sigmoid_xent_grad", &g, gin, gout);
    check_op("sigmoid_xent_grad (dx only)", &g, gin, dx_only);

    spec t = {3, {4, 3, 7}, -1, 1, NULL, 0}, p = {3, {4, 3, 7}, -1, 1, NULL, 0},
         loss = {2, {4, 3}, 0, 0, NULL, 0};
    dist_op m = {.code = DIST_OPC_MSE, .nin = 2, .nout = 1};
    spec min_[2] = {t, p};
    check_op("mse", &m, min_, &loss);
    dist_op mg = {.code = DIST_OPC_MSE_GRAD, .nin = 3, .nout = 2};
    spec mgin[3] = {t, p, {2, {4, 3}, -1, 1, NULL, 0}}, mgout[2] = {t, p};
    check_op("mse_grad", &mg, mgin, mgout);
}
END_TEST

/* ---- batch normalization ------------------------------------------------------------------- */

START_TEST(test_batch_norm_family_matches_cpu) {
    const float eps = 1e-3f;
    /* rows 40, C 3; rows 600, C 4 (strided block sums) */
    const spec xs[2] = {{3, {8, 5, 3}, -2, 3, NULL, 0}, {2, {600, 4}, -2, 3, NULL, 0}};
    for (int c = 0; c < 2; c++) {
        spec x = xs[c];
        int64_t ch = x.shape[x.nd - 1];
        spec stats = {2, {4, ch}, 0, 0, NULL, 0}, sums = {2, {2, ch}, 0, 0, NULL, 0};
        dist_op local = {
            .code = DIST_OPC_BN_STATS, .k = DIST_BN_LOCAL, .nin = 1, .nout = 1, .f = {eps, 0}};
        both st = run_both(&local, &x, &stats);
        expect_close("bn_stats (local)", &local, &st);
        dist_op sm = {.code = DIST_OPC_BN_STATS, .k = DIST_BN_SUMS, .nin = 1, .nout = 1};
        check_op("bn_stats (sums)", &sm, &x, &sums);

        spec sv = stats, gamma = {1, {ch}, 0.5f, 1.5f, NULL, 0}, beta = {1, {ch}, -1, 1, NULL, 0};
        sv.v = st.cpu[0];
        dist_op ap = {.code = DIST_OPC_BN_APPLY, .nin = 4, .nout = 1};
        spec apin[4] = {x, sv, gamma, beta}, apin_plain[4] = {x, sv, NONE, NONE};
        check_op("bn_apply", &ap, apin, &x);
        check_op("bn_apply (no gamma, beta)", &ap, apin_plain, &x);
        /* a fused ReLU: the apply's output, which then masks dy in the gradient ops below */
        dist_op apr = ap;
        apr.relu = 1;
        both yr = run_both(&apr, apin, &x);
        expect_close("bn_apply (relu)", &apr, &yr);
        spec yv = x;
        yv.v = yr.cpu[0];

        /* the backward of each mode: the sums (both outputs, or one), then dx from them */
        spec dy = x, count = {0, {0}, 0, 0, NULL, 0};
        dy.lo = -1, dy.hi = 1;
        float rows = (float)(spec_numel(&x) / ch);
        count.v = &rows;
        const int modes[] = {DIST_BN_INFERENCE, DIST_BN_LOCAL, DIST_BN_SYNC};
        for (int m = 0; m < 3; m++) {
            for (int g = 0; g < 2; g++) {
                spec gm = g ? gamma : NONE;
                dist_op gs = {.code = DIST_OPC_BN_GRAD_SUMS, .k = modes[m], .nin = 5, .nout = 2};
                spec gsin[5] = {x, dy, sv, gm, count}, gsout[2] = {sums, sums};
                both gsum = run_both(&gs, gsin, gsout);
                expect_close("bn_grad_sums", &gs, &gsum);
                spec params_only[2] = {sums, NONE}, input_only[2] = {NONE, sums};
                check_op("bn_grad_sums (parameters only)", &gs, gsin, params_only);
                check_op("bn_grad_sums (input terms only)", &gs, gsin, input_only);

                spec terms = sums;
                terms.v = gsum.cpu[1];
                dist_op gi = {.code = DIST_OPC_BN_GRAD_INPUT, .k = modes[m], .nin = 6, .nout = 1};
                spec giin[6] = {x, dy, sv, gm, terms, NONE};
                check_op("bn_grad_input", &gi, giin, &x);

                dist_op gsr = gs, gir = gi;
                gsr.relu = gir.relu = 1;
                gsr.nin = 6, gir.nin = 7;
                spec gsrin[6] = {x, dy, sv, gm, count, yv};
                check_op("bn_grad_sums (relu)", &gsr, gsrin, gsout);
                spec girin[7] = {x, dy, sv, gm, terms, NONE, yv};
                check_op("bn_grad_input (relu)", &gir, girin, &x);
                both_free(&gsum);
            }
        }
        both_free(&yr);
        both_free(&st);
    }
    /* moments from all-reduced sums; channel 2's E[x^2] < mean^2 (clamped) */
    const float sv[6] = {4.0f, -2.0f, 10.0f, 3.0f, 5.0f, 1.0f}, n = 10.0f;
    spec sums = {2, {2, 3}, 0, 0, sv, 0}, count = {0, {0}, 0, 0, &n, 0},
         stats = {2, {4, 3}, 0, 0, NULL, 0};
    dist_op mo = {.code = DIST_OPC_BN_MOMENTS, .nin = 2, .nout = 1, .f = {eps, 0}};
    spec moin[2] = {sums, count};
    both r = run_both(&mo, moin, &stats);
    expect_close("bn_moments", &mo, &r);
    ck_assert_msg(r.gpu[0][3 * 3 + 2] == 1.0f, "bn_moments: channel 2 is not marked clamped");
    both_free(&r);
    dist_op is = {.code = DIST_OPC_BN_INFER_STATS, .nin = 2, .nout = 1, .f = {eps, 0}};
    spec isin[2] = {{1, {5}, -1, 1, NULL, 0}, {1, {5}, 0.1f, 2, NULL, 0}},
         isout = {2, {4, 5}, 0, 0, NULL, 0};
    check_op("bn_infer_stats", &is, isin, &isout);
}
END_TEST

/* LayerNormalization: C 3 (inside one lane set), 17 and 128 (across the 16 lanes), 200 rows
 * (across the 64-row blocks of gamma's and beta's sums); with and without gamma and beta, and
 * the gradient's outputs one at a time */
START_TEST(test_layer_norm_and_its_gradient_match_cpu) {
    const int64_t widths[3] = {3, 17, 128};
    for (int w = 0; w < 3; w++) {
        const int64_t c = widths[w];
        spec x = {3, {8, 25, c}, -2, 3, NULL, 0}, dy = {3, {8, 25, c}, -1, 1, NULL, 0};
        spec gamma = {1, {c}, 0.5f, 1.5f, NULL, 0}, beta = {1, {c}, -1, 1, NULL, 0};
        spec stats = {2, {200, 2}, 0, 0, NULL, 0}, param = {1, {c}, 0, 0, NULL, 0};
        dist_op fwd = {.code = DIST_OPC_LAYER_NORM, .nin = 3, .nout = 2, .f = {1e-3f, 0}};
        spec fin[3] = {x, gamma, beta}, fin_plain[3] = {x, NONE, NONE}, fout[2] = {x, stats};
        check_op("layer_norm (no gamma, beta)", &fwd, fin_plain, fout);
        both f = run_both(&fwd, fin, fout);
        expect_close("layer_norm", &fwd, &f);
        spec sv = stats;
        sv.v = f.cpu[1];
        dist_op bwd = {.code = DIST_OPC_LAYER_NORM_GRAD, .nin = 4, .nout = 3};
        spec bin[4] = {x, dy, sv, gamma}, bin_plain[4] = {x, dy, sv, NONE};
        spec all[3] = {x, param, param}, dx_only[3] = {x, NONE, NONE},
             params_only[3] = {NONE, param, param};
        /* x and dy are drawn again for each call: the statistics are x's only in the first */
        check_op("layer_norm_grad", &bwd, bin, all);
        check_op("layer_norm_grad (no gamma)", &bwd, bin_plain, all);
        check_op("layer_norm_grad (dx only)", &bwd, bin, dx_only);
        check_op("layer_norm_grad (dgamma, dbeta only)", &bwd, bin, params_only);
        both_free(&f);
    }
}
END_TEST

/* ---- dropout, whole-tensor ---------------------------------------------------------------- */

START_TEST(test_dropout_mask_bits_equal_cpu_and_the_hash) {
    const float rates[] = {0.3f, 0.0f, 0.9f};
    for (int r = 0; r < 3; r++) {
        dist_op op = {.code = DIST_OPC_DROPOUT_MASK,
                      .nin = 0,
                      .nout = 1,
                      .f = {rates[r], 0},
                      .u = {0x1234u, 0xdeadbeefu, 7u + (uint32_t)r, 3u}};
        spec mask = {2, {33, 31}, 0, 0, NULL, 0};
        both m = run_both(&op, NULL, &mask);
        ck_assert_msg(memcmp(m.cpu[0], m.gpu[0], (size_t)m.n[0] * sizeof(float)) == 0,
                      "dropout (rate %g): the GPU mask differs from the CPU's", (double)rates[r]);
        const float scale = 1.0f / (1.0f - rates[r]);
        for (int64_t i = 0; i < m.n[0]; i++) {
            float u = (float)(dist_op_hash32(op.u, (uint32_t)i) >> 8) * 0x1p-24f;
            float want = u >= rates[r] ? scale : 0.0f;
            ck_assert_msg(memcmp(&want, &m.gpu[0][i], sizeof want) == 0,
                          "dropout (rate %g): element %lld is %g, the hash says %g",
                          (double)rates[r], (long long)i, (double)m.gpu[0][i], (double)want);
        }
        both_free(&m);
    }
}
END_TEST

START_TEST(test_sum_squares_and_clipping_match_cpu) {
    dist_op ss = {.code = DIST_OPC_SUM_SQUARES, .nin = 1, .nout = 1};
    spec x = {2, {37, 29}, -2, 2, NULL, 0}, scalar = {0, {0}, 0, 0, NULL, 0};
    check_op("sum_squares", &ss, &x, &scalar);
    spec big = {1, {100000}, -1, 1, NULL, 0};
    check_op("sum_squares (100000)", &ss, &big, &scalar);

    dist_op cv = {.code = DIST_OPC_CLIP_VALUE, .nin = 1, .nout = 1, .f = {-0.5f, 0.75f}};
    check_op("clip_by_value", &cv, &x, &x);
    const float odd[4] = {NAN, INFINITY, -INFINITY, 0.5f};
    spec oddx = {1, {4}, 0, 0, odd, 0};
    both r = run_both(&cv, &oddx, &oddx);
    expect_close("clip_by_value (NaN, inf)", &cv, &r);
    ck_assert_msg(isnan(r.gpu[0][0]), "clip_by_value: a NaN became %g", (double)r.gpu[0][0]);
    both_free(&r);

    /* summed squares that clip, that do not, zero, inf and NaN */
    const float sq[] = {400.0f, 0.25f, 0.0f, INFINITY, NAN};
    for (int i = 0; i < 5; i++) {
        dist_op cn = {.code = DIST_OPC_CLIP_BY_NORM, .nin = 2, .nout = 1, .f = {2.0f, 0}};
        spec s = {0, {0}, 0, 0, &sq[i], 0};
        spec in[2] = {x, s};
        check_op("clip_by_norm", &cn, in, &x);
    }
}
END_TEST

START_TEST(test_loss_scale_ops_match_cpu) {
    /* the finite test on a large tensor (many blocks) with one Inf or NaN anywhere, or none */
    dist_op af = {.code = DIST_OPC_ALL_FINITE, .nin = 1, .nout = 1};
    spec scalar = {0, {0}, 0, 0, NULL, 0};
    static float big[70001];
    const float bad[3] = {1.0f, INFINITY, NAN};
    for (int i = 0; i < 3; i++) {
        for (int j = 0; j < 70001; j++) big[j] = (float)(j % 17) - 8.0f;
        big[69999] = bad[i] * (i ? 1.0f : big[69999]);
        spec x = {1, {70001}, 0, 0, big, 0};
        both r = run_both(&af, &x, &scalar);
        expect_close("all_finite", &af, &r);
        ck_assert_msg(r.gpu[0][0] == (i ? 0.0f : 1.0f), "all_finite: %g", (double)r.gpu[0][0]);
        both_free(&r);
    }
    /* select: the branch not chosen holds an Inf and a NaN */
    dist_op sel = {.code = DIST_OPC_SELECT, .nin = 3, .nout = 1};
    static float a[64], b[64];
    for (int c = 0; c < 2; c++) {
        for (int j = 0; j < 64; j++) a[j] = (float)j, b[j] = -(float)j;
        (c ? b : a)[3] = INFINITY, (c ? b : a)[5] = NAN;
        const float cond = (float)c;
        spec in[3] = {{0, {0}, 0, 0, &cond, 0}, {1, {64}, 0, 0, a, 0}, {1, {64}, 0, 0, b, 0}};
        spec y = {1, {64}, 0, 0, NULL, 0};
        both r = run_both(&sel, in, &y);
        expect_close("select", &sel, &r);
        for (int j = 0; j < 64; j++) ck_assert(isfinite(r.gpu[0][j]));
        both_free(&r);
    }
    dist_op sc = {.code = DIST_OPC_SCALE, .nin = 1, .nout = 1, .f = {65536.0f, 0}};
    spec x = {2, {37, 29}, -2, 2, NULL, 0};
    check_op("scale", &sc, &x, &x);
}
END_TEST

/* Attention's shapes: [2, 4] batches of [16, 8] @ [8, 16] (scores) with every transpose flag
 * and every operand stored with its heads inside ([2, 16, 4, 8] read as [2, 4, 16, 8]), on
 * cuBLAS's strided-batched GEMM against the CPU's oneDNN product */
START_TEST(test_batch_matmul_matches_cpu) {
    for (int k = 0; k < 32; k++) {
        const int ta = k & 1, tb = k >> 1 & 1, ia = k >> 2 & 1, ib = k >> 3 & 1, ic = k >> 4 & 1;
        const int64_t ar = ta ? 8 : 16, ac = ta ? 16 : 8, br = tb ? 16 : 8, bc = tb ? 8 : 16;
        dist_op op = {.code = DIST_OPC_BATCH_MATMUL, .k = k, .nin = 2, .nout = 1};
        spec in[2] = {{4, {2, ia ? ar : 4, ia ? 4 : ar, ac}, -1, 1, NULL, 0},
                      {4, {2, ib ? br : 4, ib ? 4 : br, bc}, -1, 1, NULL, 0}};
        spec y = {4, {2, ic ? 16 : 4, ic ? 4 : 16, 16}, 0, 0, NULL, 0};
        check_op("batch_matmul", &op, in, &y);
    }
}
END_TEST

/* ---- the embedding lookup ---------------------------------------------------------------- */

/* One tensor of dtype dt with the bytes of v on backend be. */
static dist_tensor *typed_on(dist_backend *be, dist_dtype dt, int nd, const int64_t *shape,
                             const void *v) {
    dist_tensor *t = NULL;
    ck_assert_msg(dist_backend_alloc_tensor(be, dt, nd, shape, &t) == DIST_OK, "alloc: %s",
                  dist_last_error());
    if (v)
        ck_assert_msg(dist_backend_from_host(be, v, dist_tensor_bytes(t), t) == DIST_OK,
                      "upload: %s", dist_last_error());
    return t;
}

/* Gather rows of a [500, 48] table by 3000 ids (many repeats, some outside [0, 500)) and
 * scatter-add dy back: the GPU gives the CPU's bits, the gradient's repeated rows included
 * (the ids' order is fixed by ops.h). */
START_TEST(test_gather_and_its_gradient_give_the_cpu_bits) {
    enum { V = 500, D = 48, N = 3000 };
    static float table[V * D], dy[N * D], yc[N * D], yg[N * D], gc[V * D], gg[V * D];
    static int32_t ids[N];
    for (int i = 0; i < V * D; i++) table[i] = dist_test_uniform(&g_rng, -1, 1);
    for (int i = 0; i < N * D; i++) dy[i] = dist_test_uniform(&g_rng, -1, 1);
    for (int i = 0; i < N; i++) ids[i] = (int32_t)dist_test_uniform(&g_rng, -5, V + 5);
    const int64_t ts[2] = {V, D}, is[1] = {N}, ys[2] = {N, D};
    dist_backend *be[2] = {g_cpu, g_gpu};
    float *ys_out[2] = {yc, yg}, *gs_out[2] = {gc, gg};
    for (int b = 0; b < 2; b++) {
        dist_tensor *t = typed_on(be[b], DIST_F32, 2, ts, table);
        dist_tensor *i = typed_on(be[b], DIST_I32, 1, is, ids);
        dist_tensor *y = typed_on(be[b], DIST_F32, 2, ys, NULL);
        dist_tensor *d = typed_on(be[b], DIST_F32, 2, ys, dy);
        dist_tensor *g = typed_on(be[b], DIST_F32, 2, ts, NULL);
        dist_op op = {.code = DIST_OPC_GATHER, .nin = 2, .nout = 1};
        const dist_tensor *in[2] = {t, i};
        ck_assert_msg(dist_backend_run_op(be[b], &op, in, &y) == DIST_OK, "%s", dist_last_error());
        dist_op gop = {.code = DIST_OPC_GATHER_GRAD, .nin = 2, .nout = 1};
        const dist_tensor *gin[2] = {i, d};
        ck_assert_msg(dist_backend_run_op(be[b], &gop, gin, &g) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_int_eq(dist_backend_to_host(be[b], y, ys_out[b], sizeof yc), DIST_OK);
        ck_assert_int_eq(dist_backend_to_host(be[b], g, gs_out[b], sizeof gc), DIST_OK);
        dist_backend_free_tensor(be[b], t), dist_backend_free_tensor(be[b], i);
        dist_backend_free_tensor(be[b], y), dist_backend_free_tensor(be[b], d);
        dist_backend_free_tensor(be[b], g);
    }
    ck_assert(memcmp(yc, yg, sizeof yc) == 0);
    ck_assert(memcmp(gc, gg, sizeof gc) == 0);
}
END_TEST

/* ---- step graphs ----------------------------------------------------------------------------- */

enum { G_X, G_B, G_U, G_DA, G_DB, G_R, G_DX, G_S, G_ST, G_M, G_COUNT };

/* The ops of one step on fixed tensors (t), in one order: what a graph replays. */
static void graph_step_ops(dist_tensor **t) {
    const dist_op ops[] = {
        {.code = DIST_OPC_UNARY, .k = DIST_UN_GELU, .nin = 1, .nout = 1},
        {.code = DIST_OPC_BINARY_GRAD, .k = DIST_BIN_MUL, .nin = 3, .nout = 2},
        {.code = DIST_OPC_REDUCE, .k = DIST_RED_MAX, .mask = 1, .nin = 1, .nout = 1},
        {.code = DIST_OPC_REDUCE_GRAD, .k = DIST_RED_MAX, .mask = 1, .nin = 3, .nout = 1},
        {.code = DIST_OPC_SOFTMAX, .nin = 1, .nout = 1},
        {.code = DIST_OPC_BN_STATS, .k = DIST_BN_LOCAL, .nin = 1, .nout = 1, .f = {1e-3f, 0}},
        {.code = DIST_OPC_DROPOUT_MASK, .nout = 1, .f = {0.25f, 0}, .u = {1, 2, 3, 4}},
    };
    const dist_tensor *in[][3] = {
        {t[G_X]}, {t[G_X], t[G_B], t[G_X]}, {t[G_X]}, {t[G_X], t[G_R], t[G_B]}, {t[G_X]}, {t[G_X]},
        {NULL}};
    dist_tensor *out[][2] = {{t[G_U]}, {t[G_DA], t[G_DB]}, {t[G_R]}, {t[G_DX]},
                             {t[G_S]}, {t[G_ST]},          {t[G_M]}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        dist_status st = dist_backend_run_op(g_gpu, &ops[i], in[i], out[i]);
        ck_assert_msg(st == DIST_OK, "%s: %s", dist_op_name(&ops[i]), dist_last_error());
    }
}

START_TEST(test_ops_replayed_from_a_step_graph_give_the_eager_bits) {
    /* [2400, 8]: db sums 2400 rows per output (the block-per-output path); b [1, 8] is also
     * the reduce_max gradient's dy */
    enum { R = 2400, C = 8 };
    const int64_t shapes[G_COUNT][2] = {{R, C}, {1, C}, {R, C}, {R, C}, {1, C},
                                        {1, C}, {R, C}, {R, C}, {4, C}, {R, C}};
    dist_tensor *t[G_COUNT];
    for (int i = 0; i < G_COUNT; i++) {
        spec s = {2, {shapes[i][0], shapes[i][1]}, 0, 0, NULL, 0};
        t[i] = alloc_on(g_gpu, &s);
    }
    float *xv = malloc(R * C * sizeof *xv), bv[C];
    for (int i = 0; i < R * C; i++) xv[i] = 0.25f * (float)((int)dist_test_uniform(&g_rng, -8, 8));
    for (int i = 0; i < C; i++) bv[i] = dist_test_uniform(&g_rng, -1, 1);
    upload(g_gpu, t[G_X], xv);
    upload(g_gpu, t[G_B], bv);
    graph_step_ops(t); /* eager: outside a step */
    float *eager[G_COUNT] = {0};
    for (int i = G_U; i < G_COUNT; i++) eager[i] = download(g_gpu, t[i]);
    dist_backend *be = g_gpu;
    for (int rep = 0; rep < 4; rep++) {
        for (int i = G_U; i < G_COUNT; i++) {
            float *nan = malloc(dist_tensor_bytes(t[i]));
            memset(nan, 0xff, dist_tensor_bytes(t[i]));
            upload(g_gpu, t[i], nan);
            free(nan);
        }
        ck_assert_msg(be->iface->step_begin(be->ctx) == DIST_OK, "step_begin: %s",
                      dist_last_error());
        graph_step_ops(t);
        ck_assert_msg(be->iface->step_end(be->ctx) == DIST_OK, "step_end: %s", dist_last_error());
        for (int i = G_U; i < G_COUNT; i++) {
            float *v = download(g_gpu, t[i]);
            ck_assert_msg(memcmp(v, eager[i], dist_tensor_bytes(t[i])) == 0,
                          "step %d: output %d differs from the eager run's", rep, i);
            free(v);
        }
    }
    dist_graph_stats gs;
    dist_backend_graph_stats(g_gpu, &gs);
    ck_assert_msg(gs.replayed >= 1,
                  "no step was replayed from a graph (captured %lld, failures %lld)",
                  (long long)gs.captured, (long long)gs.capture_failures);
    for (int i = 0; i < G_COUNT; i++) {
        free(eager[i]);
        dist_backend_free_tensor(g_gpu, t[i]);
    }
    free(xv);
}
END_TEST

/* ---- what the backend refuses -------------------------------------------------------------- */

START_TEST(test_every_opcode_is_supported_and_non_float32_is_refused_with_a_message) {
    for (int code = 1; code < DIST_OPC_COUNT; code++) {
        dist_op op = {.code = (dist_opcode)code, .nin = 1, .nout = 1};
        if (code == DIST_OPC_BN_STATS) op.k = DIST_BN_LOCAL;
        if (dist_op_is_fusion(code)) continue; /* the CPU's own */
        ck_assert_msg(dist_backend_supports_op(g_gpu, &op, NULL, NULL),
                      "the CUDA backend does not run %s (code %d)", dist_op_name(&op), code);
    }
    int64_t shape[1] = {4};
    dist_tensor *xi = NULL, *y = NULL;
    ck_assert(dist_backend_alloc_tensor(g_gpu, DIST_I32, 1, shape, &xi) == DIST_OK);
    ck_assert(dist_backend_alloc_tensor(g_gpu, DIST_F32, 1, shape, &y) == DIST_OK);
    dist_op op = {.code = DIST_OPC_UNARY, .k = DIST_UN_EXP, .nin = 1, .nout = 1};
    const dist_tensor *in[1] = {xi};
    dist_tensor *out[1] = {y};
    ck_assert(!dist_backend_supports_op(g_gpu, &op, in, out));
    dist_status st = dist_backend_run_op(g_gpu, &op, in, out);
    ck_assert_int_eq(st, DIST_UNSUPPORTED);
    ck_assert_msg(strstr(dist_last_error(), "exp") != NULL, "message '%s'", dist_last_error());
    dist_backend_free_tensor(g_gpu, xi);
    dist_backend_free_tensor(g_gpu, y);
}
END_TEST

static Suite *gpu_suite(void) {
    Suite *s = suite_create("cuda_ops");
    TCase *tc = tcase_create("ops");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_every_opcode_is_supported_and_non_float32_is_refused_with_a_message);
    tcase_add_test(tc, test_unary_and_its_gradient_match_cpu_for_every_kind);
    tcase_add_test(tc, test_binary_broadcasts_and_its_gradient_sums_like_cpu);
    tcase_add_test(tc, test_binary_with_a_fused_relu_matches_cpu_both_ways);
    tcase_add_test(tc, test_reduce_and_its_gradient_match_cpu_over_axis_masks);
    tcase_add_test(tc, test_transpose_slice_pad_concat_match_cpu);
    tcase_add_test(tc, test_avg_pool_same_and_valid_and_gradient_match_cpu);
    tcase_add_test(tc, test_softmax_log_softmax_and_gradients_match_cpu);
    tcase_add_test(tc, test_sigmoid_xent_and_mse_with_gradients_match_cpu);
    tcase_add_test(tc, test_batch_norm_family_matches_cpu);
    tcase_add_test(tc, test_layer_norm_and_its_gradient_match_cpu);
    tcase_add_test(tc, test_dropout_mask_bits_equal_cpu_and_the_hash);
    tcase_add_test(tc, test_sum_squares_and_clipping_match_cpu);
    tcase_add_test(tc, test_loss_scale_ops_match_cpu);
    tcase_add_test(tc, test_gather_and_its_gradient_give_the_cpu_bits);
    tcase_add_test(tc, test_batch_matmul_matches_cpu);
    tcase_add_test(tc, test_ops_replayed_from_a_step_graph_give_the_eager_bits);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) {
    setenv("CK_FORK", "no", 1); /* a CUDA context cannot cross fork() */
    if (dist_device_count(DIST_DEVICE_CUDA) == 0)
        return dist_test_skip_without_gpu(
            1, "test_cuda_ops: no CUDA device is visible to the op set's tests");
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    if (dist_backend_create(&o, &g_cpu) != DIST_OK) {
        fprintf(stderr, "CPU backend: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    o.device = (dist_device){DIST_DEVICE_CUDA, 0};
    if (dist_backend_create(&o, &g_gpu) != DIST_OK) {
        fprintf(stderr, "CUDA backend: %s\n", dist_last_error());
        dist_backend_destroy(g_cpu);
        return EXIT_FAILURE;
    }
    int rc = dist_test_run(gpu_suite());
    dist_backend_destroy(g_gpu);
    dist_backend_destroy(g_cpu);
    return rc;
}
