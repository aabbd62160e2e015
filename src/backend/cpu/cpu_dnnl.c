/* CPU kernels on oneDNN: convolution, pooling, matmul and layout reorders.
 *
 * Primitives are created once per shape and cached with their memory objects, weight reorders
 * and a user-mode scratchpad, so a steady-state training step allocates nothing. Activations
 * stay in oneDNN's blocked layout between layers when the channel count allows it: nChw16c
 * where oneDNN runs AVX-512, nChw8c on AVX2. A plain NHWC convolution falls back to a GEMM
 * path 2-3x slower, and the wrong block for the ISA to the reference code, ~1000x slower. */
#include "backend/cpu/cpu_internal.h"
#include "core/env.h"
#include "core/error.h"

#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    OP_CONV_FWD = 1,
    OP_CONV_BWD_DATA,
    OP_CONV_BWD_FILTER,
    OP_POOL_FWD,
    OP_POOL_BWD,
    OP_MATMUL,
    OP_REORDER
};

typedef struct prim_key {
    int op;
    int layout[3];
    int dtype[3];
    int flags[4];
    int64_t dims[4][4];
    int geom[11];
} prim_key;

_Static_assert(sizeof(prim_key) <= sizeof(((cpu_prim *)0)->key), "prim_key too large");

dist_status cpu_dnnl_check(dnnl_status_t s, const char *what) {
    if (s == dnnl_success) return DIST_OK;
    const char *name;
    switch (s) {
    case dnnl_out_of_memory:
        return dist_error(DIST_OUT_OF_MEMORY, "oneDNN %s: out of memory", what);
    case dnnl_invalid_arguments: name = "invalid arguments"; break;
    case dnnl_unimplemented: name = "no implementation for these shapes/layouts"; break;
    case dnnl_runtime_error: name = "runtime error"; break;
    default: name = "failure"; break;
    }
    return dist_error(s == dnnl_unimplemented ? DIST_UNSUPPORTED : DIST_INTERNAL,
                      "oneDNN %s: %s (%d)", what, name, (int)s);
}

#define DNNL_TRY(call, what) DIST_TRY(cpu_dnnl_check((call), (what)))

/* The replica's thread count for what oneDNN does next on this thread, set before primitives
 * are created as well as run: oneDNN fixes a kernel's thread split when it is made. */
static void use_threads(const cpu_ctx *c) { omp_set_num_threads(c->threads); }

static dnnl_data_type_t dnnl_dt(dist_dtype t) {
    switch (t) {
    case DIST_F16: return dnnl_f16;
    case DIST_BF16: return dnnl_bf16;
    case DIST_I32: return dnnl_s32;
    case DIST_U8: return dnnl_u8;
    default: return dnnl_f32;
    }
}

/* A 4-D activation (logical NHWC) as a oneDNN memory descriptor (dims in NCHW order). */
static dist_status act_md(const dist_tensor *t, dnnl_memory_desc_t *md) {
    if (t->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "expected a 4-D NHWC tensor, got %d-D", t->ndim);
    dnnl_dims_t dims = {t->shape[0], t->shape[3], t->shape[1], t->shape[2]};
    /* With one channel, NHWC and NCHW are the same bytes; oneDNN's fast kernels want nchw. */
    dnnl_format_tag_t tag = t->layout == DIST_LAYOUT_NCHW16C  ? dnnl_nChw16c
                            : t->layout == DIST_LAYOUT_NCHW8C ? dnnl_nChw8c
                            : t->shape[3] == 1                ? dnnl_nchw
                                                              : dnnl_nhwc;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(md, 4, dims, dnnl_dt(t->dtype), tag),
             "memory descriptor");
    return DIST_OK;
}

/* Compare the ISA's bits, not its value: avx2_vnni (0x407) is numerically larger than
 * avx512_core_amx (0x3e7) in oneDNN 2.6 but has no AVX-512. */
int cpu_dnnl_isa_allows(dnnl_cpu_isa_t need) {
    const unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    return (isa & (unsigned)need) == (unsigned)need;
}

int cpu_dnnl_activation_block(void) {
    if (cpu_dnnl_isa_allows(dnnl_cpu_isa_avx512_core)) return 16;
    if (cpu_dnnl_isa_allows(dnnl_cpu_isa_avx2)) return 8;
    return 0;
}

static dist_layout preferred_layout(const cpu_ctx *c, int64_t channels) {
    if (c->block == 16 && channels % 16 == 0) return DIST_LAYOUT_NCHW16C;
    if (c->block == 8 && channels % 8 == 0) return DIST_LAYOUT_NCHW8C;
    return DIST_LAYOUT_PLAIN;
}

static void key_tensor(prim_key *k, int slot, const dist_tensor *t) {
    if (!t) return;
    k->layout[slot] = (int)t->layout + 1;
    k->dtype[slot] = (int)t->dtype;
    for (int i = 0; i < 4 && i < t->ndim; i++) k->dims[slot][i] = t->shape[i];
}

static cpu_prim *cache_find(cpu_ctx *c, const prim_key *k) {
    for (int i = 0; i < c->nprims; i++)
        if (memcmp(c->prims[i].key, k, sizeof *k) == 0) return &c->prims[i];
    return NULL;
}

static void prim_release(cpu_prim *p) {
    if (p->prim) dnnl_primitive_destroy(p->prim);
    if (p->reorder_in) dnnl_primitive_destroy(p->reorder_in);
    if (p->reorder_out) dnnl_primitive_destroy(p->reorder_out);
    if (p->reorder_x) dnnl_primitive_destroy(p->reorder_x);
    if (p->reorder_dy) dnnl_primitive_destroy(p->reorder_dy);
    for (int i = 0; i < 12; i++)
        if (p->mem[i]) dnnl_memory_destroy(p->mem[i]);
    for (int i = 0; i < 5; i++) free(p->buf[i]);
    memset(p, 0, sizeof *p);
}

/* A fresh slot for a new primitive; evicts round-robin when the cache is full (shapes change
 * only with the batch size, so eviction is rare). */
static cpu_prim *cache_slot(cpu_ctx *c, const prim_key *k) {
    cpu_prim *p;
    if (c->nprims < CPU_PRIM_CACHE) {
        p = &c->prims[c->nprims++];
    } else {
        p = &c->prims[c->next_evict];
        c->next_evict = (c->next_evict + 1) % CPU_PRIM_CACHE;
        prim_release(p);
    }
    memset(p, 0, sizeof *p);
    memcpy(p->key, k, sizeof *k);
    return p;
}

/* Gives back a slot cache_slot handed out whose primitive could not be made. A slot it
 * appended leaves the cache; one it took by eviction (cache full) stays, released: its zeroed
 * key matches no lookup (op 0). Decrementing nprims there would drop the last entry instead. */
static void cache_abandon(cpu_ctx *c, cpu_prim *p) {
    prim_release(p);
    if (c->nprims > 0 && p == &c->prims[c->nprims - 1]) c->nprims--;
}

void cpu_prims_destroy(cpu_ctx *c) {
    for (int i = 0; i < c->nprims; i++) prim_release(&c->prims[i]);
    c->nprims = 0;
}

static dist_status mem_new(cpu_ctx *c, const dnnl_memory_desc_t *md, dnnl_memory_t *out) {
    DNNL_TRY(dnnl_memory_create(out, md, c->engine, DNNL_MEMORY_NONE), "memory object");
    return DIST_OK;
}

static dist_status buf_new(const dnnl_memory_desc_t *md, void **out) {
    size_t bytes = dnnl_memory_desc_get_size(md);
    *out = NULL;
    if (bytes == 0) return DIST_OK;
    if (posix_memalign(out, 64, bytes) != 0)
        return dist_error(DIST_OUT_OF_MEMORY, "CPU backend: cannot allocate %zu bytes of scratch",
                          bytes);
    return DIST_OK;
}

static dist_status attr_new(dnnl_primitive_attr_t *attr) {
    DNNL_TRY(dnnl_primitive_attr_create(attr), "attribute");
    DNNL_TRY(dnnl_primitive_attr_set_scratchpad_mode(*attr, dnnl_scratchpad_mode_user),
             "scratchpad mode");
    return DIST_OK;
}

/* Finishes a primitive: creates it, records its implementation name, allocates its user
 * scratchpad into buf[2] / mem[7]. Takes ownership of pd. */
static dist_status prim_finish(cpu_ctx *c, cpu_prim *p, dnnl_primitive_desc_t pd) {
    dist_status st = DIST_OK;
    const char *impl = "unknown";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    p->impl = impl; /* a static string inside oneDNN */
    p->winograd = strstr(impl, "wino") != NULL;
    const dnnl_memory_desc_t *sp = dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    if (sp && dnnl_memory_desc_get_size(sp) > 0) {
        DIST_TRY_GOTO(buf_new(sp, &p->buf[2]), st, out);
        DIST_TRY_GOTO(mem_new(c, sp, &p->mem[7]), st, out);
        dnnl_memory_set_data_handle(p->mem[7], p->buf[2]);
    }
    DIST_TRY_GOTO(cpu_dnnl_check(dnnl_primitive_create(&p->prim, pd), "primitive"), st, out);
out:
    dnnl_primitive_desc_destroy(pd);
    return st;
}

static dist_status reorder_new(cpu_ctx *c, const dnnl_memory_desc_t *from,
                               const dnnl_memory_desc_t *to, dnnl_primitive_t *out) {
    dnnl_primitive_desc_t rpd;
    DNNL_TRY(dnnl_reorder_primitive_desc_create(&rpd, from, c->engine, to, c->engine, NULL),
             "reorder descriptor");
    dnnl_status_t s = dnnl_primitive_create(out, rpd);
    dnnl_primitive_desc_destroy(rpd);
    return cpu_dnnl_check(s, "reorder");
}

