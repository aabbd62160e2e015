/* The StableHLO emitter: a traced step graph (xla_graph.h) as MLIR assembly in the generic
 * operation form, which every StableHLO consumer (PJRT plugins compile "mlir" programs)
 * parses without depending on the pretty printers' syntax. */
#include "core/error.h"
#include "dist/replica.h"
#include "xla/xla_graph.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- graph -------------------------------------------------------------------------------- */

void xg_init(xg_graph *g) { memset(g, 0, sizeof *g); }

void xg_clear(xg_graph *g) {
    for (int i = 0; i < g->count; i++) free(g->nodes[i].bytes);
    g->count = 0;
    g->num_scalars = 0;
    g->num_outputs = 0;
    g->num_states = 0;
    g->num_args = 0;
}

void xg_free(xg_graph *g) {
    xg_clear(g);
    free(g->nodes);
    free(g->outputs);
    free(g->aliases);
    free(g->states);
    free(g->args);
    memset(g, 0, sizeof *g);
}

int64_t xg_numel(const xg_node *n) {
    int64_t p = 1;
    for (int i = 0; i < n->ndim; i++) p *= n->dims[i];
    return p;
}

dist_status xg_add(xg_graph *g, xg_op op, dist_dtype dtype, int ndim, const int64_t *dims, int nin,
                   const int *in, int *id) {
    if (ndim > XG_MAX_DIMS || nin > XG_MAX_IN)
        return dist_error(DIST_UNSUPPORTED, "tpu: a value of rank %d (at most %d)", ndim,
                          XG_MAX_DIMS);
    if (g->count == g->cap) {
        int cap = g->cap ? g->cap * 2 : 256;
        xg_node *n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (graph)");
        g->nodes = n;
        g->cap = cap;
    }
    xg_node *n = &g->nodes[g->count];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->dtype = dtype;
    n->ndim = ndim;
    for (int i = 0; i < ndim; i++) n->dims[i] = dims[i];
    n->nin = nin;
    for (int i = 0; i < nin; i++) n->in[i] = in[i];
    *id = g->count++;
    return DIST_OK;
}

dist_status xg_add_output(xg_graph *g, int node, int alias) {
    if (g->num_outputs == g->cap_outputs) {
        int cap = g->cap_outputs ? g->cap_outputs * 2 : 16;
        int *o = realloc(g->outputs, (size_t)cap * sizeof *o);
        if (!o) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (graph)");
        g->outputs = o;
        int *a = realloc(g->aliases, (size_t)cap * sizeof *a);
        if (!a) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (graph)");
        g->aliases = a;
        g->cap_outputs = cap;
    }
    g->outputs[g->num_outputs] = node;
    g->aliases[g->num_outputs] = alias;
    g->num_outputs++;
    return DIST_OK;
}

/* ---- text --------------------------------------------------------------------------------- */

typedef struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
    int tmp;             /* counter of auxiliary value names */
    const char *scalars; /* the runtime scalars' value name (NULL: %scalars) */
} sbuf;

static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 1 << 16;
        while (cap - b->len <= (size_t)n) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
}

static const char *elem(dist_dtype t) {
    switch (t) {
    case DIST_F32: return "f32";
    case DIST_F16: return "f16";
    case DIST_BF16: return "bf16";
    case DIST_I32: return "i32";
    case DIST_I64: return "i64";
    case DIST_U8: return "ui8";
    default: break;
    }
    return "f32";
}

/* tensor<AxBxf32> into s */
static void type_of(char *s, size_t n, dist_dtype dt, int ndim, const int64_t *dims) {
    size_t k = (size_t)snprintf(s, n, "tensor<");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(s + k, n - k, "%" PRId64 "x", dims[i]);
    if (k < n) snprintf(s + k, n - k, "%s>", elem(dt));
}

static void type_i1(char *s, size_t n, int ndim, const int64_t *dims) {
    size_t k = (size_t)snprintf(s, n, "tensor<");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(s + k, n - k, "%" PRId64 "x", dims[i]);
    if (k < n) snprintf(s + k, n - k, "i1>");
}

#define TY(name, node)                                                                             \
    char name[96];                                                                                 \
    type_of(name, sizeof name, (node)->dtype, (node)->ndim, (node)->dims)

static void ints(sbuf *b, const int64_t *v, int n) {
    for (int i = 0; i < n; i++) put(b, "%s%" PRId64, i ? ", " : "", v[i]);
}

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* A fresh f32 scalar-shaped constant splat: returns its name in out. */
static void splat_f32(sbuf *b, float v, int ndim, const int64_t *dims, char *out, size_t n) {
    snprintf(out, n, "%%t%d", b->tmp++);
    char ty[96];
    type_of(ty, sizeof ty, DIST_F32, ndim, dims);
    put(b, "    %s = \"stablehlo.constant\"() {value = dense<0x%08" PRIX32 "> : %s} : () -> %s\n",
        out, f32_bits(v), ty, ty);
}

/* A binary reduction region body (add, maximum or minimum over f32/i32 scalars). */
static void region_body(sbuf *b, const char *op, const char *scalar_ty) {
    int a = b->tmp++, c = b->tmp++, r = b->tmp++;
    put(b, "{\n    ^bb0(%%t%d: %s, %%t%d: %s):\n", a, scalar_ty, c, scalar_ty);
    put(b, "      %%t%d = \"stablehlo.%s\"(%%t%d, %%t%d) : (%s, %s) -> %s\n", r, op, a, c,
        scalar_ty, scalar_ty, scalar_ty);
    put(b, "      \"stablehlo.return\"(%%t%d) : (%s) -> ()\n    }", r, scalar_ty);
}

static void region2(sbuf *b, const char *op, const char *scalar_ty) {
    put(b, " (");
    region_body(b, op, scalar_ty);
    put(b, ")");
}

/* name = reduce(x over dims) with op and init (f32 or i32 scalar constant text) */
static void reduce(sbuf *b, const char *out, const char *x, const char *xty, const int64_t *axes,
                   int naxes, const char *op, dist_dtype dt, const char *init_bits,
                   const char *resty) {
    const char *sty = dt == DIST_I32 ? "tensor<i32>" : "tensor<f32>";
    int init = b->tmp++;
    put(b, "    %%t%d = \"stablehlo.constant\"() {value = dense<%s> : %s} : () -> %s\n", init,
        init_bits, sty, sty);
    put(b, "    %s = \"stablehlo.reduce\"(%s, %%t%d)", out, x, init);
    region2(b, op, sty);
    put(b, " {dimensions = array<i64: ");
    ints(b, axes, naxes);
    put(b, ">} : (%s, %s) -> %s\n", xty, sty, resty);
}

static void bcast_in_dim(sbuf *b, const char *out, const char *x, const char *xty,
                         const int64_t *map, int nmap, const char *resty) {
    put(b, "    %s = \"stablehlo.broadcast_in_dim\"(%s) {broadcast_dimensions = array<i64%s", out,
        x, nmap ? ": " : "");
    ints(b, map, nmap);
    put(b, ">} : (%s) -> %s\n", xty, resty);
}

static void binary(sbuf *b, const char *out, const char *op, const char *x, const char *y,
                   const char *ty) {
    put(b, "    %s = \"stablehlo.%s\"(%s, %s) : (%s, %s) -> %s\n", out, op, x, y, ty, ty, ty);
}

static void compare(sbuf *b, const char *out, const char *dir, const char *x, const char *y,
                    const char *ty, const char *pty) {
    put(b,
        "    %s = \"stablehlo.compare\"(%s, %s) {comparison_direction = "
        "#stablehlo<comparison_direction %s>} : (%s, %s) -> %s\n",
        out, x, y, dir, ty, ty, pty);
}

static void tname(sbuf *b, char *out, size_t n) { snprintf(out, n, "%%t%d", b->tmp++); }

