/* The CPU backend's private state, shared by its files. */
#ifndef DIST_BACKEND_CPU_INTERNAL_H
#define DIST_BACKEND_CPU_INTERNAL_H

#include "backend/backend.h"
#include "backend/layer_ops.h"

#include <dnnl.h>
#include <immintrin.h>

/* One cached oneDNN primitive with everything it needs to run without allocating: its memory
 * objects (data handles swapped per call), reorders for weights, and a user scratchpad. */
typedef struct cpu_prim {
    unsigned char key[256];
    dnnl_primitive_t prim;
    dnnl_primitive_t reorder_in; /* plain weights -> the primitive's weights layout */
    /* the primitive's diff-weights layout -> plain; for a forward or backward-data whose kernel
     * runs in a layout of its own (cpu_dnnl.c's blocked_twin, any_layouts), its y or dx from
     * buf[4] / buf[3] into the tensor's layout */
    dnnl_primitive_t reorder_out;
    /* where oneDNN has no fast kernel for an activation's own layout: x and dy -> copies in the
     * kernel's layout in buf[3] / buf[4] (mem[8..11]) */
    dnnl_primitive_t reorder_x, reorder_dy;
    dnnl_memory_t mem[12];
    /* scratch: reordered weights, reordered diff weights, scratchpad, x or dx and dy or y in
     * the kernel's layout */
    void *buf[5];
    size_t workspace_bytes;
    const char *impl;  /* oneDNN implementation name, e.g. "jit:avx512_core" */
    unsigned winograd; /* impl is a Winograd kernel (counted in cpu_ctx.winograd_runs) */
    /* native bfloat16 convolutions: the kernel takes x (bit 0) / dy (bit 1) in the tensor's own
     * layout, so the tape's shared copies (dist_conv2d_desc.x_bf16, dy_bf16) fit it */
    unsigned own_layout;
    /* a forward convolution whose output is plain NHWC although the blocked layout was
     * preferred (oneDNN had only its reference code for the blocked one: a 3-channel stem) */
    unsigned plain_out;
} cpu_prim;

#define CPU_PRIM_CACHE 48

enum { CPU_BF16_OFF = 0, CPU_BF16_NATIVE = 1, CPU_BF16_MEASURE = 2 };

/* One distinct bf16 call under CPU_BF16_MEASURE (cpu_bf16_choice.c): its key, the best time of
 * each path (index 1: native bfloat16, 0: float32 on rounded values), and the decision. */
#define CPU_BF16_CHOICES 96
typedef struct cpu_bf16_choice {
    unsigned char key[256];
    int calls;
    int decided, native;
    double best[2];
    long runs[2];
} cpu_bf16_choice;

/* One call being measured: cpu_bf16_choose fills it, cpu_bf16_measured reads it. */
typedef struct cpu_bf16_trial {
    int entry; /* -1: not measured */
    int native, timed;
    double t0;
} cpu_bf16_trial;