static dist_status run_reorder(cpu_ctx *c, dnnl_primitive_t r, dnnl_memory_t from,
                               dnnl_memory_t to) {
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    DNNL_TRY(dnnl_primitive_execute(r, c->stream, 2, args), "reorder");
    return DIST_OK;
}

static dist_status run_prim(cpu_ctx *c, cpu_prim *p, int nargs, dnnl_exec_arg_t *args) {
    if (p->mem[7]) {
        args[nargs].arg = DNNL_ARG_SCRATCHPAD;
        args[nargs].memory = p->mem[7];
        nargs++;
    }
    DNNL_TRY(dnnl_primitive_execute(p->prim, c->stream, nargs, args), p->impl);
    return DIST_OK;
}

/* run_prim for a convolution pass: also records its kernel (cpu_ctx.conv_impl). */
static dist_status run_conv_prim(cpu_ctx *c, cpu_prim *p, int nargs, dnnl_exec_arg_t *args) {
    c->conv_impl = p->impl;
    return run_prim(c, p, nargs, args);
}

static void set_handle(dnnl_memory_t m, const void *ptr) {
    dnnl_memory_set_data_handle(m, (void *)ptr);
}

/* ---- convolution ---------------------------------------------------------------------- */

typedef struct conv_mds {
    dnnl_memory_desc_t src, wei_plain, wei_any, bias, dst;
    dnnl_dims_t strides, dilates, pad_l, pad_r;
} conv_mds;

static dist_status conv_setup(const dist_conv2d_desc *d, const dist_tensor *x, const dist_tensor *w,
                              dist_layout y_layout, dist_dtype y_dtype, int64_t oh, int64_t ow,
                              conv_mds *m) {
    DIST_TRY(act_md(x, &m->src));
    int64_t kh = w->shape[0], kw = w->shape[1], ci = w->shape[2], co = w->shape[3];
    int64_t g = dist_conv2d_groups(d);
    /* grouped: oneDNN's weights are (G, O/G, I/G, H, W); TensorFlow's HWIO kernel with
     * I = in/G and O = G * (O/G) is their hwigo layout, byte for byte */
    dnnl_dims_t wdims = {co, ci, kh, kw}, gdims = {g, co / g, ci, kh, kw};
    int wnd = g > 1 ? 5 : 4;
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&m->wei_plain, wnd, g > 1 ? gdims : wdims,
                                          dnnl_dt(w->dtype), g > 1 ? dnnl_hwigo : dnnl_hwio),
             "weights md");
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&m->wei_any, wnd, g > 1 ? gdims : wdims,
                                          dnnl_dt(w->dtype), dnnl_format_tag_any),
             "weights md");
    dnnl_dims_t bdims = {co};
    DNNL_TRY(dnnl_memory_desc_init_by_tag(&m->bias, 1, bdims, dnnl_f32, dnnl_x), "bias md");
    dist_tensor yt = *x;
    yt.shape[1] = oh;
    yt.shape[2] = ow;
    yt.shape[3] = co;
    yt.layout = y_layout;
    yt.dtype = y_dtype;
    DIST_TRY(act_md(&yt, &m->dst));
    m->strides[0] = d->stride_h;
    m->strides[1] = d->stride_w;
    m->dilates[0] = dist_conv2d_dil_h(d) - 1; /* oneDNN counts the taps' gaps */
    m->dilates[1] = dist_conv2d_dil_w(d) - 1;
    m->pad_l[0] = d->pad_top;
    m->pad_l[1] = d->pad_left;
    m->pad_r[0] = d->pad_bottom;
    m->pad_r[1] = d->pad_right;
    return DIST_OK;
}

static dist_status conv_check(const dist_conv2d_desc *d, const dist_tensor *x, const dist_tensor *w,
                              int64_t *oh, int64_t *ow) {
    if (x->ndim != 4 || w->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "conv2d: input must be NHWC and kernel HWIO");
    int64_t g = dist_conv2d_groups(d);
    if (x->shape[3] != w->shape[2] * g || w->shape[3] % g != 0)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "conv2d: input has %lld channels and the kernel %lld filters, the "
                          "kernel expects %lld x %lld groups and a multiple of %lld filters",
                          (long long)x->shape[3], (long long)w->shape[3], (long long)w->shape[2],
                          (long long)g, (long long)g);
    int64_t ekh = (w->shape[0] - 1) * dist_conv2d_dil_h(d) + 1;
    int64_t ekw = (w->shape[1] - 1) * dist_conv2d_dil_w(d) + 1;
    *oh = (x->shape[1] + d->pad_top + d->pad_bottom - ekh) / d->stride_h + 1;
    *ow = (x->shape[2] + d->pad_left + d->pad_right - ekw) / d->stride_w + 1;
    if (*oh <= 0 || *ow <= 0)
        return dist_error(DIST_INVALID_ARGUMENT, "conv2d: kernel larger than input");
    return DIST_OK;
}

static void conv_key(prim_key *k, int op, const dist_conv2d_desc *d, const dist_tensor *a,
                     const dist_tensor *w, const dist_tensor *b) {
    memset(k, 0, sizeof *k);
    k->op = op;
    key_tensor(k, 0, a);
    key_tensor(k, 1, w);
    key_tensor(k, 2, b);
    k->geom[0] = d->stride_h;
    k->geom[1] = d->stride_w;
    k->geom[2] = d->pad_top;
    k->geom[3] = d->pad_bottom;
    k->geom[4] = d->pad_left;
    k->geom[5] = d->pad_right;
    k->geom[6] = d->relu;
    k->geom[8] = dist_conv2d_dil_h(d);
    k->geom[9] = dist_conv2d_dil_w(d);
    k->geom[10] = dist_conv2d_groups(d);
}

static int is_reference_impl(dnnl_primitive_desc_t pd);
static dist_status copy_setup(cpu_ctx *c, cpu_prim *p, const dnnl_memory_desc_t *from,
                              const dnnl_memory_desc_t *to, int slot, int mfrom, int mto,
                              dnnl_primitive_t *reorder);

/* oneDNN 2.6 has only its reference loops (~200-1700x slower, measured on AVX-512) for a
 * convolution whose plain NHWC activation meets a blocked one (a plain input from an op that
 * writes plain tensors, such as BatchNormalization or average pooling, before a convolution
 * with a blocked output; its backward-data). The activation's blocked twin: where the channels
 * fill the ISA's block, m's descriptor in that layout and *alt a fast primitive descriptor for
 * it (NULL otherwise). make_pd builds the descriptor from the modified m. */
typedef dist_status (*conv_pd_fn)(cpu_ctx *c, const conv_mds *m, const void *arg,
                                  dnnl_primitive_desc_t *pd);
static dist_status blocked_twin(cpu_ctx *c, const dist_tensor *t, int is_src, conv_mds *m,
                                conv_pd_fn make_pd, const void *arg, dnnl_primitive_desc_t *alt) {
    *alt = NULL;
    dist_layout bl = preferred_layout(c, t->shape[3]);
    if (t->layout != DIST_LAYOUT_PLAIN || bl == DIST_LAYOUT_PLAIN || t->shape[3] == 1)
        return DIST_OK;
    dist_tensor tb = *t;
    tb.layout = bl;
    conv_mds m2 = *m;
    DIST_TRY(act_md(&tb, is_src ? &m2.src : &m2.dst));
    dnnl_primitive_desc_t pd = NULL;
    dist_status st = make_pd(c, &m2, arg, &pd);
    if (st == DIST_OUT_OF_MEMORY) return st;
    if (st != DIST_OK || is_reference_impl(pd)) {
        if (pd) dnnl_primitive_desc_destroy(pd);
        return DIST_OK;
    }
    *m = m2;
    *alt = pd;
    return DIST_OK;
}

/* The last resort where the tensors' own layouts and the blocked twin leave oneDNN 2.6 with
 * only its reference loops (a plain output whose channels do not fill the block: 1 -> 24 3x3
 * ran ~1 s a batch; a one-channel output; depthwise with two filters per channel): the pass
 * with both activations in "any" layout, which oneDNN fills with the one its fastest kernel
 * takes (often nChw16c with the channels padded to a multiple of 16), else both in plain NHWC
 * (its GEMM kernel, the only one for a 7x7 kernel dilated by 2 into 1-4 channels on AVX2,
 * does not answer "any"); the activations are reordered into and out of it around each call.
 * On success m's src and dst are the chosen layouts (src_q, dst_q: the queries that name them
 * for this pass) and *alt the descriptor; *alt NULL, m untouched and no error left where
 * oneDNN has no JIT kernel in either. */
static dist_status any_layouts(cpu_ctx *c, conv_mds *m, conv_pd_fn make_pd, const void *arg,
                               dnnl_query_t src_q, dnnl_query_t dst_q, dnnl_primitive_desc_t *alt) {
    const dnnl_format_tag_t tags[2] = {dnnl_format_tag_any, dnnl_nhwc};
    *alt = NULL;
    for (int t = 0; t < 2; t++) {
        conv_mds m2 = *m;
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&m2.src, 4, m->src.dims, m->src.data_type, tags[t]),
                 "memory descriptor");
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&m2.dst, 4, m->dst.dims, m->dst.data_type, tags[t]),
                 "memory descriptor");
        dnnl_primitive_desc_t pd = NULL;
        dist_status st = make_pd(c, &m2, arg, &pd);
        if (st == DIST_OUT_OF_MEMORY) return st;
        if (st != DIST_OK || is_reference_impl(pd)) {
            if (pd) dnnl_primitive_desc_destroy(pd);
            dist_clear_error();
            continue;
        }
        m2.src = *dnnl_primitive_desc_query_md(pd, src_q, 0);
        m2.dst = *dnnl_primitive_desc_query_md(pd, dst_q, 0);
        *m = m2;
        *alt = pd;
        return DIST_OK;
    }
    return DIST_OK;
}