static void replica_groups(sbuf *b, int n) {
    put(b, "replica_groups = dense<[[");
    for (int i = 0; i < n; i++) put(b, "%s%d", i ? ", " : "", i);
    put(b, "]]> : tensor<1x%dxi64>", n);
}

static dist_status emit_node(sbuf *b, const xg_graph *g, int id, const char *const *names) {
    const xg_node *n = &g->nodes[id];
    char out[32];
    snprintf(out, sizeof out, "%s", names[id]);
    TY(ty, n);
#define IN(k) (names[n->in[k]])
#define INN(k) (&g->nodes[n->in[k]])
    switch (n->op) {
    case XG_ARG:
    case XG_STATE: return DIST_OK; /* function arguments */
    case XG_SCALAR: {
        char s[32];
        tname(b, s, sizeof s);
        put(b,
            "    %s = \"stablehlo.slice\"(%s) {limit_indices = array<i64: %" PRId64
            ">, start_indices = array<i64: %" PRId64 ">, strides = array<i64: 1>} : "
            "(tensor<%dxf32>) -> tensor<1xf32>\n",
            s, b->scalars ? b->scalars : "%scalars", n->i[0] + 1, n->i[0], g->num_scalars);
        put(b, "    %s = \"stablehlo.reshape\"(%s) : (tensor<1xf32>) -> tensor<f32>\n", out, s);
        return DIST_OK;
    }
    case XG_CONST: {
        size_t bytes = (size_t)xg_numel(n) * dist_dtype_size(n->dtype);
        put(b, "    %s = \"stablehlo.constant\"() {value = dense<\"0x", out);
        const unsigned char *p = n->bytes;
        for (size_t i = 0; i < bytes; i++) put(b, "%02X", p[i]);
        put(b, "\"> : %s} : () -> %s\n", ty, ty);
        return DIST_OK;
    }
    case XG_SPLAT:
        if (n->dtype == DIST_F32) {
            put(b,
                "    %s = \"stablehlo.constant\"() {value = dense<0x%08" PRIX32
                "> : %s} : () -> %s\n",
                out, f32_bits(n->f[0]), ty, ty);
        } else if (n->dtype == DIST_I32 || n->dtype == DIST_I64) {
            put(b, "    %s = \"stablehlo.constant\"() {value = dense<%lld> : %s} : () -> %s\n", out,
                (long long)n->f[0], ty, ty);
        } else {
            char s[32];
            splat_f32(b, n->f[0], n->ndim, n->dims, s, sizeof s);
            char fty[96];
            type_of(fty, sizeof fty, DIST_F32, n->ndim, n->dims);
            put(b, "    %s = \"stablehlo.convert\"(%s) : (%s) -> %s\n", out, s, fty, ty);
        }
        return DIST_OK;
    case XG_RESHAPE: {
        TY(ity, INN(0));
        put(b, "    %s = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", out, IN(0), ity, ty);
        return DIST_OK;
    }
    case XG_SLICE: {
        TY(ity, INN(0));
        put(b,
            "    %s = \"stablehlo.slice\"(%s) {limit_indices = array<i64: %" PRId64
            ">, start_indices = array<i64: %" PRId64 ">, strides = array<i64: 1>} : (%s) -> %s\n",
            out, IN(0), n->i[0] + xg_numel(n), n->i[0], ity, ty);
        return DIST_OK;
    }
    case XG_CONCAT: {
        put(b, "    %s = \"stablehlo.concatenate\"(", out);
        for (int k = 0; k < n->nin; k++) put(b, "%s%s", k ? ", " : "", IN(k));
        put(b, ") {dimension = %" PRId64 " : i64} : (", n->i[0]);
        for (int k = 0; k < n->nin; k++) {
            TY(ity, INN(k));
            put(b, "%s%s", k ? ", " : "", ity);
        }
        put(b, ") -> %s\n", ty);
        return DIST_OK;
    }
    case XG_CONVERT: {
        TY(ity, INN(0));
        put(b, "    %s = \"stablehlo.convert\"(%s) : (%s) -> %s\n", out, IN(0), ity, ty);
        return DIST_OK;
    }
    case XG_BROADCAST: {
        TY(ity, INN(0));
        bcast_in_dim(b, out, IN(0), ity, NULL, 0, ty);
        return DIST_OK;
    }
    case XG_BIAS: {
        TY(bty, INN(1));
        char s[32];
        tname(b, s, sizeof s);
        int64_t last = n->ndim - 1;
        bcast_in_dim(b, s, IN(1), bty, &last, 1, ty);
        binary(b, out, "add", IN(0), s, ty);
        return DIST_OK;
    }
    case XG_ADD: binary(b, out, "add", IN(0), IN(1), ty); return DIST_OK;
    case XG_SUB: binary(b, out, "subtract", IN(0), IN(1), ty); return DIST_OK;
    case XG_MUL: binary(b, out, "multiply", IN(0), IN(1), ty); return DIST_OK;
    case XG_DIV: binary(b, out, "divide", IN(0), IN(1), ty); return DIST_OK;
    case XG_MAX: binary(b, out, "maximum", IN(0), IN(1), ty); return DIST_OK;
    case XG_SQRT:
        put(b, "    %s = \"stablehlo.sqrt\"(%s) : (%s) -> %s\n", out, IN(0), ty, ty);
        return DIST_OK;
    case XG_RELU_GRAD: {
        char z[32], p[32], pty[96];
        splat_f32(b, 0.0f, n->ndim, n->dims, z, sizeof z);
        tname(b, p, sizeof p);
        type_i1(pty, sizeof pty, n->ndim, n->dims);
        compare(b, p, "GT", IN(0), z, ty, pty);
        put(b, "    %s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s\n", out, p, IN(1), z,
            pty, ty, ty, ty);
        return DIST_OK;
    }
    case XG_CONV: {
        const dist_conv2d_desc *d = &n->a.conv;
        TY(xty, INN(0));
        TY(wty, INN(1));
        put(b,
            "    %s = \"stablehlo.convolution\"(%s, %s) {batch_group_count = 1 : i64, "
            "dimension_numbers = #stablehlo.conv<[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]>, "
            "feature_group_count = %d : i64, lhs_dilation = array<i64: 1, 1>, padding = "
            "dense<[[%d, %d], [%d, %d]]> : tensor<2x2xi64>, rhs_dilation = array<i64: %d, %d>, "
            "window_strides = array<i64: %d, %d>} : (%s, %s) -> %s\n",
            out, IN(0), IN(1), dist_conv2d_groups(d), d->pad_top, d->pad_bottom, d->pad_left,
            d->pad_right, dist_conv2d_dil_h(d), dist_conv2d_dil_w(d), d->stride_h, d->stride_w, xty,
            wty, ty);
        return DIST_OK;
    }
    case XG_CONV_DX: {
        /* dx = dy (dilated by the strides) convolved with the kernel reversed in space, its
         * input and output features swapped; grouped: per group, so the kernel
         * [kh, kw, I/G, G * O/G] becomes [kh, kw, O/G, G * I/G] (XLA's own rewrite) */
        const dist_conv2d_desc *d = &n->a.conv;
        const xg_node *dy = INN(0), *w = INN(1);
        TY(dyty, dy);
        TY(wty, w);
        int64_t ng = dist_conv2d_groups(d), dh = dist_conv2d_dil_h(d), dw = dist_conv2d_dil_w(d);
        int64_t kh = w->dims[0], kw = w->dims[1], ig = w->dims[2], og = w->dims[3] / ng;
        int64_t ekh = (kh - 1) * dh + 1, ekw = (kw - 1) * dw + 1;
        int64_t lo_h = ekh - 1 - d->pad_top, lo_w = ekw - 1 - d->pad_left;
        int64_t hi_h = n->dims[1] + ekh - 2 - (dy->dims[1] - 1) * d->stride_h - lo_h;
        int64_t hi_w = n->dims[2] + ekw - 2 - (dy->dims[2] - 1) * d->stride_w - lo_w;
        char r[32], kty[96];
        tname(b, r, sizeof r);
        put(b, "    %s = \"stablehlo.reverse\"(%s) {dimensions = array<i64: 0, 1>} : (%s) -> %s\n",
            r, IN(1), wty, wty);
        const char *dn = "[b, 0, 1, f]x[0, 1, o, i]->[b, 0, 1, f]";
        snprintf(kty, sizeof kty, "%s", wty);
        if (ng > 1) {
            char r5[32], t5[32], ty5[96], tt5[96];
            int64_t d5[5] = {kh, kw, ig, ng, og}, p5[5] = {kh, kw, og, ng, ig};
            int64_t k4[4] = {kh, kw, og, ng * ig};
            type_of(ty5, sizeof ty5, w->dtype, 5, d5);
            type_of(tt5, sizeof tt5, w->dtype, 5, p5);
            type_of(kty, sizeof kty, w->dtype, 4, k4);
            tname(b, r5, sizeof r5);
            tname(b, t5, sizeof t5);
            put(b, "    %s = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", r5, r, wty, ty5);
            put(b,
                "    %s = \"stablehlo.transpose\"(%s) {permutation = array<i64: 0, 1, 4, 3, 2>} "
                ": (%s) -> %s\n",
                t5, r5, ty5, tt5);
            tname(b, r, sizeof r);
            put(b, "    %s = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", r, t5, tt5, kty);
            dn = "[b, 0, 1, f]x[0, 1, i, o]->[b, 0, 1, f]";
        }
        put(b,
            "    %s = \"stablehlo.convolution\"(%s, %s) {batch_group_count = 1 : i64, "
            "dimension_numbers = #stablehlo.conv<%s>, "
            "feature_group_count = %" PRId64 " : i64, lhs_dilation = array<i64: %d, %d>, padding = "
            "dense<[[%" PRId64 ", %" PRId64 "], [%" PRId64 ", %" PRId64
            "]]> : tensor<2x2xi64>, rhs_dilation = array<i64: %" PRId64 ", %" PRId64
            ">, window_strides = array<i64: 1, 1>} : (%s, %s) -> %s\n",
            out, IN(0), r, dn, ng, d->stride_h, d->stride_w, lo_h, hi_h, lo_w, hi_w, dh, dw, dyty,
            kty, ty);
        return DIST_OK;
    }
    case XG_CONV_DW: {
        /* dw[kh, kw, i, o] = sum over images and outputs of x * dy: x's images as the features,
         * dy as the kernel dilated by the strides, the taps dilation apart as the window
         * strides; grouped: batch_group_count splits x's channels and dy's into the groups */
        const dist_conv2d_desc *d = &n->a.conv;
        const xg_node *x = INN(0), *dy = INN(1);
        TY(xty, x);
        TY(dyty, dy);
        int64_t kh = n->dims[0], kw = n->dims[1];
        int64_t dh = dist_conv2d_dil_h(d), dw = dist_conv2d_dil_w(d);
        int64_t lo_h = d->pad_top, lo_w = d->pad_left;
        int64_t hi_h = (kh - 1) * dh + 1 - x->dims[1] - lo_h + (dy->dims[1] - 1) * d->stride_h;
        int64_t hi_w = (kw - 1) * dw + 1 - x->dims[2] - lo_w + (dy->dims[2] - 1) * d->stride_w;
        put(b,
            "    %s = \"stablehlo.convolution\"(%s, %s) {batch_group_count = %d : i64, "
            "dimension_numbers = #stablehlo.conv<[f, 0, 1, b]x[i, 0, 1, o]->[0, 1, b, f]>, "
            "feature_group_count = 1 : i64, lhs_dilation = array<i64: 1, 1>, padding = "
            "dense<[[%" PRId64 ", %" PRId64 "], [%" PRId64 ", %" PRId64
            "]]> : tensor<2x2xi64>, rhs_dilation = array<i64: %d, %d>, window_strides = "
            "array<i64: %" PRId64 ", %" PRId64 ">} : (%s, %s) -> %s\n",
            out, IN(0), IN(1), dist_conv2d_groups(d), lo_h, hi_h, lo_w, hi_w, d->stride_h,
            d->stride_w, dh, dw, xty, dyty, ty);
        return DIST_OK;
    }
    case XG_REDUCE_SUM:
    case XG_REDUCE_MAX: { /* over the axes of mask i[0], then to the node's shape */
        const xg_node *x = INN(0);
        TY(xty, x);
        int64_t axes[XG_MAX_DIMS], kept[XG_MAX_DIMS];
        int na = 0, nk = 0;
        for (int a = 0; a < x->ndim; a++) {
            if (n->i[0] >> a & 1)
                axes[na++] = a;
            else
                kept[nk++] = x->dims[a];
        }
        char rty[96], r[32];
        type_of(rty, sizeof rty, n->dtype, nk, kept);
        tname(b, r, sizeof r);
        if (n->op == XG_REDUCE_SUM)
            reduce(b, r, IN(0), xty, axes, na, "add", DIST_F32, "0x00000000", rty);
        else
            reduce(b, r, IN(0), xty, axes, na, "maximum", DIST_F32, "0xFF800000", rty);
        put(b, "    %s = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", out, r, rty, ty);
        return DIST_OK;
    }
    case XG_MAXPOOL:
    case XG_MAXPOOL_DX: {
        const dist_pool2d_desc *d = &n->a.pool;
        const xg_node *x = INN(0);
        TY(xty, x);
        char win[160];
        snprintf(win, sizeof win,
                 "padding = dense<[[0, 0], [%d, %d], [%d, %d], [0, 0]]> : tensor<4x2xi64>, "
                 "window_dimensions = array<i64: 1, %d, %d, 1>, window_strides = array<i64: 1, "
                 "%d, %d, 1>",
                 d->pad_top, d->pad_bottom, d->pad_left, d->pad_right, d->window_h, d->window_w,
                 d->stride_h, d->stride_w);
        if (n->op == XG_MAXPOOL) {
            int init = b->tmp++;
            put(b,
                "    %%t%d = \"stablehlo.constant\"() {value = dense<0xFF800000> : tensor<f32>} : "
                "() -> tensor<f32>\n",
                init);
            put(b, "    %s = \"stablehlo.reduce_window\"(%s, %%t%d)", out, IN(0), init);
            region2(b, "maximum", "tensor<f32>");
            put(b, " {%s} : (%s, tensor<f32>) -> %s\n", win, xty, ty);
        } else {
            TY(dyty, INN(1));
            int init = b->tmp++, a = b->tmp++, c = b->tmp++, r = b->tmp++;
            put(b,
                "    %%t%d = \"stablehlo.constant\"() {value = dense<0x00000000> : tensor<f32>} : "
                "() -> tensor<f32>\n",
                init);
            put(b, "    %s = \"stablehlo.select_and_scatter\"(%s, %s, %%t%d) ({\n", out, IN(0),
                IN(1), init);
            put(b, "    ^bb0(%%t%d: tensor<f32>, %%t%d: tensor<f32>):\n", a, c);
            put(b,
                "      %%t%d = \"stablehlo.compare\"(%%t%d, %%t%d) {comparison_direction = "
                "#stablehlo<comparison_direction GE>} : (tensor<f32>, tensor<f32>) -> "
                "tensor<i1>\n",
                r, a, c);
            put(b, "      \"stablehlo.return\"(%%t%d) : (tensor<i1>) -> ()\n    }, ", r);
            region_body(b, "add", "tensor<f32>");
            put(b, ") {%s} : (%s, %s, tensor<f32>) -> %s\n", win, xty, dyty, ty);
        }
        return DIST_OK;
    }
    case XG_MATMUL: {
        TY(aty, INN(0));
        TY(bty, INN(1));
        put(b,
            "    %s = \"stablehlo.dot_general\"(%s, %s) {dot_dimension_numbers = "
            "#stablehlo.dot<lhs_contracting_dimensions = [%d], rhs_contracting_dimensions = "
            "[%d]>} : (%s, %s) -> %s\n",
            out, IN(0), IN(1), n->i[0] ? 0 : 1, n->i[1] ? 1 : 0, aty, bty, ty);
        return DIST_OK;
    }
    case XG_GATHER_ROWS: {
        TY(tty, INN(0));
        TY(ity, INN(1));
        put(b,
            "    %s = \"stablehlo.gather\"(%s, %s) {dimension_numbers = "
            "#stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], start_index_map = "
            "[0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, "
            "%" PRId64 ">} : (%s, %s) -> %s\n",
            out, IN(0), IN(1), n->dims[1], tty, ity, ty);
        return DIST_OK;
    }
    case XG_SCATTER_ADD: {
        TY(ity, INN(0));
        TY(uty, INN(1));
        int zero = b->tmp++;
        put(b,
            "    %%t%d = \"stablehlo.constant\"() {value = dense<0.000000e+00> : %s} : () -> %s\n",
            zero, ty, ty);
        put(b, "    %s = \"stablehlo.scatter\"(%%t%d, %s, %s)", out, zero, IN(0), IN(1));
        region2(b, "add", "tensor<f32>");
        put(b,
            " {indices_are_sorted = false, scatter_dimension_numbers = "
            "#stablehlo.scatter<update_window_dims = [1], inserted_window_dims = [0], "
            "scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : "
            "(%s, %s, %s) -> %s\n",
            ty, ity, uty, ty);
        return DIST_OK;
    }
    case XG_BATCH_MATMUL: {
        TY(aty, INN(0));
        TY(bty, INN(1));
        put(b,
            "    %s = \"stablehlo.dot_general\"(%s, %s) {dot_dimension_numbers = "
            "#stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], "
            "lhs_contracting_dimensions = [%d], rhs_contracting_dimensions = [%d]>} : (%s, %s) "
            "-> %s\n",
            out, IN(0), IN(1), n->i[0] ? 1 : 2, n->i[1] ? 2 : 1, aty, bty, ty);
        return DIST_OK;
    }
    case XG_XENT_LOSS:
    case XG_SOFTMAX:
    case XG_XENT_GRAD:
    case XG_ACC_COUNT: {
        /* logits (or probs for the gradient) [N, K], labels [N] */
        const xg_node *l = INN(0);
        int64_t N = l->dims[0], K = l->dims[1];
        char lty[96], nty[96], ity[96], pty[96], nity[96];
        type_of(lty, sizeof lty, DIST_F32, 2, l->dims);
        type_of(nty, sizeof nty, DIST_F32, 1, &N);
        type_of(ity, sizeof ity, DIST_I32, 2, l->dims);
        type_of(nity, sizeof nity, DIST_I32, 1, &N);
        snprintf(pty, sizeof pty, "tensor<%" PRId64 "x%" PRId64 "xi1>", N, K);
        int64_t axis1 = 1, map0 = 0;
        char iota[32], yb[32], eq[32];
        tname(b, iota, sizeof iota);
        tname(b, yb, sizeof yb);
        tname(b, eq, sizeof eq);
        put(b, "    %s = \"stablehlo.iota\"() {iota_dimension = 1 : i64} : () -> %s\n", iota, ity);
        bcast_in_dim(b, yb, IN(1), nity, &map0, 1, ity);
        compare(b, eq, "EQ", iota, yb, ity, pty);
        char one[32], zero[32], oh[32];
        splat_f32(b, 1.0f, 2, l->dims, one, sizeof one);
        splat_f32(b, 0.0f, 2, l->dims, zero, sizeof zero);
        tname(b, oh, sizeof oh);
        put(b, "    %s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s\n", oh, eq, one,
            zero, pty, lty, lty, lty);
        if (n->op == XG_XENT_GRAD) {
            char db[32], diff[32];
            tname(b, db, sizeof db);
            tname(b, diff, sizeof diff);
            bcast_in_dim(b, db, IN(2), nty, &map0, 1, lty);
            binary(b, diff, "subtract", IN(0), oh, lty);
            binary(b, out, "multiply", db, diff, lty);
            return DIST_OK;
        }
        char mx[32], mxb[32];
        tname(b, mx, sizeof mx);
        tname(b, mxb, sizeof mxb);
        reduce(b, mx, IN(0), lty, &axis1, 1, "maximum", DIST_F32, "0xFF800000", nty);
        bcast_in_dim(b, mxb, mx, nty, &map0, 1, lty);
        if (n->op == XG_ACC_COUNT) {
            char ism[32], kk[32], idx[32], first[32], ok[32], one1[32], zero1[32], hit[32], cnt[32];
            char npty[64];
            snprintf(npty, sizeof npty, "tensor<%" PRId64 "xi1>", N);
            tname(b, ism, sizeof ism);
            tname(b, kk, sizeof kk);
            tname(b, idx, sizeof idx);
            tname(b, first, sizeof first);
            tname(b, ok, sizeof ok);
            tname(b, hit, sizeof hit);
            tname(b, cnt, sizeof cnt);
            compare(b, ism, "EQ", IN(0), mxb, lty, pty);
            put(b,
                "    %s = \"stablehlo.constant\"() {value = dense<%" PRId64 "> : %s} : () -> %s\n",
                kk, K, ity, ity);
            put(b, "    %s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s\n", idx, ism,
                iota, kk, pty, ity, ity, ity);
            reduce(b, first, idx, ity, &axis1, 1, "minimum", DIST_I32, "2147483647", nity);
            compare(b, ok, "EQ", first, IN(1), nity, npty);
            splat_f32(b, 1.0f, 1, &N, one1, sizeof one1);
            splat_f32(b, 0.0f, 1, &N, zero1, sizeof zero1);
            put(b, "    %s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s\n", hit, ok,
                one1, zero1, npty, nty, nty, nty);
            reduce(b, cnt, hit, nty, &map0, 1, "add", DIST_F32, "0x00000000", "tensor<f32>");
            put(b, "    %s = \"stablehlo.reshape\"(%s) : (tensor<f32>) -> %s\n", out, cnt, ty);
            return DIST_OK;
        }
        char sh[32], e[32], se[32];
        tname(b, sh, sizeof sh);
        tname(b, e, sizeof e);
        tname(b, se, sizeof se);
        binary(b, sh, "subtract", IN(0), mxb, lty);
        put(b, "    %s = \"stablehlo.exponential\"(%s) : (%s) -> %s\n", e, sh, lty, lty);
        reduce(b, se, e, lty, &axis1, 1, "add", DIST_F32, "0x00000000", nty);
        if (n->op == XG_SOFTMAX) {
            char seb[32];
            tname(b, seb, sizeof seb);
            bcast_in_dim(b, seb, se, nty, &map0, 1, lty);
            binary(b, out, "divide", e, seb, lty);
            return DIST_OK;
        }
        char lse[32], prod[32], picked[32];
        tname(b, lse, sizeof lse);
        tname(b, prod, sizeof prod);
        tname(b, picked, sizeof picked);
        put(b, "    %s = \"stablehlo.log\"(%s) : (%s) -> %s\n", lse, se, nty, nty);
        binary(b, prod, "multiply", sh, oh, lty);
        reduce(b, picked, prod, lty, &axis1, 1, "add", DIST_F32, "0x00000000", nty);
        binary(b, out, "subtract", lse, picked, nty);
        return DIST_OK;
    }
    case XG_ALL_REDUCE: {
        const char *sty = n->dtype == DIST_F32   ? "tensor<f32>"
                          : n->dtype == DIST_I64 ? "tensor<i64>"
                                                 : "tensor<i32>";
        dist_reduce_op op = (dist_reduce_op)n->i[0];
        const char *fn = op == DIST_REDUCE_MAX   ? "maximum"
                         : op == DIST_REDUCE_MIN ? "minimum"
                                                 : "add";
        char r[32];
        if (op == DIST_REDUCE_MEAN)
            tname(b, r, sizeof r);
        else
            snprintf(r, sizeof r, "%s", out);
        put(b, "    %s = \"stablehlo.all_reduce\"(%s)", r, IN(0));
        region2(b, fn, sty);
        put(b, " {");
        replica_groups(b, g->num_replicas);
        put(b, "} : (%s) -> %s\n", ty, ty);
        if (op == DIST_REDUCE_MEAN) {
            char s[32];
            splat_f32(b, 1.0f / (float)g->num_replicas, n->ndim, n->dims, s, sizeof s);
            binary(b, out, "multiply", r, s, ty);
        }
        return DIST_OK;
    }
    case XG_ALL_GATHER: {
        TY(ity, INN(0));
        put(b, "    %s = \"stablehlo.all_gather\"(%s) {all_gather_dim = 0 : i64, ", out, IN(0));
        replica_groups(b, g->num_replicas);
        put(b, "} : (%s) -> %s\n", ity, ty);
        return DIST_OK;
    }
    case XG_UNARY: {
        static const char *const fn[XU_COUNT] = {
            "stablehlo.negate",       "stablehlo.exponential", "stablehlo.log",
            "stablehlo.log_plus_one", "stablehlo.abs",         "stablehlo.sign",
            "stablehlo.tanh",         "stablehlo.logistic",    "chlo.erf"};
        if (n->i[0] == XU_IS_FINITE) {
            char p[32], pty[96];
            tname(b, p, sizeof p);
            type_i1(pty, sizeof pty, n->ndim, n->dims);
            put(b, "    %s = \"stablehlo.is_finite\"(%s) : (%s) -> %s\n", p, IN(0), ty, pty);
            put(b, "    %s = \"stablehlo.convert\"(%s) : (%s) -> %s\n", out, p, pty, ty);
            return DIST_OK;
        }
        if (n->i[0] < 0 || n->i[0] >= XU_IS_FINITE) break;
        put(b, "    %s = \"%s\"(%s) : (%s) -> %s\n", out, fn[n->i[0]], IN(0), ty, ty);
        return DIST_OK;
    }
    case XG_MIN: binary(b, out, "minimum", IN(0), IN(1), ty); return DIST_OK;
    case XG_XOR: binary(b, out, "xor", IN(0), IN(1), ty); return DIST_OK;
    case XG_OR: binary(b, out, "or", IN(0), IN(1), ty); return DIST_OK;
    case XG_SHL: binary(b, out, "shift_left", IN(0), IN(1), ty); return DIST_OK;
    case XG_SHR: binary(b, out, "shift_right_logical", IN(0), IN(1), ty); return DIST_OK;
    case XG_SELECT_CMP: {
        static const char *const dir[] = {"EQ", "NE", "LT", "LE", "GT", "GE"};
        if (n->i[0] < 0 || n->i[0] > XC_GE) break;
        TY(cty, INN(0));
        char p[32], pty[96];
        tname(b, p, sizeof p);
        type_i1(pty, sizeof pty, n->ndim, n->dims);
        compare(b, p, dir[n->i[0]], IN(0), IN(1), cty, pty);
        put(b, "    %s = \"stablehlo.select\"(%s, %s, %s) : (%s, %s, %s) -> %s\n", out, p, IN(2),
            IN(3), pty, ty, ty, ty);
        return DIST_OK;
    }
    case XG_BCAST_DIMS: {
        TY(ity, INN(0));
        int64_t map[XG_MAX_DIMS];
        int nm = 0;
        for (int a = 0; a < n->ndim; a++)
            if (n->i[0] >> a & 1) map[nm++] = a;
        bcast_in_dim(b, out, IN(0), ity, map, nm, ty);
        return DIST_OK;
    }
    case XG_TRANSPOSE: {
        TY(ity, INN(0));
        put(b, "    %s = \"stablehlo.transpose\"(%s) {permutation = array<i64: ", out, IN(0));
        ints(b, n->a.perm, n->ndim);
        put(b, ">} : (%s) -> %s\n", ity, ty);
        return DIST_OK;
    }
    case XG_SLICE_ND: {
        TY(ity, INN(0));
        int64_t lim[XG_MAX_DIMS], one[XG_MAX_DIMS];
        for (int a = 0; a < n->ndim; a++) lim[a] = n->a.pad.lo[a] + n->dims[a], one[a] = 1;
        put(b, "    %s = \"stablehlo.slice\"(%s) {limit_indices = array<i64: ", out, IN(0));
        ints(b, lim, n->ndim);
        put(b, ">, start_indices = array<i64: ");
        ints(b, n->a.pad.lo, n->ndim);
        put(b, ">, strides = array<i64: ");
        ints(b, one, n->ndim);
        put(b, ">} : (%s) -> %s\n", ity, ty);
        return DIST_OK;
    }
    case XG_PAD: {
        TY(ity, INN(0));
        int z = b->tmp++;
        put(b,
            "    %%t%d = \"stablehlo.constant\"() {value = dense<0x00000000> : tensor<f32>} : () "
            "-> tensor<f32>\n",
            z);
        put(b, "    %s = \"stablehlo.pad\"(%s, %%t%d) {edge_padding_high = array<i64: ", out, IN(0),
            z);
        ints(b, n->a.pad.hi, n->ndim);
        put(b, ">, edge_padding_low = array<i64: ");
        ints(b, n->a.pad.lo, n->ndim);
        put(b, ">, interior_padding = array<i64: ");
        ints(b, n->a.pad.interior, n->ndim);
        put(b, ">} : (%s, tensor<f32>) -> %s\n", ity, ty);
        return DIST_OK;
    }
    case XG_REDUCE_WINDOW: {
        const dist_pool2d_desc *d = &n->a.pool;
        TY(xty, INN(0));
        int init = b->tmp++;
        put(b,
            "    %%t%d = \"stablehlo.constant\"() {value = dense<0x00000000> : tensor<f32>} : () "
            "-> tensor<f32>\n",
            init);
        put(b, "    %s = \"stablehlo.reduce_window\"(%s, %%t%d)", out, IN(0), init);
        region2(b, "add", "tensor<f32>");
        put(b,
            " {padding = dense<[[0, 0], [%d, %d], [%d, %d], [0, 0]]> : tensor<4x2xi64>, "
            "window_dimensions = array<i64: 1, %d, %d, 1>, window_strides = array<i64: 1, %d, "
            "%d, 1>} : (%s, tensor<f32>) -> %s\n",
            d->pad_top, d->pad_bottom, d->pad_left, d->pad_right, d->window_h, d->window_w,
            d->stride_h, d->stride_w, xty, ty);
        return DIST_OK;
    }
    case XG_IOTA:
        put(b, "    %s = \"stablehlo.iota\"() {iota_dimension = %" PRId64 " : i64} : () -> %s\n",
            out, n->i[0], ty);
        return DIST_OK;
    case XG_ISPLAT:
        put(b, "    %s = \"stablehlo.constant\"() {value = dense<%" PRId64 "> : %s} : () -> %s\n",
            out, n->dtype == DIST_I32 ? (int64_t)(int32_t)(uint32_t)n->i[0] : n->i[0], ty, ty);
        return DIST_OK;
    case XG_REPLICA_ID: {
        char r[32];
        tname(b, r, sizeof r);
        put(b, "    %s = \"stablehlo.replica_id\"() : () -> tensor<ui32>\n", r);
        put(b, "    %s = \"stablehlo.convert\"(%s) : (tensor<ui32>) -> %s\n", out, r, ty);
        return DIST_OK;
    }
    }
#undef IN
#undef INN
    return dist_error(DIST_UNSUPPORTED, "tpu: the StableHLO emitter has no rule for node kind %d",
                      (int)n->op);
}

