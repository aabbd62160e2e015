/* The op set on the CPU backend (cpu_ops.c), through dist_backend_run_op as the tape calls it:
 * every op of backend/ops.h but the four of cpu_ops_misc.c (test_cpu_ops_misc.c), on small
 * inputs whose results are worked out by hand in the comments (exact in float32), or, for the
 * transcendental ones, against the closed form in double; and the refusals: a backend without
 * run_op, and a tensor the CPU ops do not take, give DIST_UNSUPPORTED naming the op; a missing
 * input or output is DIST_INVALID_ARGUMENT naming the slot. */
#include "backend/backend.h"
#include "backend/cpu/cpu_vmath.h"
#include "backend/ops_dispatch.h"
#include "testutil.h"

#include <dist/dist.h>
#include <float.h>
#include <math.h>
#include <string.h>

static dist_backend *g_be;

static dist_tensor t1(float *data, int64_t n) { return dist_tensor_view(data, DIST_F32, 1, &n); }
static dist_tensor t2(float *data, int64_t r, int64_t c) {
    int64_t s[2] = {r, c};
    return dist_tensor_view(data, DIST_F32, 2, s);
}
static dist_tensor t4(float *data, int64_t n, int64_t h, int64_t w, int64_t c) {
    int64_t s[4] = {n, h, w, c};
    return dist_tensor_view(data, DIST_F32, 4, s);
}
static dist_tensor scalar(float *data) { return dist_tensor_view(data, DIST_F32, 0, NULL); }

static dist_op op_of(dist_opcode code, int k, int nin, int nout) {
    dist_op op;
    memset(&op, 0, sizeof op);
    op.code = code;
    op.k = k;
    op.nin = nin;
    op.nout = nout;
    return op;
}

/* Runs op with up to 6 inputs and 2 outputs (NULL-terminated lists are not used: counts). */
static dist_status run(const dist_op *op, const dist_tensor *i0, const dist_tensor *i1,
                       const dist_tensor *i2, const dist_tensor *i3, const dist_tensor *i4,
                       dist_tensor *o0, dist_tensor *o1) {
    const dist_tensor *in[6] = {i0, i1, i2, i3, i4, NULL};
    dist_tensor *out[2] = {o0, o1};
    return dist_backend_run_op(g_be, op, in, out);
}

static void expect(const float *got, const float *want, int n, double tol) {
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabs((double)got[i] - (double)want[i]) <= tol, "element %d: %.9g, want %.9g",
                      i, (double)got[i], (double)want[i]);
}

/* ---- elementwise ---------------------------------------------------------------------- */