/* Replaces *pd, a reference kernel, by any_layouts' descriptor where there is one. */
static dist_status any_layouts_if_reference(cpu_ctx *c, conv_mds *m, conv_pd_fn make_pd,
                                            const void *arg, dnnl_query_t src_q, dnnl_query_t dst_q,
                                            dnnl_primitive_desc_t *pd) {
    if (!is_reference_impl(*pd)) return DIST_OK;
    dnnl_primitive_desc_t alt;
    dist_status st = any_layouts(c, m, make_pd, arg, src_q, dst_q, &alt);
    if (st != DIST_OK) {
        dnnl_primitive_desc_destroy(*pd);
        *pd = NULL;
        return st;
    }
    if (alt) {
        dnnl_primitive_desc_destroy(*pd);
        *pd = alt;
    }
    return DIST_OK;
}

/* The native bfloat16 versions (below): *ran = 0 when oneDNN has no such kernel for the
 * shapes, and the float32 path runs instead. */
static int use_bf16(const cpu_ctx *c, const dist_conv2d_desc *d, int64_t in_channels);
static dist_status conv_fwd_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                 const dist_tensor *w, const dist_tensor *b, dist_tensor *y,
                                 int64_t oh, int64_t ow, dist_layout yl, int *ran);
static dist_status conv_bwd_data_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *dy,
                                      const dist_tensor *w, dist_tensor *dx, int64_t oh, int64_t ow,
                                      int *ran);
static dist_status conv_bwd_filter_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, dist_tensor *dw, dist_tensor *db,
                                        int64_t oh, int64_t ow, int *ran);

static dist_status conv_fwd_pd_alg(cpu_ctx *c, const conv_mds *m, int with_bias, int relu,
                                   dnnl_alg_kind_t alg, dnnl_primitive_desc_t *pd) {
    dnnl_convolution_desc_t cd;
    DNNL_TRY(dnnl_dilated_convolution_forward_desc_init(
                 &cd, dnnl_forward_training, alg, &m->src, &m->wei_any, with_bias ? &m->bias : NULL,
                 &m->dst, m->strides, m->dilates, m->pad_l, m->pad_r),
             "convolution descriptor");
    dnnl_primitive_attr_t attr;
    DIST_TRY(attr_new(&attr));
    if (relu) {
        dnnl_post_ops_t po;
        dnnl_post_ops_create(&po);
        dnnl_post_ops_append_eltwise(po, 1.0f, dnnl_eltwise_relu, 0.0f, 0.0f);
        dnnl_primitive_attr_set_post_ops(attr, po);
        dnnl_post_ops_destroy(po);
    }
    dnnl_status_t s = dnnl_primitive_desc_create(pd, &cd, attr, c->engine, NULL);
    dnnl_primitive_attr_destroy(attr);
    return cpu_dnnl_check(s, "convolution forward");
}

/* The forward's primitive descriptor: oneDNN's Winograd kernel first where the backend uses it
 * (cpu_ctx.winograd) and oneDNN has one for the shape, else the direct kernel. */
static dist_status conv_fwd_pd(cpu_ctx *c, const conv_mds *m, int with_bias, int relu,
                               dnnl_primitive_desc_t *pd) {
    if (c->winograd && m->src.data_type == dnnl_f32) {
        if (conv_fwd_pd_alg(c, m, with_bias, relu, dnnl_convolution_winograd, pd) == DIST_OK)
            return DIST_OK;
        dist_clear_error(); /* no Winograd kernel for it (shape, stride, ISA): the direct one */
    }
    return conv_fwd_pd_alg(c, m, with_bias, relu, dnnl_convolution_direct, pd);
}

static dist_status fwd_pd_fn(cpu_ctx *c, const conv_mds *m, const void *arg,
                             dnnl_primitive_desc_t *pd) {
    const int *flags = arg; /* with bias, relu */
    return conv_fwd_pd(c, m, flags[0], flags[1], pd);
}

/* The forward's descriptor with a plain NHWC output (x in its own layout), where oneDNN has a
 * JIT kernel for it (brgconv on AVX-512), m set to match; NULL, with m untouched and no error
 * left, where it has only its reference code or none. */
static dnnl_primitive_desc_t conv_fwd_plain_pd(cpu_ctx *c, const dist_conv2d_desc *d,
                                               const dist_tensor *x, const dist_tensor *w,
                                               const dist_tensor *b, dist_dtype y_dtype, int64_t oh,
                                               int64_t ow, conv_mds *m) {
    conv_mds m2;
    dnnl_primitive_desc_t pd = NULL;
    if (conv_setup(d, x, w, DIST_LAYOUT_PLAIN, y_dtype, oh, ow, &m2) == DIST_OK &&
        conv_fwd_pd(c, &m2, b != NULL, d->relu, &pd) == DIST_OK && !is_reference_impl(pd)) {
        *m = m2;
        return pd;
    }
    if (pd) dnnl_primitive_desc_destroy(pd);
    dist_clear_error();
    return NULL;
}

/* A plain input whose channels would fill the block comes from an op that writes plain tensors
 * (BatchNormalization, an add of two of them, the model's input): a blocked output would cost
 * a reorder of x here and one of y back to plain for such an op after it, each step and again
 * for the gradients (ResNet-20: 100 reorders a step). Plain in and plain out is what TensorFlow
 * runs; the backward passes follow the layouts they are given. */
static int conv_fwd_stays_plain(const cpu_ctx *c, const dist_tensor *x) {
    return x->layout == DIST_LAYOUT_PLAIN && x->dtype == DIST_F32 &&
           preferred_layout(c, x->shape[3]) != DIST_LAYOUT_PLAIN;
}