dist_status xg_emit_stablehlo(const xg_graph *g, char **text, size_t *len) {
    DIST_CHECK_ARG(g && text && len, "xg_emit_stablehlo: NULL argument");
    sbuf b = {0};
    char **names = calloc((size_t)(g->count ? g->count : 1), sizeof *names);
    char *store = calloc((size_t)(g->count ? g->count : 1), 24);
    if (!names || !store) {
        free(names);
        free(store);
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
    }
    for (int i = 0; i < g->count; i++) {
        names[i] = store + (size_t)i * 24;
        snprintf(names[i], 24, "%%v%d", i);
    }
    /* arguments: scalars, states, inputs */
    int argi = 0;
    put(&b,
        "module @libdist_step attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = %d : "
        "i32} {\n  func.func public @main(",
        g->num_replicas);
    if (g->num_scalars > 0) {
        put(&b, "%%scalars: tensor<%dxf32>", g->num_scalars);
        argi++;
    }
    for (int s = 0; s < g->num_states; s++) {
        const xg_node *n = &g->nodes[g->states[s]];
        TY(ty, n);
        snprintf(names[g->states[s]], 24, "%%arg%d", argi);
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ty);
        for (int o = 0; o < g->num_outputs; o++)
            if (g->aliases[o] == s) put(&b, " {tf.aliasing_output = %d : i32}", o);
        argi++;
    }
    for (int a = 0; a < g->num_args; a++) {
        const xg_node *n = &g->nodes[g->args[a]];
        TY(ty, n);
        snprintf(names[g->args[a]], 24, "%%arg%d", argi);
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ty);
        argi++;
    }
    put(&b, ") -> (");
    for (int o = 0; o < g->num_outputs; o++) {
        TY(ty, &g->nodes[g->outputs[o]]);
        put(&b, "%s%s", o ? ", " : "", ty);
    }
    put(&b, ") {\n");
    dist_status st = DIST_OK;
    for (int i = 0; i < g->count && st == DIST_OK; i++)
        st = emit_node(&b, g, i, (const char *const *)names);
    if (st == DIST_OK) {
        put(&b, "    \"func.return\"(");
        for (int o = 0; o < g->num_outputs; o++)
            put(&b, "%s%s", o ? ", " : "", names[g->outputs[o]]);
        put(&b, ") : (");
        for (int o = 0; o < g->num_outputs; o++) {
            TY(ty, &g->nodes[g->outputs[o]]);
            put(&b, "%s%s", o ? ", " : "", ty);
        }
        put(&b, ") -> ()\n  }\n}\n");
    }
    free(names);
    free(store);
    if (st != DIST_OK) {
        free(b.p);
        return st;
    }
    if (b.oom) {
        free(b.p);
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
    }
    *text = b.p;
    *len = b.len;
    return DIST_OK;
}

