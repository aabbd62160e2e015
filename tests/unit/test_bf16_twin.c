/* Bfloat16 twins of the rounding pass (ROUND with aux, dist_be_round_bf16_twin): the twin holds
 * the bfloat16 rounding of every input bit for bit (nearest even, NaN kept quiet, -0, denormals,
 * Inf, overflow, ties), the rounded float32 output is the plain ROUND's; backends without the
 * kernel say they do not run it; a variable's autocast writes one, and a native product then
 * converts neither operand; a mixed_bfloat16 training step gives the same bits with twins on
 * and off (native bfloat16 forced).
 *
 * Needs AVX-512 (native bfloat16 matmuls): without it the program exits 77 (skipped), or fails
 * when DIST_REQUIRE_NATIVE_BF16=1 says the machine has it. */
#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "testutil.h"

#include <dist/dist.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static dist_backend *native_backend(int threads) {
    dist_backend *be = dist_test_cpu_backend(threads);
    ck_assert_msg(dist_cpu_backend_set_native_bf16(be, 1) == DIST_OK, "%s", dist_last_error());
    return be;
}

/* bfloat16 of float32 bits u, written out: nearest even on the upper half; a NaN keeps its
 * sign and upper payload with the quiet bit set. */
static uint16_t ref_bf16(uint32_t u) {
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u | 0x00400000u) >> 16);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint32_t bits_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* inputs and the bfloat16 each must give */
static const uint32_t special[][2] = {
    {0x00000000u, 0x0000u}, /* +0 */
    {0x80000000u, 0x8000u}, /* -0 */
    {0x00000001u, 0x0000u}, /* smallest denormal: down to +0 */
    {0x80000001u, 0x8000u}, /* ... negative: -0 */
    {0x00008000u, 0x0000u}, /* denormal tie, even below: down */
    {0x00018000u, 0x0002u}, /* denormal tie, odd below: up */
    {0x007fffffu, 0x0080u}, /* largest denormal: up to the smallest normal */
    {0x00412345u, 0x0041u}, /* a denormal kept a denormal */
    {0x3f808000u, 0x3f80u}, /* 1 + half an ulp: tie to even (down) */
    {0x3f818000u, 0x3f82u}, /* tie, odd below: up */
    {0x3f808001u, 0x3f81u}, /* just above the tie: up */
    {0x3f807fffu, 0x3f80u}, /* just below: down */
    {0xbf818000u, 0xbf82u}, /* negative tie: away from zero to even */
    {0x7f800000u, 0x7f80u}, /* +Inf */
    {0xff800000u, 0xff80u}, /* -Inf */
    {0x7f7fffffu, 0x7f80u}, /* FLT_MAX overflows to Inf */
    {0x7f7f7fffu, 0x7f7fu}, /* just below overflowing */
    {0x7f800001u, 0x7fc0u}, /* signalling NaN, low payload: quiet */
    {0xffa12345u, 0xffe1u}, /* negative signalling NaN: sign and upper payload kept */
    {0x7fc00000u, 0x7fc0u}, /* quiet NaN */
    {0x7fff0000u, 0x7fffu}, /* NaN with every payload bit of the upper half */
};
enum { NSPECIAL = sizeof special / sizeof *special };