START_TEST(test_unary_ops_give_their_functions) {
    float x[4] = {-1.0f, 0.0f, 0.5f, 2.0f}, y[4];
    dist_tensor tx = t1(x, 4), ty = t1(y, 4);
    struct {
        int k;
        float want[4];
    } exact[] = {{DIST_UN_NEG, {1, 0, -0.5f, -2}},
                 {DIST_UN_SQUARE, {1, 0, 0.25f, 4}},
                 {DIST_UN_ABS, {1, 0, 0.5f, 2}}};
    for (int c = 0; c < 3; c++) {
        dist_op op = op_of(DIST_OPC_UNARY, exact[c].k, 1, 1);
        ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
        expect(y, exact[c].want, 4, 0.0);
    }
    for (int k = DIST_UN_EXP; k <= DIST_UN_GELU_TANH; k++) { /* the Keras kinds: below */
        if (k == DIST_UN_SQUARE || k == DIST_UN_ABS) continue;
        float xs[4] = {0.25f, 0.5f, 1.0f, 2.0f}, want[4];
        dist_tensor txs = t1(xs, 4);
        for (int i = 0; i < 4; i++) {
            double v = xs[i];
            double f[DIST_UN_COUNT] = {
                [DIST_UN_EXP] = exp(v),
                [DIST_UN_LOG] = log(v),
                [DIST_UN_SQRT] = sqrt(v),
                [DIST_UN_SIGMOID] = 1.0 / (1.0 + exp(-v)),
                [DIST_UN_TANH] = tanh(v),
                [DIST_UN_GELU] = 0.5 * v * (1.0 + erf(v / sqrt(2.0))),
                [DIST_UN_GELU_TANH] =
                    0.5 * v * (1.0 + tanh(sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)))};
            want[i] = (float)f[k];
        }
        dist_op op = op_of(DIST_OPC_UNARY, k, 1, 1);
        ck_assert_int_eq(run(&op, &txs, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
        expect(y, want, 4, 1e-6);
    }
}
END_TEST

/* The Keras activations (ELU .. RELU_MAX): each value and gradient against the function and
 * its derivative in double (and central differences of the double function away from the
 * kinks), the float32 arithmetic of ops.h (TensorFlow's kernels) bit for bit, and the
 * conventions at the kinks: 0 for every kind, the cap for RELU_MAX with and without the
 * gradient there, -0, NaN, and softplus's two switch points. */
typedef struct keras_kind {
    int k;
    float f0, f1;
    const char *name;
} keras_kind;

static double keras_ref(const keras_kind *c, double x) {
    const double sa = 1.7580993408473768599402175208123, s = 1.0507009873554804934193349852946;
    switch (c->k) {
    case DIST_UN_ELU: return x > 0 ? x : c->f0 * expm1(x);
    case DIST_UN_SELU: return x < 0 ? sa * expm1(x) : s * x;
    case DIST_UN_SOFTPLUS: return x > 30 ? x : log1p(exp(x));
    case DIST_UN_SOFTSIGN: return x / (fabs(x) + 1);
    case DIST_UN_LEAKY_RELU: return x > 0 ? x : c->f0 * x;
    case DIST_UN_HARD_SIGMOID:
        return c->f0 ? fmin(fmax(0.2 * x + 0.5, 0), 1) : fmin(fmax(x + 3, 0), 6) / 6;
    default: return x > 0 ? (x < c->f0 ? x : c->f0) : 0;
    }
}

/* ops.h's float32 formulas, written out with the CPU's exp, logistic function and log1p
 * (cpu_vmath.h; TensorFlow's kernels' arithmetic around them) */
static float keras_f32(const keras_kind *c, float x) {
    const float sa = 1.7580993408473768599402175208123f, s = 1.0507009873554804934193349852946f;
    switch (c->k) {
    case DIST_UN_ELU: return x > 0 ? x : c->f0 * (x < 0 ? cpu_exp_neg_f32(x) - 1.0f : x);
    case DIST_UN_SELU: return x < 0 ? sa * (cpu_exp_neg_f32(x) - 1.0f) : s * x;
    case DIST_UN_SOFTPLUS: {
        const float t = logf(FLT_EPSILON) + 2.0f;
        if (x > -t) return x;
        if (x < t) return cpu_exp_neg_f32(x);
        return (x > 0 ? x : 0.0f) + cpu_log1p_unit_f32(cpu_exp_neg_f32(-fabsf(x)));
    }
    case DIST_UN_SOFTSIGN: return x / (fabsf(x) + 1.0f);
    case DIST_UN_LEAKY_RELU: return x > 0 ? x : x * c->f0;
    case DIST_UN_HARD_SIGMOID: {
        if (c->f0 == 0) {
            const float t = x + 3.0f;
            return (t != t ? t : (t > 0 ? (t < 6.0f ? t : 6.0f) : 0.0f)) / 6.0f;
        }
        const float z = x * 0.2f + 0.5f, m = z < 1.0f ? z : 1.0f;
        return z != z ? z : (m > 0 ? m : 0.0f);
    }
    default: return x != x ? x : (x > 0 ? (x < c->f0 ? x : c->f0) : 0.0f);
    }
}

static float keras_grad_f32(const keras_kind *c, float x, float y, float g) {
    const float sa = 1.7580993408473768599402175208123f, s = 1.0507009873554804934193349852946f;
    switch (c->k) {
    case DIST_UN_ELU: {
        float y0 = x < 0 ? cpu_exp_neg_f32(x) - 1.0f : x;
        float d = c->f0 == 1.0f ? g : x > 0 ? g + c->f0 * 0.0f : 0.0f + c->f0 * g;
        return y0 < 0 ? (y0 + 1.0f) * d : d;
    }
    case DIST_UN_SELU: return y < 0 ? g * (y + sa) : g * s;
    case DIST_UN_SOFTPLUS: return g * cpu_sigmoid_f32(x);
    case DIST_UN_SOFTSIGN: return g / ((fabsf(x) + 1.0f) * (fabsf(x) + 1.0f));
    case DIST_UN_LEAKY_RELU: return x > 0 ? g : g * c->f0;
    case DIST_UN_HARD_SIGMOID: {
        if (c->f0 == 0) return (g / 6.0f) * (x + 3.0f > 0 && x + 3.0f < 6.0f ? 1.0f : 0.0f);
        const float z = x * 0.2f + 0.5f, m = z < 1.0f ? z : 1.0f;
        return (m >= 0 ? (z <= 1.0f ? g : 0.0f) : 0.0f) * 0.2f;
    }
    default:
        if (c->f1 == 0) return g * (x > 0 && x < c->f0 ? 1.0f : 0.0f);
        return (x <= c->f0 ? g : 0.0f) * (x > 0 ? 1.0f : 0.0f);
    }
}

static int same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

START_TEST(test_keras_activations_match_tensorflow_formulas_and_derivatives) {
    const keras_kind kinds[] = {{DIST_UN_ELU, 1.0f, 0, "elu"},
                                {DIST_UN_ELU, 0.5f, 0, "elu alpha 0.5"},
                                {DIST_UN_SELU, 0, 0, "selu"},
                                {DIST_UN_SOFTPLUS, 0, 0, "softplus"},
                                {DIST_UN_SOFTSIGN, 0, 0, "softsign"},
                                {DIST_UN_LEAKY_RELU, 0.3f, 0, "leaky_relu"},
                                {DIST_UN_LEAKY_RELU, -1.5f, 0, "leaky_relu alpha -1.5"},
                                {DIST_UN_RELU_MAX, 6.0f, 0, "relu6"},
                                {DIST_UN_RELU_MAX, 2.5f, 1, "relu max 2.5"},
                                {DIST_UN_HARD_SIGMOID, 0, 0, "hard_sigmoid"},
                                {DIST_UN_HARD_SIGMOID, 1.0f, 0, "hard_sigmoid tf_keras"}};
    enum { N = 64 };
    float x[N], y[N], dy[N], dx[N];
    int n = 0;
    for (int i = 0; i < 40; i++) x[n++] = -9.75f + 0.5f * (float)i; /* -9.75 .. 9.75 */
    const float t = logf(FLT_EPSILON) + 2.0f;
    const float special[] = {0.0f,  -0.0f,  6.0f,   2.5f,    t,     -t,      nextafterf(t, 0),
                             30.0f, -30.0f, 1e-10f, -1e-10f, 80.0f, -100.0f, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = special[i];
    for (int i = 0; i < n; i++) dy[i] = 0.5f + 0.25f * (float)(i % 5);
    dist_tensor tx = t1(x, n), ty = t1(y, n), tdy = t1(dy, n), tdx = t1(dx, n);
    for (size_t c = 0; c < sizeof kinds / sizeof kinds[0]; c++) {
        const keras_kind *kc = &kinds[c];
        dist_op op = op_of(DIST_OPC_UNARY, kc->k, 1, 1),
                g = op_of(DIST_OPC_UNARY_GRAD, kc->k, 3, 1);
        op.f[0] = g.f[0] = kc->f0;
        op.f[1] = g.f[1] = kc->f1;
        ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
        ck_assert_int_eq(run(&g, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
        for (int i = 0; i < n; i++) {
            const float xi = x[i];
            /* ops.h's arithmetic, bit for bit */
            ck_assert_msg(same_bits(y[i], keras_f32(kc, xi)), "%s(%g) = %.9g, want %.9g", kc->name,
                          (double)xi, (double)y[i], (double)keras_f32(kc, xi));
            const float gw = keras_grad_f32(kc, xi, y[i], dy[i]);
            ck_assert_msg(same_bits(dx[i], gw), "%s'(%g) dy = %.9g, want %.9g", kc->name,
                          (double)xi, (double)dx[i], (double)gw);
            if (xi != xi) {
                ck_assert_msg(y[i] != y[i], "%s(NaN) = %g", kc->name, (double)y[i]);
                continue;
            }
            /* the function in double */
            double r = keras_ref(kc, xi);
            ck_assert_msg(fabs(y[i] - r) <= 2e-7 * fmax(1.0, fabs(r)), "%s(%g) = %.9g, double %.9g",
                          kc->name, (double)xi, (double)y[i], r);
            /* the derivative: central differences of the double function where it is smooth */
            const double h = 1e-4;
            const double hs_kink = kc->f0 ? 2.5 : 3.0; /* hard_sigmoid's, at +-that */
            int kink = fabs(xi) < 2 * h ||
                       (kc->k == DIST_UN_RELU_MAX && fabs(xi - kc->f0) < 2 * h) ||
                       (kc->k == DIST_UN_HARD_SIGMOID && fabs(fabs(xi) - hs_kink) < 2 * h);
            if (!kink && fabs(xi) < 50) {
                double d = (keras_ref(kc, xi + h) - keras_ref(kc, xi - h)) / (2 * h);
                ck_assert_msg(fabs(dx[i] - d * dy[i]) <= 2e-5 * fmax(1.0, fabs(d * dy[i])),
                              "%s'(%g) dy = %.9g, differences %.9g", kc->name, (double)xi,
                              (double)dx[i], d * dy[i]);
            }
        }
    }
    /* the kinks by name: TensorFlow's gradients at 0 and at the cap */
    float kx[4] = {0.0f, 6.0f, 2.5f, -0.0f}, ky[4], kdy[4] = {1, 1, 1, 1}, kdx[4];
    dist_tensor tkx = t1(kx, 4), tky = t1(ky, 4), tkdy = t1(kdy, 4), tkdx = t1(kdx, 4);
    struct {
        int k;
        float f0, f1, want[4];
    } kinks[] = {{DIST_UN_ELU, 1.0f, 0, {1, 1, 1, 1}},       /* EluGrad: y0 = 0 is not < 0 */
                 {DIST_UN_ELU, 0.5f, 0, {0.5f, 1, 1, 0.5f}}, /* where(x > 0): alpha at 0 */
                 {DIST_UN_LEAKY_RELU, 0.3f, 0, {0.3f, 1, 1, 0.3f}},
                 {DIST_UN_RELU_MAX, 6.0f, 0, {0, 0, 1, 0}}, /* relu6: 0 < x < 6 */
                 {DIST_UN_RELU_MAX, 2.5f, 1, {0, 0, 1, 0}}, /* clip: 0 < x <= 2.5 */
                 {DIST_UN_RELU_MAX, 6.0f, 1, {0, 1, 1, 0}}};
    for (size_t c = 0; c < sizeof kinks / sizeof kinks[0]; c++) {
        dist_op op = op_of(DIST_OPC_UNARY, kinks[c].k, 1, 1),
                g = op_of(DIST_OPC_UNARY_GRAD, kinks[c].k, 3, 1);
        op.f[0] = g.f[0] = kinks[c].f0;
        op.f[1] = g.f[1] = kinks[c].f1;
        ck_assert_int_eq(run(&op, &tkx, NULL, NULL, NULL, NULL, &tky, NULL), DIST_OK);
        ck_assert_int_eq(run(&g, &tkx, &tky, &tkdy, NULL, NULL, &tkdx, NULL), DIST_OK);
        expect(kdx, kinks[c].want, 4, 0.0);
    }
    /* hard_sigmoid's kinks: Keras 3's relu6 excludes x + 3 = 0 and 6; tf_keras's clip includes
     * 0.2 x + 0.5 = 0 and 1 (x = -2.5 and 2.5, exact in float32) */
    float hx[4] = {-3.0f, 3.0f, -2.5f, 2.5f}, hy[4], hdy[4] = {1, 1, 1, 1}, hdx[4];
    dist_tensor thx = t1(hx, 4), thy = t1(hy, 4), thdy = t1(hdy, 4), thdx = t1(hdx, 4);
    for (int form = 0; form < 2; form++) {
        dist_op op = op_of(DIST_OPC_UNARY, DIST_UN_HARD_SIGMOID, 1, 1),
                g = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_HARD_SIGMOID, 3, 1);
        op.f[0] = g.f[0] = (float)form;
        ck_assert_int_eq(run(&op, &thx, NULL, NULL, NULL, NULL, &thy, NULL), DIST_OK);
        ck_assert_int_eq(run(&g, &thx, &thy, &thdy, NULL, NULL, &thdx, NULL), DIST_OK);
        if (form == 0) {
            expect(hy, (float[]){0, 1, 0.5f / 6.0f, 5.5f / 6.0f}, 4, 0.0);
            expect(hdx, (float[]){0, 0, 1.0f / 6.0f, 1.0f / 6.0f}, 4, 0.0);
        } else {
            expect(hy, (float[]){0, 1, 0, 1}, 4, 0.0);
            expect(hdx, (float[]){0, 0, 0.2f, 0.2f}, 4, 0.0);
        }
    }
    /* TensorFlow's masks are products: -0 or NaN where dy is negative or NaN, and the clip's
     * select gives +0 above the cap; ELU's where-gradient sums 0 + alpha dy (+0 for a -0) */
    float sx[4] = {-1.0f, 7.0f, 7.0f, 0.0f}, sdy[4] = {-1.0f, -1.0f, NAN, -0.0f}, sy[4], sdx[4];
    dist_tensor tsx = t1(sx, 4), tsy = t1(sy, 4), tsdy = t1(sdy, 4), tsdx = t1(sdx, 4);
    struct {
        int k;
        float f0, f1;
        int neg[4], nan[4];
    } signs[] = {{DIST_UN_RELU_MAX, 6.0f, 0, {1, 1, 0, 1}, {0, 0, 1, 0}}, /* relu6 */
                 {DIST_UN_RELU_MAX, 2.5f, 1, {1, 0, 0, 1}, {0, 0, 0, 0}}, /* relu, clip */
                 {DIST_UN_ELU, 0.5f, 0, {1, 0, 0, 0}, {0, 0, 1, 0}}};
    for (size_t c = 0; c < sizeof signs / sizeof signs[0]; c++) {
        dist_op op = op_of(DIST_OPC_UNARY, signs[c].k, 1, 1);
        dist_op g = op_of(DIST_OPC_UNARY_GRAD, signs[c].k, 3, 1);
        op.f[0] = g.f[0] = signs[c].f0;
        op.f[1] = g.f[1] = signs[c].f1;
        ck_assert_int_eq(run(&op, &tsx, NULL, NULL, NULL, NULL, &tsy, NULL), DIST_OK);
        ck_assert_int_eq(run(&g, &tsx, &tsy, &tsdy, NULL, NULL, &tsdx, NULL), DIST_OK);
        for (int i = 0; i < 4; i++) {
            if (signs[c].nan[i]) {
                ck_assert_msg(isnan(sdx[i]), "case %zu element %d: %g, want NaN", c, i,
                              (double)sdx[i]);
                continue;
            }
            if (signs[c].k == DIST_UN_ELU && i < 2) continue; /* not zeros: -0.18, -1 */
            ck_assert_msg(sdx[i] == 0.0f && !!signbit(sdx[i]) == signs[c].neg[i],
                          "case %zu element %d: %g (sign %d), want %s0", c, i, (double)sdx[i],
                          !!signbit(sdx[i]), signs[c].neg[i] ? "-" : "+");
        }
    }
}
END_TEST

/* DIST_UN_PIECEWISE (Keras 3's hard_tanh, soft_shrink, hard_shrink, sparse_sigmoid,
 * sparse_plus): ops.h's float32 arithmetic bit for bit (written out here as TensorFlow's
 * clip_by_value and where compose it), the function in double, central differences away from
 * the kinks, and the gradients at the kinks by name. */
static double piecewise_ref(int w, double t, double x) {
    switch (w) {
    case DIST_PW_HARD_TANH: return fmin(fmax(x, -1), 1);
    case DIST_PW_SOFT_SHRINK: return x > t ? x - t : x < -t ? x + t : 0;
    case DIST_PW_HARD_SHRINK: return fabs(x) > t ? x : 0;
    case DIST_PW_SPARSE_SIGMOID: return x <= -1 ? 0 : x >= 1 ? 1 : (x + 1) / 2;
    default: return x <= -1 ? 0 : x < 1 ? (x + 1) * (x + 1) / 4 : x;
    }
}

static float piecewise_f32(int w, float t, float x) {
    switch (w) {
    case DIST_PW_HARD_TANH: {
        const float m = fminf(x, 1.0f); /* tf.minimum(x, 1), then tf.maximum(m, -1) */
        return isnan(x) ? x : fmaxf(m, -1.0f);
    }
    case DIST_PW_SOFT_SHRINK: return x > t ? x - t : (x < -t ? x + t : 0.0f);
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? x : 0.0f;
    case DIST_PW_SPARSE_SIGMOID: return x <= -1.0f ? 0.0f : (x >= 1.0f ? 1.0f : 0.5f * (x + 1.0f));
    default: {
        const volatile float u = x + 1.0f, sq = u * u; /* tf.pow(u, 2) */
        return x <= -1.0f ? 0.0f : (x < 1.0f ? 0.25f * sq : x);
    }
    }
}

/* the gradients of TensorFlow's graph: each select passes dy or +0, two paths add */
static float piecewise_grad_f32(int w, float t, float x, float g) {
    switch (w) {
    case DIST_PW_HARD_TANH: {
        const float m = fminf(x, 1.0f);
        const float gm = m >= -1.0f ? g : 0.0f; /* the maximum's select */
        return x <= 1.0f ? gm : 0.0f;           /* the minimum's */
    }
    case DIST_PW_SOFT_SHRINK: {
        const float outer_else = x > t ? 0.0f : g, lo = x < -t ? outer_else : 0.0f;
        return (x > t ? g : 0.0f) + lo;
    }
    case DIST_PW_HARD_SHRINK: return fabsf(x) > t ? g : 0.0f;
    case DIST_PW_SPARSE_SIGMOID: {
        const float inner = x <= -1.0f ? 0.0f : g, mid = x >= 1.0f ? 0.0f : inner;
        return 0.5f * mid;
    }
    default: {
        const float inner = x <= -1.0f ? 0.0f : g;
        const float mid = x < 1.0f ? inner : 0.0f, own = x < 1.0f ? 0.0f : inner;
        const volatile float gp = 0.25f * mid, gu = (gp * 2.0f) * (x + 1.0f);
        return gu + own;
    }
    }
}

START_TEST(test_keras3_piecewise_activations_match_tensorflow) {
    const struct {
        int w;
        float t;
        const char *name;
    } forms[] = {{DIST_PW_HARD_TANH, 0, "hard_tanh"},
                 {DIST_PW_SOFT_SHRINK, 0.5f, "soft_shrink"},
                 {DIST_PW_SOFT_SHRINK, 1.25f, "soft_shrink 1.25"},
                 {DIST_PW_HARD_SHRINK, 0.5f, "hard_shrink"},
                 {DIST_PW_HARD_SHRINK, 1.25f, "hard_shrink 1.25"},
                 {DIST_PW_SPARSE_SIGMOID, 0, "sparse_sigmoid"},
                 {DIST_PW_SPARSE_PLUS, 0, "sparse_plus"}};
    enum { N = 96 };
    float x[N], y[N], dy[N], dx[N];
    int n = 0;
    for (int i = 0; i < 80; i++) x[n++] = -4.9375f + 0.125f * (float)i; /* -4.94 .. 4.94 */
    const float special[] = {0.0f,   -0.0f, 1.0f,   -1.0f,  0.5f,     -0.5f,     1.25f,
                             -1.25f, 0.75f, -0.75f, 1e-30f, INFINITY, -INFINITY, NAN};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = special[i];
    for (int i = 0; i < n; i++)
        dy[i] = (i % 7 == 3 ? -1.0f : 1.0f) * (0.5f + 0.25f * (float)(i % 5));
    dist_tensor tx = t1(x, n), ty = t1(y, n), tdy = t1(dy, n), tdx = t1(dx, n);
    for (size_t c = 0; c < sizeof forms / sizeof forms[0]; c++) {
        const int w = forms[c].w;
        const float t = forms[c].t;
        dist_op op = op_of(DIST_OPC_UNARY, DIST_UN_PIECEWISE, 1, 1),
                g = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_PIECEWISE, 3, 1);
        op.f[0] = g.f[0] = (float)w;
        op.f[1] = g.f[1] = t;
        {
            ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
            ck_assert_int_eq(run(&g, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
            for (int i = 0; i < n; i++) {
                const float xi = x[i], yw = piecewise_f32(w, t, xi);
                const float gw = piecewise_grad_f32(w, t, xi, dy[i]);
                ck_assert_msg(same_bits(y[i], yw), "%s(%g) = %.9g, want %.9g", forms[c].name,
                              (double)xi, (double)y[i], (double)yw);
                ck_assert_msg(same_bits(dx[i], gw), "%s'(%g) dy = %.9g, want %.9g", forms[c].name,
                              (double)xi, (double)dx[i], (double)gw);
                if (!isfinite(xi)) continue;
                const double r = piecewise_ref(w, t, xi);
                ck_assert_msg(fabs(y[i] - r) <= 1e-7 * fmax(1.0, fabs(r)),
                              "%s(%g) = %.9g, double %.9g", forms[c].name, (double)xi, (double)y[i],
                              r);
                const double h = 1e-4;
                const int kink = fabs(fabs(xi) - 1.0) < 2 * h || fabs(fabs(xi) - t) < 2 * h;
                if (!kink) {
                    double d =
                        (piecewise_ref(w, t, xi + h) - piecewise_ref(w, t, xi - h)) / (2 * h);
                    ck_assert_msg(fabs(dx[i] - d * dy[i]) <= 1e-6 * fmax(1.0, fabs(d * dy[i])),
                                  "%s'(%g) dy = %.9g, differences %.9g", forms[c].name, (double)xi,
                                  (double)dx[i], d * dy[i]);
                }
            }
        }
    }
    /* the kinks by name, dy = 1: clip_by_value passes both ends; a where's condition decides */
    float kx[6] = {-1.0f, 1.0f, -0.5f, 0.5f, 0.0f, NAN}, ky[6], kdy[6] = {1, 1, 1, 1, 1, 1}, kdx[6];
    dist_tensor tkx = t1(kx, 6), tky = t1(ky, 6), tkdy = t1(kdy, 6), tkdx = t1(kdx, 6);
    const struct {
        int w;
        float t, want_y[6], want_dx[6];
    } kinks[] = {{DIST_PW_HARD_TANH, 0, {-1, 1, -0.5f, 0.5f, 0, NAN}, {1, 1, 1, 1, 1, 0}},
                 {DIST_PW_SOFT_SHRINK, 0.5f, {-0.5f, 0.5f, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}},
                 {DIST_PW_HARD_SHRINK, 0.5f, {-1, 1, 0, 0, 0, 0}, {1, 1, 0, 0, 0, 0}},
                 {DIST_PW_SPARSE_SIGMOID,
                  0,
                  {0, 1, 0.25f, 0.75f, 0.5f, NAN},
                  {0, 0, 0.5f, 0.5f, 0.5f, 0.5f}},
                 {DIST_PW_SPARSE_PLUS,
                  0,
                  {0, 1, 0.0625f, 0.5625f, 0.25f, NAN},
                  {0, 1, 0.25f, 0.75f, 0.5f, NAN}}};
    for (size_t c = 0; c < sizeof kinks / sizeof kinks[0]; c++) {
        dist_op op = op_of(DIST_OPC_UNARY, DIST_UN_PIECEWISE, 1, 1),
                g = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_PIECEWISE, 3, 1);
        op.f[0] = g.f[0] = (float)kinks[c].w;
        op.f[1] = g.f[1] = kinks[c].t;
        ck_assert_int_eq(run(&op, &tkx, NULL, NULL, NULL, NULL, &tky, NULL), DIST_OK);
        ck_assert_int_eq(run(&g, &tkx, &tky, &tkdy, NULL, NULL, &tkdx, NULL), DIST_OK);
        for (int i = 0; i < 6; i++) {
            const float wy = kinks[c].want_y[i], wd = kinks[c].want_dx[i];
            ck_assert_msg(isnan(wy) ? isnan(ky[i]) : ky[i] == wy, "form %zu y(%g) = %g, want %g", c,
                          (double)kx[i], (double)ky[i], (double)wy);
            ck_assert_msg(isnan(wd) ? isnan(kdx[i]) : kdx[i] == wd, "form %zu dx(%g) = %g, want %g",
                          c, (double)kx[i], (double)kdx[i], (double)wd);
        }
    }
}
END_TEST

START_TEST(test_unary_gradients_read_x_or_y) {
    /* square: dy * 2x; exp: dy * y; abs: sign(x) dy, 0 at 0; sqrt: dy * 0.5 / y */
    float x[3] = {-1.0f, 0.0f, 3.0f}, y[3] = {1.0f, 2.0f, 4.0f}, dy[3] = {2.0f, 3.0f, 0.5f}, dx[3];
    dist_tensor tx = t1(x, 3), ty = t1(y, 3), tdy = t1(dy, 3), tdx = t1(dx, 3);
    struct {
        int k;
        float want[3];
    } c[] = {{DIST_UN_SQUARE, {-4, 0, 3}},
             {DIST_UN_EXP, {2, 6, 2}},
             {DIST_UN_ABS, {-2, 0, 0.5f}},
             {DIST_UN_SQRT, {1, 0.75f, 0.0625f}},
             {DIST_UN_NEG, {-2, -3, -0.5f}}};
    for (int i = 0; i < 5; i++) {
        dist_op op = op_of(DIST_OPC_UNARY_GRAD, c[i].k, 3, 1);
        ck_assert_int_eq(run(&op, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
        expect(dx, c[i].want, 3, 0.0);
    }
}
END_TEST

START_TEST(test_binary_ops_broadcast_numpy_style) {
    float a[6] = {1, 2, 3, 4, 5, 6}, row[3] = {10, 20, 30}, col[2] = {2, 4}, y[6];
    dist_tensor ta = t2(a, 2, 3), trow = t1(row, 3), tcol = t2(col, 2, 1), ty = t2(y, 2, 3);
    dist_op add = op_of(DIST_OPC_BINARY, DIST_BIN_ADD, 2, 1);
    ck_assert_int_eq(run(&add, &ta, &trow, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){11, 22, 33, 14, 25, 36}, 6, 0.0);
    dist_op div = op_of(DIST_OPC_BINARY, DIST_BIN_DIV, 2, 1);
    ck_assert_int_eq(run(&div, &ta, &tcol, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){0.5f, 1, 1.5f, 1, 1.25f, 1.5f}, 6, 0.0);
    dist_op sub = op_of(DIST_OPC_BINARY, DIST_BIN_SUB, 2, 1);
    ck_assert_int_eq(run(&sub, &trow, &ta, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){9, 18, 27, 6, 15, 24}, 6, 0.0);
    float p[3] = {1, 5, 3}, q[3] = {2, 5, 1}, m[3];
    dist_tensor tp = t1(p, 3), tq = t1(q, 3), tm = t1(m, 3);
    dist_op mx = op_of(DIST_OPC_BINARY, DIST_BIN_MAX, 2, 1), mn = mx;
    mn.k = DIST_BIN_MIN;
    ck_assert_int_eq(run(&mx, &tp, &tq, NULL, NULL, NULL, &tm, NULL), DIST_OK);
    expect(m, (float[]){2, 5, 3}, 3, 0.0);
    ck_assert_int_eq(run(&mn, &tp, &tq, NULL, NULL, NULL, &tm, NULL), DIST_OK);
    expect(m, (float[]){1, 5, 1}, 3, 0.0);
    /* a shape that does not broadcast to the output */
    float bad[2] = {0, 0};
    dist_tensor tbad = t1(bad, 2);
    ck_assert_int_eq(run(&add, &ta, &tbad, NULL, NULL, NULL, &ty, NULL), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_binary_gradients_sum_over_broadcast_axes) {
    /* y = a * row: da = dy * row, drow = column sums of dy * a */
    float a[6] = {1, 2, 3, 4, 5, 6}, row[3] = {10, 20, 30}, dy[6] = {1, 1, 1, 1, 1, 2};
    float da[6], drow[3];
    dist_tensor ta = t2(a, 2, 3), trow = t1(row, 3), tdy = t2(dy, 2, 3), tda = t2(da, 2, 3),
                tdrow = t1(drow, 3);
    dist_op mul = op_of(DIST_OPC_BINARY_GRAD, DIST_BIN_MUL, 3, 2);
    ck_assert_int_eq(run(&mul, &ta, &trow, &tdy, NULL, NULL, &tda, &tdrow), DIST_OK);
    expect(da, (float[]){10, 20, 30, 10, 20, 60}, 6, 0.0);
    expect(drow, (float[]){5, 7, 15}, 3, 0.0);
    /* only db asked for: da stays untouched */
    float keep[6] = {-7, -7, -7, -7, -7, -7};
    memcpy(da, keep, sizeof da);
    ck_assert_int_eq(run(&mul, &ta, &trow, &tdy, NULL, NULL, NULL, &tdrow), DIST_OK);
    expect(da, keep, 6, 0.0);
    /* maximum: a tie sends the gradient to a (TensorFlow's) */
    float p[2] = {1, 2}, q[2] = {1, 3}, g[2] = {4, 5}, dp[2], dq[2];
    dist_tensor tp = t1(p, 2), tq = t1(q, 2), tg = t1(g, 2), tdp = t1(dp, 2), tdq = t1(dq, 2);
    dist_op mx = op_of(DIST_OPC_BINARY_GRAD, DIST_BIN_MAX, 3, 2);
    ck_assert_int_eq(run(&mx, &tp, &tq, &tg, NULL, NULL, &tdp, &tdq), DIST_OK);
    expect(dp, (float[]){4, 0}, 2, 0.0);
    expect(dq, (float[]){0, 5}, 2, 0.0);
    /* div: da = dy / b, db = dy * (-a / b) / b */
    float n[1] = {3}, d[1] = {2}, one[1] = {1}, dn[1], dd[1];
    dist_tensor tn = t1(n, 1), td = t1(d, 1), tone = t1(one, 1), tdn = t1(dn, 1), tdd = t1(dd, 1);
    dist_op dv = op_of(DIST_OPC_BINARY_GRAD, DIST_BIN_DIV, 3, 2);
    ck_assert_int_eq(run(&dv, &tn, &td, &tone, NULL, NULL, &tdn, &tdd), DIST_OK);
    expect(dn, (float[]){0.5f}, 1, 0.0);
    expect(dd, (float[]){-0.75f}, 1, 0.0);
}
END_TEST

/* ---- reductions and shapes ------------------------------------------------------------ */

START_TEST(test_reductions_over_masked_axes) {
    float x[6] = {1, 2, 3, 4, 5, 6}, y[3];
    dist_tensor tx = t2(x, 2, 3), rows = t1(y, 2), cols = t1(y, 3), all = t1(y, 1);
    dist_op op = op_of(DIST_OPC_REDUCE, DIST_RED_SUM, 1, 1);
    op.mask = 2; /* axis 1 */
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &rows, NULL), DIST_OK);
    expect(y, (float[]){6, 15}, 2, 0.0);
    op.k = DIST_RED_MEAN;
    op.mask = 1; /* axis 0 */
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &cols, NULL), DIST_OK);
    expect(y, (float[]){2.5f, 3.5f, 4.5f}, 3, 0.0);
    op.k = DIST_RED_MAX;
    op.mask = 3;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &all, NULL), DIST_OK);
    expect(y, (float[]){6}, 1, 0.0);
    x[4] = NAN; /* a NaN is the maximum */
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &all, NULL), DIST_OK);
    ck_assert(isnan(y[0]));
    /* the output must hold the kept elements */
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &rows, NULL), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_reduction_gradients_broadcast_back) {
    float x[6] = {1, 3, 3, 4, 0, 2}, y[2] = {3, 4}, dy[2] = {3, 6}, dx[6];
    dist_tensor tx = t2(x, 2, 3), ty = t1(y, 2), tdy = t1(dy, 2), tdx = t2(dx, 2, 3);
    dist_op op = op_of(DIST_OPC_REDUCE_GRAD, DIST_RED_SUM, 3, 1);
    op.mask = 2;
    ck_assert_int_eq(run(&op, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){3, 3, 3, 6, 6, 6}, 6, 0.0);
    op.k = DIST_RED_MEAN;
    ck_assert_int_eq(run(&op, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){1, 1, 1, 2, 2, 2}, 6, 0.0);
    /* max: the two tied 3s of row 0 share its gradient */
    op.k = DIST_RED_MAX;
    ck_assert_int_eq(run(&op, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){0, 1.5f, 1.5f, 6, 0, 0}, 6, 0.0);
}
END_TEST