static dist_status conv2d_forward(cpu_ctx *c, int native, const dist_conv2d_desc *d,
                                  const dist_tensor *x, const dist_tensor *w, const dist_tensor *b,
                                  dist_tensor *y) {
    use_threads(c);
    int64_t oh, ow;
    DIST_TRY(conv_check(d, x, w, &oh, &ow));
    dist_layout yl = preferred_layout(c, w->shape[3]);
    if (native) {
        int ran;
        DIST_TRY(conv_fwd_bf16(c, d, x, w, b, y, oh, ow, yl, &ran));
        if (ran) return DIST_OK;
    }
    if (cpu_conv2_forward_applies(c, d, x, w, b, y, yl)) {
        c->conv_impl = "libdist:avx2 (cpu_conv2.c)";
        return cpu_conv2_forward(c, d, x, w, b, y, yl);
    }
    prim_key k;
    conv_key(&k, OP_CONV_FWD, d, x, w, b);
    k.geom[7] = c->winograd;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m;
        dnnl_primitive_desc_t pd = NULL;
        if (conv_fwd_stays_plain(c, x)) pd = conv_fwd_plain_pd(c, d, x, w, b, y->dtype, oh, ow, &m);
        int plain_out = pd != NULL;
        if (!plain_out) {
            DIST_TRY(conv_setup(d, x, w, yl, y->dtype, oh, ow, &m));
            DIST_TRY(conv_fwd_pd(c, &m, b != NULL, d->relu, &pd));
        }
        dnnl_memory_desc_t x_own = m.src;
        dnnl_primitive_desc_t alt = NULL;
        if (!plain_out && is_reference_impl(pd)) {
            const int flags[2] = {b != NULL, d->relu};
            dist_status bst = blocked_twin(c, x, 1, &m, fwd_pd_fn, flags, &alt);
            if (bst != DIST_OK) {
                dnnl_primitive_desc_destroy(pd);
                return bst;
            }
            if (alt) {
                dnnl_primitive_desc_destroy(pd);
                pd = alt;
            }
        }
        /* Still the reference code (oneDNN 2.6 has no JIT kernel for a 3-channel NHWC source
         * and a blocked destination: ResNet's stem ran ~700x slower than TF's): a plain NHWC
         * output, as TensorFlow asks for; the layers after it take any layout */
        if (!plain_out && is_reference_impl(pd) && yl != DIST_LAYOUT_PLAIN) {
            dnnl_primitive_desc_t pd2 = conv_fwd_plain_pd(c, d, x, w, b, y->dtype, oh, ow, &m);
            if (pd2) {
                dnnl_primitive_desc_destroy(pd);
                pd = pd2;
                x_own = m.src;
                plain_out = 1;
            }
        }
        dnnl_memory_desc_t y_own = m.dst;
        const int flags[2] = {b != NULL, d->relu};
        DIST_TRY(any_layouts_if_reference(c, &m, fwd_pd_fn, flags, dnnl_query_src_md,
                                          dnnl_query_dst_md, &pd));
        p = cache_slot(c, &k);
        p->plain_out = (unsigned)plain_out;
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        dist_status st = DIST_OK;
        if (!dnnl_memory_desc_equal(&x_own, &m.src)) /* x into the kernel's layout: mem[8] -> [9] */
            DIST_TRY_GOTO(copy_setup(c, p, &x_own, &m.src, 3, 8, 9, &p->reorder_x), st, fail);
        DIST_TRY_GOTO(buf_new(wmd, &p->buf[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.src, &p->mem[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.wei_plain, &p->mem[1]), st, fail);
        DIST_TRY_GOTO(mem_new(c, wmd, &p->mem[2]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.bias, &p->mem[3]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.dst, &p->mem[4]), st, fail);
        if (!dnnl_memory_desc_equal(&y_own, &m.dst)) { /* y from the kernel's: buf[4] -> mem[10] */
            DIST_TRY_GOTO(buf_new(&m.dst, &p->buf[4]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &y_own, &p->mem[10]), st, fail);
            set_handle(p->mem[4], p->buf[4]);
            DIST_TRY_GOTO(reorder_new(c, &m.dst, &y_own, &p->reorder_out), st, fail);
        }
        set_handle(p->mem[2], p->buf[0]);
        DIST_TRY_GOTO(reorder_new(c, &m.wei_plain, wmd, &p->reorder_in), st, fail);
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
ready:;
    dnnl_memory_t xm = p->mem[0];
    if (p->reorder_x) {
        set_handle(p->mem[8], x->data);
        DIST_TRY(run_reorder(c, p->reorder_x, p->mem[8], p->mem[9]));
        xm = p->mem[9];
    } else {
        set_handle(p->mem[0], x->data);
    }
    set_handle(p->mem[1], w->data);
    if (!p->reorder_out) set_handle(p->mem[4], y->data);
    DIST_TRY(run_reorder(c, p->reorder_in, p->mem[1], p->mem[2]));
    dnnl_exec_arg_t args[6] = {
        {DNNL_ARG_SRC, xm}, {DNNL_ARG_WEIGHTS, p->mem[2]}, {DNNL_ARG_DST, p->mem[4]}};
    int n = 3;
    if (b) {
        set_handle(p->mem[3], b->data);
        args[n].arg = DNNL_ARG_BIAS;
        args[n++].memory = p->mem[3];
    }
    DIST_TRY(run_conv_prim(c, p, n, args));
    if (p->reorder_out) {
        set_handle(p->mem[10], y->data);
        DIST_TRY(run_reorder(c, p->reorder_out, p->mem[4], p->mem[10]));
    }
    if (p->winograd) c->winograd_runs++;
    y->layout = p->plain_out ? DIST_LAYOUT_PLAIN : yl;
    return DIST_OK;
}

/* backward-data's primitive descriptor for m (a forward one as the hint); arg unused. */
static dist_status bwd_data_pd_fn(cpu_ctx *c, const conv_mds *m, const void *arg,
                                  dnnl_primitive_desc_t *pd) {
    (void)arg;
    dnnl_primitive_desc_t hint;
    DIST_TRY(conv_fwd_pd(c, m, 0, 0, &hint));
    dnnl_convolution_desc_t cd;
    dnnl_primitive_attr_t attr;
    dist_status st = attr_new(&attr);
    if (st != DIST_OK) {
        dnnl_primitive_desc_destroy(hint);
        return st;
    }
    dnnl_status_t s = dnnl_dilated_convolution_backward_data_desc_init(
        &cd, dnnl_convolution_direct, &m->src, &m->wei_any, &m->dst, m->strides, m->dilates,
        m->pad_l, m->pad_r);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &cd, attr, c->engine, hint);
    dnnl_primitive_attr_destroy(attr);
    dnnl_primitive_desc_destroy(hint);
    return cpu_dnnl_check(s, "convolution backward-data");
}

static dist_status conv2d_backward_data(cpu_ctx *c, int native, const dist_conv2d_desc *d,
                                        const dist_tensor *dy, const dist_tensor *w,
                                        dist_tensor *dx) {
    use_threads(c);
    int64_t oh, ow;
    DIST_TRY(conv_check(d, dx, w, &oh, &ow));
    if (native) {
        int ran;
        DIST_TRY(conv_bwd_data_bf16(c, d, dy, w, dx, oh, ow, &ran));
        if (ran) return DIST_OK;
    }
    prim_key k;
    conv_key(&k, OP_CONV_BWD_DATA, d, dy, w, dx);
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m;
        DIST_TRY(conv_setup(d, dx, w, dy->layout, dy->dtype, oh, ow, &m));
        dnnl_primitive_desc_t pd;
        DIST_TRY(bwd_data_pd_fn(c, &m, NULL, &pd));
        dnnl_memory_desc_t dx_own = m.src;
        dnnl_primitive_desc_t alt = NULL;
        if (is_reference_impl(pd)) {
            dist_status bst = blocked_twin(c, dx, 1, &m, bwd_data_pd_fn, NULL, &alt);
            if (bst != DIST_OK) {
                dnnl_primitive_desc_destroy(pd);
                return bst;
            }
            if (alt) {
                dnnl_primitive_desc_destroy(pd);
                pd = alt;
            }
        }
        dnnl_memory_desc_t dy_own = m.dst;
        DIST_TRY(any_layouts_if_reference(c, &m, bwd_data_pd_fn, NULL, dnnl_query_diff_src_md,
                                          dnnl_query_diff_dst_md, &pd));
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        if (!dnnl_memory_desc_equal(&dy_own, &m.dst)) /* dy into the kernel's: mem[10] -> [11] */
            DIST_TRY_GOTO(copy_setup(c, p, &dy_own, &m.dst, 4, 10, 11, &p->reorder_dy), st, fail);
        /* dx written in the kernel's layout into buf[3] (mem[8]), then reordered (mem[9]) */
        if (!dnnl_memory_desc_equal(&dx_own, &m.src)) {
            DIST_TRY_GOTO(buf_new(&m.src, &p->buf[3]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &m.src, &p->mem[8]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &dx_own, &p->mem[9]), st, fail);
            set_handle(p->mem[8], p->buf[3]);
            DIST_TRY_GOTO(reorder_new(c, &m.src, &dx_own, &p->reorder_out), st, fail);
        }
        DIST_TRY_GOTO(buf_new(wmd, &p->buf[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.dst, &p->mem[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.wei_plain, &p->mem[1]), st, fail);
        DIST_TRY_GOTO(mem_new(c, wmd, &p->mem[2]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.src, &p->mem[3]), st, fail);
        set_handle(p->mem[2], p->buf[0]);
        DIST_TRY_GOTO(reorder_new(c, &m.wei_plain, wmd, &p->reorder_in), st, fail);
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
ready:;
    dnnl_memory_t dxm = p->reorder_out ? p->mem[8] : p->mem[3], dym = p->mem[0];
    if (p->reorder_dy) {
        set_handle(p->mem[10], dy->data);
        DIST_TRY(run_reorder(c, p->reorder_dy, p->mem[10], p->mem[11]));
        dym = p->mem[11];
    } else {
        set_handle(p->mem[0], dy->data);
    }
    set_handle(p->mem[1], w->data);
    if (!p->reorder_out) set_handle(p->mem[3], dx->data);
    DIST_TRY(run_reorder(c, p->reorder_in, p->mem[1], p->mem[2]));
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_DIFF_DST, dym}, {DNNL_ARG_WEIGHTS, p->mem[2]}, {DNNL_ARG_DIFF_SRC, dxm}};
    DIST_TRY(run_conv_prim(c, p, 3, args));
    if (!p->reorder_out) return DIST_OK;
    set_handle(p->mem[9], dx->data);
    return run_reorder(c, p->reorder_out, p->mem[8], p->mem[9]);
}

static dist_status conv_bwd_filter_pd(cpu_ctx *c, const conv_mds *m, int with_bias,
                                      dnnl_primitive_desc_t *pd) {
    dnnl_primitive_desc_t hint;
    DIST_TRY(conv_fwd_pd(c, m, with_bias, 0, &hint));
    dnnl_convolution_desc_t cd;
    dnnl_primitive_attr_t attr;
    dist_status st = attr_new(&attr);
    if (st != DIST_OK) {
        dnnl_primitive_desc_destroy(hint);
        return st;
    }
    dnnl_status_t s = dnnl_dilated_convolution_backward_weights_desc_init(
        &cd, dnnl_convolution_direct, &m->src, &m->wei_any, with_bias ? &m->bias : NULL, &m->dst,
        m->strides, m->dilates, m->pad_l, m->pad_r);
    if (s == dnnl_success) s = dnnl_primitive_desc_create(pd, &cd, attr, c->engine, hint);
    dnnl_primitive_attr_destroy(attr);
    dnnl_primitive_desc_destroy(hint);
    return cpu_dnnl_check(s, "convolution backward-weights");
}

static dist_status bwd_filter_pd_fn(cpu_ctx *c, const conv_mds *m, const void *arg,
                                    dnnl_primitive_desc_t *pd) {
    const int *with_bias = arg;
    return conv_bwd_filter_pd(c, m, *with_bias, pd);
}

static int is_reference_impl(dnnl_primitive_desc_t pd) {
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    return strncmp(impl, "ref:", 4) == 0;
}

/* A copy of an activation in another layout or data type (a plain NHWC copy for
 * backward-weights, a bfloat16 copy for the native kernels): a reorder from the tensor's own
 * layout into a buffer the primitive owns (buf[slot], mem[from] -> mem[to]). */
static dist_status copy_setup(cpu_ctx *c, cpu_prim *p, const dnnl_memory_desc_t *from,
                              const dnnl_memory_desc_t *to, int slot, int mfrom, int mto,
                              dnnl_primitive_t *reorder) {
    DIST_TRY(buf_new(to, &p->buf[slot]));
    DIST_TRY(mem_new(c, from, &p->mem[mfrom]));
    DIST_TRY(mem_new(c, to, &p->mem[mto]));
    set_handle(p->mem[mto], p->buf[slot]);
    return reorder_new(c, from, to, reorder);
}

static dist_status conv2d_backward_filter(cpu_ctx *c, int native, const dist_conv2d_desc *d,
                                          const dist_tensor *x, const dist_tensor *dy,
                                          dist_tensor *dw, dist_tensor *db) {
    use_threads(c);
    int64_t oh, ow;
    DIST_TRY(conv_check(d, x, dw, &oh, &ow));
    if (native) {
        int ran;
        DIST_TRY(conv_bwd_filter_bf16(c, d, x, dy, dw, db, oh, ow, &ran));
        if (ran) return DIST_OK;
    }
    if (cpu_conv1_backward_filter_applies(d, x, dy, dw)) {
        c->conv_impl = "libdist (cpu_conv1.c)";
        return cpu_conv1_backward_filter(c, d, x, dy, dw, db);
    }
    if (cpu_conv2_backward_filter_applies(c, d, x, dy, dw)) {
        c->conv_impl = "libdist:avx2 (cpu_conv2.c)";
        return cpu_conv2_backward_filter(c, d, x, dy, dw, db);
    }
    prim_key k;
    conv_key(&k, OP_CONV_BWD_FILTER, d, x, dy, dw);
    k.flags[0] = db != NULL;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m;
        DIST_TRY(conv_setup(d, x, dw, dy->layout, dy->dtype, oh, ow, &m));
        dnnl_primitive_desc_t pd;
        DIST_TRY(conv_bwd_filter_pd(c, &m, db != NULL, &pd));
        /* On AVX2, oneDNN 2.6 has no fast backward-weights kernel for a one-channel nchw
         * input with an nChw8c gradient; in plain NHWC both are fast (jit:avx2). */
        dnnl_memory_desc_t x_own = m.src, dy_own = m.dst;
        int plain = 0;
        if (is_reference_impl(pd) && (x->layout != DIST_LAYOUT_PLAIN || x->shape[3] == 1 ||
                                      dy->layout != DIST_LAYOUT_PLAIN)) {
            dnnl_memory_desc_t xs = m.src, ds = m.dst;
            dnnl_dims_t xd = {x->shape[0], x->shape[3], x->shape[1], x->shape[2]};
            dnnl_dims_t dd = {dy->shape[0], dy->shape[3], dy->shape[1], dy->shape[2]};
            dnnl_status_t s1 =
                dnnl_memory_desc_init_by_tag(&m.src, 4, xd, dnnl_dt(x->dtype), dnnl_nhwc);
            dnnl_status_t s2 =
                dnnl_memory_desc_init_by_tag(&m.dst, 4, dd, dnnl_dt(dy->dtype), dnnl_nhwc);
            dnnl_primitive_desc_t alt = NULL;
            if (s1 == dnnl_success && s2 == dnnl_success &&
                conv_bwd_filter_pd(c, &m, db != NULL, &alt) == DIST_OK && !is_reference_impl(alt)) {
                dnnl_primitive_desc_destroy(pd);
                pd = alt;
                plain = 1;
            } else {
                if (alt) dnnl_primitive_desc_destroy(alt);
                m.src = xs;
                m.dst = ds;
            }
        }
        const int with_bias = db != NULL;
        DIST_TRY(any_layouts_if_reference(c, &m, bwd_filter_pd_fn, &with_bias, dnnl_query_src_md,
                                          dnnl_query_diff_dst_md, &pd));
        /* Copies of x and dy where the kernel takes another layout; a one-channel nchw input
         * is already NHWC bytes, so the plain path copies only a blocked one. */
        int x_copy =
            plain ? x->layout != DIST_LAYOUT_PLAIN : !dnnl_memory_desc_equal(&x_own, &m.src);
        int dy_copy =
            plain ? dy->layout != DIST_LAYOUT_PLAIN : !dnnl_memory_desc_equal(&dy_own, &m.dst);
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        const dnnl_memory_desc_t *wmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
        DIST_TRY_GOTO(buf_new(wmd, &p->buf[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.src, &p->mem[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.dst, &p->mem[1]), st, fail);
        DIST_TRY_GOTO(mem_new(c, wmd, &p->mem[2]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.wei_plain, &p->mem[3]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.bias, &p->mem[4]), st, fail);
        set_handle(p->mem[2], p->buf[0]);
        DIST_TRY_GOTO(reorder_new(c, wmd, &m.wei_plain, &p->reorder_out), st, fail);
        if (x_copy)
            DIST_TRY_GOTO(copy_setup(c, p, &x_own, &m.src, 3, 8, 9, &p->reorder_x), st, fail);
        if (dy_copy)
            DIST_TRY_GOTO(copy_setup(c, p, &dy_own, &m.dst, 4, 10, 11, &p->reorder_dy), st, fail);
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
ready:
    dnnl_memory_t xm = p->mem[0], dym = p->mem[1];
    if (p->reorder_x) {
        set_handle(p->mem[8], x->data);
        DIST_TRY(run_reorder(c, p->reorder_x, p->mem[8], p->mem[9]));
        xm = p->mem[9];
    } else {
        set_handle(p->mem[0], x->data);
    }
    if (p->reorder_dy) {
        set_handle(p->mem[10], dy->data);
        DIST_TRY(run_reorder(c, p->reorder_dy, p->mem[10], p->mem[11]));
        dym = p->mem[11];
    } else {
        set_handle(p->mem[1], dy->data);
    }
    set_handle(p->mem[3], dw->data);
    dnnl_exec_arg_t args[5] = {
        {DNNL_ARG_SRC, xm}, {DNNL_ARG_DIFF_DST, dym}, {DNNL_ARG_DIFF_WEIGHTS, p->mem[2]}};
    int n = 3;
    if (db) {
        set_handle(p->mem[4], db->data);
        args[n].arg = DNNL_ARG_DIFF_BIAS;
        args[n++].memory = p->mem[4];
    }
    DIST_TRY(run_conv_prim(c, p, n, args));
    return run_reorder(c, p->reorder_out, p->mem[2], p->mem[3]);
}

/* ---- native bfloat16 convolutions (mixed_bfloat16) -------------------------------------- *
 *
 * A convolution marked bf16 runs on oneDNN's bfloat16 kernels where the CPU has the
 * instructions: x, w and dy are converted to bfloat16 copies in the layout the kernel picks
 * (one reorder each, ~25-35 us for the seed CNN's second convolution at batch 64), the kernel
 * accumulates in float32 and writes float32 y, dx and dw. The products are those of the
 * float32 path on the same bfloat16 values (exact in float32), so the two paths differ only
 * in the order of the sums. The master weights, the gradients the optimizer sees and the
 * activations between kernels stay float32 storage, as on every other path. */

int cpu_dnnl_native_bf16_default(void) {
    const char *env = dist_env_raw(DIST_ENV_CPU_NATIVE_BF16);
    if (env && strcmp(env, "0") == 0) return CPU_BF16_OFF;
    if (!cpu_dnnl_isa_allows(dnnl_cpu_isa_avx512_core_bf16)) return CPU_BF16_OFF;
    return env && strcmp(env, "1") == 0 ? CPU_BF16_NATIVE : CPU_BF16_MEASURE;
}

/* ---- Winograd forwards (opt-in) ------------------------------------------------------- *
 *
 * oneDNN 2.6's jit_wino_4x3 (AVX-512) computes a 3x3 / stride-1 convolution as F(4x4, 3x3)
 * Winograd: 2.25 multiplications per output instead of 9, plus the input, filter and output
 * transforms. At the seed CNN's second convolution (batch 64, 12x12x32 -> 10x10x64, Zen 4)
 * it takes 1.18 ms against the direct kernel's 2.06 ms. Its outputs are as accurate as
 * float32 sums are (largest error 2.5e-7 of the sum of the terms' magnitudes, the direct
 * kernel's 1.1e-7; test_cpu_conv2), but not the same bits as the direct kernel TensorFlow's
 * oneDNN runs: a training run then leaves TensorFlow's trajectory after a few steps, as any
 * other order of the sums does, and reaches the same accuracy. Off unless asked for:
 * DIST_CPU_WINOGRAD=1 (distrain --conv-algorithm winograd). Mixed precision is unaffected (its
 * convolutions are bfloat16 or float16 ones); the backward passes stay the direct and own
 * kernels. */

int cpu_dnnl_winograd_default(void) {
    const char *env = dist_env_raw(DIST_ENV_CPU_WINOGRAD);
    return env && strcmp(env, "1") == 0;
}

dist_status dist_cpu_backend_set_winograd(dist_backend *backend, int on) {
    cpu_ctx *c = cpu_ctx_of(backend);
    if (!c)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_set_winograd: not a CPU backend");
    c->winograd = on != 0;
    return DIST_OK;
}

long dist_cpu_backend_winograd_runs(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->winograd_runs : -1;
}

const char *dist_cpu_backend_last_conv_impl(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->conv_impl : NULL;
}

dist_status dist_cpu_backend_set_native_bf16(dist_backend *backend, int on) {
    cpu_ctx *c = cpu_ctx_of(backend);
    if (!c)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_set_native_bf16: not a CPU backend");
    if (on && !cpu_dnnl_isa_allows(dnnl_cpu_isa_avx512_core))
        return dist_error(DIST_UNSUPPORTED,
                          "native bfloat16 convolutions need AVX-512 (oneDNN 2.6 has none below "
                          "avx512_core); this CPU's oneDNN ISA is 0x%x",
                          (unsigned)dnnl_get_effective_cpu_isa());
    c->native_bf16 = on != 0;
    return DIST_OK;
}

dist_status dist_cpu_backend_set_bf16_twins(dist_backend *backend, int on) {
    cpu_ctx *c = cpu_ctx_of(backend);
    if (!c)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_set_bf16_twins: not a CPU backend");
    c->bf16_twins = on != 0;
    return DIST_OK;
}

long dist_cpu_backend_bf16_twins_written(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->bf16_twins_written : -1;
}

long dist_cpu_backend_bf16_operand_reorders(const dist_backend *backend) {
    const cpu_ctx *c = cpu_ctx_of(backend);
    return c ? c->bf16_operand_reorders : -1;
}

/* At least 16 input channels: with one (the seed CNN's first convolution) the convolution
 * is bound by memory and bfloat16 gains nothing (Zen 4, batch 64: forward 274 us float32,
 * 262 us bfloat16), while the own float32 backward-filter kernel serves it well. */
static int use_bf16(const cpu_ctx *c, const dist_conv2d_desc *d, int64_t in_channels) {
    return d->bf16 && c->native_bf16 && in_channels >= 16;
}

/* The public entries: the path (native bfloat16 or float32 on the rounded values) as
 * cpu_bf16_choose decides for the call's key, and its time reported back (cpu_bf16_choice.c). */
static int conv_native(cpu_ctx *c, int op, const dist_conv2d_desc *d, int64_t in_channels,
                       const dist_tensor *a, const dist_tensor *w, const dist_tensor *b,
                       cpu_bf16_trial *t) {
    t->entry = -1;
    if (!use_bf16(c, d, in_channels)) return 0;
    prim_key k;
    conv_key(&k, op, d, a, w, b);
    return cpu_bf16_choose(c, &k, sizeof k, t);
}

dist_status cpu_conv2d_forward(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                               const dist_tensor *w, const dist_tensor *b, dist_tensor *y) {
    cpu_ctx *c = ctx;
    cpu_bf16_trial t;
    int native = conv_native(c, OP_CONV_FWD, d, x->ndim == 4 ? x->shape[3] : 0, x, w, b, &t);
    dist_status st = conv2d_forward(c, native, d, x, w, b, y);
    cpu_bf16_measured(c, &t, st, "convolution forward", x, w);
    return st;
}

dist_status cpu_conv2d_backward_data(void *ctx, const dist_conv2d_desc *d, const dist_tensor *dy,
                                     const dist_tensor *w, dist_tensor *dx) {
    cpu_ctx *c = ctx;
    cpu_bf16_trial t;
    int native =
        conv_native(c, OP_CONV_BWD_DATA, d, dx->ndim == 4 ? dx->shape[3] : 0, dy, w, dx, &t);
    dist_status st = conv2d_backward_data(c, native, d, dy, w, dx);
    cpu_bf16_measured(c, &t, st, "convolution backward data", dy, w);
    return st;
}

dist_status cpu_conv2d_backward_filter(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                       const dist_tensor *dy, dist_tensor *dw, dist_tensor *db) {
    cpu_ctx *c = ctx;
    cpu_bf16_trial t;
    int native =
        conv_native(c, OP_CONV_BWD_FILTER, d, x->ndim == 4 ? x->shape[3] : 0, x, dy, db, &t);
    dist_status st = conv2d_backward_filter(c, native, d, x, dy, dw, db);
    cpu_bf16_measured(c, &t, st, "convolution backward filter", x, dy);
    return st;
}

static dist_status any_bf16(const dnnl_memory_desc_t *f32, dnnl_memory_desc_t *out) {
    DNNL_TRY(
        dnnl_memory_desc_init_by_tag(out, f32->ndims, f32->dims, dnnl_bf16, dnnl_format_tag_any),
        "bfloat16 memory descriptor");
    return DIST_OK;
}

/* The float32 descriptors of m with bfloat16 "any" in the slots that are set. */
static dist_status bf16_mds(const conv_mds *m, int src, int wei, int dst, conv_mds *out) {
    *out = *m;
    if (src) DIST_TRY(any_bf16(&m->src, &out->src));
    if (wei) DIST_TRY(any_bf16(&m->wei_any, &out->wei_any));
    if (dst) DIST_TRY(any_bf16(&m->dst, &out->dst));
    return DIST_OK;
}

/* Records that oneDNN has no bfloat16 kernel for this key (or only its reference loops, which
 * are far slower than float32: plain NHWC with odd channel counts gets them), so the float32
 * path runs without asking again: a cache entry with no primitive. Destroys pd (may be NULL). */
static dist_status no_native(cpu_ctx *c, const prim_key *k, dnnl_primitive_desc_t pd) {
    if (pd) dnnl_primitive_desc_destroy(pd);
    cpu_prim *p = cache_slot(c, k);
    p->impl = "float32 (no bfloat16 kernel)";
    return DIST_OK;
}

/* 1 when md (a kernel's bfloat16 operand) is t's own layout in bfloat16. */
static int own_layout_bf16(const dnnl_memory_desc_t *md, const dist_tensor *t) {
    dist_tensor tb = *t;
    tb.dtype = DIST_BF16;
    dnnl_memory_desc_t own;
    return t->ndim == 4 && act_md(&tb, &own) == DIST_OK && dnnl_memory_desc_equal(&own, md);
}

/* A native pass's bfloat16 operand t (reorder mem[from] -> mem[to], the primitive's own buffer
 * buf[slot]): the kept copy when it holds t's values, else converted, into the kept copy when
 * there is one (then marked as holding them). The kept copy has t's own layout. */
static dist_status bf16_operand(cpu_ctx *c, cpu_prim *p, const dist_tensor *t,
                                const dist_bf16_copy *kept, int from, int to, int slot,
                                dnnl_primitive_t reorder) {
    int keep = kept && kept->data && kept->ready;
    if (keep && (*kept->ready & kept->bit)) {
        set_handle(p->mem[to], kept->data);
        return DIST_OK;
    }
    set_handle(p->mem[to], keep ? kept->data : p->buf[slot]);
    set_handle(p->mem[from], t->data);
    DIST_TRY(run_reorder(c, reorder, p->mem[from], p->mem[to]));
    c->bf16_operand_reorders++;
    if (keep) *kept->ready |= kept->bit;
    return DIST_OK;
}

/* A convolution's x (bit 1: mem[8] -> mem[0], buf[3]) or dy (bit 2: mem[10] -> mem[5], buf[4])
 * in bfloat16, kept in dist_conv2d_desc.x_bf16 / dy_bf16 where the kernel takes the tensor's
 * own layout. */
static dist_status conv_bf16_operand(cpu_ctx *c, cpu_prim *p, const dist_conv2d_desc *d,
                                     const dist_tensor *t, unsigned bit) {
    int is_x = bit == 1u;
    dist_bf16_copy kept = {is_x ? d->x_bf16 : d->dy_bf16, d->copies, bit};
    return bf16_operand(c, p, t, p->own_layout & bit ? &kept : NULL, is_x ? 8 : 10, is_x ? 0 : 5,
                        is_x ? 3 : 4, is_x ? p->reorder_x : p->reorder_dy);
}

static dist_status conv_fwd_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                 const dist_tensor *w, const dist_tensor *b, dist_tensor *y,
                                 int64_t oh, int64_t ow, dist_layout yl, int *ran) {
    *ran = 0;
    prim_key k;
    conv_key(&k, OP_CONV_FWD, d, x, w, b);
    k.flags[1] = 1;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m, mb;
        DIST_TRY(conv_setup(d, x, w, yl, DIST_F32, oh, ow, &m));
        DIST_TRY(bf16_mds(&m, 1, 1, 0, &mb));
        /* the float32 output in the layout the kernel picks too: fixing it to the blocked one
         * denies oneDNN 2.6 its AMX kernel (brgconv writes plain NHWC), and the blocked bfloat16
         * kernel it falls back to ran 4-7x slower than AMX and 1.4-1.7x slower than float32
         * (Xeon model 207, ResNet-20's and the seed CNN's shapes) */
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&mb.dst, m.dst.ndims, m.dst.dims, dnnl_f32,
                                              dnnl_format_tag_any),
                 "convolution output md");
        dnnl_primitive_desc_t pd = NULL;
        dist_status pst = conv_fwd_pd(c, &mb, b != NULL, d->relu, &pd);
        if (pst == DIST_OUT_OF_MEMORY) return pst;
        if (pst != DIST_OK || is_reference_impl(pd)) return no_native(c, &k, pst ? NULL : pd);
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        const dnnl_memory_desc_t *dmd = dnnl_primitive_desc_query_md(pd, dnnl_query_dst_md, 0);
        DIST_TRY_GOTO(copy_setup(c, p, &m.src, smd, 3, 8, 0, &p->reorder_x), st, fail);
        p->own_layout = own_layout_bf16(smd, x) ? 1u : 0u;
        DIST_TRY_GOTO(copy_setup(c, p, &m.wei_plain, wmd, 0, 1, 2, &p->reorder_in), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.bias, &p->mem[3]), st, fail);
        /* y is written in the kernel's layout where that is the preferred one or plain NHWC
         * (the layers after a convolution take either); any other is reordered into the
         * preferred one from buf[4] (mem[4] -> mem[10]) */
        conv_mds mp;
        DIST_TRY_GOTO(conv_setup(d, x, w, DIST_LAYOUT_PLAIN, DIST_F32, oh, ow, &mp), st, fail);
        p->plain_out = yl != DIST_LAYOUT_PLAIN && dnnl_memory_desc_equal(dmd, &mp.dst);
        DIST_TRY_GOTO(mem_new(c, dmd, &p->mem[4]), st, fail);
        if (!p->plain_out && !dnnl_memory_desc_equal(dmd, &m.dst)) {
            DIST_TRY_GOTO(buf_new(dmd, &p->buf[4]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &m.dst, &p->mem[10]), st, fail);
            set_handle(p->mem[4], p->buf[4]);
            DIST_TRY_GOTO(reorder_new(c, dmd, &m.dst, &p->reorder_out), st, fail);
        }
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
    if (!p->prim) return DIST_OK;