typedef struct cpu_ctx {
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    int threads;
    /* Channel block of the activations kept between kernels: 16 where oneDNN runs AVX-512,
     * 8 on AVX2 (its kernels there are written for nChw8c; nChw16c falls back to ref:any,
     * ~1000x slower), 0 (plain NHWC) below that. */
    int block;
    /* Convolutions and large matmuls marked bf16 (mixed_bfloat16): CPU_BF16_OFF, the float32
     * kernels on the rounded values; CPU_BF16_NATIVE, oneDNN's native bfloat16 kernels;
     * CPU_BF16_MEASURE, whichever of the two measured faster for each distinct call
     * (cpu_bf16_choice.c; the default where oneDNN dispatches to AVX512_BF16 or AMX, see
     * cpu_dnnl_native_bf16_default). */
    int native_bf16;
    /* ROUND writes bfloat16 twins (dist_be_round_bf16_twin) where native_bf16 is not off: 1,
     * the default; tests turn it off to compare (dist_cpu_backend_set_bf16_twins) */
    int bf16_twins;
    long bf16_twins_written; /* rounding passes that wrote one (tests) */
    /* f32 -> bf16 reorders of native passes' operands: those a kept copy or twin spared are not
     * counted (tests check a twin spares the conversion) */
    long bf16_operand_reorders;
    int nchoices;
    cpu_bf16_choice choices[CPU_BF16_CHOICES];
    long bf16_native_chosen, bf16_rounding_chosen; /* keys decided either way */
    /* float32 convolution forwards on oneDNN's Winograd kernel (F(4x4, 3x3), AVX-512) where
     * it has one for the shape, else the direct one: DIST_CPU_WINOGRAD=1 (0, the default: the
     * direct kernels TensorFlow runs). 1.75x faster at the seed CNN's second convolution,
     * outputs as accurate but not the same bits (cpu_dnnl.c). */
    int winograd;
    long winograd_runs; /* forwards that ran on it (tests) */
    /* cpu_conv1_pool_backward_filter runs (1, the default); tests turn it off to compare */
    int fused_pool_filter;
    long fused_pool_filter_runs; /* times it ran (tests check the tape takes the fused path) */
    long conv_pool_forward_runs; /* times cpu_conv_pool_forward ran (likewise) */
    long conv1_cvt_rounding;     /* threads of the fused first layer that rounded with
                                  * vcvtneps2bf16 (cpu_conv1.c; tests) */
    /* the kernel that ran the last convolution pass through cpu_conv2d_*: oneDNN's
     * implementation name ("ref:" for its reference loops) or the own kernel's (tests) */
    const char *conv_impl;
    int nprims;
    cpu_prim prims[CPU_PRIM_CACHE];
    int next_evict;
    /* cpu_conv1.c's partial sums, grown on first use of a shape (steady state: no allocation) */
    float *conv1_part;
    size_t conv1_part_n;
    /* cpu_conv_pool.c's scratch (the kernel rearranged, partials, lists), grown likewise */
    float *conv_pool_buf;
    size_t conv_pool_n;
    /* cpu_conv_pool_forward's scratch: the cropped input and the convolution's output */
    float *conv_fwd_buf;
    size_t conv_fwd_n;
    /* cpu_batch_matmul.c's primitive cache, made on first use (NULL before) */
    struct cpu_bmm_cache *bmm;
    /* ATTENTION and ATTENTION_GRAD run (1, the default); tests turn them off to compare with
     * the tape's three ops. cpu_attention.c's scratch (a few batch elements' scores), grown on
     * first use of a shape */
    int fused_attention;
    long fused_attention_runs;   /* forwards and gradients run (tests) */
    long fused_attention_chunks; /* forward chunks run (tests: the batch was cut) */
    float *att_buf;
    size_t att_n;
} cpu_ctx;

struct cpu_ctx;
/* Whether a bf16 call whose kernel cache key is `key` runs natively (1) or in float32 on the
 * rounded values (0); under CPU_BF16_MEASURE it starts *t's measurement, which the caller ends
 * with cpu_bf16_measured after the call (what: the op's name for the log; a, b: its operands). */
int cpu_bf16_choose(struct cpu_ctx *c, const void *key, size_t key_bytes, cpu_bf16_trial *t);
void cpu_bf16_measured(struct cpu_ctx *c, const cpu_bf16_trial *t, dist_status st, const char *what,
                       const dist_tensor *a, const dist_tensor *b);
/* The backend's mode for a strategy's `deterministic` option: a measured choice would make the
 * order of the sums depend on timings, so deterministic runs take the rule (CPU_BF16_NATIVE
 * where the ISA has bfloat16). */
int cpu_bf16_mode_for(int deterministic);
/* For tests and logs: the mode (CPU_BF16_*) and how many distinct calls chose each path. */
dist_status dist_cpu_backend_bf16_choices(const dist_backend *backend, int *mode,
                                          long *native_chosen, long *rounding_chosen);
/* The i-th decided call: each path's best time in seconds, the choice, and the calls that ran
 * each path (runs[1] native, runs[0] float32 on rounded values). DIST_NOT_FOUND past the end or
 * while still measuring. */
dist_status dist_cpu_backend_bf16_choice(const dist_backend *backend, int i, double *native_s,
                                         double *rounding_s, int *native, long runs[2]);