/* ---- k steps in one program: a while loop over stacked inputs ----------------------------- */

static void stacked_type(char *s, size_t n, int k, const xg_node *node) {
    int64_t dims[XG_MAX_DIMS + 1];
    dims[0] = k;
    for (int i = 0; i < node->ndim; i++) dims[i + 1] = node->dims[i];
    type_of(s, n, node->dtype, node->ndim + 1, dims);
}

/* tensor<1x...> of a node's shape: one step's slice of a stacked value. */
static void one_type(char *s, size_t n, const xg_node *node) { stacked_type(s, n, 1, node); }

/* The carried values of the loop, in order: the counter, the scalars (when any), the state
 * inputs, the state outputs that are not inputs, the stacked inputs, the stacked step outputs. */
typedef struct loop_layout {
    int scalars;    /* index of the scalars, or -1 */
    int states;     /* first state input */
    int write_only; /* first write-only state output */
    int num_wo;
    int *wo_output;  /* per write-only carried value: its output index */
    int inputs;      /* first stacked input */
    int accs;        /* first accumulator */
    int *acc_output; /* per accumulator: its output index */
    int num_accs;
    int count; /* carried values in all */
} loop_layout;

/* The carried value that holds output o at the end. */
static int carried_of(const loop_layout *L, const xg_graph *g, int o) {
    for (int w = 0; w < L->num_wo; w++)
        if (L->wo_output[w] == o) return L->write_only + w;
    for (int q = 0; q < L->num_accs; q++)
        if (L->acc_output[q] == o) return L->accs + q;
    return L->states + g->aliases[o];
}