START_TEST(test_the_twin_is_the_bfloat16_rounding_bit_for_bit) {
    /* one vector's worth, a tail, and (with two threads) several pieces of the threaded split */
    const int64_t sizes[] = {NSPECIAL, 16 * 5 + 7, 3 * 65536 + 37};
    for (int threads = 1; threads <= 2; threads++) {
        dist_backend *be = native_backend(threads);
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
            int64_t n = sizes[si];
            float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
            float *y_plain = malloc((size_t)n * 4);
            uint16_t *h = malloc((size_t)n * 2);
            uint64_t s = 21 + (uint64_t)si;
            for (int64_t i = 0; i < n; i++) {
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                uint32_t u = (uint32_t)(s >> 32);
                /* every bit pattern, and values near 1 with low bits at and around the tie */
                x[i] = (i & 1) ? from_bits(u) : from_bits(0x3f800000u | (u & 0x1ffffu));
            }
            /* the specials at the start, inside a later vector and in the tail */
            for (int k = 0; k < NSPECIAL; k++) {
                x[k % n] = from_bits(special[k][0]);
                if (n > 64) x[32 + k] = from_bits(special[k][0]);
                if (n > 2 * NSPECIAL) x[n - 1 - k] = from_bits(special[k][0]);
            }
            int64_t shape[1] = {n};
            dist_tensor tx = dist_tensor_view(x, DIST_F32, 1, shape);
            dist_tensor ty = dist_tensor_view(y, DIST_F32, 1, shape);
            dist_tensor tp = dist_tensor_view(y_plain, DIST_F32, 1, shape);
            memset(h, 0xa5, (size_t)n * 2);
            ck_assert_msg(dist_be_round_bf16_twin(be->iface, be->ctx, &tx, &ty, h) == DIST_OK, "%s",
                          dist_last_error());
            ck_assert_int_eq(dist_be_round(be->iface, be->ctx, &tx, DIST_BF16, &tp), DIST_OK);
            for (int64_t i = 0; i < n; i++) {
                uint32_t u = bits_of(x[i]);
                uint16_t want = ref_bf16(u);
                ck_assert_msg(h[i] == want,
                              "n %lld, %d threads: twin of 0x%08x at %lld is 0x%04x, want 0x%04x",
                              (long long)n, threads, u, (long long)i, h[i], want);
                /* the float32 output is the plain pass's, and holds the twin's value */
                ck_assert_msg(bits_of(y[i]) == bits_of(y_plain[i]),
                              "0x%08x at %lld: y 0x%08x, the plain round's 0x%08x", u, (long long)i,
                              bits_of(y[i]), bits_of(y_plain[i]));
                /* a bfloat16 value, whichever loop (vector body or tail) wrote it: a NaN's
                 * lower half zero too */
                ck_assert_msg(bits_of(y[i]) == (uint32_t)want << 16, "0x%08x: y 0x%08x", u,
                              bits_of(y[i]));
            }
            for (int k = 0; k < NSPECIAL; k++)
                ck_assert_msg(ref_bf16(special[k][0]) == special[k][1],
                              "the reference: 0x%08x gives 0x%04x, want 0x%04x", special[k][0],
                              ref_bf16(special[k][0]), special[k][1]);
            free(x), free(y), free(y_plain), free(h);
        }
        dist_backend_destroy(be);
    }
}
END_TEST

/* The CPU writes twins only while a native kernel may read them; a kernel table without the
 * twin's kernel (the tpu tracer's, CUDA's) runs no ROUND with aux, and a float16 ROUND takes
 * none. */
START_TEST(test_twins_are_offered_only_where_they_are_written_and_read) {
    dist_backend *be = native_backend(1);
    ck_assert_int_eq(dist_be_supports_round_twin(be->iface, be->ctx), 1);
    ck_assert_int_eq(dist_cpu_backend_set_bf16_twins(be, 0), DIST_OK);
    ck_assert_int_eq(dist_be_supports_round_twin(be->iface, be->ctx), 0);
    ck_assert_int_eq(dist_cpu_backend_set_bf16_twins(be, 1), DIST_OK);
    ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 0), DIST_OK);
    ck_assert_int_eq(dist_be_supports_round_twin(be->iface, be->ctx), 0);
    ck_assert_int_eq(dist_be_supports_code(be->iface, be->ctx, DIST_OPC_ROUND), 1);
    dist_backend_destroy(be);

    const dist_layer_kernels plain_only = {.round = cpu_round};
    unsigned char twin;
    dist_op op = {.code = DIST_OPC_ROUND, .dtype = DIST_BF16, .aux = &twin};
    ck_assert_int_eq(dist_layer_supports(&plain_only, &op), 0);
    op.aux = NULL;
    ck_assert_int_eq(dist_layer_supports(&plain_only, &op), 1);
    const dist_layer_kernels both = {.round = cpu_round, .round_bf16_twin = cpu_round_bf16_twin};
    op.aux = &twin;
    ck_assert_int_eq(dist_layer_supports(&both, &op), 1);
    op.dtype = DIST_F16;
    ck_assert_int_eq(dist_layer_supports(&both, &op), 0);
}
END_TEST