/* Sixteen floats rounded to bfloat16 precision (nearest even; NaN kept, quiet, its lower half
 * zero as vcvtneps2bf16 leaves it), as cpu_round.c
 * rounds them, for the AVX-512 loops that round in registers. */
__attribute__((target("avx512f,avx512bw,avx512vl"))) static inline __m512
cpu_round_bf16_512(__m512 v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r =
        _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)),
                         _mm512_set1_epi32((int)0xffff0000u));
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_mov_epi32(r, nan,
                              _mm512_and_si512(_mm512_or_si512(u, _mm512_set1_epi32(0x00400000)),
                                               _mm512_set1_epi32((int)0xffff0000u)));
    return _mm512_castsi512_ps(r);
}

/* Sets flush-to-zero and denormals-are-zero on the calling thread. */
void dist_cpu_set_flush_denormals(void);

dist_status cpu_dnnl_check(dnnl_status_t s, const char *what);
/* The channel block for the ISA oneDNN dispatches to on this processor (see cpu_ctx.block). */
int cpu_dnnl_activation_block(void);
/* Whether oneDNN's effective ISA (the CPU's, lowered by ONEDNN_MAX_CPU_ISA) includes `need`;
 * the own kernels' flags (cpu_has_*) keep to it too, so a run capped at AVX2 runs their AVX2
 * copies as oneDNN runs its AVX2 kernels. */
int cpu_dnnl_isa_allows(dnnl_cpu_isa_t need);
/* 1 when oneDNN runs bfloat16 convolutions natively here (its ISA includes AVX512_BF16: Cooper
 * Lake, Sapphire Rapids and later with AMX, AMD Zen 4 and later) and DIST_CPU_NATIVE_BF16 is
 * not 0. Plain AVX-512 only emulates bfloat16 (3-4x slower than float32), AVX2 has none. */
int cpu_dnnl_native_bf16_default(void);
/* For tests: the kernel that ran the backend's last convolution pass (forward, backward-data or
 * backward-filter): oneDNN's implementation name, which starts with "ref:" for its reference
 * loops, or "libdist:" and the file for the own kernels; NULL before any, or for a backend that
 * is not the CPU's. A static string. */
const char *dist_cpu_backend_last_conv_impl(const dist_backend *backend);
/* For tests: native bfloat16 convolutions on (1) or off (0) for this backend. On also works
 * on plain AVX-512, where oneDNN emulates the instructions (same results, slower); it fails
 * with DIST_UNSUPPORTED below AVX-512, where oneDNN has no bfloat16 convolution. */
dist_status dist_cpu_backend_set_native_bf16(dist_backend *backend, int on);
/* For tests: ROUND's bfloat16 twins on (1, the default) or off (0) for this backend, and the
 * counters of twins written and of operand conversions native passes made (-1: not a CPU
 * backend). */
dist_status dist_cpu_backend_set_bf16_twins(dist_backend *backend, int on);
long dist_cpu_backend_bf16_twins_written(const dist_backend *backend);
long dist_cpu_backend_bf16_operand_reorders(const dist_backend *backend);
/* DIST_CPU_WINOGRAD's setting, and the setter and run counter tests use (cpu_dnnl.c). */
int cpu_dnnl_winograd_default(void);
dist_status dist_cpu_backend_set_winograd(dist_backend *backend, int on);
long dist_cpu_backend_winograd_runs(const dist_backend *backend);

/* oneDNN-backed kernels (cpu_dnnl.c) */
dist_status cpu_conv2d_forward(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                               const dist_tensor *w, const dist_tensor *b, dist_tensor *y);
dist_status cpu_conv2d_backward_data(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                                     const dist_tensor *w, dist_tensor *dx);
dist_status cpu_conv2d_backward_filter(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                       const dist_tensor *dy, dist_tensor *dw, dist_tensor *db);
/* The max pool's workspace: one byte per output, the arg-max's offset in the window (ARG) and
 * whether the pooled value is > 0 (POS). cpu_conv1.c's fused backward reads it too. */
#define CPU_POOL_WS_POS 0x80
#define CPU_POOL_WS_ARG 0x7f
dist_status cpu_max_pool2d_workspace_bytes(void *ctx, const dist_pool2d_desc *d,
                                           const dist_tensor *x, size_t *bytes);