/* NaN as TensorFlow 2.20 treats it (printed by tf itself): maximum / minimum propagate it,
 * reduce_max's gradient is NaN everywhere when the maximum is NaN, abs's gradient at NaN is
 * NaN (sign(NaN)), and maximum's gradient keeps the x >= y rule (0 to x where x is NaN). */
START_TEST(test_nan_follows_tensorflow) {
    const float nan = NAN;
    float a[3] = {nan, 1, 2}, b[3] = {1, nan, 2}, m[3];
    dist_tensor ta = t1(a, 3), tb = t1(b, 3), tm = t1(m, 3);
    dist_op mx = op_of(DIST_OPC_BINARY, DIST_BIN_MAX, 2, 1), mn = mx;
    mn.k = DIST_BIN_MIN;
    ck_assert_int_eq(run(&mx, &ta, &tb, NULL, NULL, NULL, &tm, NULL), DIST_OK);
    ck_assert(isnan(m[0]) && isnan(m[1]) && m[2] == 2.0f);
    ck_assert_int_eq(run(&mn, &ta, &tb, NULL, NULL, NULL, &tm, NULL), DIST_OK);
    ck_assert(isnan(m[0]) && isnan(m[1]) && m[2] == 2.0f);
    float x[3] = {1, nan, 2}, y[1] = {nan}, dy[1] = {1}, dx[3];
    dist_tensor tx = t1(x, 3), ty = t1(y, 1), tdy = t1(dy, 1), tdx = t1(dx, 3);
    dist_op rg = op_of(DIST_OPC_REDUCE_GRAD, DIST_RED_MAX, 3, 1);
    rg.mask = 1;
    ck_assert_int_eq(run(&rg, &tx, &ty, &tdy, NULL, NULL, &tdx, NULL), DIST_OK);
    ck_assert(isnan(dx[0]) && isnan(dx[1]) && isnan(dx[2]));
    float ax[3] = {nan, 0, -1}, g[3] = {1, 1, 1}, ag[3];
    dist_tensor tax = t1(ax, 3), tg = t1(g, 3), tag = t1(ag, 3);
    dist_op abs_g = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_ABS, 3, 1);
    ck_assert_int_eq(run(&abs_g, &tax, &tax, &tg, NULL, NULL, &tag, NULL), DIST_OK);
    ck_assert(isnan(ag[0]) && ag[1] == 0.0f && ag[2] == -1.0f);
    float x2[2] = {nan, 1}, c2[2] = {1, nan}, one[2] = {1, 1}, gx[2], gc[2];
    dist_tensor tx2 = t1(x2, 2), tc2 = t1(c2, 2), t_one = t1(one, 2), tgx = t1(gx, 2),
                tgc = t1(gc, 2);
    dist_op mg = op_of(DIST_OPC_BINARY_GRAD, DIST_BIN_MAX, 3, 2);
    ck_assert_int_eq(run(&mg, &tx2, &tc2, &t_one, NULL, NULL, &tgx, &tgc), DIST_OK);
    ck_assert(gx[0] == 0.0f && gx[1] == 0.0f);
}
END_TEST