enum { B = 32, IN = 256, HID = 512, OUT = 128, STEPS = 3 };

static dist_tensor *host_tensor(dist_backend *be, int64_t r, int64_t c, const float *h) {
    int64_t shape[2] = {r, c};
    dist_tensor *t;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, 2, shape, &t), DIST_OK);
    ck_assert_int_eq(dist_backend_from_host(be, h, (size_t)(r * c) * 4, t), DIST_OK);
    return t;
}

/* STEPS steps of a two-Dense MLP (IN -> HID ReLU -> OUT) under mixed_bfloat16 as a Keras
 * layer runs it: the input and the float32 variables autocast to bfloat16, the loss the sum of
 * squares, plain SGD on the host. Native bfloat16 forced; twins on or off. Writes each step's
 * loss, the final weights, and the operand conversions the native products made. */
static void mlp_steps(int twins, float loss[STEPS], float *w1_out, float *w2_out, long *reorders,
                      long *twins_written) {
    dist_backend *be = native_backend(1);
    ck_assert_int_eq(dist_cpu_backend_set_bf16_twins(be, twins), DIST_OK);
    float *hx = malloc((size_t)B * IN * 4), *hw1 = malloc((size_t)IN * HID * 4);
    float *hw2 = malloc((size_t)HID * OUT * 4), *g1 = malloc((size_t)IN * HID * 4);
    float *g2 = malloc((size_t)HID * OUT * 4);
    uint64_t s = 31;
    for (int i = 0; i < B * IN; i++) hx[i] = dist_test_uniform(&s, -1.0f, 1.0f);
    for (int i = 0; i < IN * HID; i++) hw1[i] = dist_test_uniform(&s, -0.1f, 0.1f);
    for (int i = 0; i < HID * OUT; i++) hw2[i] = dist_test_uniform(&s, -0.1f, 0.1f);
    dist_tensor *x = host_tensor(be, B, IN, hx), *w1 = host_tensor(be, IN, HID, hw1);
    dist_tensor *w2 = host_tensor(be, HID, OUT, hw2);
    dist_tensor *gw1 = host_tensor(be, IN, HID, hw1), *gw2 = host_tensor(be, HID, OUT, hw2);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
    long r0 = dist_cpu_backend_bf16_operand_reorders(be);
    for (int step = 0; step < STEPS; step++) {
        dist_tape_reset(t);
        ck_assert_int_eq(dist_tape_watch(t, w1), DIST_OK);
        ck_assert_int_eq(dist_tape_watch(t, w2), DIST_OK);
        dist_tensor *xc, *w1c, *w2c, *h, *y, *sq, *l;
        ck_assert_int_eq(dist_op_cast(t, x, DIST_F32, DIST_BF16, &xc), DIST_OK);
        ck_assert_int_eq(dist_op_cast(t, w1, DIST_F32, DIST_BF16, &w1c), DIST_OK);
        ck_assert_int_eq(dist_op_cast(t, w2, DIST_F32, DIST_BF16, &w2c), DIST_OK);
        ck_assert_msg(dist_op_dense(t, xc, w1c, NULL, DIST_ACT_RELU, &h) == DIST_OK, "%s",
                      dist_last_error());
        ck_assert_int_eq(dist_op_dense(t, h, w2c, NULL, DIST_ACT_NONE, &y), DIST_OK);
        ck_assert_int_eq(dist_op_mul(t, y, y, &sq), DIST_OK);
        ck_assert_int_eq(dist_op_reduce_sum(t, sq, &l), DIST_OK);
        dist_tensor *srcs[2] = {w1, w2}, *grads[2] = {gw1, gw2};
        ck_assert_msg(dist_tape_gradient(t, l, 2, srcs, grads) == DIST_OK, "%s", dist_last_error());
        ck_assert_int_eq(dist_tape_read_scalar(t, l, &loss[step]), DIST_OK);
        ck_assert_int_eq(dist_backend_to_host(be, gw1, g1, (size_t)IN * HID * 4), DIST_OK);
        ck_assert_int_eq(dist_backend_to_host(be, gw2, g2, (size_t)HID * OUT * 4), DIST_OK);
        for (int i = 0; i < IN * HID; i++) hw1[i] -= 1e-4f * g1[i];
        for (int i = 0; i < HID * OUT; i++) hw2[i] -= 1e-4f * g2[i];
        ck_assert_int_eq(dist_backend_from_host(be, hw1, (size_t)IN * HID * 4, w1), DIST_OK);
        ck_assert_int_eq(dist_backend_from_host(be, hw2, (size_t)HID * OUT * 4, w2), DIST_OK);
    }
    *reorders = dist_cpu_backend_bf16_operand_reorders(be) - r0;
    *twins_written = dist_cpu_backend_bf16_twins_written(be);
    memcpy(w1_out, hw1, (size_t)IN * HID * 4);
    memcpy(w2_out, hw2, (size_t)HID * OUT * 4);
    dist_tape_destroy(t);
    dist_tensor *all[5] = {x, w1, w2, gw1, gw2};
    for (int i = 0; i < 5; i++) dist_backend_free_tensor(be, all[i]);
    free(hx), free(hw1), free(hw2), free(g1), free(g2);
    dist_backend_destroy(be);
}