ready:
    DIST_TRY(conv_bf16_operand(c, p, d, x, 1u));
    set_handle(p->mem[1], w->data);
    DIST_TRY(run_reorder(c, p->reorder_in, p->mem[1], p->mem[2]));
    if (!p->reorder_out) set_handle(p->mem[4], y->data);
    dnnl_exec_arg_t args[6] = {
        {DNNL_ARG_SRC, p->mem[0]}, {DNNL_ARG_WEIGHTS, p->mem[2]}, {DNNL_ARG_DST, p->mem[4]}};
    int n = 3;
    if (b) {
        set_handle(p->mem[3], b->data);
        args[n].arg = DNNL_ARG_BIAS;
        args[n++].memory = p->mem[3];
    }
    DIST_TRY(run_conv_prim(c, p, n, args));
    if (p->reorder_out) {
        set_handle(p->mem[10], y->data);
        DIST_TRY(run_reorder(c, p->reorder_out, p->mem[4], p->mem[10]));
    }
    y->layout = p->plain_out ? DIST_LAYOUT_PLAIN : yl;
    *ran = 1;
    return DIST_OK;
}

/* A backward descriptor's primitive descriptor, with a forward one on bfloat16 "any" as the
 * hint oneDNN requires. */
static dist_status bwd_pd(cpu_ctx *c, const conv_mds *hint_mds, int with_bias,
                          const dnnl_convolution_desc_t *cd, dnnl_primitive_desc_t *pd) {
    dnnl_primitive_desc_t hint;
    DIST_TRY(conv_fwd_pd(c, hint_mds, with_bias, 0, &hint));
    dnnl_primitive_attr_t attr;
    dist_status st = attr_new(&attr);
    if (st == DIST_OK) {
        st = cpu_dnnl_check(dnnl_primitive_desc_create(pd, cd, attr, c->engine, hint),
                            "bfloat16 convolution backward");
        dnnl_primitive_attr_destroy(attr);
    }
    dnnl_primitive_desc_destroy(hint);
    return st;
}