START_TEST(test_transpose_slice_pad_and_concat_move_elements) {
    float x[6] = {1, 2, 3, 4, 5, 6}, y[6];
    dist_tensor tx = t2(x, 2, 3), ty = t2(y, 3, 2);
    dist_op tr = op_of(DIST_OPC_TRANSPOSE, 0, 1, 1);
    tr.v[0] = 1;
    tr.v[1] = 0;
    ck_assert_int_eq(run(&tr, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){1, 4, 2, 5, 3, 6}, 6, 0.0);
    /* slice [:, 1:3] */
    dist_tensor ts = t2(y, 2, 2);
    dist_op sl = op_of(DIST_OPC_SLICE, 0, 1, 1);
    sl.v[1] = 1;
    ck_assert_int_eq(run(&sl, &tx, NULL, NULL, NULL, NULL, &ts, NULL), DIST_OK);
    expect(y, (float[]){2, 3, 5, 6}, 4, 0.0);
    sl.v[1] = 2; /* a 2-wide box at column 2 of 3 is outside */
    ck_assert_int_eq(run(&sl, &tx, NULL, NULL, NULL, NULL, &ts, NULL), DIST_INVALID_ARGUMENT);
    /* pad: [7, 8] at (1, 1) of zeros [2, 3] */
    float small[2] = {7, 8};
    dist_tensor tsmall = t2(small, 1, 2), tbig = t2(y, 2, 3);
    dist_op pad = op_of(DIST_OPC_PAD, 0, 1, 1);
    pad.v[0] = 1;
    pad.v[1] = 1;
    ck_assert_int_eq(run(&pad, &tsmall, NULL, NULL, NULL, NULL, &tbig, NULL), DIST_OK);
    expect(y, (float[]){0, 0, 0, 0, 7, 8}, 6, 0.0);
    /* pad with k = 1: [7, 8] added at (1, 1) into another tensor's values, and in place */
    float base[6] = {1, 2, 3, 4, 5, 6};
    dist_tensor tbase = t2(base, 2, 3);
    dist_op acc = op_of(DIST_OPC_PAD, 1, 2, 1);
    acc.v[0] = 1, acc.v[1] = 1;
    ck_assert_int_eq(run(&acc, &tsmall, &tbase, NULL, NULL, NULL, &tbig, NULL), DIST_OK);
    expect(y, (float[]){1, 2, 3, 4, 12, 14}, 6, 0.0);
    expect(base, (float[]){1, 2, 3, 4, 5, 6}, 6, 0.0);
    ck_assert_int_eq(run(&acc, &tsmall, &tbase, NULL, NULL, NULL, &tbase, NULL), DIST_OK);
    expect(base, (float[]){1, 2, 3, 4, 12, 14}, 6, 0.0);
    /* a scalar's box is itself; a 1-D box at an offset */
    {
        float s0 = 3.0f, s1 = 0.0f, v[5] = {1, 2, 3, 4, 5}, piece[2];
        dist_tensor a0 = dist_tensor_view(&s0, DIST_F32, 0, NULL),
                    b0 = dist_tensor_view(&s1, DIST_F32, 0, NULL);
        dist_op s = op_of(DIST_OPC_SLICE, 0, 1, 1);
        ck_assert_int_eq(run(&s, &a0, NULL, NULL, NULL, NULL, &b0, NULL), DIST_OK);
        ck_assert_float_eq(s1, 3.0f);
        dist_op p0 = op_of(DIST_OPC_PAD, 1, 2, 1);
        ck_assert_int_eq(run(&p0, &a0, &b0, NULL, NULL, NULL, &b0, NULL), DIST_OK);
        ck_assert_float_eq(s1, 6.0f);
        dist_tensor tv = t1(v, 5), tp = t1(piece, 2);
        s.v[0] = 2;
        ck_assert_int_eq(run(&s, &tv, NULL, NULL, NULL, NULL, &tp, NULL), DIST_OK);
        expect(piece, (float[]){3, 4}, 2, 0.0);
        dist_op p1 = op_of(DIST_OPC_PAD, 1, 2, 1);
        p1.v[0] = 3;
        ck_assert_int_eq(run(&p1, &tp, &tv, NULL, NULL, NULL, &tv, NULL), DIST_OK);
        expect(v, (float[]){1, 2, 3, 7, 9}, 5, 0.0);
    }
    /* a box of a 4-D tensor whose inner axes are whole, partial, and whole again: slice, pad
     * and pad with k = 1 against the element-by-element definition */
    {
        enum { A = 3, B = 4, C = 5, D = 2 };
        static float big[A * B * C * D], box[2 * 2 * C * D], back[A * B * C * D];
        for (int i = 0; i < A * B * C * D; i++) big[i] = (float)i;
        int64_t bs[4] = {A, B, C, D}, ss[4] = {2, 2, C, D};
        dist_tensor tb4 = dist_tensor_view(big, DIST_F32, 4, bs),
                    ts4 = dist_tensor_view(box, DIST_F32, 4, ss),
                    tk4 = dist_tensor_view(back, DIST_F32, 4, bs);
        dist_op s4 = op_of(DIST_OPC_SLICE, 0, 1, 1);
        s4.v[0] = 1, s4.v[1] = 2;
        ck_assert_int_eq(run(&s4, &tb4, NULL, NULL, NULL, NULL, &ts4, NULL), DIST_OK);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 2; j++)
                for (int k = 0; k < C * D; k++)
                    ck_assert_float_eq(box[(i * 2 + j) * C * D + k],
                                       big[((i + 1) * B + j + 2) * C * D + k]);
        dist_op p4 = op_of(DIST_OPC_PAD, 1, 2, 1);
        memcpy(p4.v, s4.v, sizeof p4.v);
        ck_assert_int_eq(run(&p4, &ts4, &tb4, NULL, NULL, NULL, &tk4, NULL), DIST_OK);
        for (int i = 0; i < A * B * C * D; i++) {
            int a = i / (B * C * D), b = i / (C * D) % B;
            int in_box = a >= 1 && a < 3 && b >= 2 && b < 4;
            ck_assert_float_eq(back[i], in_box ? 2.0f * big[i] : big[i]);
        }
    }
    /* concat along axis 1: [2, 1] and [2, 2] */
    float a[2] = {1, 2}, b[4] = {3, 4, 5, 6};
    dist_tensor ta = t2(a, 2, 1), tb = t2(b, 2, 2), tc = t2(y, 2, 3);
    dist_op cat = op_of(DIST_OPC_CONCAT, 0, 2, 1);
    cat.axis = 1;
    ck_assert_int_eq(run(&cat, &ta, &tb, NULL, NULL, NULL, &tc, NULL), DIST_OK);
    expect(y, (float[]){1, 3, 4, 2, 5, 6}, 6, 0.0);
}
END_TEST

/* ---- pooling ---------------------------------------------------------------------------- */

START_TEST(test_avg_pool_counts_only_covered_positions) {
    float x[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y[4];
    dist_tensor tx = t4(x, 1, 3, 3, 1), ty = t4(y, 1, 2, 2, 1);
    /* 2x2 windows, stride 1, no padding: means of 1 2 4 5, 2 3 5 6, ... */
    dist_op op = op_of(DIST_OPC_AVG_POOL2D, 0, 1, 1);
    op.pool.window_h = op.pool.window_w = 2;
    op.pool.stride_h = op.pool.stride_w = 1;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){3, 4, 6, 7}, 4, 0.0);
    /* stride 2 with one padded row and column at the end (SAME): the edge windows average the
     * 2 or 1 elements they cover: (3 + 6) / 2, (7 + 8) / 2, 9 */
    op.pool.stride_h = op.pool.stride_w = 2;
    op.pool.pad_bottom = op.pool.pad_right = 1;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){3, 4.5f, 7.5f, 9}, 4, 0.0);
    /* backward of the stride-1 pool: each window spreads dy / 4; the centre is in 4 windows */
    float dy[4] = {1, 1, 1, 1}, dx[9];
    dist_tensor tdy = t4(dy, 1, 2, 2, 1), tdx = t4(dx, 1, 3, 3, 1);
    op.code = DIST_OPC_AVG_POOL2D_GRAD;
    op.pool.stride_h = op.pool.stride_w = 1;
    op.pool.pad_bottom = op.pool.pad_right = 0;
    ck_assert_int_eq(run(&op, &tdy, NULL, NULL, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){0.25f, 0.5f, 0.25f, 0.5f, 1, 0.5f, 0.25f, 0.5f, 0.25f}, 9, 0.0);
}
END_TEST

/* ---- softmax and losses ----------------------------------------------------------------- */

START_TEST(test_softmax_and_its_gradients) {
    float x[4] = {0, 0, 0, logf(3.0f)}, y[4];
    dist_tensor tx = t2(x, 2, 2), ty = t2(y, 2, 2);
    dist_op op = op_of(DIST_OPC_SOFTMAX, 0, 1, 1);
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){0.5f, 0.5f, 0.25f, 0.75f}, 4, 1e-6);
    op.k = 1;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){-logf(2), -logf(2), -logf(4), logf(0.75f)}, 4, 1e-6);
    /* softmax: (dy - sum(dy y)) y with y = (0.25, 0.75), dy = (1, 0): s = 0.25 */
    float sy[2] = {0.25f, 0.75f}, dy[2] = {1, 0}, dx[2];
    dist_tensor tsy = t2(sy, 1, 2), tdy = t2(dy, 1, 2), tdx = t2(dx, 1, 2);
    dist_op g = op_of(DIST_OPC_SOFTMAX_GRAD, 0, 2, 1);
    ck_assert_int_eq(run(&g, &tsy, &tdy, NULL, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){0.1875f, -0.1875f}, 2, 0.0);
    /* log_softmax: dy - exp(y) sum(dy) with exp(y) = (0.25, 0.75), dy = (1, 1) */
    float ly[2] = {logf(0.25f), logf(0.75f)}, ones[2] = {1, 1};
    dist_tensor tly = t2(ly, 1, 2), tones = t2(ones, 1, 2);
    g.k = 1;
    ck_assert_int_eq(run(&g, &tly, &tones, NULL, NULL, NULL, &tdx, NULL), DIST_OK);
    expect(dx, (float[]){0.5f, -0.5f}, 2, 1e-6);
}
END_TEST