START_TEST(test_a_mixed_step_gives_the_same_bits_with_twins_on_and_off) {
    float l_on[STEPS], l_off[STEPS];
    float *w1_on = malloc((size_t)IN * HID * 4), *w1_off = malloc((size_t)IN * HID * 4);
    float *w2_on = malloc((size_t)HID * OUT * 4), *w2_off = malloc((size_t)HID * OUT * 4);
    long re_on, re_off, tw_on, tw_off;
    mlp_steps(1, l_on, w1_on, w2_on, &re_on, &tw_on);
    mlp_steps(0, l_off, w1_off, w2_off, &re_off, &tw_off);
    for (int i = 0; i < STEPS; i++)
        ck_assert_msg(bits_of(l_on[i]) == bits_of(l_off[i]),
                      "step %d: loss %.9g with twins, %.9g without", i, l_on[i], l_off[i]);
    ck_assert_msg(l_on[STEPS - 1] != l_on[0], "the weights did not move");
    ck_assert_msg(memcmp(w1_on, w1_off, (size_t)IN * HID * 4) == 0, "w1 differs");
    ck_assert_msg(memcmp(w2_on, w2_off, (size_t)HID * OUT * 4) == 0, "w2 differs");
    /* each step's three autocasts (x, w1, w2) wrote twins, and the products converted none of
     * those three operands: forward x and w1, forward w2 (the backward's dw1 and dx2 then find
     * them ready as they find the forward's own copies); h and the gradients are converted
     * either way */
    ck_assert_int_eq(tw_on, 3 * STEPS);
    ck_assert_int_eq(tw_off, 0);
    ck_assert_msg(re_off - re_on == 3 * STEPS, "conversions: %ld with twins, %ld without", re_on,
                  re_off);
    free(w1_on), free(w1_off), free(w2_on), free(w2_off);
}
END_TEST

/* One native product of two autocast operands converts neither of them: the weight's and the
 * input's twins stand for the copies (a product of operands without twins converts both). */