static dist_status conv_bwd_data_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *dy,
                                      const dist_tensor *w, dist_tensor *dx, int64_t oh, int64_t ow,
                                      int *ran) {
    *ran = 0;
    prim_key k;
    conv_key(&k, OP_CONV_BWD_DATA, d, dy, w, dx);
    k.flags[1] = 1;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m, mb;
        DIST_TRY(conv_setup(d, dx, w, dy->layout, DIST_F32, oh, ow, &m));
        DIST_TRY(bf16_mds(&m, 1, 1, 1, &mb));
        /* dx in the kernel's layout too (as the forward's y): with a blocked dx fixed oneDNN 2.6
         * takes jit_bf16 where AMX's kernel wants plain NHWC; dx is reordered into its own
         * layout where the two differ */
        dnnl_memory_desc_t dx_any;
        DNNL_TRY(dnnl_memory_desc_init_by_tag(&dx_any, m.src.ndims, m.src.dims, dnnl_f32,
                                              dnnl_format_tag_any),
                 "convolution input-gradient md");
        dnnl_convolution_desc_t cd;
        dnnl_primitive_desc_t pd = NULL;
        dist_status pst = cpu_dnnl_check(dnnl_dilated_convolution_backward_data_desc_init(
                                             &cd, dnnl_convolution_direct, &dx_any, &mb.wei_any,
                                             &mb.dst, m.strides, m.dilates, m.pad_l, m.pad_r),
                                         "bfloat16 convolution backward-data");
        if (pst == DIST_OK) pst = bwd_pd(c, &mb, 0, &cd, &pd);
        if (pst == DIST_OUT_OF_MEMORY) return pst;
        if (pst != DIST_OK || is_reference_impl(pd)) return no_native(c, &k, pst ? NULL : pd);
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        const dnnl_memory_desc_t *ddmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
        const dnnl_memory_desc_t *wmd = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
        DIST_TRY_GOTO(copy_setup(c, p, &m.dst, ddmd, 4, 10, 5, &p->reorder_dy), st, fail);
        p->own_layout = own_layout_bf16(ddmd, dy) ? 2u : 0u;
        DIST_TRY_GOTO(copy_setup(c, p, &m.wei_plain, wmd, 0, 1, 2, &p->reorder_in), st, fail);
        const dnnl_memory_desc_t *dsmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_src_md, 0);
        DIST_TRY_GOTO(mem_new(c, dsmd, &p->mem[4]), st, fail);
        if (!dnnl_memory_desc_equal(dsmd, &m.src)) { /* dx from buf[3]: mem[4] -> mem[11] */
            DIST_TRY_GOTO(buf_new(dsmd, &p->buf[3]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &m.src, &p->mem[11]), st, fail);
            set_handle(p->mem[4], p->buf[3]);
            DIST_TRY_GOTO(reorder_new(c, dsmd, &m.src, &p->reorder_out), st, fail);
        }
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
    if (!p->prim) return DIST_OK;