static int is_state_output(const xg_graph *g, int o, const int *out_is_state) {
    (void)g;
    return out_is_state[o];
}

dist_status xg_emit_stablehlo_loop(const xg_graph *g, int k, const int *out_is_state, char **text,
                                   size_t *len) {
    DIST_CHECK_ARG(g && text && len && out_is_state && k >= 1,
                   "xg_emit_stablehlo_loop: bad argument");
    sbuf b = {0};
    int n = g->count ? g->count : 1;
    char **names = calloc((size_t)n, sizeof *names);
    char *store = calloc((size_t)n, 24);
    loop_layout L = {0};
    L.wo_output = calloc((size_t)(g->num_outputs + 1), sizeof(int));
    L.acc_output = calloc((size_t)(g->num_outputs + 1), sizeof(int));
    char **ctype = NULL; /* type of each carried value */
    dist_status st = DIST_OK;
    if (!names || !store || !L.wo_output || !L.acc_output) {
        st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
        goto done;
    }
    for (int i = 0; i < g->count; i++) {
        names[i] = store + (size_t)i * 24;
        snprintf(names[i], 24, "%%v%d", i);
    }
    int c = 1;
    L.scalars = g->num_scalars > 0 ? c++ : -1;
    L.states = c;
    c += g->num_states;
    L.write_only = c;
    for (int o = 0; o < g->num_outputs; o++)
        if (is_state_output(g, o, out_is_state) && g->aliases[o] < 0) L.wo_output[L.num_wo++] = o;
    c += L.num_wo;
    L.inputs = c;
    c += g->num_args;
    L.accs = c;
    for (int o = 0; o < g->num_outputs; o++)
        if (!is_state_output(g, o, out_is_state)) L.acc_output[L.num_accs++] = o;
    c += L.num_accs;
    L.count = c;
    ctype = calloc((size_t)c, sizeof *ctype);
    char *tstore = calloc((size_t)c, 128);
    if (!ctype || !tstore) {
        free(tstore);
        st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
        goto done;
    }
    for (int i = 0; i < c; i++) ctype[i] = tstore + (size_t)i * 128;
    snprintf(ctype[0], 128, "tensor<i32>");
    if (L.scalars >= 0) snprintf(ctype[L.scalars], 128, "tensor<%dx%dxf32>", k, g->num_scalars);
    for (int s = 0; s < g->num_states; s++) {
        const xg_node *nd = &g->nodes[g->states[s]];
        type_of(ctype[L.states + s], 128, nd->dtype, nd->ndim, nd->dims);
    }
    for (int w = 0; w < L.num_wo; w++) {
        const xg_node *nd = &g->nodes[g->outputs[L.wo_output[w]]];
        type_of(ctype[L.write_only + w], 128, nd->dtype, nd->ndim, nd->dims);
    }
    for (int a = 0; a < g->num_args; a++)
        stacked_type(ctype[L.inputs + a], 128, k, &g->nodes[g->args[a]]);
    for (int q = 0; q < L.num_accs; q++)
        stacked_type(ctype[L.accs + q], 128, k, &g->nodes[g->outputs[L.acc_output[q]]]);

    /* the function: scalars [k, S], states, stacked inputs -> state outputs, stacked outputs */
    put(&b,
        "module @libdist_steps attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = %d "
        ": i32} {\n  func.func public @main(",
        g->num_replicas);
    int argi = 0;
    if (L.scalars >= 0) {
        put(&b, "%%scalars_all: %s", ctype[L.scalars]);
        argi++;
    }
    for (int s = 0; s < g->num_states; s++) {
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ctype[L.states + s]);
        for (int o = 0; o < g->num_outputs; o++)
            if (g->aliases[o] == s) put(&b, " {tf.aliasing_output = %d : i32}", o);
        argi++;
    }
    for (int a = 0; a < g->num_args; a++, argi++)
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ctype[L.inputs + a]);
    put(&b, ") -> (");
    for (int o = 0; o < g->num_outputs; o++) {
        int carried = carried_of(&L, g, o);
        put(&b, "%s%s", o ? ", " : "", ctype[carried]);
    }
    put(&b, ") {\n");
    /* initial values */
    put(&b, "    %%i0 = \"stablehlo.constant\"() {value = dense<0> : tensor<i32>} : () -> "
            "tensor<i32>\n");
    for (int w = 0; w < L.num_wo; w++)
        put(&b, "    %%wo%d = \"stablehlo.constant\"() {value = dense<0.0> : %s} : () -> %s\n", w,
            ctype[L.write_only + w], ctype[L.write_only + w]);
    for (int q = 0; q < L.num_accs; q++) {
        const xg_node *nd = &g->nodes[g->outputs[L.acc_output[q]]];
        const char *zero =
            nd->dtype == DIST_F32 || nd->dtype == DIST_BF16 || nd->dtype == DIST_F16 ? "0.0" : "0";
        put(&b, "    %%acc%d = \"stablehlo.constant\"() {value = dense<%s> : %s} : () -> %s\n", q,
            zero, ctype[L.accs + q], ctype[L.accs + q]);
    }
    put(&b, "    %%w:%d = \"stablehlo.while\"(%%i0", L.count);
    argi = 0;
    if (L.scalars >= 0) put(&b, ", %%scalars_all"), argi++;
    for (int s = 0; s < g->num_states; s++) put(&b, ", %%arg%d", argi++);
    for (int w = 0; w < L.num_wo; w++) put(&b, ", %%wo%d", w);
    for (int a = 0; a < g->num_args; a++) put(&b, ", %%arg%d", argi++);
    for (int q = 0; q < L.num_accs; q++) put(&b, ", %%acc%d", q);
    /* condition */
    put(&b, ") ({\n    ^bb0(");
    for (int i = 0; i < L.count; i++) put(&b, "%s%%p%d: %s", i ? ", " : "", i, ctype[i]);
    put(&b, "):\n");
    put(&b,
        "      %%pk = \"stablehlo.constant\"() {value = dense<%d> : tensor<i32>} : () -> "
        "tensor<i32>\n"
        "      %%pc = \"stablehlo.compare\"(%%p0, %%pk) {comparison_direction = "
        "#stablehlo<comparison_direction LT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>\n"
        "      \"stablehlo.return\"(%%pc) : (tensor<i1>) -> ()\n    }, {\n    ^bb0(",
        k);
    for (int i = 0; i < L.count; i++) put(&b, "%s%%c%d: %s", i ? ", " : "", i, ctype[i]);
    put(&b, "):\n");
    put(&b, "    %%z = \"stablehlo.constant\"() {value = dense<0> : tensor<i32>} : () -> "
            "tensor<i32>\n");
    if (L.scalars >= 0) {
        put(&b,
            "    %%srow = \"stablehlo.dynamic_slice\"(%%c%d, %%c0, %%z) {slice_sizes = array<i64: "
            "1, %d>} : (%s, tensor<i32>, tensor<i32>) -> tensor<1x%dxf32>\n",
            L.scalars, g->num_scalars, ctype[L.scalars], g->num_scalars);
        put(&b,
            "    %%scalars = \"stablehlo.reshape\"(%%srow) : (tensor<1x%dxf32>) -> "
            "tensor<%dxf32>\n",
            g->num_scalars, g->num_scalars);
    }
    for (int s = 0; s < g->num_states; s++)
        snprintf(names[g->states[s]], 24, "%%c%d", L.states + s);
    for (int a = 0; a < g->num_args; a++) {
        const xg_node *nd = &g->nodes[g->args[a]];
        char one[128], ty[96];
        one_type(one, sizeof one, nd);
        type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
        put(&b, "    %%in%d_1 = \"stablehlo.dynamic_slice\"(%%c%d, %%c0", a, L.inputs + a);
        for (int i = 0; i < nd->ndim; i++) put(&b, ", %%z");
        put(&b, ") {slice_sizes = array<i64: 1");
        for (int i = 0; i < nd->ndim; i++) put(&b, ", %" PRId64, nd->dims[i]);
        put(&b, ">} : (%s, tensor<i32>", ctype[L.inputs + a]);
        for (int i = 0; i < nd->ndim; i++) put(&b, ", tensor<i32>");
        put(&b, ") -> %s\n", one);
        put(&b, "    %%in%d = \"stablehlo.reshape\"(%%in%d_1) : (%s) -> %s\n", a, a, one, ty);
        snprintf(names[g->args[a]], 24, "%%in%d", a);
    }
    for (int i = 0; i < g->count && st == DIST_OK; i++)
        st = emit_node(&b, g, i, (const char *const *)names);
    if (st) goto done;
    /* the next carried values */
    put(&b,
        "    %%one = \"stablehlo.constant\"() {value = dense<1> : tensor<i32>} : () -> "
        "tensor<i32>\n    %%next = \"stablehlo.add\"(%%c0, %%one) : (tensor<i32>, tensor<i32>) -> "
        "tensor<i32>\n");
    for (int q = 0; q < L.num_accs; q++) {
        const xg_node *nd = &g->nodes[g->outputs[L.acc_output[q]]];
        char one[128], ty[96];
        one_type(one, sizeof one, nd);
        type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
        put(&b, "    %%up%d_1 = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", q,
            names[g->outputs[L.acc_output[q]]], ty, one);
        put(&b, "    %%up%d = \"stablehlo.dynamic_update_slice\"(%%c%d, %%up%d_1, %%c0", q,
            L.accs + q, q);
        for (int i = 0; i < nd->ndim; i++) put(&b, ", %%z");
        put(&b, ") : (%s, %s, tensor<i32>", ctype[L.accs + q], one);
        for (int i = 0; i < nd->ndim; i++) put(&b, ", tensor<i32>");
        put(&b, ") -> %s\n", ctype[L.accs + q]);
    }
    put(&b, "    \"stablehlo.return\"(%%next");
    if (L.scalars >= 0) put(&b, ", %%c%d", L.scalars);
    for (int s = 0; s < g->num_states; s++) {
        const char *v = NULL;
        for (int o = 0; o < g->num_outputs; o++)
            if (g->aliases[o] == s) v = names[g->outputs[o]];
        if (v)
            put(&b, ", %s", v);
        else
            put(&b, ", %%c%d", L.states + s);
    }
    for (int w = 0; w < L.num_wo; w++) put(&b, ", %s", names[g->outputs[L.wo_output[w]]]);
    for (int a = 0; a < g->num_args; a++) put(&b, ", %%c%d", L.inputs + a);
    for (int q = 0; q < L.num_accs; q++) put(&b, ", %%up%d", q);
    put(&b, ") : (");
    for (int i = 0; i < L.count; i++) put(&b, "%s%s", i ? ", " : "", ctype[i]);
    put(&b, ") -> ()\n    }) : (");
    for (int i = 0; i < L.count; i++) put(&b, "%s%s", i ? ", " : "", ctype[i]);
    put(&b, ") -> (");
    for (int i = 0; i < L.count; i++) put(&b, "%s%s", i ? ", " : "", ctype[i]);
    put(&b, ")\n    \"func.return\"(");
    for (int o = 0; o < g->num_outputs; o++) {
        int carried = carried_of(&L, g, o);
        put(&b, "%s%%w#%d", o ? ", " : "", carried);
    }
    put(&b, ") : (");
    for (int o = 0; o < g->num_outputs; o++) {
        int carried = carried_of(&L, g, o);
        put(&b, "%s%s", o ? ", " : "", ctype[carried]);
    }
    put(&b, ") -> ()\n  }\n}\n");