START_TEST(test_sigmoid_cross_entropy_and_mse_with_gradients) {
    /* x = 0, z = 1: log 2; x = 2, z = 0: 2 + log1p(exp(-2)); x = -2, z = 1: 2 + log1p(exp(-2)) */
    float z[3] = {1, 0, 1}, x[3] = {0, 2, -2}, l[3];
    dist_tensor tz = t1(z, 3), tx = t1(x, 3), tl = t1(l, 3);
    dist_op op = op_of(DIST_OPC_SIGMOID_XENT, 0, 2, 1);
    ck_assert_int_eq(run(&op, &tz, &tx, NULL, NULL, NULL, &tl, NULL), DIST_OK);
    float e = (float)(2.0 + log1p(exp(-2.0)));
    expect(l, (float[]){(float)log(2.0), e, e}, 3, 1e-6);
    /* dz = dy * -x, dx = dy * (sigmoid(x) - z) */
    float dy[3] = {2, 1, 1}, dz[3], dx[3];
    dist_tensor tdy = t1(dy, 3), tdz = t1(dz, 3), tdx = t1(dx, 3);
    op = op_of(DIST_OPC_SIGMOID_XENT_GRAD, 0, 3, 2);
    ck_assert_int_eq(run(&op, &tz, &tx, &tdy, NULL, NULL, &tdz, &tdx), DIST_OK);
    float s2 = (float)(1.0 / (1.0 + exp(-2.0)));
    expect(dz, (float[]){0, -2, 2}, 3, 0.0);
    expect(dx, (float[]){-1, s2, (1 - s2) - 1}, 3, 1e-6);
    /* mse per row of 2: ((1 - 0)^2 + (3 - 0)^2) / 2 = 5, ((1 - 1)^2 + (2 - 1)^2) / 2 = 0.5 */
    float t[4] = {0, 0, 1, 1}, p[4] = {1, 3, 1, 2}, m[2];
    dist_tensor tt = t2(t, 2, 2), tp = t2(p, 2, 2), tm = t1(m, 2);
    op = op_of(DIST_OPC_MSE, 0, 2, 1);
    ck_assert_int_eq(run(&op, &tt, &tp, NULL, NULL, NULL, &tm, NULL), DIST_OK);
    expect(m, (float[]){5, 0.5f}, 2, 0.0);
    /* dpred = 2 (p - t) / 2 * dloss[row], dtrue its negative */
    float dl[2] = {1, 2}, dt[4], dp[4];
    dist_tensor tdl = t1(dl, 2), tdt = t2(dt, 2, 2), tdp = t2(dp, 2, 2);
    op = op_of(DIST_OPC_MSE_GRAD, 0, 3, 2);
    ck_assert_int_eq(run(&op, &tt, &tp, &tdl, NULL, NULL, &tdt, &tdp), DIST_OK);
    expect(dp, (float[]){1, 3, 0, 2}, 4, 0.0);
    expect(dt, (float[]){-1, -3, -0, -2}, 4, 0.0);
}
END_TEST

/* ---- batch normalization ---------------------------------------------------------------- */

/* x = rows (1, 2) and (3, 6): channel means 2 and 4, variances 1 and 4 */
static float bn_x[4] = {1, 2, 3, 6};

START_TEST(test_bn_statistics_local_sums_moments_and_given) {
    float st[8];
    dist_tensor tx = t2(bn_x, 2, 2), tst = t2(st, 4, 2);
    dist_op op = op_of(DIST_OPC_BN_STATS, DIST_BN_LOCAL, 1, 1);
    op.f[0] = 0.0f;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &tst, NULL), DIST_OK);
    expect(st, (float[]){2, 4, 1, 4, 1, 0.5f, 0, 0}, 8, 0.0);
    /* the synchronized form's local part: sums of x and x^2 */
    float sums[4];
    dist_tensor tsums = t2(sums, 2, 2);
    op.k = DIST_BN_SUMS;
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &tsums, NULL), DIST_OK);
    expect(sums, (float[]){4, 8, 10, 40}, 4, 0.0);
    /* moments from those sums over 2 rows: the same statistics */
    float count = 2;
    dist_tensor tcount = scalar(&count);
    op = op_of(DIST_OPC_BN_MOMENTS, 0, 2, 1);
    ck_assert_int_eq(run(&op, &tsums, &tcount, NULL, NULL, NULL, &tst, NULL), DIST_OK);
    expect(st, (float[]){2, 4, 1, 4, 1, 0.5f, 0, 0}, 8, 0.0);
    /* E[x^2] - mean^2 < 0 (rounding across replicas): variance 0, clamped; eps 0.25: inv 2 */
    float bad[2] = {2, 1}, one = 1, st1[4];
    dist_tensor tbad = t2(bad, 2, 1), tone = scalar(&one), tst1 = t2(st1, 4, 1);
    op.f[0] = 0.25f;
    ck_assert_int_eq(run(&op, &tbad, &tone, NULL, NULL, NULL, &tst1, NULL), DIST_OK);
    expect(st1, (float[]){2, 0, 2, 1}, 4, 0.0);
    /* inference: given mean 1, variance 3, eps 1: inv 0.5 */
    float m = 1, v = 3;
    dist_tensor tm = t1(&m, 1), tv = t1(&v, 1);
    op = op_of(DIST_OPC_BN_INFER_STATS, 0, 2, 1);
    op.f[0] = 1.0f;
    ck_assert_int_eq(run(&op, &tm, &tv, NULL, NULL, NULL, &tst1, NULL), DIST_OK);
    expect(st1, (float[]){1, 3, 0.5f, 0}, 4, 0.0);
}
END_TEST

/* statistics of bn_x with eps 0, gamma (2, 1), beta (0, 1) */
static float bn_st[8] = {2, 4, 1, 4, 1, 0.5f, 0, 0}, bn_gamma[2] = {2, 1}, bn_beta[2] = {0, 1};

START_TEST(test_bn_apply_normalizes_scales_and_shifts) {
    /* channel 0: (x - 2) * 1 * 2 + 0; channel 1: (x - 4) * 0.5 * 1 + 1 */
    float y[4];
    dist_tensor tx = t2(bn_x, 2, 2), tst = t2(bn_st, 4, 2), tg = t1(bn_gamma, 2),
                tb = t1(bn_beta, 2), ty = t2(y, 2, 2);
    dist_op op = op_of(DIST_OPC_BN_APPLY, 0, 4, 1);
    ck_assert_int_eq(run(&op, &tx, &tst, &tg, &tb, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){-2, 0, 2, 2}, 4, 0.0);
    /* without gamma and beta: (x - mean) * inv */
    ck_assert_int_eq(run(&op, &tx, &tst, NULL, NULL, NULL, &ty, NULL), DIST_OK);
    expect(y, (float[]){-1, -1, 1, 1}, 4, 0.0);
}
END_TEST

START_TEST(test_bn_gradient_sums_local_and_synchronized) {
    /* dy = (1, 1), (2, 0). Channel 0: S = 3, T = sum dy (x - 2) = -1 + 2 = 1; channel 1: S = 1,
     * T = -2. dbeta = S, dgamma = T inv = (1, -1). Input terms a = S g = (6, 1), b = T g = (2, -2)
     */
    float dy[4] = {1, 1, 2, 0}, par[4], xs[4], count = 2;
    dist_tensor tx = t2(bn_x, 2, 2), tdy = t2(dy, 2, 2), tst = t2(bn_st, 4, 2),
                tg = t1(bn_gamma, 2), tc = scalar(&count), tpar = t2(par, 2, 2), txs = t2(xs, 2, 2);
    dist_op op = op_of(DIST_OPC_BN_GRAD_SUMS, DIST_BN_LOCAL, 5, 2);
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, NULL, &tpar, &txs), DIST_OK);
    expect(par, (float[]){3, 1, 1, -1}, 4, 0.0);
    expect(xs, (float[]){6, 1, 2, -2}, 4, 0.0);
    /* synchronized over a count of 2: dmean = -a inv, dvar = -0.5 inv^3 b;
     * channel 0: dmean -6, dvar -1: ((-6 + 4) / 2, -1 / 2); channel 1: dmean -0.5,
     * dvar 0.125: ((-0.5 - 1) / 2, 0.125 / 2) */
    op.k = DIST_BN_SYNC;
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, &tc, &tpar, &txs), DIST_OK);
    expect(par, (float[]){3, 1, 1, -1}, 4, 0.0);
    expect(xs, (float[]){-1, -0.75f, -0.5f, 0.0625f}, 4, 0.0);
    /* the synchronized form needs the count: a missing input, named */
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, NULL, &tpar, &txs), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 4 is required"));
}
END_TEST

START_TEST(test_bn_input_gradient_matches_the_textbook_formula) {
    /* three rows, one channel, gamma 1.5: dx = g inv / N (N dy - sum dy - xhat sum(dy xhat)) */
    float x[3] = {1, 2, 6}, dy[3] = {0.5f, -1, 2}, g = 1.5f, st[4], xs[2], dx[3];
    dist_tensor tx = t2(x, 3, 1), tdy = t2(dy, 3, 1), tg = t1(&g, 1), tst = t2(st, 4, 1),
                txs = t2(xs, 2, 1), tdx = t2(dx, 3, 1);
    dist_op op = op_of(DIST_OPC_BN_STATS, DIST_BN_LOCAL, 1, 1);
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &tst, NULL), DIST_OK);
    op = op_of(DIST_OPC_BN_GRAD_SUMS, DIST_BN_LOCAL, 5, 2);
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, NULL, NULL, &txs), DIST_OK);
    op = op_of(DIST_OPC_BN_GRAD_INPUT, DIST_BN_LOCAL, 6, 1);
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, &txs, &tdx, NULL), DIST_OK);
    double mean = 3, var = (4.0 + 1.0 + 9.0) / 3, inv = 1 / sqrt(var), sdy = 1.5, sdyxh = 0;
    for (int i = 0; i < 3; i++) sdyxh += dy[i] * (x[i] - mean) * inv;
    float want[3];
    for (int i = 0; i < 3; i++)
        want[i] = (float)(g * inv / 3 * (3 * dy[i] - sdy - (x[i] - mean) * inv * sdyxh));
    expect(dx, want, 3, 1e-6);
    /* synchronized with one replica (the sums as BN_GRAD_SUMS gives them): the same gradient */
    float count = 3;
    dist_tensor tc = scalar(&count);
    op = op_of(DIST_OPC_BN_GRAD_SUMS, DIST_BN_SYNC, 5, 2);
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, &tc, NULL, &txs), DIST_OK);
    op = op_of(DIST_OPC_BN_GRAD_INPUT, DIST_BN_SYNC, 6, 1);
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, &txs, &tdx, NULL), DIST_OK);
    expect(dx, want, 3, 1e-5);
    /* inference: dy g inv, no sums */
    op.k = DIST_BN_INFERENCE;
    ck_assert_int_eq(run(&op, &tx, &tdy, &tst, &tg, NULL, &tdx, NULL), DIST_OK);
    for (int i = 0; i < 3; i++) want[i] = dy[i] * g * st[2];
    expect(dx, want, 3, 0.0);
}
END_TEST

/* The statistics, the gradient's sums and the input gradient of many rows: 11,000 rows of 3
 * channels (the sums add blocks of rows, the last one partial; enough elements to split over two
 * threads), against double loops, and the same bits from a one-thread backend. The channels sit
 * at 0, 50 and 100 with a spread of about 1, so a variance taken as E[x^2] - mean^2 in float
 * would be visibly wrong. */
enum { BN_ROWS = 11000, BN_C = 3 };

typedef struct bn_many {
    float st[4 * BN_C], sums[2 * BN_C], par[2 * BN_C], xs[2 * BN_C], dx[BN_ROWS * BN_C];
} bn_many;