dist_status cpu_max_pool2d_forward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                   dist_tensor *y, void *workspace);
dist_status cpu_max_pool2d_backward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                    const dist_tensor *dy, const void *workspace, dist_tensor *dx);
dist_status cpu_matmul(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                       const dist_tensor *b, float beta, dist_tensor *c);
/* matmul under mixed_bfloat16 (backend.h): bfloat16 copies of a and b where native_bf16 is
 * set and the product is large enough to gain, else cpu_matmul. */
dist_status cpu_matmul_bf16(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                            const dist_tensor *b, float beta, dist_tensor *c,
                            const dist_bf16_copy *a_copy, const dist_bf16_copy *b_copy);
dist_status cpu_to_layout(void *ctx, const dist_tensor *src, dist_tensor *dst);
/* cpu_update.c: the optimizers' element-wise updates, vectorized (the same bits in every width) */
dist_status cpu_adam_update(void *ctx, const dist_adam_desc *d, float *param, const float *grad,
                            float *m, float *v, size_t n);
dist_status cpu_sgd_update(void *ctx, const dist_sgd_desc *d, float *param, const float *grad,
                           float *mom, size_t n);
/* 8 (AVX), 4 (SSE2) or 1: the lanes the updates use on this CPU */
int cpu_update_vector_width(void);
/* The CPU runs AVX2 and FMA (the own convolution kernels' instructions); cached. cpu_round.c.
 * These three also keep to oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA): capped at AVX2, the own
 * kernels run their AVX2 copies. */
int cpu_has_avx2_fma(void);
/* AVX-512 F, BW and VL (the own AVX-512 loops' instructions); cached. cpu_round.c. */
int cpu_has_avx512_bw_vl(void);
/* ... and AVX512_BF16 (vcvtneps2bf16, vdpbf16ps) beside it; cached. cpu_round.c. */
int cpu_has_avx512_bf16(void);
/* cpu_conv1.c: backward-filter of a 3x3 convolution of a one-channel input (see the file). */
int cpu_conv1_backward_filter_applies(const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, const dist_tensor *dw);
dist_status cpu_conv1_backward_filter(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, dist_tensor *dw, dist_tensor *db);
/* cpu_conv1.c: the same filter and bias gradients when the convolution (ReLU fused) feeds a 2x2 /
 * stride 2 max pool, read straight from the pool's output gradient and workspace (the
 * backend's conv2d_relu_pool_backward_filter entry). */
dist_status cpu_conv1_pool_backward_filter(void *ctx, const dist_conv2d_desc *cd,
                                           const dist_pool2d_desc *pd, const dist_tensor *x,
                                           const dist_tensor *dy, const void *workspace,
                                           dist_tensor *dw, dist_tensor *db, int *done);
/* ... and the forward: y = max_pool(round(ReLU(conv(x, w) + b))) and the pool's workspace,
 * without writing the convolution's output (conv2d_relu_pool_forward). */
dist_status cpu_conv1_pool_forward(void *ctx, const dist_conv2d_desc *cd,
                                   const dist_pool2d_desc *pd, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *b, dist_dtype round_to,
                                   int need_dx, dist_tensor *y, void *workspace, void *y_bf16,
                                   int *done);
/* For tests: the fused entries above on (1, the default) or off (0) for this backend, and how
 * many times it ran (-1: not a CPU backend). */
dist_status dist_cpu_backend_set_fused_pool_filter(dist_backend *backend, int on);
long dist_cpu_backend_fused_pool_filter_runs(const dist_backend *backend);
/* For tests: how many times cpu_conv_pool_forward ran (-1: not a CPU backend). */
long dist_cpu_backend_conv_pool_forward_runs(const dist_backend *backend);
/* cpu_conv_pool.c: all gradients of a 3x3 convolution (ReLU fused) followed by a 2x2 / stride 2
 * max pool, from the pool's output gradient and workspace (conv2d_relu_pool_backward). *lanes:
 * the vector width it would use (16, 8), 0 where it declines. */
