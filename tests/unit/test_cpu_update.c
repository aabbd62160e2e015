/* The CPU backend's optimizer updates (src/backend/cpu/cpu_update.c) against scalar references
 * written here: the same bits for Adam and SGD (plain, momentum, Nesterov) at every length
 * around the vector widths and on 1 and 2 threads, a double-precision Adam within float
 * rounding, and non-finite gradients carried through as the scalar rule carries them. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static float frand(unsigned *s) {
    *s = *s * 1664525u + 1013904223u;
    return (float)((*s >> 8) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

static void fill(float *x, size_t n, unsigned seed, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = scale * frand(&seed);
}

/* Keras's Adam step in float, written as the rule is stated (m, v, then the parameter) */
static void adam_ref(const dist_adam_desc *d, float *p, const float *g, float *m, float *v,
                     size_t n) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * d->grad_scale;
        m[i] = m[i] + (gi - m[i]) * (1.0f - d->beta1);
        v[i] = v[i] + (gi * gi - v[i]) * (1.0f - d->beta2);
        p[i] = p[i] - d->lr * m[i] / (sqrtf(v[i]) + d->epsilon);
    }
}

static const size_t lengths[] = {0, 1, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 1000, 40003, 65536};

static void check_adam(int threads) {
    dist_backend *be = dist_test_cpu_backend(threads);
    const dist_adam_desc d = {
        .lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .epsilon = 1e-7f, .grad_scale = 0.5f};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        size_t n = lengths[li], bytes = (n ? n : 1) * sizeof(float);
        float *p = malloc(bytes), *g = malloc(bytes), *m = malloc(bytes), *v = malloc(bytes);
        float *p2 = malloc(bytes), *m2 = malloc(bytes), *v2 = malloc(bytes);
        double *pd = malloc((n ? n : 1) * sizeof(double));
        fill(p, n, 1u + (unsigned)n, 0.3f);
        fill(m, n, 2u + (unsigned)n, 0.01f);
        fill(v, n, 3u + (unsigned)n, 1e-4f);
        for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        memcpy(p2, p, n * sizeof *p);
        memcpy(m2, m, n * sizeof *m);
        memcpy(v2, v, n * sizeof *v);
        for (size_t i = 0; i < n; i++) pd[i] = p[i];
        /* three steps with fresh gradients, each compared bit for bit */
        for (int step = 0; step < 3; step++) {
            fill(g, n, 100u * (unsigned)step + (unsigned)n, 0.05f);
            for (size_t i = 0; i < n; i++) {
                double gi = (double)g[i] * d.grad_scale;
                double mi = m2[i] + (gi - m2[i]) * (1.0 - (double)d.beta1);
                double vi = v2[i] + (gi * gi - v2[i]) * (1.0 - (double)d.beta2);
                pd[i] -= (double)d.lr * mi / (sqrt(vi) + (double)d.epsilon);
            }
            ck_assert_int_eq(dist_be_adam_update(be->iface, be->ctx, &d, p, g, m, v, n), DIST_OK);
            adam_ref(&d, p2, g, m2, v2, n);
            for (size_t i = 0; i < n; i++) {
                if (memcmp(&p[i], &p2[i], 4) || memcmp(&m[i], &m2[i], 4) ||
                    memcmp(&v[i], &v2[i], 4))
                    ck_abort_msg("adam n=%zu threads=%d step %d element %zu: %.9g/%.9g/%.9g, "
                                 "reference %.9g/%.9g/%.9g",
                                 n, threads, step, i, p[i], m[i], v[i], p2[i], m2[i], v2[i]);
                /* the float rule stays within float rounding of the double one */
                ck_assert_msg(fabs(p[i] - pd[i]) <= 1e-6 * (fabs(pd[i]) + 1e-3),
                              "adam n=%zu element %zu: %.9g, double %.12g", n, i, p[i], pd[i]);
            }
        }
        free(p), free(g), free(m), free(v), free(p2), free(m2), free(v2), free(pd);
    }
    dist_backend_destroy(be);
}

START_TEST(test_adam_matches_scalar_rule_bit_for_bit_one_thread) { check_adam(1); }
END_TEST

START_TEST(test_adam_matches_scalar_rule_bit_for_bit_two_threads) { check_adam(2); }
END_TEST