START_TEST(test_a_native_product_of_autocast_operands_converts_neither) {
    for (int twins = 1; twins >= 0; twins--) {
        dist_backend *be = native_backend(1);
        ck_assert_int_eq(dist_cpu_backend_set_bf16_twins(be, twins), DIST_OK);
        float *hx = malloc((size_t)B * IN * 4), *hw = malloc((size_t)IN * HID * 4);
        uint64_t s = 41;
        for (int i = 0; i < B * IN; i++) hx[i] = dist_test_uniform(&s, -1.0f, 1.0f);
        for (int i = 0; i < IN * HID; i++) hw[i] = dist_test_uniform(&s, -1.0f, 1.0f);
        dist_tensor *x = host_tensor(be, B, IN, hx), *w = host_tensor(be, IN, HID, hw);
        dist_tape *t;
        ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
        ck_assert_int_eq(dist_tape_set_compute_precision(t, DIST_BF16), DIST_OK);
        dist_tensor *xc, *wc, *y;
        ck_assert_int_eq(dist_op_cast(t, x, DIST_F32, DIST_BF16, &xc), DIST_OK);
        ck_assert_int_eq(dist_op_cast(t, w, DIST_F32, DIST_BF16, &wc), DIST_OK);
        long r0 = dist_cpu_backend_bf16_operand_reorders(be);
        ck_assert_int_eq(dist_op_matmul(t, xc, wc, 0, 0, &y), DIST_OK);
        long conversions = dist_cpu_backend_bf16_operand_reorders(be) - r0;
        ck_assert_msg(conversions == (twins ? 0 : 2), "twins %d: %ld conversions", twins,
                      conversions);
        ck_assert_msg(dist_test_cpu_kernel_count(be, "matmul", dist_test_bf16_kernel_here()) == 1,
                      "twins %d: the product did not run natively", twins);
        dist_tape_destroy(t);
        dist_backend_free_tensor(be, x);
        dist_backend_free_tensor(be, w);
        free(hx), free(hw);
        dist_backend_destroy(be);
    }
}
END_TEST

/* A model's autocast writes twins for the variables products read, not for an Embedding's
 * table (only a gather reads it): Embedding(50, 32) then Dense(64) write one twin, the Dense
 * kernel's (the bias is 1-D, no product's operand). */
START_TEST(test_the_model_autocasts_an_embedding_table_without_a_twin) {
    dist_model *m;
    ck_assert_int_eq(dist_model_create(NULL, &m), DIST_OK);
    ck_assert_int_eq(dist_model_add_embedding(m, 50, 32), DIST_OK);
    ck_assert_int_eq(dist_model_add_dense(m, 64, DIST_ACT_NONE), DIST_OK);
    ck_assert_int_eq(dist_model_set_input_dtype(m, DIST_I32), DIST_OK);
    int64_t steps[1] = {5};
    ck_assert_int_eq(dist_model_build(m, 1, steps, 7), DIST_OK);
    ck_assert_int_eq(dist_model_set_dtype_policy(m, DIST_POLICY_MIXED_BFLOAT16), DIST_OK);
    dist_backend *be = dist_model_backend(m, 0);
    ck_assert_int_eq(dist_cpu_backend_set_native_bf16(be, 1), DIST_OK);
    dist_tape *t;
    ck_assert_int_eq(dist_tape_create(be, &t), DIST_OK);
    int32_t ids[10] = {3, 3, 0, 49, 3, 1, 2, 3, 4, 0};
    int64_t xs[2] = {2, 5};
    dist_tensor hx = dist_tensor_view(ids, DIST_I32, 2, xs), *x, *y;
    ck_assert_int_eq(dist_tape_upload(t, &hx, &x), DIST_OK);
    ck_assert_msg(dist_model_call(m, t, x, &y) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_cpu_backend_bf16_twins_written(be), 1);
    dist_tape_destroy(t);
    dist_model_destroy(m);
}
END_TEST

int main(void) {
    int skip = dist_test_skip_without_native_bf16();
    if (skip) return skip;
    Suite *s = suite_create("bf16_twin");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_the_twin_is_the_bfloat16_rounding_bit_for_bit);
    tcase_add_test(tc, test_twins_are_offered_only_where_they_are_written_and_read);
    tcase_add_test(tc, test_a_native_product_of_autocast_operands_converts_neither);
    tcase_add_test(tc, test_a_mixed_step_gives_the_same_bits_with_twins_on_and_off);
    tcase_add_test(tc, test_the_model_autocasts_an_embedding_table_without_a_twin);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