static void bn_many_run(dist_backend *be, const float *x, const float *dy, const float *g,
                        bn_many *r) {
    dist_tensor tx = t2((float *)x, BN_ROWS, BN_C), tdy = t2((float *)dy, BN_ROWS, BN_C),
                tg = t1((float *)g, BN_C), tst = t2(r->st, 4, BN_C), tsums = t2(r->sums, 2, BN_C),
                tpar = t2(r->par, 2, BN_C), txs = t2(r->xs, 2, BN_C),
                tdx = t2(r->dx, BN_ROWS, BN_C);
    dist_op op = op_of(DIST_OPC_BN_STATS, DIST_BN_SUMS, 1, 1);
    const dist_tensor *in[6] = {&tx, NULL, NULL, NULL, NULL, NULL};
    dist_tensor *out[2] = {&tsums, NULL};
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_OK);
    op = op_of(DIST_OPC_BN_STATS, DIST_BN_LOCAL, 1, 1);
    op.f[0] = 1e-3f;
    out[0] = &tst;
    ck_assert_int_eq(dist_backend_run_op(be, &op, in, out), DIST_OK);
    op = op_of(DIST_OPC_BN_GRAD_SUMS, DIST_BN_LOCAL, 5, 2);
    const dist_tensor *gin[6] = {&tx, &tdy, &tst, &tg, NULL, NULL};
    dist_tensor *gout[2] = {&tpar, &txs};
    ck_assert_int_eq(dist_backend_run_op(be, &op, gin, gout), DIST_OK);
    op = op_of(DIST_OPC_BN_GRAD_INPUT, DIST_BN_LOCAL, 6, 1);
    gin[4] = &txs;
    gout[0] = &tdx;
    gout[1] = NULL;
    ck_assert_int_eq(dist_backend_run_op(be, &op, gin, gout), DIST_OK);
}

static void expect_rel(const float *got, const double *want, int n, double rel, const char *what) {
    for (int i = 0; i < n; i++)
        ck_assert_msg(fabs((double)got[i] - want[i]) <= rel * (fabs(want[i]) + 1.0),
                      "%s %d: %.9g, want %.9g", what, i, (double)got[i], want[i]);
}

START_TEST(test_bn_over_many_rows_matches_double_loops_at_any_thread_count) {
    static float x[BN_ROWS * BN_C], dy[BN_ROWS * BN_C];
    static bn_many two, one;
    float g[BN_C] = {1.5f, -0.5f, 2.0f};
    for (int i = 0; i < BN_ROWS; i++)
        for (int j = 0; j < BN_C; j++) {
            x[i * BN_C + j] = (float)(50.0 * j + sin(0.37 * i + j));
            dy[i * BN_C + j] = (float)cos(0.11 * i * (j + 1) + 0.3);
        }
    bn_many_run(g_be, x, dy, g, &two);
    double sx[BN_C], sq[BN_C], mean[BN_C], var[BN_C], inv[BN_C];
    for (int j = 0; j < BN_C; j++) {
        double a = 0, q = 0, d2 = 0;
        for (int i = 0; i < BN_ROWS; i++) {
            double v = x[i * BN_C + j];
            a += v;
            q += v * v;
        }
        mean[j] = a / BN_ROWS;
        for (int i = 0; i < BN_ROWS; i++)
            d2 += (x[i * BN_C + j] - mean[j]) * (x[i * BN_C + j] - mean[j]);
        var[j] = d2 / BN_ROWS;
        inv[j] = 1.0 / sqrt(var[j] + 1e-3);
        sx[j] = a;
        sq[j] = q;
    }
    double want_sums[2 * BN_C];
    for (int j = 0; j < BN_C; j++) {
        want_sums[j] = sx[j];
        want_sums[BN_C + j] = sq[j];
    }
    expect_rel(two.sums, want_sums, 2 * BN_C, 1e-6, "sums");
    expect_rel(two.st, mean, BN_C, 1e-6, "mean");
    expect_rel(two.st + BN_C, var, BN_C, 1e-5, "variance");
    expect_rel(two.st + 2 * BN_C, inv, BN_C, 1e-5, "inv");
    /* the gradient's sums about the float32 mean the op saw; the input gradient from them */
    double want_par[2 * BN_C], want_xs[2 * BN_C], sdy[BN_C], sdyx[BN_C];
    for (int j = 0; j < BN_C; j++) {
        double m = two.st[j], iv = two.st[2 * BN_C + j];
        sdy[j] = sdyx[j] = 0;
        for (int i = 0; i < BN_ROWS; i++) {
            sdy[j] += dy[i * BN_C + j];
            sdyx[j] += dy[i * BN_C + j] * (x[i * BN_C + j] - m);
        }
        want_par[j] = sdy[j];
        want_par[BN_C + j] = sdyx[j] * iv;
        want_xs[j] = sdy[j] * g[j];
        want_xs[BN_C + j] = sdyx[j] * g[j];
    }
    expect_rel(two.par, want_par, 2 * BN_C, 1e-5, "dbeta/dgamma");
    expect_rel(two.xs, want_xs, 2 * BN_C, 1e-5, "the input's sums");
    for (int i = 0; i < BN_ROWS; i++)
        for (int j = 0; j < BN_C; j++) {
            /* dx = g inv (dy - sum dy / N - (x - mean) inv^2 sum(dy (x - mean)) / N) */
            double m = two.st[j], iv = two.st[2 * BN_C + j], xc = x[i * BN_C + j] - m;
            double want = g[j] * iv *
                          (dy[i * BN_C + j] - sdy[j] / BN_ROWS - xc * iv * iv * sdyx[j] / BN_ROWS);
            ck_assert_msg(fabs(two.dx[i * BN_C + j] - want) <= 1e-5 * (fabs(want) + 1.0),
                          "dx[%d][%d]: %.9g, want %.9g", i, j, (double)two.dx[i * BN_C + j], want);
        }
    /* one thread: the blocks of rows are fixed by the shape, so the same bits */
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    dist_backend *be1;
    ck_assert_int_eq(dist_backend_create(&o, &be1), DIST_OK);
    bn_many_run(be1, x, dy, g, &one);
    dist_backend_destroy(be1);
    ck_assert_int_eq(memcmp(&one, &two, sizeof one), 0);
}
END_TEST

/* ---- dispatch and refusals -------------------------------------------------------------- */

START_TEST(test_run_op_dispatches_the_misc_ops_too) {
    float x[3] = {1, 2, 2}, s;
    dist_tensor tx = t1(x, 3), ts = scalar(&s);
    dist_op op = op_of(DIST_OPC_SUM_SQUARES, 0, 1, 1);
    ck_assert_int_eq(run(&op, &tx, NULL, NULL, NULL, NULL, &ts, NULL), DIST_OK);
    ck_assert_float_eq(s, 9.0f);
}
END_TEST

START_TEST(test_a_backend_without_the_op_refuses_naming_it) {
    struct dist_backend_i iface = {.name = "fake"};
    dist_backend fake = {.iface = &iface};
    float x[2] = {1, 2}, y[2];
    dist_tensor tx = t1(x, 2), ty = t1(y, 2);
    const dist_tensor *in[1] = {&tx};
    dist_tensor *out[1] = {&ty};
    dist_op op = op_of(DIST_OPC_UNARY, DIST_UN_EXP, 1, 1);
    ck_assert_int_eq(dist_backend_run_op(&fake, &op, in, out), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "exp"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "fake"));
    /* the CPU backend takes float32 only */
    uint16_t h[2] = {0, 0};
    dist_tensor th = dist_tensor_view(h, DIST_F16, 1, (int64_t[]){2});
    in[0] = &th;
    op = op_of(DIST_OPC_SOFTMAX, 0, 1, 1);
    ck_assert_int_eq(dist_backend_supports_op(g_be, &op, in, out), 0);
    ck_assert_int_eq(dist_backend_run_op(g_be, &op, in, out), DIST_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "softmax"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "input 0 is float16"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "CPU backend"));
    /* no input array where the op takes one: a clear error, not a crash */
    op = op_of(DIST_OPC_UNARY, DIST_UN_EXP, 1, 1);
    ck_assert_int_eq(dist_backend_run_op(g_be, &op, NULL, out), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "exp: input 0 is required"));
    /* an op code outside the set */
    op.code = DIST_OPC_COUNT;
    ck_assert_int_eq(dist_backend_supports_op(g_be, &op, NULL, NULL), 0);
}
END_TEST

/* The exact GELU and its gradient (cpu_gelu.c: float32 vector loops, the tail's own form below
 * x = -2) on 40,001 points of [-10, 10] and the signed zeros: y = x Phi(x) within 5e-7 |x| of
 * the double closed form (Phi to 5e-7), dx = dy (Phi(x) + x phi(x)) within 5e-7 (1 + |x|) |dy|,
 * and below x = -2 both within 5e-7 of the result itself (from erfc: 1 + erf cancels there);
 * -inf gives NaN as the closed form's -inf * 0; the same bits on 1 and 2 threads and in place
 * (y over x, dx over dy) */
START_TEST(test_gelu_matches_the_double_closed_form_on_any_thread_count_and_in_place) {
    enum { N = 40003 };
    static float x[N], dy[N], y[2][N], dx[2][N], inplace[N];
    for (int i = 0; i < N - 2; i++) x[i] = -10.0f + 20.0f * (float)i / (float)(N - 3);
    x[N - 2] = 0.0f, x[N - 1] = -0.0f;
    for (int i = 0; i < N; i++) dy[i] = 1.0f + 0.25f * (float)(i % 7);
    const int64_t n = N;
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        dist_tensor tx = dist_tensor_view(x, DIST_F32, 1, &n), tdy = tx, ty = tx, tdx = tx;
        tdy.data = dy, ty.data = y[threads - 1], tdx.data = dx[threads - 1];
        dist_op fwd = op_of(DIST_OPC_UNARY, DIST_UN_GELU, 1, 1);
        dist_op bwd = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_GELU, 3, 1);
        const dist_tensor *fin[1] = {&tx}, *bin[3] = {&tx, &ty, &tdy};
        dist_tensor *fout[1] = {&ty}, *bout[1] = {&tdx};
        ck_assert_msg(dist_backend_run_op(be, &fwd, fin, fout) == DIST_OK, "%s", dist_last_error());
        ck_assert_msg(dist_backend_run_op(be, &bwd, bin, bout) == DIST_OK, "%s", dist_last_error());
        /* in place: y written over a copy of x, then dx over a copy of dy */
        dist_tensor tin = tx;
        tin.data = inplace;
        memcpy(inplace, x, sizeof x);
        const dist_tensor *iin[1] = {&tin};
        dist_tensor *iout[1] = {&tin};
        ck_assert_int_eq(dist_backend_run_op(be, &fwd, iin, iout), DIST_OK);
        ck_assert_int_eq(memcmp(inplace, y[threads - 1], sizeof inplace), 0);
        memcpy(inplace, dy, sizeof dy);
        const dist_tensor *gin[3] = {&tx, &ty, &tin};
        ck_assert_int_eq(dist_backend_run_op(be, &bwd, gin, iout), DIST_OK);
        ck_assert_int_eq(memcmp(inplace, dx[threads - 1], sizeof inplace), 0);
        dist_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(y[0], y[1], sizeof y[0]), 0);
    ck_assert_int_eq(memcmp(dx[0], dx[1], sizeof dx[0]), 0);
    for (int i = 0; i < N; i++) {
        const double v = x[i], phi = 0.5 * (1.0 + erf(v / sqrt(2.0)));
        const double want_y = v * phi;
        const double want_dx = dy[i] * (phi + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
        ck_assert_msg(fabs(y[0][i] - want_y) <= 5e-7 * fabs(v), "gelu(%.9g) = %.9g, want %.9g", v,
                      (double)y[0][i], want_y);
        ck_assert_msg(fabs(dx[0][i] - want_dx) <= 5e-7 * (1.0 + fabs(v)) * dy[i],
                      "gelu'(%.9g) dy = %.9g, want %.9g", v, (double)dx[0][i], want_dx);
        if (v < -2.0) { /* the tail's own form: relative to the (small) result itself */
            const double tail_y = v * 0.5 * erfc(-v / sqrt(2.0));
            const double tail_dx =
                dy[i] * (0.5 * erfc(-v / sqrt(2.0)) + v * exp(-0.5 * v * v) / sqrt(2.0 * M_PI));
            ck_assert_msg(fabs(y[0][i] - tail_y) <= 5e-7 * fabs(tail_y),
                          "gelu(%.9g) = %.9g, want %.9g (relative)", v, (double)y[0][i], tail_y);
            ck_assert_msg(fabs(dx[0][i] - tail_dx) <= 5e-7 * fabs(tail_dx),
                          "gelu'(%.9g) dy = %.9g, want %.9g (relative)", v, (double)dx[0][i],
                          tail_dx);
        }
    }
    ck_assert(signbit(y[0][N - 1])); /* -0 * Phi(0) */
    /* the tail's ends, in a first group of 16: -inf (NaN, as -inf * 0; its gradient too),
     * -30 and -3e38 (-0: the result underflows; a finite x that large must not give NaN);
     * then a group of 16 ordinary values with one tail element, -3, among them */
    float ends[32], ends_y[32], ends_dy[32], ends_dx[32];
    for (int i = 0; i < 32; i++) ends[i] = 0.5f, ends_dy[i] = 1.0f;
    ends[0] = -INFINITY, ends[1] = -30.0f, ends[2] = -3e38f, ends[20] = -3.0f;
    const int64_t ne = 32;
    dist_backend *be = dist_test_cpu_backend(1);
    dist_tensor te = dist_tensor_view(ends, DIST_F32, 1, &ne), tey = te, ted = te, tex = te;
    tey.data = ends_y, ted.data = ends_dy, tex.data = ends_dx;
    dist_op fwd = op_of(DIST_OPC_UNARY, DIST_UN_GELU, 1, 1);
    dist_op bwd = op_of(DIST_OPC_UNARY_GRAD, DIST_UN_GELU, 3, 1);
    const dist_tensor *ein[1] = {&te}, *gin[3] = {&te, &tey, &ted};
    dist_tensor *eout[1] = {&tey}, *gout[1] = {&tex};
    ck_assert_int_eq(dist_backend_run_op(be, &fwd, ein, eout), DIST_OK);
    ck_assert_int_eq(dist_backend_run_op(be, &bwd, gin, gout), DIST_OK);
    dist_backend_destroy(be);
    ck_assert(isnan(ends_y[0]) && isnan(ends_dx[0]));
    for (int i = 1; i <= 2; i++) {
        ck_assert_msg(ends_y[i] == 0.0f && signbit(ends_y[i]), "gelu(%g) = %g", (double)ends[i],
                      (double)ends_y[i]);
        ck_assert_msg(ends_dx[i] == 0.0f, "gelu'(%g) = %g", (double)ends[i], (double)ends_dx[i]);
    }
    ck_assert_msg(fabs(ends_y[20] - -3.0 * 0.5 * erfc(3.0 / sqrt(2.0))) <= 5e-7 * 4.05e-3,
                  "gelu(-3) = %.9g", (double)ends_y[20]);
    for (int i = 3; i < 32; i++)
        if (i != 20)
            ck_assert_msg(fabs(ends_y[i] - 0.5 * 0.5 * (1.0 + erf(0.5 / sqrt(2.0)))) <= 3e-7,
                          "gelu(0.5) = %.9g at %d", (double)ends_y[i], i);
}
END_TEST