ready:
    DIST_TRY(conv_bf16_operand(c, p, d, dy, 2u));
    set_handle(p->mem[1], w->data);
    DIST_TRY(run_reorder(c, p->reorder_in, p->mem[1], p->mem[2]));
    if (!p->reorder_out) set_handle(p->mem[4], dx->data);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_DIFF_DST, p->mem[5]},
                               {DNNL_ARG_WEIGHTS, p->mem[2]},
                               {DNNL_ARG_DIFF_SRC, p->mem[4]}};
    DIST_TRY(run_conv_prim(c, p, 3, args));
    if (p->reorder_out) {
        set_handle(p->mem[11], dx->data);
        DIST_TRY(run_reorder(c, p->reorder_out, p->mem[4], p->mem[11]));
    }
    *ran = 1;
    return DIST_OK;
}

static dist_status conv_bwd_filter_bf16(cpu_ctx *c, const dist_conv2d_desc *d, const dist_tensor *x,
                                        const dist_tensor *dy, dist_tensor *dw, dist_tensor *db,
                                        int64_t oh, int64_t ow, int *ran) {
    *ran = 0;
    prim_key k;
    conv_key(&k, OP_CONV_BWD_FILTER, d, x, dy, dw);
    k.flags[0] = db != NULL;
    k.flags[1] = 1;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        conv_mds m, mb;
        DIST_TRY(conv_setup(d, x, dw, dy->layout, DIST_F32, oh, ow, &m));
        DIST_TRY(bf16_mds(&m, 1, 1, 1, &mb));
        dnnl_convolution_desc_t cd;
        dnnl_primitive_desc_t pd = NULL;
        /* float32 weight and bias gradients straight from the kernel */
        dist_status pst = cpu_dnnl_check(dnnl_dilated_convolution_backward_weights_desc_init(
                                             &cd, dnnl_convolution_direct, &mb.src, &m.wei_any,
                                             db ? &m.bias : NULL, &mb.dst, m.strides, m.dilates,
                                             m.pad_l, m.pad_r),
                                         "bfloat16 convolution backward-weights");
        if (pst == DIST_OK) pst = bwd_pd(c, &mb, db != NULL, &cd, &pd);
        if (pst == DIST_OUT_OF_MEMORY) return pst;
        if (pst != DIST_OK || is_reference_impl(pd)) return no_native(c, &k, pst ? NULL : pd);
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        const dnnl_memory_desc_t *smd = dnnl_primitive_desc_query_md(pd, dnnl_query_src_md, 0);
        const dnnl_memory_desc_t *ddmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_dst_md, 0);
        const dnnl_memory_desc_t *wmd =
            dnnl_primitive_desc_query_md(pd, dnnl_query_diff_weights_md, 0);
        DIST_TRY_GOTO(copy_setup(c, p, &m.src, smd, 3, 8, 0, &p->reorder_x), st, fail);
        DIST_TRY_GOTO(copy_setup(c, p, &m.dst, ddmd, 4, 10, 5, &p->reorder_dy), st, fail);
        p->own_layout = (own_layout_bf16(smd, x) ? 1u : 0u) | (own_layout_bf16(ddmd, dy) ? 2u : 0u);
        DIST_TRY_GOTO(buf_new(wmd, &p->buf[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, wmd, &p->mem[2]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.wei_plain, &p->mem[1]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &m.bias, &p->mem[3]), st, fail);
        set_handle(p->mem[2], p->buf[0]);
        DIST_TRY_GOTO(reorder_new(c, wmd, &m.wei_plain, &p->reorder_out), st, fail);
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
    if (!p->prim) return DIST_OK;
ready:
    DIST_TRY(conv_bf16_operand(c, p, d, x, 1u));
    DIST_TRY(conv_bf16_operand(c, p, d, dy, 2u));
    dnnl_exec_arg_t args[5] = {{DNNL_ARG_SRC, p->mem[0]},
                               {DNNL_ARG_DIFF_DST, p->mem[5]},
                               {DNNL_ARG_DIFF_WEIGHTS, p->mem[2]}};
    int n = 3;
    if (db) {
        set_handle(p->mem[3], db->data);
        args[n].arg = DNNL_ARG_DIFF_BIAS;
        args[n++].memory = p->mem[3];
    }
    DIST_TRY(run_conv_prim(c, p, n, args));
    set_handle(p->mem[1], dw->data);
    DIST_TRY(run_reorder(c, p->reorder_out, p->mem[2], p->mem[1]));
    *ran = 1;
    return DIST_OK;
}

/* ---- matmul --------------------------------------------------------------------------- */

static dist_status mat_md(const dist_tensor *t, int trans, dnnl_data_type_t dt,
                          dnnl_memory_desc_t *md) {
    if (t->ndim != 2)
        return dist_error(DIST_INVALID_ARGUMENT, "matmul: expected 2-D tensors, got %d-D", t->ndim);
    int64_t r = t->shape[0], cl = t->shape[1];
    dnnl_dims_t dims = {trans ? cl : r, trans ? r : cl};
    dnnl_dims_t strides = {trans ? 1 : cl, trans ? cl : 1};
    DNNL_TRY(dnnl_memory_desc_init_by_strides(md, 2, dims, dt, strides), "matmul md");
    return DIST_OK;
}

/* The kernel cache's key of a matmul (shapes, layouts, transposes; the caller adds scalars) */
static void matmul_key(prim_key *k, int trans_a, int trans_b, const dist_tensor *a,
                       const dist_tensor *b, const dist_tensor *cm) {
    memset(k, 0, sizeof *k);
    k->op = OP_MATMUL;
    key_tensor(k, 0, a);
    key_tensor(k, 1, b);
    key_tensor(k, 2, cm);
    k->flags[0] = trans_a;
    k->flags[1] = trans_b;
}

/* Products below this many multiply-adds stay float32 under mixed_bfloat16: converting the
 * operands costs more than the bfloat16 kernel saves (the seed CNN's 64x64x10 output layer). */
#define MATMUL_BF16_MIN_MACS (1 << 20)