done:
    if (ctype) free(ctype[0]);
    free(ctype);
    free(names);
    free(store);
    free(L.wo_output);
    free(L.acc_output);
    if (st == DIST_OK && b.oom) st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
    if (st != DIST_OK) {
        free(b.p);
        return st;
    }
    *text = b.p;
    *len = b.len;
    return DIST_OK;
}

/* k steps unrolled into one program: copy j reads row j of the stacked inputs and scalars and
 * the state copy j - 1 wrote. */
dist_status xg_emit_stablehlo_unrolled(const xg_graph *g, int k, const int *out_is_state,
                                       char **text, size_t *len) {
    DIST_CHECK_ARG(g && text && len && out_is_state && k >= 1,
                   "xg_emit_stablehlo_unrolled: bad argument");
    sbuf b = {0};
    int n = g->count ? g->count : 1;
    char **names = calloc((size_t)n, sizeof *names);
    char *store = calloc((size_t)n, 32);
    char *cur = calloc((size_t)(g->num_states + 1), 32); /* each state's current value */
    char *wo = calloc((size_t)(g->num_outputs + 1), 32); /* write-only outputs' last value */
    char sname[32] = "";
    dist_status st = DIST_OK;
    if (!names || !store || !cur || !wo) {
        st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
        goto done;
    }
    for (int i = 0; i < g->count; i++) names[i] = store + (size_t)i * 32;
    put(&b,
        "module @libdist_steps attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = %d "
        ": i32} {\n  func.func public @main(",
        g->num_replicas);
    int argi = 0;
    if (g->num_scalars > 0) {
        put(&b, "%%scalars_all: tensor<%dx%dxf32>", k, g->num_scalars);
        argi++;
    }
    for (int s = 0; s < g->num_states; s++) {
        TY(ty, &g->nodes[g->states[s]]);
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ty);
        for (int o = 0; o < g->num_outputs; o++)
            if (g->aliases[o] == s) put(&b, " {tf.aliasing_output = %d : i32}", o);
        snprintf(cur + 32 * s, 32, "%%arg%d", argi);
        argi++;
    }
    int first_arg = argi;
    for (int a = 0; a < g->num_args; a++, argi++) {
        char ty[128];
        stacked_type(ty, sizeof ty, k, &g->nodes[g->args[a]]);
        put(&b, "%s%%arg%d: %s", argi ? ", " : "", argi, ty);
    }
    put(&b, ") -> (");
    for (int o = 0; o < g->num_outputs; o++) {
        char ty[128];
        const xg_node *nd = &g->nodes[g->outputs[o]];
        if (out_is_state[o])
            type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
        else
            stacked_type(ty, sizeof ty, k, nd);
        put(&b, "%s%s", o ? ", " : "", ty);
    }
    put(&b, ") {\n");
    for (int j = 0; j < k && st == DIST_OK; j++) {
        if (g->num_scalars > 0) {
            put(&b,
                "    %%sr%d = \"stablehlo.slice\"(%%scalars_all) {limit_indices = array<i64: %d, "
                "%d>, start_indices = array<i64: %d, 0>, strides = array<i64: 1, 1>} : "
                "(tensor<%dx%dxf32>) -> tensor<1x%dxf32>\n",
                j, j + 1, g->num_scalars, j, k, g->num_scalars, g->num_scalars);
            snprintf(sname, sizeof sname, "%%sc%d", j);
            put(&b,
                "    %s = \"stablehlo.reshape\"(%%sr%d) : (tensor<1x%dxf32>) -> tensor<%dxf32>\n",
                sname, j, g->num_scalars, g->num_scalars);
            b.scalars = sname;
        }
        for (int i = 0; i < g->count; i++) snprintf(names[i], 32, "%%u%d_%d", j, i);
        for (int s = 0; s < g->num_states; s++)
            snprintf(names[g->states[s]], 32, "%s", cur + 32 * s);
        for (int a = 0; a < g->num_args; a++) {
            const xg_node *nd = &g->nodes[g->args[a]];
            char stk[128], one[128], ty[96];
            stacked_type(stk, sizeof stk, k, nd);
            one_type(one, sizeof one, nd);
            type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
            put(&b, "    %%in%d_%d_1 = \"stablehlo.slice\"(%%arg%d) {limit_indices = array<i64: %d",
                j, a, first_arg + a, j + 1);
            for (int i = 0; i < nd->ndim; i++) put(&b, ", %" PRId64, nd->dims[i]);
            put(&b, ">, start_indices = array<i64: %d", j);
            for (int i = 0; i < nd->ndim; i++) put(&b, ", 0");
            put(&b, ">, strides = array<i64: 1");
            for (int i = 0; i < nd->ndim; i++) put(&b, ", 1");
            put(&b, ">} : (%s) -> %s\n", stk, one);
            snprintf(names[g->args[a]], 32, "%%in%d_%d", j, a);
            put(&b, "    %s = \"stablehlo.reshape\"(%%in%d_%d_1) : (%s) -> %s\n", names[g->args[a]],
                j, a, one, ty);
        }
        for (int i = 0; i < g->count && st == DIST_OK; i++)
            st = emit_node(&b, g, i, (const char *const *)names);
        for (int o = 0; o < g->num_outputs; o++) {
            if (g->aliases[o] >= 0)
                snprintf(cur + 32 * g->aliases[o], 32, "%s", names[g->outputs[o]]);
            else if (out_is_state[o])
                snprintf(wo + 32 * o, 32, "%s", names[g->outputs[o]]);
        }
        /* step outputs of copy j, reshaped to [1, ...] for the stacking below */
        for (int o = 0; o < g->num_outputs; o++) {
            if (out_is_state[o]) continue;
            const xg_node *nd = &g->nodes[g->outputs[o]];
            char one[128], ty[96];
            one_type(one, sizeof one, nd);
            type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
            put(&b, "    %%o%d_%d = \"stablehlo.reshape\"(%s) : (%s) -> %s\n", j, o,
                names[g->outputs[o]], ty, one);
        }
    }
    if (st) goto done;
    for (int o = 0; o < g->num_outputs; o++) {
        if (out_is_state[o]) continue;
        const xg_node *nd = &g->nodes[g->outputs[o]];
        char one[128], stk[128];
        one_type(one, sizeof one, nd);
        stacked_type(stk, sizeof stk, k, nd);
        put(&b, "    %%stk%d = \"stablehlo.concatenate\"(", o);
        for (int j = 0; j < k; j++) put(&b, "%s%%o%d_%d", j ? ", " : "", j, o);
        put(&b, ") {dimension = 0 : i64} : (");
        for (int j = 0; j < k; j++) put(&b, "%s%s", j ? ", " : "", one);
        put(&b, ") -> %s\n", stk);
    }
    put(&b, "    \"func.return\"(");
    for (int o = 0; o < g->num_outputs; o++) {
        if (!out_is_state[o])
            put(&b, "%s%%stk%d", o ? ", " : "", o);
        else if (g->aliases[o] >= 0)
            put(&b, "%s%s", o ? ", " : "", cur + 32 * g->aliases[o]);
        else
            put(&b, "%s%s", o ? ", " : "", wo + 32 * o);
    }
    put(&b, ") : (");
    for (int o = 0; o < g->num_outputs; o++) {
        char ty[128];
        const xg_node *nd = &g->nodes[g->outputs[o]];
        if (out_is_state[o])
            type_of(ty, sizeof ty, nd->dtype, nd->ndim, nd->dims);
        else
            stacked_type(ty, sizeof ty, k, nd);
        put(&b, "%s%s", o ? ", " : "", ty);
    }
    put(&b, ") -> ()\n  }\n}\n");
done:
    free(names);
    free(store);
    free(cur);
    free(wo);
    if (st == DIST_OK && b.oom) st = dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (emitter)");
    if (st != DIST_OK) {
        free(b.p);
        return st;
    }
    *text = b.p;
    *len = b.len;
    return DIST_OK;
}