/* The transcendental activations (cpu_act.c: SIGMOID, TANH, ELU, SELU, SOFTPLUS, GELU_TANH,
 * float32 vector loops) on 80,001 points of [-20, 20] and the ends (+-0, +-inf, NaN, the
 * switch points of tanh's and softplus's forms, exp's underflow):
 * - bit for bit ops.h's float32 arithmetic, written out below with cpu_vmath.h's functions
 *   (the vector copies of every ISA give the scalar bits), on 1 and 2 threads and in place;
 * - within a bound of the function and its derivative in double, in ulps of the result
 *   (measured worst in parentheses): sigmoid 3 (2.1), tanh 7 (5.8, Eigen's approximation),
 *   ELU and SELU 2 of max(|y|, 1) (exp(x) - 1 as TensorFlow's: absolute near 0), softplus 8
 *   (7.4 at its switch point t, TensorFlow's), GELU_TANH (4 + 12 |u|) (x sigmoid(2u) keeps
 *   digits where 1 + tanh(u) loses all; u's rounding, up to 6 ulp, is amplified by 2 |u|:
 *   5e-6 relative at x = -9, where TensorFlow's form gives 0); the gradients
 *   computed from y within twice y's error times dy (16 ulp of 1 for tanh, whose y is
 *   within 7 ulp; 4 for sigmoid), the others like their
 *   functions (GELU_TANH's 2 ulp of max(|d|, 1)); below FLT_MIN, 0 (exp's underflow). */
static float act_ref_f32(int k, float a, float x) {
    const float sa = 1.7580993408473768599402175208123f, s = 1.0507009873554804934193349852946f;
    switch (k) {
    case DIST_UN_SIGMOID: return cpu_sigmoid_f32(x);
    case DIST_UN_TANH: return cpu_tanh_f32(x);
    case DIST_UN_ELU: return x > 0 ? x : a * (x < 0 ? cpu_exp_neg_f32(x) - 1.0f : x);
    case DIST_UN_SELU: return x < 0 ? sa * (cpu_exp_neg_f32(x) - 1.0f) : s * x;
    case DIST_UN_SOFTPLUS: {
        const keras_kind c = {DIST_UN_SOFTPLUS, 0, 0, "softplus"};
        return keras_f32(&c, x);
    }
    default: { /* GELU_TANH */
        const float xc = x < -1e4f ? -1e4f : (x > 1e4f ? 1e4f : x);
        const float u = 0.7978845608028654f * (xc + 0.044715f * (xc * xc * xc));
        return x * cpu_sigmoid_f32(2.0f * u);
    }
    }
}

static float act_grad_ref_f32(int k, float a, float x, float y, float g) {
    switch (k) {
    case DIST_UN_SIGMOID: return g * (y * (1.0f - y));
    case DIST_UN_TANH: return g * (1.0f - y * y);
    case DIST_UN_ELU: {
        const keras_kind c = {DIST_UN_ELU, a, 0, "elu"};
        return keras_grad_f32(&c, x, y, g);
    }
    case DIST_UN_SELU: {
        const keras_kind c = {DIST_UN_SELU, 0, 0, "selu"};
        return keras_grad_f32(&c, x, y, g);
    }
    case DIST_UN_SOFTPLUS: return g * cpu_sigmoid_f32(x);
    default: { /* GELU_TANH */
        const float xc = x < -1e4f ? -1e4f : (x > 1e4f ? 1e4f : x);
        const float u = 0.7978845608028654f * (xc + 0.044715f * (xc * xc * xc));
        const float du = 0.7978845608028654f * (1.0f + 3.0f * 0.044715f * (xc * xc));
        const float e = cpu_exp_neg_f32(-2.0f * fabsf(u)), d = 1.0f + e;
        const float sg = (u >= 0.0f ? 1.0f : e) / d;
        return g * (sg + x * (2.0f * (e / (d * d)) * du));
    }
    }
}

static double act_ref(int k, double a, double x, double *deriv, double *u_out) {
    const double sa = 1.7580993408473768599402175208123, s = 1.0507009873554804934193349852946;
    const double c = sqrt(2.0 / M_PI);
    const double sig = 1.0 / (1.0 + exp(-x));
    *u_out = 0;
    switch (k) {
    case DIST_UN_SIGMOID: *deriv = sig * (1.0 - sig); return sig;
    case DIST_UN_TANH: *deriv = 1.0 - tanh(x) * tanh(x); return tanh(x);
    case DIST_UN_ELU: *deriv = x > 0 ? 1.0 : a * exp(x); return x > 0 ? x : a * expm1(x);
    case DIST_UN_SELU: *deriv = x > 0 ? s : sa * exp(x); return x > 0 ? s * x : sa * expm1(x);
    case DIST_UN_SOFTPLUS: *deriv = sig; return x > 30 ? x : log1p(exp(x));
    default: { /* GELU_TANH: 0.5 (1 + tanh(u)) = sigmoid(2u), kept from cancelling */
        const double u = c * (x + 0.044715 * x * x * x), s2 = 1.0 / (1.0 + exp(-2.0 * u));
        *u_out = u;
        *deriv = s2 + x * 2.0 * s2 * (1.0 - s2) * c * (1.0 + 3.0 * 0.044715 * x * x);
        return x * s2;
    }
    }
}

static double ulp_of(double r) {
    const float f = fabsf((float)r);
    return (double)nextafterf(f, INFINITY) - (double)f;
}

START_TEST(test_transcendental_activations_match_their_formulas_and_double) {
    enum { G = 80001, N = G + 24 };
    static float x[N], dy[N], y[2][N], dx[2][N], inplace[N];
    for (int i = 0; i < G; i++) x[i] = -20.0f + 40.0f * (float)i / (float)(G - 1);
    const float t = logf(FLT_EPSILON) + 2.0f, ends[24] = {0.0f,
                                                          -0.0f,
                                                          INFINITY,
                                                          -INFINITY,
                                                          NAN,
                                                          4e-4f,
                                                          -4e-4f,
                                                          nextafterf(4e-4f, 0),
                                                          7.90531110763549805f,
                                                          -8.0f,
                                                          t,
                                                          -t,
                                                          nextafterf(t, 0),
                                                          nextafterf(-t, 0),
                                                          -87.5f,
                                                          -44.0f,
                                                          44.0f,
                                                          100.0f,
                                                          -100.0f,
                                                          1e-30f,
                                                          -1e-30f,
                                                          3e38f,
                                                          -3e38f,
                                                          1e5f};
    memcpy(x + G, ends, sizeof ends);
    for (int i = 0; i < N; i++) dy[i] = 0.5f + 0.25f * (float)(i % 5);
    const struct {
        int k;
        float a;
        const char *name;
    } kinds[] = {{DIST_UN_SIGMOID, 0, "sigmoid"},    {DIST_UN_TANH, 0, "tanh"},
                 {DIST_UN_ELU, 1.0f, "elu"},         {DIST_UN_ELU, 0.5f, "elu alpha 0.5"},
                 {DIST_UN_SELU, 0, "selu"},          {DIST_UN_SOFTPLUS, 0, "softplus"},
                 {DIST_UN_GELU_TANH, 0, "gelu_tanh"}};
    const int64_t n = N;
    for (size_t c = 0; c < sizeof kinds / sizeof kinds[0]; c++) {
        const int k = kinds[c].k;
        const float a = kinds[c].a;
        dist_op fwd = op_of(DIST_OPC_UNARY, k, 1, 1), bwd = op_of(DIST_OPC_UNARY_GRAD, k, 3, 1);
        fwd.f[0] = bwd.f[0] = a;
        for (int threads = 1; threads <= 2; threads++) {
            dist_backend *be = dist_test_cpu_backend(threads);
            dist_tensor tx = dist_tensor_view(x, DIST_F32, 1, &n), tdy = tx, ty = tx, tdx = tx;
            tdy.data = dy, ty.data = y[threads - 1], tdx.data = dx[threads - 1];
            const dist_tensor *fin[1] = {&tx}, *bin[3] = {&tx, &ty, &tdy};
            dist_tensor *fout[1] = {&ty}, *bout[1] = {&tdx};
            ck_assert_msg(dist_backend_run_op(be, &fwd, fin, fout) == DIST_OK, "%s",
                          dist_last_error());
            ck_assert_msg(dist_backend_run_op(be, &bwd, bin, bout) == DIST_OK, "%s",
                          dist_last_error());
            dist_tensor tin = tx; /* in place: y over a copy of x, then dx over a copy of dy */
            tin.data = inplace;
            memcpy(inplace, x, sizeof x);
            const dist_tensor *iin[1] = {&tin}, *gin[3] = {&tx, &ty, &tin};
            dist_tensor *iout[1] = {&tin};
            ck_assert_int_eq(dist_backend_run_op(be, &fwd, iin, iout), DIST_OK);
            ck_assert_msg(memcmp(inplace, y[threads - 1], sizeof inplace) == 0, "%s in place",
                          kinds[c].name);
            memcpy(inplace, dy, sizeof dy);
            ck_assert_int_eq(dist_backend_run_op(be, &bwd, gin, iout), DIST_OK);
            ck_assert_msg(memcmp(inplace, dx[threads - 1], sizeof inplace) == 0, "%s' in place",
                          kinds[c].name);
            dist_backend_destroy(be);
        }
        ck_assert_msg(memcmp(y[0], y[1], sizeof y[0]) == 0, "%s: 1 and 2 threads", kinds[c].name);
        ck_assert_msg(memcmp(dx[0], dx[1], sizeof dx[0]) == 0, "%s': 1 and 2 threads",
                      kinds[c].name);
        for (int i = 0; i < N; i++) {
            const float xi = x[i], want = act_ref_f32(k, a, xi);
            ck_assert_msg(same_bits(y[0][i], want), "%s(%.9g) = %.9g, the formula %.9g",
                          kinds[c].name, (double)xi, (double)y[0][i], (double)want);
            const float gw = act_grad_ref_f32(k, a, xi, y[0][i], dy[i]);
            ck_assert_msg(same_bits(dx[0][i], gw), "%s'(%.9g) dy = %.9g, the formula %.9g",
                          kinds[c].name, (double)xi, (double)dx[0][i], (double)gw);
            if (!isfinite(xi) || fabsf(xi) > 1e3f) continue; /* the ends: below */
            double d, u;
            const double r = act_ref(k, a, xi, &d, &u);
            double tol, dtol;
            switch (k) {
            case DIST_UN_SIGMOID:
            case DIST_UN_TANH:
                tol = (k == DIST_UN_TANH ? 7 : 3) * ulp_of(r) + FLT_MIN;   /* exp: 0 below -87 */
                dtol = (k == DIST_UN_TANH ? 16 : 4) * ulp_of(1.0) * dy[i]; /* 2 |y| err(y) */
                break;
            case DIST_UN_ELU:
            case DIST_UN_SELU:
                tol = 2 * ulp_of(fmax(fabs(r), 1.0));
                dtol = 2 * ulp_of(fmax(fabs(d * dy[i]), dy[i]));
                break;
            case DIST_UN_SOFTPLUS:
                tol = 8 * ulp_of(r) + FLT_MIN;
                dtol = 3 * ulp_of(d * dy[i]) + FLT_MIN;
                break;
            default:
                tol = (4 + 12 * fabs(u)) * ulp_of(fmax(fabs(r), 1e-30));
                dtol = 2 * ulp_of(fmax(fabs(d), 1.0)) * dy[i];
                break;
            }
            ck_assert_msg(fabs(y[0][i] - r) <= tol, "%s(%.9g) = %.9g, double %.9g", kinds[c].name,
                          (double)xi, (double)y[0][i], r);
            /* ELU's and SELU's kinks (the conventions, above); SeluGrad reads y < 0, which
             * is false where exp(x) - 1 rounds to 0 (|x| < 6e-8), and so is libdist's */
            if (xi == 0.0f || (k == DIST_UN_SELU && fabsf(xi) < 1e-7f)) continue;
            ck_assert_msg(fabs(dx[0][i] - d * dy[i]) <= dtol, "%s'(%.9g) dy = %.9g, double %.9g",
                          kinds[c].name, (double)xi, (double)dx[0][i], d * dy[i]);
        }
        /* the ends by value: zeros' signs, infinities, NaN */
        const float *ye = y[0] + G;
        if (k == DIST_UN_SIGMOID)
            ck_assert(ye[0] == 0.5f && ye[1] == 0.5f && ye[2] == 1.0f && ye[3] == 0.0f);
        if (k == DIST_UN_TANH)
            ck_assert(ye[0] == 0.0f && !signbit(ye[0]) && ye[1] == 0.0f && signbit(ye[1]) &&
                      ye[2] == 1.0f && ye[3] == -1.0f && ye[7] == nextafterf(4e-4f, 0) &&
                      ye[21] == 1.0f);
        if (k == DIST_UN_ELU) ck_assert(ye[1] == 0.0f && signbit(ye[1]) && ye[3] == -a);
        if (k == DIST_UN_SOFTPLUS)
            ck_assert(ye[2] == INFINITY && ye[3] == 0.0f && ye[21] == 3e38f && ye[22] == 0.0f);
        if (k == DIST_UN_GELU_TANH) /* +inf * 1; -inf * 0 (as 0.5 x (1 + tanh u)); -0 */
            ck_assert(ye[2] == INFINITY && isnan(ye[3]) && ye[1] == 0.0f && signbit(ye[1]) &&
                      ye[21] == 3e38f && ye[22] == 0.0f && isfinite(dx[0][G + 22]));
        /* NaN stays NaN; ELU's and SELU's gradients pass dy there (EluGrad's and SeluGrad's
         * y < 0 test is false), the others give NaN */
        const int nan_grad = k != DIST_UN_ELU && k != DIST_UN_SELU;
        ck_assert_msg(isnan(ye[4]) && (isnan(dx[0][G + 4]) != 0) == nan_grad,
                      "%s(NaN) = %g, gradient %g", kinds[c].name, (double)ye[4],
                      (double)dx[0][G + 4]);
    }
}
END_TEST