/* native: bfloat16 copies of a and b (mem[8] -> mem[0], mem[10] -> mem[1]) feed a bfloat16
 * kernel with a float32 result; *ran = 0 when oneDNN has none for these shapes. */
static dist_status matmul_run(cpu_ctx *c, int native, int trans_a, int trans_b, float alpha,
                              const dist_tensor *a, const dist_tensor *b, float beta,
                              dist_tensor *cm, const dist_bf16_copy *a_copy,
                              const dist_bf16_copy *b_copy, int *ran) {
    *ran = 0;
    prim_key k;
    matmul_key(&k, trans_a, trans_b, a, b, cm);
    memcpy(&k.flags[2], &alpha, sizeof alpha);
    memcpy(&k.flags[3], &beta, sizeof beta);
    k.geom[0] = native;
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        dnnl_data_type_t in = native ? dnnl_bf16 : dnnl_f32;
        dnnl_memory_desc_t amd, bmd, cmd, af, bf;
        DIST_TRY(mat_md(a, trans_a, in, &amd));
        DIST_TRY(mat_md(b, trans_b, in, &bmd));
        DIST_TRY(mat_md(a, trans_a, dnnl_f32, &af));
        DIST_TRY(mat_md(b, trans_b, dnnl_f32, &bf));
        DIST_TRY(mat_md(cm, 0, dnnl_f32, &cmd));
        dnnl_matmul_desc_t md;
        DNNL_TRY(dnnl_matmul_desc_init(&md, &amd, &bmd, NULL, &cmd), "matmul descriptor");
        dnnl_primitive_attr_t attr;
        DIST_TRY(attr_new(&attr));
        if (alpha != 1.0f) dnnl_primitive_attr_set_output_scales(attr, 1, 0, &alpha);
        if (beta != 0.0f) {
            dnnl_post_ops_t po;
            dnnl_post_ops_create(&po);
            dnnl_post_ops_append_sum(po, beta);
            dnnl_primitive_attr_set_post_ops(attr, po);
            dnnl_post_ops_destroy(po);
        }
        dnnl_primitive_desc_t pd = NULL;
        dist_status pst =
            cpu_dnnl_check(dnnl_primitive_desc_create(&pd, &md, attr, c->engine, NULL), "matmul");
        dnnl_primitive_attr_destroy(attr);
        if (native && pst != DIST_OUT_OF_MEMORY && (pst != DIST_OK || is_reference_impl(pd)))
            return no_native(c, &k, pst ? NULL : pd);
        DIST_TRY(pst);
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        if (native) {
            DIST_TRY_GOTO(copy_setup(c, p, &af, &amd, 3, 8, 0, &p->reorder_x), st, fail);
            DIST_TRY_GOTO(copy_setup(c, p, &bf, &bmd, 4, 10, 1, &p->reorder_dy), st, fail);
        } else {
            DIST_TRY_GOTO(mem_new(c, &amd, &p->mem[0]), st, fail);
            DIST_TRY_GOTO(mem_new(c, &bmd, &p->mem[1]), st, fail);
        }
        DIST_TRY_GOTO(mem_new(c, &cmd, &p->mem[2]), st, fail);
        DIST_TRY_GOTO(prim_finish(c, p, pd), st, fail_nopd);
        goto ready;
    fail:
        dnnl_primitive_desc_destroy(pd);
    fail_nopd:
        cache_abandon(c, p);
        return st;
    }
    if (!p->prim) return DIST_OK;
ready:
    if (native) {
        DIST_TRY(bf16_operand(c, p, a, a_copy, 8, 0, 3, p->reorder_x));
        DIST_TRY(bf16_operand(c, p, b, b_copy, 10, 1, 4, p->reorder_dy));
    } else {
        set_handle(p->mem[0], a->data);
        set_handle(p->mem[1], b->data);
    }
    set_handle(p->mem[2], cm->data);
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, p->mem[0]}, {DNNL_ARG_WEIGHTS, p->mem[1]}, {DNNL_ARG_DST, p->mem[2]}};
    DIST_TRY(run_prim(c, p, 3, args));
    *ran = 1;
    return DIST_OK;
}

/* Shape checks and the empty cases; *done = 1 when nothing is left to compute. */
static dist_status matmul_check(int trans_a, int trans_b, float beta, const dist_tensor *a,
                                const dist_tensor *b, dist_tensor *cm, int64_t *macs, int *done) {
    *done = 1;
    if (a->ndim != 2 || b->ndim != 2 || cm->ndim != 2)
        return dist_error(DIST_INVALID_ARGUMENT, "matmul: expected 2-D tensors");
    int64_t m = trans_a ? a->shape[1] : a->shape[0], ka = trans_a ? a->shape[0] : a->shape[1];
    int64_t kb = trans_b ? b->shape[1] : b->shape[0], nn = trans_b ? b->shape[0] : b->shape[1];
    if (ka != kb || cm->shape[0] != m || cm->shape[1] != nn)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "matmul: shapes do not agree ([%lld x %lld] @ [%lld x %lld] -> [%lld x %lld])",
            (long long)m, (long long)ka, (long long)kb, (long long)nn, (long long)cm->shape[0],
            (long long)cm->shape[1]);
    if (m == 0 || nn == 0) return DIST_OK;
    if (ka == 0) {
        float *out = cm->data;
        for (int64_t i = 0; i < m * nn; i++) out[i] = beta == 0.0f ? 0.0f : beta * out[i];
        return DIST_OK;
    }
    *macs = m * nn * ka;
    *done = 0;
    return DIST_OK;
}

dist_status cpu_matmul(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                       const dist_tensor *b, float beta, dist_tensor *cm) {
    cpu_ctx *c = ctx;
    use_threads(c);
    int64_t macs;
    int done, ran;
    DIST_TRY(matmul_check(trans_a, trans_b, beta, a, b, cm, &macs, &done));
    if (done) return DIST_OK;
    return matmul_run(c, 0, trans_a, trans_b, alpha, a, b, beta, cm, NULL, NULL, &ran);
}

dist_status cpu_matmul_bf16(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                            const dist_tensor *b, float beta, dist_tensor *cm,
                            const dist_bf16_copy *a_copy, const dist_bf16_copy *b_copy) {
    cpu_ctx *c = ctx;
    use_threads(c);
    int64_t macs;
    int done, ran = 0;
    DIST_TRY(matmul_check(trans_a, trans_b, beta, a, b, cm, &macs, &done));
    if (done) return DIST_OK;
    cpu_bf16_trial t = {.entry = -1};
    int native = 0;
    if (c->native_bf16 && macs >= MATMUL_BF16_MIN_MACS) {
        prim_key k;
        matmul_key(&k, trans_a, trans_b, a, b, cm);
        k.flags[2] = beta != 0.0f;
        native = cpu_bf16_choose(c, &k, sizeof k, &t);
    }
    dist_status st = DIST_OK;
    if (native)
        st = matmul_run(c, 1, trans_a, trans_b, alpha, a, b, beta, cm, a_copy, b_copy, &ran);
    if (st == DIST_OK && !ran)
        st = matmul_run(c, 0, trans_a, trans_b, alpha, a, b, beta, cm, NULL, NULL, &ran);
    cpu_bf16_measured(c, &t, st,
                      trans_a ? (trans_b ? "matmul (a^T b^T)" : "matmul (a^T b)")
                              : (trans_b ? "matmul (a b^T)" : "matmul"),
                      a, b);
    return st;
}

/* ---- layout conversion ---------------------------------------------------------------- */

dist_status cpu_to_layout(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    cpu_ctx *c = ctx;
    use_threads(c);
    if (dist_tensor_numel(src) != dist_tensor_numel(dst) || src->dtype != dst->dtype)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: tensors differ in size or dtype");
    if (src->layout == dst->layout) {
        if (src->data != dst->data) memcpy(dst->data, src->data, dist_tensor_bytes(src));
        return DIST_OK;
    }
    if (src->ndim != 4 || dst->ndim != 4)
        return dist_error(DIST_INVALID_ARGUMENT, "to_layout: blocked layouts need 4-D tensors");
    prim_key k;
    memset(&k, 0, sizeof k);
    k.op = OP_REORDER;
    key_tensor(&k, 0, src);
    key_tensor(&k, 1, dst);
    cpu_prim *p = cache_find(c, &k);
    if (!p) {
        dnnl_memory_desc_t smd, dmd;
        DIST_TRY(act_md(src, &smd));
        DIST_TRY(act_md(dst, &dmd));
        p = cache_slot(c, &k);
        dist_status st = DIST_OK;
        DIST_TRY_GOTO(mem_new(c, &smd, &p->mem[0]), st, fail);
        DIST_TRY_GOTO(mem_new(c, &dmd, &p->mem[1]), st, fail);
        DIST_TRY_GOTO(reorder_new(c, &smd, &dmd, &p->prim), st, fail);
        p->impl = "reorder";
        goto ready;
    fail:
        cache_abandon(c, p);
        return st;
    }
ready:
    set_handle(p->mem[0], src->data);
    set_handle(p->mem[1], dst->data);
    return run_reorder(c, p->prim, p->mem[0], p->mem[1]);
}

void dist_cpu_backend_impl_info(const dist_backend *backend, char *buf, size_t size) {
    static const char *const names[] = {"?",        "conv_fwd", "conv_bwd_data", "conv_bwd_filter",
                                        "pool_fwd", "pool_bwd", "matmul",        "reorder"};
    const cpu_ctx *c = backend->ctx;
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < c->nprims && len + 1 < size; i++) {
        prim_key k;
        memcpy(&k, c->prims[i].key, sizeof k);
        const char *name = k.op >= 1 && k.op <= 7 ? names[k.op] : "?";
        len += (size_t)snprintf(buf + len, size - len, "%s=%s;", name,
                                c->prims[i].impl ? c->prims[i].impl : "?");
    }
}