START_TEST(test_adam_carries_non_finite_gradients_like_the_scalar_rule) {
    dist_backend *be = dist_test_cpu_backend(1);
    const dist_adam_desc d = {
        .lr = 1e-2f, .beta1 = 0.9f, .beta2 = 0.999f, .epsilon = 1e-7f, .grad_scale = 1.0f};
    enum { N = 19 }; /* a vector body and a scalar tail */
    float p[N], g[N], m[N], v[N], p2[N], m2[N], v2[N];
    for (int i = 0; i < N; i++) {
        p[i] = p2[i] = 0.5f;
        m[i] = m2[i] = 0.0f;
        v[i] = v2[i] = 0.0f;
        g[i] = i % 5 == 0 ? NAN : i % 5 == 1 ? INFINITY : i % 5 == 2 ? 0.0f : -1e30f;
    }
    ck_assert_int_eq(dist_be_adam_update(be->iface, be->ctx, &d, p, g, m, v, N), DIST_OK);
    adam_ref(&d, p2, g, m2, v2, N);
    for (int i = 0; i < N; i++) {
        ck_assert_msg(!memcmp(&p[i], &p2[i], 4), "element %d (g %g): %g, reference %g", i, g[i],
                      p[i], p2[i]);
        if (i % 5 == 0) ck_assert(isnan(p[i]));
        if (i % 5 == 2) ck_assert(p[i] == 0.5f); /* a zero gradient on zero slots moves nothing */
    }
    dist_backend_destroy(be);
}
END_TEST

static void check_sgd(float momentum, int nesterov, int threads) {
    dist_backend *be = dist_test_cpu_backend(threads);
    const dist_sgd_desc d = {
        .lr = 0.05f, .momentum = momentum, .nesterov = nesterov, .grad_scale = 0.25f};
    for (size_t li = 0; li < sizeof lengths / sizeof *lengths; li++) {
        size_t n = lengths[li], bytes = (n ? n : 1) * sizeof(float);
        float *p = malloc(bytes), *g = malloc(bytes), *mo = malloc(bytes);
        float *p2 = malloc(bytes), *mo2 = malloc(bytes);
        fill(p, n, 7u + (unsigned)n, 0.3f);
        fill(mo, n, 8u + (unsigned)n, 0.01f);
        memcpy(p2, p, n * sizeof *p);
        memcpy(mo2, mo, n * sizeof *mo);
        for (int step = 0; step < 2; step++) {
            fill(g, n, 50u + (unsigned)step + (unsigned)n, 0.1f);
            ck_assert_int_eq(
                dist_be_sgd_update(be->iface, be->ctx, &d, p, g, momentum != 0.0f ? mo : NULL, n),
                DIST_OK);
            for (size_t i = 0; i < n; i++) { /* Keras's SGD rule */
                float gi = g[i] * d.grad_scale;
                if (momentum == 0.0f) {
                    p2[i] -= d.lr * g[i] * d.grad_scale;
                    continue;
                }
                float vel = momentum * mo2[i] - d.lr * gi;
                mo2[i] = vel;
                p2[i] += nesterov ? momentum * vel - d.lr * gi : vel;
            }
            for (size_t i = 0; i < n; i++)
                if (memcmp(&p[i], &p2[i], 4) || (momentum != 0.0f && memcmp(&mo[i], &mo2[i], 4)))
                    ck_abort_msg("sgd momentum %g nesterov %d n=%zu threads %d element %zu: %.9g, "
                                 "reference %.9g",
                                 momentum, nesterov, n, threads, i, p[i], p2[i]);
        }
        free(p), free(g), free(mo), free(p2), free(mo2);
    }
    dist_backend_destroy(be);
}

START_TEST(test_sgd_matches_scalar_rules) {
    for (int threads = 1; threads <= 2; threads++) {
        check_sgd(0.0f, 0, threads);
        check_sgd(0.9f, 0, threads);
        check_sgd(0.9f, 1, threads);
    }
}
END_TEST

START_TEST(test_sgd_momentum_without_buffer_is_an_error) {
    dist_backend *be = dist_test_cpu_backend(1);
    const dist_sgd_desc d = {.lr = 0.1f, .momentum = 0.9f, .grad_scale = 1.0f};
    float p[4] = {0}, g[4] = {1, 1, 1, 1};
    ck_assert_int_eq(dist_be_sgd_update(be->iface, be->ctx, &d, p, g, NULL, 4),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "momentum buffer"));
    ck_assert(p[0] == 0.0f);
    dist_backend_destroy(be);
}
END_TEST

/* The vector paths are the ones under test: on x86-64 they must be the ones taken. */
START_TEST(test_updates_use_vectors_on_x86_64) {
#if defined(__x86_64__)
    ck_assert_int_ge(cpu_update_vector_width(), 4);
#else
    ck_assert_int_eq(cpu_update_vector_width(), 1);
#endif
}
END_TEST

int main(void) {
    Suite *s = suite_create("cpu_update");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_adam_matches_scalar_rule_bit_for_bit_one_thread);
    tcase_add_test(tc, test_adam_matches_scalar_rule_bit_for_bit_two_threads);
    tcase_add_test(tc, test_adam_carries_non_finite_gradients_like_the_scalar_rule);
    tcase_add_test(tc, test_sgd_matches_scalar_rules);
    tcase_add_test(tc, test_sgd_momentum_without_buffer_is_an_error);
    tcase_add_test(tc, test_updates_use_vectors_on_x86_64);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