/* Softmax's row as ops.h writes it down, in float32 with the backend's own exp
 * (cpu_vmath.h): the maximum, e = exp(x - m), the sum of e in the lane order, e * (1 / s).
 * Compiled without contraction, as the backend's loops are. */
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
static void softmax_row_reference(const float *x, float *y, int k) {
    float m = x[0];
    for (int j = 1; j < k; j++)
        if (x[j] > m) m = x[j];
    float lane[16] = {0};
    for (int j = 0; j < k; j++) {
        y[j] = cpu_exp_neg_f32(x[j] - m);
        lane[j % 16] += y[j];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int l = 0; l < w; l++) lane[l] += lane[l + w];
    const float inv = 1.0f / lane[0];
    for (int j = 0; j < k; j++) y[j] *= inv;
}
#pragma GCC pop_options

/* Softmax and its gradient (cpu_softmax.c: float32 vector exp, sums in ops.h's lane order) on
 * 300 rows of 37: each element within 4e-7 relative of exp(x - m) / sum in double, x - m the
 * float32 difference ops.h names (exp to ~1 ulp, the float32 sum), and bitwise ops.h's float32
 * formula (softmax_row_reference: the lane order, the reciprocal); -inf logits give 0, a NaN
 * logit a NaN row; the gradient bitwise (dy - s) y with s summed in the lane order (two
 * groups of 16 and 5 more); the same bits on 1 and 2 threads and in place */
START_TEST(test_softmax_matches_the_double_closed_form_on_any_thread_count_and_in_place) {
    enum { R = 300, K = 37 };
    static float x[R * K], y[2][R * K], inplace[R * K];
    uint32_t seed = 7u;
    for (int i = 0; i < R * K; i++) /* logits in [-40, 40) */
        x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-24f * 80.0f - 40.0f;
    x[5 * K + 3] = -INFINITY, x[6 * K] = -INFINITY, x[7 * K + 36] = NAN;
    const int64_t shape[2] = {R, K};
    dist_op op = op_of(DIST_OPC_SOFTMAX, 0, 1, 1);
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        dist_tensor tx = dist_tensor_view(x, DIST_F32, 2, shape), ty = tx, tin = tx;
        ty.data = y[threads - 1], tin.data = inplace;
        const dist_tensor *in[1] = {&tx}, *iin[1] = {&tin};
        dist_tensor *out[1] = {&ty}, *iout[1] = {&tin};
        ck_assert_msg(dist_backend_run_op(be, &op, in, out) == DIST_OK, "%s", dist_last_error());
        memcpy(inplace, x, sizeof x);
        ck_assert_int_eq(dist_backend_run_op(be, &op, iin, iout), DIST_OK);
        ck_assert_int_eq(memcmp(inplace, y[threads - 1], sizeof inplace), 0);
        dist_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(y[0], y[1], sizeof y[0]), 0);
    for (int r = 0; r < R; r++) {
        const float *xr = x + r * K, *yr = y[0] + r * K;
        if (r == 7) {
            for (int j = 0; j < K; j++) ck_assert_msg(isnan(yr[j]), "row 7: y[%d] = %g", j, yr[j]);
            continue;
        }
        float exact[K]; /* bitwise: the lane order and the reciprocal, on every ISA copy */
        softmax_row_reference(xr, exact, K);
        ck_assert_msg(memcmp(yr, exact, sizeof exact) == 0, "row %d: not ops.h's bits", r);
        /* ops.h's exp(x - m) of the float32 difference */
        float m = -INFINITY;
        double s = 0.0;
        for (int j = 0; j < K; j++) m = xr[j] > m ? xr[j] : m;
        for (int j = 0; j < K; j++) s += exp((double)(xr[j] - m));
        for (int j = 0; j < K; j++) {
            const double want = exp((double)(xr[j] - m)) / s;
            ck_assert_msg(fabs(yr[j] - want) <= 4e-7 * want + 1e-38, "y[%d][%d] = %.9g, want %.9g",
                          r, j, (double)yr[j], want);
        }
    }
    ck_assert(y[0][5 * K + 3] == 0.0f && y[0][6 * K] == 0.0f);
    /* the gradient, (dy - sum(dy y)) y: the sum's float32 rounding, K terms of |dy y| <= y,
     * within 2K ulp of 1; the same bits on 1 and 2 threads and over dy */
    static float dy[R * K], dx[2][R * K];
    for (int i = 0; i < R * K; i++)
        dy[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) * 0x1p-23f - 1.0f;
    dist_op g = op_of(DIST_OPC_SOFTMAX_GRAD, 0, 2, 1);
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = dist_test_cpu_backend(threads);
        dist_tensor ty = dist_tensor_view(y[0], DIST_F32, 2, shape), tdy = ty, tdx = ty, tin = ty;
        tdy.data = dy, tdx.data = dx[threads - 1], tin.data = inplace;
        const dist_tensor *in[2] = {&ty, &tdy}, *iin[2] = {&ty, &tin};
        dist_tensor *out[1] = {&tdx}, *iout[1] = {&tin};
        ck_assert_msg(dist_backend_run_op(be, &g, in, out) == DIST_OK, "%s", dist_last_error());
        memcpy(inplace, dy, sizeof dy);
        ck_assert_int_eq(dist_backend_run_op(be, &g, iin, iout), DIST_OK);
        ck_assert_int_eq(memcmp(inplace, dx[threads - 1], sizeof inplace), 0);
        dist_backend_destroy(be);
    }
    ck_assert_int_eq(memcmp(dx[0], dx[1], sizeof dx[0]), 0);
    for (int r = 0; r < R; r++) {
        if (r == 7) continue; /* NaN */
        const float *yr = y[0] + r * K, *gr = dy + r * K;
        double s = 0.0;
        for (int j = 0; j < K; j++) s += (double)gr[j] * yr[j];
        /* ops.h's lane order, in float32: lane j mod 16, then the pairwise fold */
        float lane[16] = {0};
        for (int j = 0; j < K; j++) lane[j % 16] += gr[j] * yr[j];
        for (int w = 8; w >= 1; w /= 2)
            for (int l = 0; l < w; l++) lane[l] += lane[l + w];
        for (int j = 0; j < K; j++) {
            const float exact = (gr[j] - lane[0]) * yr[j];
            ck_assert_msg(memcmp(&dx[0][r * K + j], &exact, sizeof exact) == 0,
                          "dx[%d][%d] = %.9g, the lane order gives %.9g", r, j,
                          (double)dx[0][r * K + j], (double)exact);
            const double want = ((double)gr[j] - s) * yr[j];
            ck_assert_msg(fabs(dx[0][r * K + j] - want) <= 2.0 * K * 0x1p-24 * yr[j] + 1e-38,
                          "dx[%d][%d] = %.9g, want %.9g", r, j, (double)dx[0][r * K + j], want);
        }
    }
}
END_TEST

int main(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 2;
    if (dist_backend_create(&o, &g_be) != DIST_OK) return 1;
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("cpu_ops");
    tcase_add_test(tc, test_unary_ops_give_their_functions);
    tcase_add_test(tc, test_keras3_piecewise_activations_match_tensorflow);
    tcase_add_test(tc, test_unary_gradients_read_x_or_y);
    tcase_add_test(tc, test_keras_activations_match_tensorflow_formulas_and_derivatives);
    tcase_add_test(tc, test_gelu_matches_the_double_closed_form_on_any_thread_count_and_in_place);
    tcase_add_test(tc, test_transcendental_activations_match_their_formulas_and_double);
    tcase_add_test(tc,
                   test_softmax_matches_the_double_closed_form_on_any_thread_count_and_in_place);
    tcase_add_test(tc, test_binary_ops_broadcast_numpy_style);
    tcase_add_test(tc, test_nan_follows_tensorflow);
    tcase_add_test(tc, test_binary_gradients_sum_over_broadcast_axes);
    tcase_add_test(tc, test_reductions_over_masked_axes);
    tcase_add_test(tc, test_reduction_gradients_broadcast_back);
    tcase_add_test(tc, test_transpose_slice_pad_and_concat_move_elements);
    tcase_add_test(tc, test_avg_pool_counts_only_covered_positions);
    tcase_add_test(tc, test_softmax_and_its_gradients);
    tcase_add_test(tc, test_sigmoid_cross_entropy_and_mse_with_gradients);
    tcase_add_test(tc, test_bn_statistics_local_sums_moments_and_given);
    tcase_add_test(tc, test_bn_apply_normalizes_scales_and_shifts);
    tcase_add_test(tc, test_bn_gradient_sums_local_and_synchronized);
    tcase_add_test(tc, test_bn_input_gradient_matches_the_textbook_formula);
    tcase_add_test(tc, test_bn_over_many_rows_matches_double_loops_at_any_thread_count);
    tcase_add_test(tc, test_run_op_dispatches_the_misc_ops_too);
    tcase_add_test(tc, test_a_backend_without_the_op_refuses_naming_it);
    suite_add_tcase(s, tc);
    int rc = dist_test_run(s);
    dist_backend_destroy(g_be);
    return rc;
}