int cpu_conv_pool_backward_applies(const dist_conv2d_desc *cd, const dist_pool2d_desc *pd,
                                   const dist_tensor *x, const dist_tensor *w,
                                   const dist_tensor *dy, int *lanes);
/* ... and its forward where x needs a gradient (conv2d_relu_pool_forward with need_dx): the
 * convolution over only the rows and columns the pool reads, rounded to round_to, pooled. */
dist_status cpu_conv_pool_forward(cpu_ctx *c, const dist_conv2d_desc *cd,
                                  const dist_pool2d_desc *pd, const dist_tensor *x,
                                  const dist_tensor *w, const dist_tensor *b, dist_dtype round_to,
                                  dist_tensor *p, void *workspace, int *done);
dist_status cpu_conv_pool_backward(void *ctx, const dist_conv2d_desc *cd,
                                   const dist_pool2d_desc *pd, const dist_tensor *x,
                                   const dist_tensor *w, const dist_tensor *dy,
                                   const void *workspace, dist_tensor *dx, dist_tensor *dw,
                                   dist_tensor *db, int *done);
/* cpu_conv2.c: backward-filter of 3-wide convolutions with several input channels on AVX2. */
int cpu_conv2_backward_filter_applies(const cpu_ctx *c, const dist_conv2d_desc *d,
                                      const dist_tensor *x, const dist_tensor *dy,
                                      const dist_tensor *dw);
dist_status cpu_conv2_backward_filter(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                      const dist_tensor *dy, dist_tensor *dw, dist_tensor *db);
/* cpu_conv2.c: forward (bias and ReLU fused) of convolutions with several input channels and
 * output channels a multiple of 32 on AVX2, writing y in y_layout. */
int cpu_conv2_forward_applies(const cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                              const dist_tensor *w, const dist_tensor *b, const dist_tensor *y,
                              dist_layout y_layout);
dist_status cpu_conv2_forward(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                              const dist_tensor *w, const dist_tensor *b, dist_tensor *y,
                              dist_layout y_layout);
/* cpu_round.c: y = x rounded to float16 / bfloat16 precision, in float32 storage. */
dist_status cpu_round(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y);
/* ... n floats on the calling thread (y may be x): cpu_round's bits, for loops that round a
 * block of their own output while it is in cache. */
void cpu_round_values(dist_dtype dtype, const float *x, float *y, int64_t n);
/* ... to bfloat16 precision, writing y's bfloat16 twin (numel * 2 bytes, y's layout) in the same
 * pass: ROUND with aux (ops.h). */
dist_status cpu_round_bf16_twin(void *ctx, const dist_tensor *x, dist_tensor *y, void *y_bf16);
/* 1 when the vector paths (AVX2 + F16C) run on this processor. */
int cpu_round_simd(void);
void cpu_prims_destroy(cpu_ctx *c);
/* cpu_ops.c: the op set (backend/ops.h) on plain float32 host tensors; its layer kernels
 * through cpu_layer_kernels (cpu_backend.c: the kernels of the files above). */
extern const dist_layer_kernels cpu_layer_kernels;
int cpu_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                    dist_tensor *const *out);
dist_status cpu_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                       dist_tensor *const *out);
/* backend's context where it is a CPU backend (its run_op is cpu_run_op), else NULL: the
 * test hooks' check (dist_cpu_backend_set_*, *_runs) */
static inline cpu_ctx *cpu_ctx_of(const dist_backend *backend) {
    return backend && backend->iface && backend->iface->run_op == cpu_run_op ? backend->ctx : NULL;
}
/* cpu_ops_misc.c: the op set's dropout mask and whole-tensor ops, called by cpu_run_op with
 * the arguments it was given (supports_op has checked the dtypes and counts). */
dist_status cpu_op_dropout_mask(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out);
dist_status cpu_op_sum_squares(void *ctx, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out);
dist_status cpu_op_clip_value(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out);
dist_status cpu_op_clip_by_norm(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out);
dist_status cpu_op_all_finite(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out);
dist_status cpu_op_select(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out);
dist_status cpu_op_scale(void *ctx, const dist_op *op, const dist_tensor *const *in,
                         dist_tensor *const *out);
/* cpu_gather.c: the embedding lookup and its scatter-add gradient (ids int32) */
dist_status cpu_op_gather(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out);
dist_status cpu_op_gather_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                               dist_tensor *const *out);
/* cpu_gelu.c: the exact GELU (DIST_UN_GELU) and dx = dy * GELU'(x) over n floats, vectorized,
 * split over up to `threads` threads (the same bits on any count); y / dx may be x or dy. */
void cpu_gelu_forward(int threads, const float *x, float *y, int64_t n);
void cpu_gelu_backward(int threads, const float *x, const float *dy, float *dx, int64_t n);
/* cpu_act.c: the transcendental activations (SIGMOID, TANH, ELU, SELU, SOFTPLUS, GELU_TANH;
 * cpu_act_handles) and their gradients over n floats, vectorized, split over up to `threads`
 * threads (the same bits on any count); f: the op's attributes (ELU's alpha). */
int cpu_act_handles(int kind);
void cpu_act_forward(int threads, int kind, const float *f, const float *x, float *y, int64_t n);
void cpu_act_backward(int threads, int kind, const float *f, const float *x, const float *y,
                      const float *dy, float *dx, int64_t n);
/* cpu_softmax.c: softmax (ops.h's SOFTMAX, k = 0) of rows x rows of k floats, vectorized, rows
 * split over up to `threads` threads (the same bits on any count); y may be x. `round`
 * (DIST_F16, DIST_BF16; DIST_F32: none) rounds x before and y after, a few rows at a time while
 * they are in cache: the bits of cpu_round, softmax, cpu_round (the fused attention under a
 * mixed policy, whose scores and probabilities the tape's parts round). */
void cpu_softmax_rows(int threads, const float *x, float *y, int64_t rows, int64_t k,
                      dist_dtype round);
/* ... and its gradient (SOFTMAX_GRAD, k = 0) from y and dy; dx may be y or dy, but with
 * `round` (which rounds dy into dx before, and dx after) dx must not be y. */
void cpu_softmax_grad_rows(int threads, const float *y, const float *dy, float *dx, int64_t rows,
                           int64_t k, dist_dtype round);
/* cpu_layernorm.c: LAYER_NORM and LAYER_NORM_GRAD (ops.h), rows split over the threads */
dist_status cpu_op_layer_norm(void *ctx, const dist_op *op, const dist_tensor *const *in,
                              dist_tensor *const *out);
dist_status cpu_op_layer_norm_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                   dist_tensor *const *out);
/* cpu_batch_matmul.c: [batch, M, K] @ [batch, K, N] on oneDNN's matmul, its primitives
 * cached in cpu_ctx.bmm (freed by cpu_bmm_cache_destroy) */
dist_status cpu_op_batch_matmul(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                dist_tensor *const *out);
void cpu_bmm_cache_destroy(cpu_ctx *c);
/* cpu_ops.c: DIST_INVALID_ARGUMENT naming the op and `what` unless x has n elements */
dist_status cpu_need_numel(const dist_op *op, const dist_tensor *x, int64_t n, const char *what);
/* cpu_attention.c: the ATTENTION fusion and its gradient (ops.h), its batch in chunks whose
 * scores stay in cache, each part the op this backend runs for it */
dist_status cpu_op_attention(void *ctx, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out);
dist_status cpu_op_attention_grad(void *ctx, const dist_op *op, const dist_tensor *const *in,
                                  dist_tensor *const *out);
/* For tests: ATTENTION and ATTENTION_GRAD on (the default) or declined (the tape then runs
 * their parts), and how many times they ran. */
dist_status dist_cpu_backend_set_fused_attention(dist_backend *backend, int on);
long dist_cpu_backend_fused_attention_runs(const dist_backend *backend);
long dist_cpu_backend_fused_attention_chunks(const dist_backend *backend);
/* For tests: the oneDNN implementation of the i-th cached batched product (NULL past the end). */
const char *dist_cpu_backend_batch_matmul_impl(const dist_backend *backend, int i);

/* For tests and start-up checks: the implementation names of the primitives created so far,
 * written as "op=impl;..." into buf. */
void dist_cpu_backend_impl_info(const dist_backend *backend, char *buf, size_t size);

#endif
