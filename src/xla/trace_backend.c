/* The symbolic backend (trace_backend.h): regions with a host mirror, byte-range tracking of
 * traced values, and kernels that record graph nodes. */
#include "xla/trace_backend.h"

#include "backend/layer_ops.h"
#include "core/error.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct xseg {
    size_t off, len; /* bytes of the region */
    int node;        /* the node whose value is there */
    size_t node_off; /* bytes into that node's (flat) value */
} xseg;

typedef struct xregion {
    int64_t id;
    char *base;
    size_t bytes;
    /* trace state */
    xseg *segs;
    int nsegs, cap_segs;
    int state_node; /* XG_STATE node of this region in the current trace, or -1 */
    int scratch;    /* -1 unknown, 0 state, 1 scratch (asked once per trace) */
    int is_arg;     /* an input of the current trace */
    /* device state */
    dist_dtype dtype;
    int on_devices; /* the current value is in dev[] (the host mirror may be stale) */
    int host_valid; /* the host mirror holds the current value */
    void *dev[XLA_MAX_DEVICES];
} xregion;

struct xla_trace {
    int num_devices;
    xla_device_ops ops;
    xregion *regions;
    int nregions, cap_regions;
    int64_t next_id;
    /* traced mode */
    xg_graph *g;
    float *scalars;
    int nscalars, cap_scalars;
    int64_t *out_regions;   /* per program output: region id or -1 */
    int64_t *state_regions; /* per node id of the last trace: region id of XG_STATE nodes */
    int cap_state_regions;
};

/* ---- regions ------------------------------------------------------------------------------ */

static xregion *find_region(xla_trace *t, const void *p, size_t bytes) {
    const char *c = p;
    for (int i = 0; i < t->nregions; i++) {
        xregion *r = &t->regions[i];
        if (c >= r->base && c < r->base + r->bytes) {
            if ((size_t)(c - r->base) + bytes > r->bytes) return NULL;
            return r;
        }
    }
    return NULL;
}

static xregion *region_by_id(xla_trace *t, int64_t id) {
    for (int i = 0; i < t->nregions; i++)
        if (t->regions[i].id == id) return &t->regions[i];
    return NULL;
}

static void release_dev(xla_trace *t, xregion *r) {
    for (int d = 0; d < t->num_devices; d++) {
        if (r->dev[d] && t->ops.release) t->ops.release(t->ops.user, r->dev[d]);
        r->dev[d] = NULL;
    }
    r->on_devices = 0;
}

/* Makes the host mirror current (downloads device 0's copy). */
static dist_status sync_host(xla_trace *t, xregion *r) {
    if (r->host_valid) return DIST_OK;
    if (!r->dev[0] || !t->ops.download)
        return dist_error(DIST_INTERNAL, "tpu: a region's value is neither on the host nor on "
                                         "the devices");
    DIST_TRY(t->ops.download(t->ops.user, r->dev[0], r->base, r->bytes));
    r->host_valid = 1;
    return DIST_OK;
}

/* The host mirror was changed: the devices' copies are stale. */
static void host_changed(xla_trace *t, xregion *r) {
    release_dev(t, r);
    r->host_valid = 1;
}

static dist_status tb_alloc(void *ctx, size_t bytes, void **out) {
    xla_trace *t = ctx;
    if (t->nregions == t->cap_regions) {
        int cap = t->cap_regions ? t->cap_regions * 2 : 32;
        xregion *n = realloc(t->regions, (size_t)cap * sizeof *n);
        if (!n) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (regions)");
        t->regions = n;
        t->cap_regions = cap;
    }
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p)
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of host memory for a %zu-byte buffer",
                          bytes);
    xregion *r = &t->regions[t->nregions++];
    memset(r, 0, sizeof *r);
    r->id = ++t->next_id;
    r->base = p;
    r->bytes = bytes;
    r->state_node = -1;
    r->scratch = -1;
    r->host_valid = 1;
    r->dtype = DIST_F32;
    *out = p;
    return DIST_OK;
}

static void tb_free(void *ctx, void *ptr) {
    xla_trace *t = ctx;
    if (!ptr) return;
    for (int i = 0; i < t->nregions; i++) {
        if (t->regions[i].base != ptr) continue;
        xregion *r = &t->regions[i];
        release_dev(t, r);
        free(r->segs);
        free(r->base);
        t->regions[i] = t->regions[--t->nregions];
        return;
    }
}

/* ---- traced values ------------------------------------------------------------------------ */

static int tracing(const xla_trace *t) { return t->g != NULL; }

static int is_scratch(xla_trace *t, xregion *r) {
    if (r->scratch < 0)
        r->scratch = t->ops.is_scratch ? t->ops.is_scratch(t->ops.user, r->base) : 0;
    return r->scratch;
}

static dist_status seg_reserve(xregion *r, int extra) {
    if (r->nsegs + extra <= r->cap_segs) return DIST_OK;
    int cap = r->cap_segs ? r->cap_segs * 2 : 8;
    while (cap < r->nsegs + extra) cap *= 2;
    xseg *n = realloc(r->segs, (size_t)cap * sizeof *n);
    if (!n) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
    r->segs = n;
    r->cap_segs = cap;
    return DIST_OK;
}

/* Records that [off, off + len) of r now holds node (from byte node_off of its value). */
static dist_status region_write(xregion *r, size_t off, size_t len, int node, size_t node_off) {
    DIST_TRY(seg_reserve(r, 2));
    size_t end = off + len;
    xseg *keep = malloc(((size_t)r->nsegs + 2) * sizeof *keep);
    if (!keep) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
    int k = 0;
    for (int i = 0; i < r->nsegs; i++) {
        xseg s = r->segs[i];
        size_t se = s.off + s.len;
        if (se <= off || s.off >= end) {
            keep[k++] = s;
            continue;
        }
        if (s.off < off) keep[k++] = (xseg){s.off, off - s.off, s.node, s.node_off};
        if (se > end) keep[k++] = (xseg){end, se - end, s.node, s.node_off + (end - s.off)};
    }
    /* insert sorted */
    int pos = 0;
    while (pos < k && keep[pos].off < off) pos++;
    memmove(&keep[pos + 1], &keep[pos], (size_t)(k - pos) * sizeof *keep);
    keep[pos] = (xseg){off, len, node, node_off};
    k++;
    DIST_TRY(seg_reserve(r, k - r->nsegs));
    memcpy(r->segs, keep, (size_t)k * sizeof *keep);
    r->nsegs = k;
    free(keep);
    return DIST_OK;
}

static dist_status add_node(xla_trace *t, xg_op op, dist_dtype dtype, int ndim, const int64_t *dims,
                            int nin, const int *in, int *id) {
    return xg_add(t->g, op, dtype, ndim, dims, nin, in, id);
}

static dist_status flat(xla_trace *t, int node, int64_t numel, int *out) {
    const xg_node *n = &t->g->nodes[node];
    if (n->ndim == 1) {
        *out = node;
        return DIST_OK;
    }
    return add_node(t, XG_RESHAPE, n->dtype, 1, &numel, 1, &node, out);
}

static dist_status const_node(xla_trace *t, const void *src, size_t bytes, dist_dtype dtype,
                              int *id);

static dist_status state_node(xla_trace *t, xregion *r, dist_dtype dtype, int *out) {
    if (r->state_node >= 0) {
        if (t->g->nodes[r->state_node].dtype != dtype)
            return dist_error(DIST_UNSUPPORTED, "tpu: a step reads the same buffer as %s and as %s",
                              dist_dtype_name(t->g->nodes[r->state_node].dtype),
                              dist_dtype_name(dtype));
        *out = r->state_node;
        return DIST_OK;
    }
    size_t es = dist_dtype_size(dtype);
    if (r->bytes % es)
        return dist_error(DIST_UNSUPPORTED, "tpu: a %zu-byte buffer read as %s", r->bytes,
                          dist_dtype_name(dtype));
    int64_t n = (int64_t)(r->bytes / es);
    int id;
    DIST_TRY(add_node(t, XG_STATE, dtype, 1, &n, 0, NULL, &id));
    if (id >= t->cap_state_regions) {
        int cap = t->cap_state_regions ? t->cap_state_regions * 2 : 256;
        while (cap <= id) cap *= 2;
        int64_t *sr = realloc(t->state_regions, (size_t)cap * sizeof *sr);
        if (!sr) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
        t->state_regions = sr;
        t->cap_state_regions = cap;
    }
    t->state_regions[id] = r->id;
    r->state_node = id;
    r->dtype = dtype;
    xg_graph *g = t->g;
    if (g->num_states == g->cap_states) {
        int cap = g->cap_states ? g->cap_states * 2 : 16;
        int *s = realloc(g->states, (size_t)cap * sizeof *s);
        if (!s) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
        g->states = s;
        g->cap_states = cap;
    }
    g->states[g->num_states++] = id;
    *out = id;
    return DIST_OK;
}

/* The value of bytes [off, off + len) of r as a flat [len / size] node of dtype. */
static dist_status region_read(xla_trace *t, xregion *r, size_t off, size_t len, dist_dtype dtype,
                               int *out) {
    size_t es = dist_dtype_size(dtype);
    int pieces[XG_MAX_IN];
    int np = 0;
    size_t pos = off, end = off + len;
    int si = 0;
    while (pos < end) {
        while (si < r->nsegs && r->segs[si].off + r->segs[si].len <= pos) si++;
        int node = -1;
        size_t node_off, take;
        if (si < r->nsegs && r->segs[si].off <= pos) {
            xseg *s = &r->segs[si];
            node = s->node;
            node_off = s->node_off + (pos - s->off);
            take = s->off + s->len - pos;
        } else {
            if (r->is_arg || is_scratch(t, r))
                return dist_error(DIST_UNSUPPORTED,
                                  "tpu: the step reads memory it never wrote (a kernel's "
                                  "uninitialized output)");
            DIST_TRY(state_node(t, r, dtype, &node));
            node_off = pos;
            size_t next = si < r->nsegs ? r->segs[si].off : r->bytes;
            take = next - pos;
        }
        if (take > end - pos) take = end - pos;
        const xg_node *n = &t->g->nodes[node];
        if (n->dtype != dtype && n->op == XG_CONST) { /* an upload is typed by its reader */
            int c;
            DIST_TRY(const_node(t, (const char *)n->bytes + node_off, take, dtype, &c));
            node = c;
            node_off = 0;
            n = &t->g->nodes[node];
        }
        if (n->dtype != dtype)
            return dist_error(DIST_UNSUPPORTED,
                              "tpu: the step reads %s data as %s (reinterpreting memory is not "
                              "traced)",
                              dist_dtype_name(n->dtype), dist_dtype_name(dtype));
        if (node_off % es || take % es)
            return dist_error(DIST_UNSUPPORTED, "tpu: a misaligned %s read",
                              dist_dtype_name(dtype));
        int64_t n_numel = xg_numel(n), want = (int64_t)(take / es);
        int piece;
        if (node_off == 0 && want == n_numel) {
            DIST_TRY(flat(t, node, n_numel, &piece));
        } else {
            int f;
            DIST_TRY(flat(t, node, n_numel, &f));
            DIST_TRY(add_node(t, XG_SLICE, dtype, 1, &want, 1, &f, &piece));
            t->g->nodes[piece].i[0] = (int64_t)(node_off / es);
        }
        if (np == XG_MAX_IN) { /* fold what we have so far */
            int64_t sum = 0;
            for (int k = 0; k < np; k++) sum += xg_numel(&t->g->nodes[pieces[k]]);
            int c;
            DIST_TRY(add_node(t, XG_CONCAT, dtype, 1, &sum, np, pieces, &c));
            pieces[0] = c;
            np = 1;
        }
        pieces[np++] = piece;
        pos += take;
    }
    if (np == 1) {
        *out = pieces[0];
        return DIST_OK;
    }
    int64_t total = (int64_t)(len / es);
    return add_node(t, XG_CONCAT, dtype, 1, &total, np, pieces, out);
}

static int same_dims(const xg_node *n, int ndim, const int64_t *dims) {
    if (n->ndim != ndim) return 0;
    for (int i = 0; i < ndim; i++)
        if (n->dims[i] != dims[i]) return 0;
    return 1;
}

static dist_status read_tensor(xla_trace *t, const dist_tensor *x, int *out) {
    size_t bytes = dist_tensor_bytes(x);
    xregion *r = find_region(t, x->data, bytes);
    if (!r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "tpu: a tensor that is not memory of the tpu strategy's devices");
    int flatn;
    DIST_TRY(region_read(t, r, (size_t)((char *)x->data - r->base), bytes, x->dtype, &flatn));
    int nd = x->ndim;
    int64_t dims[XG_MAX_DIMS];
    if (nd > XG_MAX_DIMS)
        return dist_error(DIST_UNSUPPORTED, "tpu: tensors of rank %d (at most %d)", nd,
                          XG_MAX_DIMS);
    for (int i = 0; i < nd; i++) dims[i] = x->shape[i];
    if (same_dims(&t->g->nodes[flatn], nd, dims)) {
        *out = flatn;
        return DIST_OK;
    }
    /* the flat piece may itself be a whole node of the right shape behind a reshape */
    const xg_node *fn = &t->g->nodes[flatn];
    if (fn->op == XG_RESHAPE && same_dims(&t->g->nodes[fn->in[0]], nd, dims)) {
        *out = fn->in[0];
        return DIST_OK;
    }
    return add_node(t, XG_RESHAPE, x->dtype, nd, dims, 1, &flatn, out);
}

static dist_status write_tensor(xla_trace *t, const dist_tensor *y, int node) {
    size_t bytes = dist_tensor_bytes(y);
    xregion *r = find_region(t, y->data, bytes);
    if (!r)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "tpu: a kernel's output is not memory of the tpu strategy's devices");
    const xg_node *n = &t->g->nodes[node];
    if ((size_t)xg_numel(n) * dist_dtype_size(n->dtype) != bytes)
        return dist_error(DIST_INTERNAL, "tpu: traced value of %lld elements written to %zu bytes",
                          (long long)xg_numel(n), bytes);
    return region_write(r, (size_t)((char *)y->data - r->base), bytes, node, 0);
}

static dist_status new_like(xla_trace *t, xg_op op, const dist_tensor *shape_of, int nin,
                            const int *in, int *id) {
    int64_t dims[XG_MAX_DIMS];
    for (int i = 0; i < shape_of->ndim && i < XG_MAX_DIMS; i++) dims[i] = shape_of->shape[i];
    if (shape_of->ndim > XG_MAX_DIMS)
        return dist_error(DIST_UNSUPPORTED, "tpu: tensors of rank %d", shape_of->ndim);
    return add_node(t, op, shape_of->dtype, shape_of->ndim, dims, nin, in, id);
}

static dist_status scalar_input(xla_trace *t, float value, int *id) {
    if (t->nscalars == t->cap_scalars) {
        int cap = t->cap_scalars ? t->cap_scalars * 2 : 16;
        float *s = realloc(t->scalars, (size_t)cap * sizeof *s);
        if (!s) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
        t->scalars = s;
        t->cap_scalars = cap;
    }
    DIST_TRY(add_node(t, XG_SCALAR, DIST_F32, 0, NULL, 0, NULL, id));
    t->g->nodes[*id].i[0] = t->nscalars;
    t->scalars[t->nscalars++] = value;
    t->g->num_scalars = t->nscalars;
    return DIST_OK;
}

static dist_status splat(xla_trace *t, float v, dist_dtype dtype, int ndim, const int64_t *dims,
                         int *id) {
    DIST_TRY(add_node(t, XG_SPLAT, dtype, ndim, dims, 0, NULL, id));
    t->g->nodes[*id].f[0] = v;
    return DIST_OK;
}

static dist_status bcast(xla_trace *t, int scalar, const xg_node *like, int *id) {
    return add_node(t, XG_BROADCAST, DIST_F32, like->ndim, like->dims, 1, &scalar, id);
}

static dist_status binop(xla_trace *t, xg_op op, int a, int b, int *id) {
    const xg_node *n = &t->g->nodes[a];
    int in[2] = {a, b};
    int64_t dims[XG_MAX_DIMS];
    memcpy(dims, n->dims, sizeof dims);
    return add_node(t, op, n->dtype, n->ndim, dims, 2, in, id);
}

static dist_status need_trace(xla_trace *t, const char *kernel) {
    if (tracing(t)) return DIST_OK;
    return dist_error(DIST_UNSUPPORTED,
                      "tpu: the %s kernel ran outside a traced step (under the tpu strategy, ops "
                      "run only inside dist_strategy_run)",
                      kernel);
}

#define TRACED(name) DIST_TRY(need_trace(t, name))

/* ---- memory entries ----------------------------------------------------------------------- */

static dist_status const_node(xla_trace *t, const void *src, size_t bytes, dist_dtype dtype,
                              int *id) {
    int64_t n = (int64_t)(bytes / dist_dtype_size(dtype));
    DIST_TRY(add_node(t, XG_CONST, dtype, 1, &n, 0, NULL, id));
    void *copy = malloc(bytes ? bytes : 1);
    if (!copy) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (constant)");
    memcpy(copy, src, bytes);
    t->g->nodes[*id].bytes = copy;
    return DIST_OK;
}

/* The bytes of a traced range when they are known on the host (constants the step uploaded). */
static int const_bytes(xla_trace *t, xregion *r, size_t off, size_t len, void *dst) {
    for (int i = 0; i < r->nsegs; i++) {
        xseg *s = &r->segs[i];
        if (s->off <= off && s->off + s->len >= off + len) {
            const xg_node *n = &t->g->nodes[s->node];
            if (n->op != XG_CONST) return 0;
            memcpy(dst, (const char *)n->bytes + s->node_off + (off - s->off), len);
            return 1;
        }
    }
    return 0;
}

static dist_status tb_copy(void *ctx, void *dst, const void *src, size_t bytes,
                           dist_copy_kind kind) {
    xla_trace *t = ctx;
    if (bytes == 0) return DIST_OK;
    if (kind == DIST_COPY_H2D) {
        xregion *r = find_region(t, dst, bytes);
        if (!r) return dist_error(DIST_INVALID_ARGUMENT, "tpu: copy to memory it does not own");
        if (tracing(t)) {
            /* a host value uploaded by the step: a constant of the program. Its dtype is only
             * known when it is read; bytes are recorded as uint8 and retyped on read. */
            int id;
            dist_dtype dt = bytes % 4 == 0 ? DIST_F32 : DIST_U8;
            DIST_TRY(const_node(t, src, bytes, dt, &id));
            return region_write(r, (size_t)((char *)dst - r->base), bytes, id, 0);
        }
        if (!r->host_valid && ((char *)dst != r->base || bytes != r->bytes))
            DIST_TRY(sync_host(t, r));
        memcpy(dst, src, bytes);
        host_changed(t, r);
        return DIST_OK;
    }
    if (kind == DIST_COPY_D2H) {
        xregion *r = find_region(t, src, bytes);
        if (!r) return dist_error(DIST_INVALID_ARGUMENT, "tpu: copy from memory it does not own");
        if (tracing(t)) {
            if (const_bytes(t, r, (size_t)((const char *)src - r->base), bytes, dst))
                return DIST_OK;
            return dist_error(DIST_UNSUPPORTED,
                              "tpu: the step reads a computed value on the host (a host copy "
                              "inside a traced step; the value exists only when the program "
                              "runs)");
        }
        DIST_TRY(sync_host(t, r));
        memcpy(dst, src, bytes);
        return DIST_OK;
    }
    xregion *rs = find_region(t, src, bytes), *rd = find_region(t, dst, bytes);
    if (!rs || !rd) return dist_error(DIST_INVALID_ARGUMENT, "tpu: copy of memory it does not own");
    if (tracing(t)) {
        /* move the segments: read the source as bytes of its own dtype */
        dist_dtype dt = DIST_F32;
        for (int i = 0; i < rs->nsegs; i++)
            if (rs->segs[i].off <= (size_t)((const char *)src - rs->base) &&
                rs->segs[i].off + rs->segs[i].len > (size_t)((const char *)src - rs->base))
                dt = t->g->nodes[rs->segs[i].node].dtype;
        int v;
        DIST_TRY(region_read(t, rs, (size_t)((const char *)src - rs->base), bytes, dt, &v));
        return region_write(rd, (size_t)((char *)dst - rd->base), bytes, v, 0);
    }
    DIST_TRY(sync_host(t, rs));
    if (!rd->host_valid) DIST_TRY(sync_host(t, rd));
    memmove(dst, src, bytes);
    host_changed(t, rd);
    return DIST_OK;
}

static dist_status tb_memset_zero(void *ctx, void *dst, size_t bytes) {
    xla_trace *t = ctx;
    xregion *r = find_region(t, dst, bytes);
    if (!r) return dist_error(DIST_INVALID_ARGUMENT, "tpu: memset of memory it does not own");
    if (tracing(t)) {
        int64_t n = (int64_t)(bytes / 4);
        if (bytes % 4)
            return dist_error(DIST_UNSUPPORTED, "tpu: zeroing %zu bytes (not whole words)", bytes);
        int id;
        DIST_TRY(splat(t, 0.0f, DIST_F32, 1, &n, &id));
        return region_write(r, (size_t)((char *)dst - r->base), bytes, id, 0);
    }
    if (!r->host_valid && ((char *)dst != r->base || bytes != r->bytes)) DIST_TRY(sync_host(t, r));
    memset(dst, 0, bytes);
    host_changed(t, r);
    return DIST_OK;
}

static dist_status tb_synchronize(void *ctx) {
    (void)ctx;
    return DIST_OK;
}

/* ---- kernels ------------------------------------------------------------------------------ */

static dist_status relu_of(xla_trace *t, int x, int *out) {
    int z;
    const xg_node *n = &t->g->nodes[x];
    DIST_TRY(splat(t, 0.0f, n->dtype, n->ndim, n->dims, &z));
    return binop(t, XG_MAX, x, z, out);
}

static dist_status bias_of(xla_trace *t, int y, int b, int *out) {
    int in[2] = {y, b};
    const xg_node *n = &t->g->nodes[y];
    int64_t dims[XG_MAX_DIMS];
    memcpy(dims, n->dims, sizeof dims);
    return add_node(t, XG_BIAS, n->dtype, n->ndim, dims, 2, in, out);
}

static dist_status tb_conv2d_forward(void *ctx, const dist_conv2d_desc *d, const dist_tensor *x,
                                     const dist_tensor *w, const dist_tensor *b, dist_tensor *y) {
    xla_trace *t = ctx;
    TRACED("conv2d_forward");
    int in[2], v;
    DIST_TRY(read_tensor(t, x, &in[0]));
    DIST_TRY(read_tensor(t, w, &in[1]));
    DIST_TRY(new_like(t, XG_CONV, y, 2, in, &v));
    t->g->nodes[v].a.conv = *d;
    t->g->nodes[v].a.conv.relu = 0;
    if (b) {
        int bn;
        DIST_TRY(read_tensor(t, b, &bn));
        DIST_TRY(bias_of(t, v, bn, &v));
    }
    if (d->relu) DIST_TRY(relu_of(t, v, &v));
    return write_tensor(t, y, v);
}

static dist_status tb_conv2d_backward_data(void *ctx, const dist_conv2d_desc *d,
                                           const dist_tensor *dy, const dist_tensor *w,
                                           dist_tensor *dx) {
    xla_trace *t = ctx;
    TRACED("conv2d_backward_data");
    int in[2], v;
    DIST_TRY(read_tensor(t, dy, &in[0]));
    DIST_TRY(read_tensor(t, w, &in[1]));
    DIST_TRY(new_like(t, XG_CONV_DX, dx, 2, in, &v));
    t->g->nodes[v].a.conv = *d;
    return write_tensor(t, dx, v);
}

static dist_status bias_grad_of(xla_trace *t, int dy, const dist_tensor *db, int *out) {
    const xg_node *n = &t->g->nodes[dy];
    int64_t mask = 0;
    for (int a = 0; a + 1 < n->ndim; a++) mask |= (int64_t)1 << a;
    DIST_TRY(new_like(t, XG_REDUCE_SUM, db, 1, &dy, out));
    t->g->nodes[*out].i[0] = mask;
    return DIST_OK;
}

static dist_status tb_conv2d_backward_filter(void *ctx, const dist_conv2d_desc *d,
                                             const dist_tensor *x, const dist_tensor *dy,
                                             dist_tensor *dw, dist_tensor *db) {
    xla_trace *t = ctx;
    TRACED("conv2d_backward_filter");
    int in[2], v;
    DIST_TRY(read_tensor(t, x, &in[0]));
    DIST_TRY(read_tensor(t, dy, &in[1]));
    DIST_TRY(new_like(t, XG_CONV_DW, dw, 2, in, &v));
    t->g->nodes[v].a.conv = *d;
    DIST_TRY(write_tensor(t, dw, v));
    if (db) {
        int s;
        DIST_TRY(bias_grad_of(t, in[1], db, &s));
        DIST_TRY(write_tensor(t, db, s));
    }
    return DIST_OK;
}

static dist_status tb_pool_ws(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                              size_t *bytes) {
    (void)ctx, (void)d, (void)x;
    *bytes = 0;
    return DIST_OK;
}

static dist_status tb_pool_forward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                   dist_tensor *y, void *workspace) {
    xla_trace *t = ctx;
    (void)workspace;
    TRACED("max_pool2d_forward");
    int in, v;
    DIST_TRY(read_tensor(t, x, &in));
    DIST_TRY(new_like(t, XG_MAXPOOL, y, 1, &in, &v));
    t->g->nodes[v].a.pool = *d;
    return write_tensor(t, y, v);
}

static dist_status tb_pool_backward(void *ctx, const dist_pool2d_desc *d, const dist_tensor *x,
                                    const dist_tensor *dy, const void *workspace, dist_tensor *dx) {
    xla_trace *t = ctx;
    (void)workspace;
    TRACED("max_pool2d_backward");
    int in[2], v;
    DIST_TRY(read_tensor(t, x, &in[0]));
    DIST_TRY(read_tensor(t, dy, &in[1]));
    DIST_TRY(new_like(t, XG_MAXPOOL_DX, dx, 2, in, &v));
    t->g->nodes[v].a.pool = *d;
    return write_tensor(t, dx, v);
}

static dist_status scale_by(xla_trace *t, int x, float alpha, int *out) {
    if (alpha == 1.0f) {
        *out = x;
        return DIST_OK;
    }
    const xg_node *n = &t->g->nodes[x];
    int s;
    DIST_TRY(splat(t, alpha, n->dtype, n->ndim, n->dims, &s));
    return binop(t, XG_MUL, x, s, out);
}

static dist_status tb_matmul(void *ctx, int trans_a, int trans_b, float alpha, const dist_tensor *a,
                             const dist_tensor *b, float beta, dist_tensor *c) {
    xla_trace *t = ctx;
    TRACED("matmul");
    int in[2], v;
    DIST_TRY(read_tensor(t, a, &in[0]));
    DIST_TRY(read_tensor(t, b, &in[1]));
    DIST_TRY(new_like(t, XG_MATMUL, c, 2, in, &v));
    t->g->nodes[v].i[0] = trans_a;
    t->g->nodes[v].i[1] = trans_b;
    DIST_TRY(scale_by(t, v, alpha, &v));
    if (beta != 0.0f) {
        int old;
        DIST_TRY(read_tensor(t, c, &old));
        DIST_TRY(scale_by(t, old, beta, &old));
        DIST_TRY(binop(t, XG_ADD, v, old, &v));
    }
    return write_tensor(t, c, v);
}

static dist_status tb_bias_add(void *ctx, dist_tensor *y, const dist_tensor *b, int relu) {
    xla_trace *t = ctx;
    TRACED("bias_add");
    int yn, bn, v;
    DIST_TRY(read_tensor(t, y, &yn));
    DIST_TRY(read_tensor(t, b, &bn));
    DIST_TRY(bias_of(t, yn, bn, &v));
    if (relu) DIST_TRY(relu_of(t, v, &v));
    return write_tensor(t, y, v);
}

static dist_status tb_bias_grad(void *ctx, const dist_tensor *dy, dist_tensor *db) {
    xla_trace *t = ctx;
    TRACED("bias_grad");
    int in, v;
    DIST_TRY(read_tensor(t, dy, &in));
    DIST_TRY(bias_grad_of(t, in, db, &v));
    return write_tensor(t, db, v);
}

static dist_status tb_relu_forward(void *ctx, const dist_tensor *x, dist_tensor *y) {
    xla_trace *t = ctx;
    TRACED("relu_forward");
    int in, v;
    DIST_TRY(read_tensor(t, x, &in));
    DIST_TRY(relu_of(t, in, &v));
    return write_tensor(t, y, v);
}

static dist_status tb_relu_backward(void *ctx, const dist_tensor *y, const dist_tensor *dy,
                                    dist_tensor *dx) {
    xla_trace *t = ctx;
    TRACED("relu_backward");
    int in[2], v;
    DIST_TRY(read_tensor(t, y, &in[0]));
    DIST_TRY(read_tensor(t, dy, &in[1]));
    DIST_TRY(new_like(t, XG_RELU_GRAD, dx, 2, in, &v));
    return write_tensor(t, dx, v);
}

static dist_status tb_xent_forward(void *ctx, const dist_tensor *logits, const dist_tensor *labels,
                                   dist_tensor *loss, dist_tensor *probs) {
    xla_trace *t = ctx;
    TRACED("softmax_xent_forward");
    int in[2], l, p;
    DIST_TRY(read_tensor(t, logits, &in[0]));
    DIST_TRY(read_tensor(t, labels, &in[1]));
    DIST_TRY(new_like(t, XG_XENT_LOSS, loss, 2, in, &l));
    DIST_TRY(write_tensor(t, loss, l));
    if (probs) {
        DIST_TRY(new_like(t, XG_SOFTMAX, probs, 2, in, &p));
        DIST_TRY(write_tensor(t, probs, p));
    }
    return DIST_OK;
}

static dist_status tb_xent_backward(void *ctx, const dist_tensor *probs, const dist_tensor *labels,
                                    const dist_tensor *dloss, dist_tensor *dlogits) {
    xla_trace *t = ctx;
    TRACED("softmax_xent_backward");
    int in[3], v;
    DIST_TRY(read_tensor(t, probs, &in[0]));
    DIST_TRY(read_tensor(t, labels, &in[1]));
    DIST_TRY(read_tensor(t, dloss, &in[2]));
    DIST_TRY(new_like(t, XG_XENT_GRAD, dlogits, 3, in, &v));
    return write_tensor(t, dlogits, v);
}

static dist_status tb_accuracy_count(void *ctx, const dist_tensor *logits,
                                     const dist_tensor *labels, dist_tensor *count) {
    xla_trace *t = ctx;
    TRACED("accuracy_count");
    int in[2], v;
    DIST_TRY(read_tensor(t, logits, &in[0]));
    DIST_TRY(read_tensor(t, labels, &in[1]));
    DIST_TRY(new_like(t, XG_ACC_COUNT, count, 2, in, &v));
    return write_tensor(t, count, v);
}

static dist_status tb_to_layout(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    xla_trace *t = ctx;
    TRACED("to_layout");
    int v;
    DIST_TRY(read_tensor(t, src, &v));
    return write_tensor(t, dst, v);
}

static dist_status tb_add(void *ctx, const dist_tensor *a, const dist_tensor *b, dist_tensor *out) {
    xla_trace *t = ctx;
    TRACED("add");
    int x, y, v;
    DIST_TRY(read_tensor(t, a, &x));
    DIST_TRY(read_tensor(t, b, &y));
    if (!same_dims(&t->g->nodes[y], t->g->nodes[x].ndim, t->g->nodes[x].dims)) {
        const xg_node *n = &t->g->nodes[x];
        int64_t dims[XG_MAX_DIMS];
        memcpy(dims, n->dims, sizeof dims);
        DIST_TRY(add_node(t, XG_RESHAPE, n->dtype, n->ndim, dims, 1, &y, &y));
    }
    DIST_TRY(binop(t, XG_ADD, x, y, &v));
    return write_tensor(t, out, v);
}

static dist_status tb_scale(void *ctx, const dist_tensor *x, float alpha, dist_tensor *out) {
    xla_trace *t = ctx;
    TRACED("scale");
    int in, v;
    DIST_TRY(read_tensor(t, x, &in));
    const xg_node *n = &t->g->nodes[in];
    int s;
    DIST_TRY(splat(t, alpha, n->dtype, n->ndim, n->dims, &s));
    DIST_TRY(binop(t, XG_MUL, in, s, &v));
    return write_tensor(t, out, v);
}

static dist_status tb_fill(void *ctx, dist_tensor *x, float value) {
    xla_trace *t = ctx;
    TRACED("fill");
    int64_t dims[XG_MAX_DIMS];
    for (int i = 0; i < x->ndim && i < XG_MAX_DIMS; i++) dims[i] = x->shape[i];
    int v;
    DIST_TRY(splat(t, value, x->dtype, x->ndim, dims, &v));
    return write_tensor(t, x, v);
}

static dist_status tb_reduce_sum(void *ctx, const dist_tensor *x, dist_tensor *out) {
    xla_trace *t = ctx;
    TRACED("reduce_sum");
    int in, v;
    DIST_TRY(read_tensor(t, x, &in));
    const xg_node *n = &t->g->nodes[in];
    DIST_TRY(new_like(t, XG_REDUCE_SUM, out, 1, &in, &v));
    t->g->nodes[v].i[0] = ((int64_t)1 << n->ndim) - 1;
    return write_tensor(t, out, v);
}

static dist_status flat_view(xla_trace *t, const float *p, size_t n, dist_tensor *out) {
    (void)t;
    int64_t dim = (int64_t)n;
    *out = dist_tensor_view((void *)p, DIST_F32, 1, &dim);
    return DIST_OK;
}

static dist_status scaled(xla_trace *t, int x, float value, int *out) {
    int s, b;
    DIST_TRY(scalar_input(t, value, &s));
    DIST_TRY(bcast(t, s, &t->g->nodes[x], &b));
    return binop(t, XG_MUL, x, b, out);
}

static dist_status tb_adam_update(void *ctx, const dist_adam_desc *d, float *param,
                                  const float *grad, float *m, float *v, size_t n) {
    xla_trace *t = ctx;
    TRACED("adam_update");
    dist_tensor tp, tg, tm, tv;
    flat_view(t, param, n, &tp);
    flat_view(t, grad, n, &tg);
    flat_view(t, m, n, &tm);
    flat_view(t, v, n, &tv);
    int P, G, M, V;
    DIST_TRY(read_tensor(t, &tp, &P));
    DIST_TRY(read_tensor(t, &tg, &G));
    DIST_TRY(read_tensor(t, &tm, &M));
    DIST_TRY(read_tensor(t, &tv, &V));
    /* the CPU kernel's order: g = grad * gs; m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
     * p -= lr m / (sqrt(v) + eps) */
    int g, dm, m1, g2, dv, v1, sq, eps, den, num, upd, p1;
    DIST_TRY(scaled(t, G, d->grad_scale, &g));
    DIST_TRY(binop(t, XG_SUB, g, M, &dm));
    DIST_TRY(scaled(t, dm, 1.0f - d->beta1, &dm));
    DIST_TRY(binop(t, XG_ADD, M, dm, &m1));
    DIST_TRY(binop(t, XG_MUL, g, g, &g2));
    DIST_TRY(binop(t, XG_SUB, g2, V, &dv));
    DIST_TRY(scaled(t, dv, 1.0f - d->beta2, &dv));
    DIST_TRY(binop(t, XG_ADD, V, dv, &v1));
    DIST_TRY(add_node(t, XG_SQRT, DIST_F32, 1, t->g->nodes[v1].dims, 1, &v1, &sq));
    int es;
    DIST_TRY(scalar_input(t, d->epsilon, &es));
    DIST_TRY(bcast(t, es, &t->g->nodes[sq], &eps));
    DIST_TRY(binop(t, XG_ADD, sq, eps, &den));
    DIST_TRY(scaled(t, m1, d->lr, &num));
    DIST_TRY(binop(t, XG_DIV, num, den, &upd));
    DIST_TRY(binop(t, XG_SUB, P, upd, &p1));
    DIST_TRY(write_tensor(t, &tm, m1));
    DIST_TRY(write_tensor(t, &tv, v1));
    return write_tensor(t, &tp, p1);
}

static dist_status tb_sgd_update(void *ctx, const dist_sgd_desc *d, float *param, const float *grad,
                                 float *mom, size_t n) {
    xla_trace *t = ctx;
    TRACED("sgd_update");
    dist_tensor tp, tg, tm;
    flat_view(t, param, n, &tp);
    flat_view(t, grad, n, &tg);
    int P, G, g, step, p1;
    DIST_TRY(read_tensor(t, &tp, &P));
    DIST_TRY(read_tensor(t, &tg, &G));
    DIST_TRY(scaled(t, G, d->grad_scale, &g));
    if (d->momentum == 0.0f) {
        DIST_TRY(scaled(t, g, d->lr, &step));
        DIST_TRY(binop(t, XG_SUB, P, step, &p1));
        return write_tensor(t, &tp, p1);
    }
    if (!mom) return dist_error(DIST_INVALID_ARGUMENT, "sgd_update: momentum buffer is NULL");
    flat_view(t, mom, n, &tm);
    int M, vel, lg, mv, nest;
    DIST_TRY(read_tensor(t, &tm, &M));
    /* vel = mu m - lr g; p += nesterov ? mu vel - lr g : vel */
    DIST_TRY(scaled(t, M, d->momentum, &mv));
    DIST_TRY(scaled(t, g, d->lr, &lg));
    DIST_TRY(binop(t, XG_SUB, mv, lg, &vel));
    DIST_TRY(write_tensor(t, &tm, vel));
    if (d->nesterov) {
        DIST_TRY(scaled(t, vel, d->momentum, &nest));
        DIST_TRY(binop(t, XG_SUB, nest, lg, &step));
    } else {
        step = vel;
    }
    DIST_TRY(binop(t, XG_ADD, P, step, &p1));
    return write_tensor(t, &tp, p1);
}

static dist_status tb_cast(void *ctx, const dist_tensor *src, dist_tensor *dst) {
    xla_trace *t = ctx;
    TRACED("cast");
    int in, v;
    DIST_TRY(read_tensor(t, src, &in));
    DIST_TRY(new_like(t, XG_CONVERT, dst, 1, &in, &v));
    return write_tensor(t, dst, v);
}

static dist_status tb_round(void *ctx, const dist_tensor *x, dist_dtype dtype, dist_tensor *y) {
    xla_trace *t = ctx;
    TRACED("round");
    int in, lo, v;
    DIST_TRY(read_tensor(t, x, &in));
    const xg_node *n = &t->g->nodes[in];
    int64_t dims[XG_MAX_DIMS];
    memcpy(dims, n->dims, sizeof dims);
    int nd = n->ndim;
    if (dtype == DIST_F32) {
        v = in;
    } else {
        DIST_TRY(add_node(t, XG_CONVERT, dtype, nd, dims, 1, &in, &lo));
        DIST_TRY(add_node(t, XG_CONVERT, DIST_F32, nd, dims, 1, &lo, &v));
    }
    return write_tensor(t, y, v);
}

static dist_status tb_all_finite(void *ctx, const dist_tensor *x, int *all_finite) {
    (void)ctx, (void)x, (void)all_finite;
    return dist_error(DIST_UNSUPPORTED,
                      "tpu: check numerics (the all_finite kernel) reads a value on the host "
                      "inside the step; it is not traced");
}

/* ---- the op set (backend/ops.h) ----------------------------------------------------------- */

/* Every op is composed of generic graph nodes (xla_graph.h) in the arithmetic ops.h writes, in
 * float32 throughout: the sums ops.h accumulates in double are float32 reductions here, as
 * XLA's own (TPUs have no float64), which keeps them within rounding of the CPU backend's.
 * Shapes are copied out of the graph before a node is added: adding one may move the nodes. */

typedef struct xshape {
    int ndim;
    int64_t dims[XG_MAX_DIMS];
} xshape;

static xshape shape_of(const xla_trace *t, int id) {
    const xg_node *n = &t->g->nodes[id];
    xshape s = {n->ndim, {0}};
    memcpy(s.dims, n->dims, sizeof s.dims);
    return s;
}

static xshape tensor_shape(const dist_tensor *x) {
    xshape s = {x->ndim, {0}};
    for (int i = 0; i < x->ndim && i < XG_MAX_DIMS; i++) s.dims[i] = x->shape[i];
    return s;
}

static dist_status node_of(xla_trace *t, xg_op op, dist_dtype dt, const xshape *s, int nin,
                           const int *in, int64_t attr, int *id) {
    DIST_TRY(add_node(t, op, dt, s->ndim, s->dims, nin, in, id));
    t->g->nodes[*id].i[0] = attr;
    return DIST_OK;
}

static dist_status unary(xla_trace *t, xg_unary f, int x, int *out) {
    xshape s = shape_of(t, x);
    return node_of(t, XG_UNARY, t->g->nodes[x].dtype, &s, 1, &x, f, out);
}

static dist_status sqrt_of(xla_trace *t, int x, int *out) {
    xshape s = shape_of(t, x);
    return node_of(t, XG_SQRT, DIST_F32, &s, 1, &x, 0, out);
}

static dist_status splat_like(xla_trace *t, float v, int like, int *out) {
    xshape s = shape_of(t, like);
    return splat(t, v, DIST_F32, s.ndim, s.dims, out);
}

/* a (op) c and c (op) a for a float constant c */
static dist_status binop_c(xla_trace *t, xg_op op, int a, float c, int *out) {
    int k;
    DIST_TRY(splat_like(t, c, a, &k));
    return binop(t, op, a, k, out);
}

static dist_status c_binop(xla_trace *t, xg_op op, float c, int a, int *out) {
    int k;
    DIST_TRY(splat_like(t, c, a, &k));
    return binop(t, op, k, a, out);
}

/* (a cmp b) ? tv : fv, all of one shape */
static dist_status select_cmp(xla_trace *t, xg_cmp c, int a, int b, int tv, int fv, int *out) {
    xshape s = shape_of(t, tv);
    int in[4] = {a, b, tv, fv};
    return node_of(t, XG_SELECT_CMP, t->g->nodes[tv].dtype, &s, 4, in, c, out);
}

static dist_status reshape_to(xla_trace *t, int x, const xshape *s, int *out) {
    if (same_dims(&t->g->nodes[x], s->ndim, s->dims)) {
        *out = x;
        return DIST_OK;
    }
    return node_of(t, XG_RESHAPE, t->g->nodes[x].dtype, s, 1, &x, 0, out);
}

/* x broadcast to s with its axes aligned right (NumPy's rule: extents equal or 1) */
static dist_status bcast_right(xla_trace *t, int x, const xshape *s, int *out) {
    const xg_node *n = &t->g->nodes[x];
    if (same_dims(n, s->ndim, s->dims)) {
        *out = x;
        return DIST_OK;
    }
    int64_t mask = 0;
    for (int a = s->ndim - n->ndim; a < s->ndim; a++) mask |= (int64_t)1 << a;
    return node_of(t, XG_BCAST_DIMS, n->dtype, s, 1, &x, mask, out);
}

/* x reduced (XG_REDUCE_SUM / XG_REDUCE_MAX) over the axes of mask, to shape s (the kept axes,
 * with or without the reduced ones as extent 1) */
static dist_status reduce_to(xla_trace *t, xg_op op, int x, int64_t mask, const xshape *s,
                             int *out) {
    return node_of(t, op, DIST_F32, s, 1, &x, mask, out);
}

/* x's shape with the axes of mask as extent 1 */
static xshape keepdims(const xshape *x, int64_t mask) {
    xshape s = *x;
    for (int a = 0; a < s.ndim; a++)
        if (mask >> a & 1) s.dims[a] = 1;
    return s;
}

static dist_status isplat(xla_trace *t, uint32_t v, const xshape *s, int *out) {
    return node_of(t, XG_ISPLAT, DIST_I32, s, 0, NULL, (int64_t)v, out);
}

/* dist_op_mix32 on an int32 node (the bits of uint32 arithmetic: wrapping multiply, logical
 * shifts) */
static dist_status mix32(xla_trace *t, int x, int *out) {
    static const struct {
        xg_op op;
        uint32_t c;
    } steps[] = {
        {XG_SHR, 16}, {XG_MUL, 0x7feb352du}, {XG_SHR, 15}, {XG_MUL, 0x846ca68bu}, {XG_SHR, 16}};
    xshape s = shape_of(t, x);
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        int c, v;
        DIST_TRY(isplat(t, steps[k].c, &s, &c));
        DIST_TRY(binop(t, steps[k].op, x, c, &v));
        if (steps[k].op == XG_SHR) DIST_TRY(binop(t, XG_XOR, x, v, &v));
        x = v;
    }
    *out = x;
    return DIST_OK;
}

static dist_status read_opt(xla_trace *t, const dist_tensor *x, int *out) {
    *out = -1;
    return x ? read_tensor(t, x, out) : DIST_OK;
}

static dist_status write_opt(xla_trace *t, dist_tensor *y, int node) {
    if (!y) return DIST_OK;
    int v;
    xshape s = tensor_shape(y);
    DIST_TRY(reshape_to(t, node, &s, &v));
    return write_tensor(t, y, v);
}

#define GELU_C 0.7978845608028654f    /* sqrt(2 / pi) */
#define RSQRT_2 0.7071067811865476f   /* 1 / sqrt(2) */
#define RSQRT_2PI 0.3989422804014327f /* 1 / sqrt(2 pi) */

#define SELU_SCALE 1.0507009873554804934193349852946f
#define SELU_SCALE_ALPHA 1.7580993408473768599402175208123f

/* expf(x) - 1 where x < 0, else x: tf.nn.elu's output (the ELU kind's y0, ops.h) */
static dist_status elu_y0(xla_trace *t, int x, int zero, int *out) {
    int e;
    DIST_TRY(unary(t, XU_EXP, x, &e));
    DIST_TRY(binop_c(t, XG_SUB, e, 1.0f, &e));
    return select_cmp(t, XC_LT, x, zero, e, x, out);
}

/* GELU_TANH's u = c (xc + 0.044715 xc^3) and u' = c (1 + 3 * 0.044715 xc^2) (du: optional) of
 * x clamped to [-1e4, 1e4] (ops.h) */
static dist_status gelu_tanh_u(xla_trace *t, int x, int *u, int *du) {
    int lo, hi, xc, a;
    DIST_TRY(splat_like(t, -1e4f, x, &lo));
    DIST_TRY(splat_like(t, 1e4f, x, &hi));
    DIST_TRY(select_cmp(t, XC_LT, x, lo, lo, x, &xc));
    DIST_TRY(select_cmp(t, XC_GT, xc, hi, hi, xc, &xc));
    DIST_TRY(binop(t, XG_MUL, xc, xc, &a));
    if (du) {
        DIST_TRY(c_binop(t, XG_MUL, 3.0f * 0.044715f, a, du));
        DIST_TRY(c_binop(t, XG_ADD, 1.0f, *du, du));
        DIST_TRY(c_binop(t, XG_MUL, GELU_C, *du, du));
    }
    DIST_TRY(binop(t, XG_MUL, a, xc, &a));
    DIST_TRY(c_binop(t, XG_MUL, 0.044715f, a, &a));
    DIST_TRY(binop(t, XG_ADD, xc, a, &a));
    return c_binop(t, XG_MUL, GELU_C, a, u);
}

/* DIST_UN_PIECEWISE (ops.h): Keras 3's piecewise activations as selects, f[0] selecting */
static dist_status op_piecewise(xla_trace *t, const float *f, int x, int z, int *y) {
    int a, b, lo, hi;
    const float th = f[1];
    switch ((int)f[0]) {
    case DIST_PW_HARD_TANH: /* a minimum, then a maximum; NaN kept */
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(select_cmp(t, XC_LT, x, hi, x, hi, &a));
        DIST_TRY(select_cmp(t, XC_GT, a, lo, a, lo, &a));
        return select_cmp(t, XC_NE, x, x, x, a, y);
    case DIST_PW_SOFT_SHRINK:
        DIST_TRY(splat_like(t, th, x, &hi));
        DIST_TRY(splat_like(t, -th, x, &lo));
        DIST_TRY(binop_c(t, XG_ADD, x, th, &a));
        DIST_TRY(select_cmp(t, XC_LT, x, lo, a, z, &a));
        DIST_TRY(binop_c(t, XG_SUB, x, th, &b));
        return select_cmp(t, XC_GT, x, hi, b, a, y);
    case DIST_PW_HARD_SHRINK:
        DIST_TRY(splat_like(t, th, x, &hi));
        DIST_TRY(unary(t, XU_ABS, x, &a));
        return select_cmp(t, XC_GT, a, hi, x, z, y);
    case DIST_PW_SPARSE_SIGMOID:
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(binop_c(t, XG_ADD, x, 1.0f, &a));
        DIST_TRY(c_binop(t, XG_MUL, 0.5f, a, &a));
        DIST_TRY(select_cmp(t, XC_GE, x, hi, hi, a, &a));
        return select_cmp(t, XC_LE, x, lo, z, a, y);
    default: /* DIST_PW_SPARSE_PLUS */
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(binop_c(t, XG_ADD, x, 1.0f, &a));
        DIST_TRY(binop(t, XG_MUL, a, a, &a));
        DIST_TRY(c_binop(t, XG_MUL, 0.25f, a, &a));
        DIST_TRY(select_cmp(t, XC_LT, x, hi, a, x, &a));
        return select_cmp(t, XC_LE, x, lo, z, a, y);
    }
}

static dist_status op_piecewise_grad(xla_trace *t, const float *f, int x, int dy, int z, int *dx) {
    int a, b, g, lo, hi;
    const float th = f[1];
    switch ((int)f[0]) {
    case DIST_PW_HARD_TANH:
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(select_cmp(t, XC_LT, x, hi, x, hi, &a)); /* m */
        DIST_TRY(select_cmp(t, XC_GE, a, lo, dy, z, &g));
        return select_cmp(t, XC_LE, x, hi, g, z, dx);
    case DIST_PW_SOFT_SHRINK:
        DIST_TRY(splat_like(t, th, x, &hi));
        DIST_TRY(splat_like(t, -th, x, &lo));
        DIST_TRY(select_cmp(t, XC_GT, x, hi, dy, z, &a));
        DIST_TRY(select_cmp(t, XC_LT, x, lo, dy, z, &b));
        DIST_TRY(select_cmp(t, XC_LE, x, hi, b, z, &b));
        return binop(t, XG_ADD, a, b, dx);
    case DIST_PW_HARD_SHRINK:
        DIST_TRY(splat_like(t, th, x, &hi));
        DIST_TRY(unary(t, XU_ABS, x, &a));
        return select_cmp(t, XC_GT, a, hi, dy, z, dx);
    case DIST_PW_SPARSE_SIGMOID:
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(select_cmp(t, XC_LE, x, lo, z, dy, &g));
        DIST_TRY(select_cmp(t, XC_GE, x, hi, z, g, &g));
        return c_binop(t, XG_MUL, 0.5f, g, dx);
    default: /* DIST_PW_SPARSE_PLUS */
        DIST_TRY(splat_like(t, 1.0f, x, &hi));
        DIST_TRY(splat_like(t, -1.0f, x, &lo));
        DIST_TRY(select_cmp(t, XC_LE, x, lo, z, dy, &g));
        DIST_TRY(select_cmp(t, XC_LT, x, hi, g, z, &a)); /* the middle's */
        DIST_TRY(select_cmp(t, XC_LT, x, hi, z, g, &b)); /* x's own */
        DIST_TRY(c_binop(t, XG_MUL, 0.25f, a, &a));
        DIST_TRY(binop_c(t, XG_MUL, a, 2.0f, &a));
        DIST_TRY(binop_c(t, XG_ADD, x, 1.0f, &g));
        DIST_TRY(binop(t, XG_MUL, a, g, &a));
        return binop(t, XG_ADD, a, b, dx);
    }
}

/* The Keras activations of ops.h (ELU .. PIECEWISE) as selects of their pieces */
static dist_status op_unary_keras(xla_trace *t, int k, const float *f, int x, int *y) {
    int z, a, b;
    DIST_TRY(splat_like(t, 0.0f, x, &z));
    switch (k) {
    case DIST_UN_PIECEWISE: return op_piecewise(t, f, x, z, y);
    case DIST_UN_ELU:
        DIST_TRY(elu_y0(t, x, z, &a));
        DIST_TRY(c_binop(t, XG_MUL, f[0], a, &a));
        return select_cmp(t, XC_GT, x, z, x, a, y);
    case DIST_UN_SELU:
        DIST_TRY(unary(t, XU_EXP, x, &a));
        DIST_TRY(binop_c(t, XG_SUB, a, 1.0f, &a));
        DIST_TRY(c_binop(t, XG_MUL, SELU_SCALE_ALPHA, a, &a));
        DIST_TRY(c_binop(t, XG_MUL, SELU_SCALE, x, &b));
        return select_cmp(t, XC_LT, x, z, a, b, y);
    case DIST_UN_SOFTPLUS: { /* the middle as max(x, 0) + log1p(exp(-|x|)) */
        const float th = DIST_SOFTPLUS_T;
        int lo, hi, m;
        DIST_TRY(unary(t, XU_ABS, x, &b));
        DIST_TRY(unary(t, XU_NEG, b, &b));
        DIST_TRY(unary(t, XU_EXP, b, &b));
        DIST_TRY(unary(t, XU_LOG1P, b, &b));
        DIST_TRY(select_cmp(t, XC_GT, x, z, x, z, &m));
        DIST_TRY(binop(t, XG_ADD, m, b, &b));
        DIST_TRY(unary(t, XU_EXP, x, &a));
        DIST_TRY(splat_like(t, th, x, &lo));
        DIST_TRY(splat_like(t, -th, x, &hi));
        DIST_TRY(select_cmp(t, XC_LT, x, lo, a, b, &a));
        return select_cmp(t, XC_GT, x, hi, x, a, y);
    }
    case DIST_UN_HARD_SIGMOID: {
        int one, m;
        if (f[0] == 0) { /* Keras 3: relu6(x + 3) / 6, NaN kept */
            DIST_TRY(binop_c(t, XG_ADD, x, 3.0f, &a));
            DIST_TRY(splat_like(t, 6.0f, x, &b));
            DIST_TRY(select_cmp(t, XC_LT, a, b, a, b, &m));
            DIST_TRY(select_cmp(t, XC_GT, a, z, m, z, &m));
            DIST_TRY(select_cmp(t, XC_NE, a, a, a, m, &m));
            return binop_c(t, XG_DIV, m, 6.0f, y);
        }
        /* tf_keras: a minimum, then a maximum, of z = x * 0.2 + 0.5; NaN kept */
        DIST_TRY(binop_c(t, XG_MUL, x, 0.2f, &a));
        DIST_TRY(binop_c(t, XG_ADD, a, 0.5f, &a));
        DIST_TRY(splat_like(t, 1.0f, x, &one));
        DIST_TRY(select_cmp(t, XC_LT, a, one, a, one, &m));
        DIST_TRY(select_cmp(t, XC_GT, m, z, m, z, &m));
        return select_cmp(t, XC_NE, a, a, a, m, y);
    }
    case DIST_UN_SOFTSIGN:
        DIST_TRY(unary(t, XU_ABS, x, &a));
        DIST_TRY(binop_c(t, XG_ADD, a, 1.0f, &a));
        return binop(t, XG_DIV, x, a, y);
    case DIST_UN_LEAKY_RELU:
        DIST_TRY(binop_c(t, XG_MUL, x, f[0], &a));
        return select_cmp(t, XC_GT, x, z, x, a, y);
    default: /* DIST_UN_RELU_MAX: NaN kept */
        DIST_TRY(splat_like(t, f[0], x, &b));
        DIST_TRY(select_cmp(t, XC_LT, x, b, x, b, &a));
        DIST_TRY(select_cmp(t, XC_GT, x, z, a, z, &a));
        return select_cmp(t, XC_NE, x, x, x, a, y);
    }
}

static dist_status op_unary_keras_grad(xla_trace *t, int k, const float *f, int x, int y, int dy,
                                       int *dx) {
    int z, a, b;
    DIST_TRY(splat_like(t, 0.0f, x, &z));
    switch (k) {
    case DIST_UN_PIECEWISE: return op_piecewise_grad(t, f, x, dy, z, dx);
    case DIST_UN_ELU: {
        int p, d = dy;
        DIST_TRY(elu_y0(t, x, z, &a));
        if (f[0] != 1.0f) { /* the where's gradient: x > 0 ? dy + a * 0 : 0 + a * dy */
            int q;
            DIST_TRY(c_binop(t, XG_MUL, f[0], dy, &b));
            DIST_TRY(c_binop(t, XG_ADD, 0.0f, b, &b));
            DIST_TRY(splat_like(t, f[0] * 0.0f, x, &q));
            DIST_TRY(binop(t, XG_ADD, dy, q, &q));
            DIST_TRY(select_cmp(t, XC_GT, x, z, q, b, &d));
        }
        DIST_TRY(binop_c(t, XG_ADD, a, 1.0f, &p));
        DIST_TRY(binop(t, XG_MUL, p, d, &p));
        return select_cmp(t, XC_LT, a, z, p, d, dx);
    }
    case DIST_UN_SELU:
        DIST_TRY(binop_c(t, XG_ADD, y, SELU_SCALE_ALPHA, &a));
        DIST_TRY(binop(t, XG_MUL, dy, a, &a));
        DIST_TRY(binop_c(t, XG_MUL, dy, SELU_SCALE, &b));
        return select_cmp(t, XC_LT, y, z, a, b, dx);
    case DIST_UN_SOFTPLUS: /* dy * sigmoid(x) */
        DIST_TRY(unary(t, XU_LOGISTIC, x, &a));
        return binop(t, XG_MUL, dy, a, dx);
    case DIST_UN_HARD_SIGMOID: {
        int one, m, c6;
        DIST_TRY(splat_like(t, 1.0f, x, &one));
        if (f[0] == 0) { /* (dy / 6) * (0 < x + 3 < 6) */
            DIST_TRY(binop_c(t, XG_ADD, x, 3.0f, &a));
            DIST_TRY(splat_like(t, 6.0f, x, &c6));
            DIST_TRY(select_cmp(t, XC_GT, a, z, one, z, &m));
            DIST_TRY(select_cmp(t, XC_LT, a, c6, m, z, &m));
            DIST_TRY(binop_c(t, XG_DIV, dy, 6.0f, &b));
            return binop(t, XG_MUL, b, m, dx);
        }
        DIST_TRY(binop_c(t, XG_MUL, x, 0.2f, &a));
        DIST_TRY(binop_c(t, XG_ADD, a, 0.5f, &a));
        DIST_TRY(select_cmp(t, XC_LT, a, one, a, one, &m));
        DIST_TRY(select_cmp(t, XC_LE, a, one, dy, z, &b));
        DIST_TRY(select_cmp(t, XC_GE, m, z, b, z, &b));
        return binop_c(t, XG_MUL, b, 0.2f, dx);
    }
    case DIST_UN_SOFTSIGN:
        DIST_TRY(unary(t, XU_ABS, x, &a));
        DIST_TRY(binop_c(t, XG_ADD, a, 1.0f, &a));
        DIST_TRY(binop(t, XG_MUL, a, a, &a));
        return binop(t, XG_DIV, dy, a, dx);
    case DIST_UN_LEAKY_RELU:
        DIST_TRY(binop_c(t, XG_MUL, dy, f[0], &a));
        return select_cmp(t, XC_GT, x, z, dy, a, dx);
    default: { /* DIST_UN_RELU_MAX: the masks as products, as TensorFlow's gradients */
        int one, m;
        DIST_TRY(splat_like(t, f[0], x, &b));
        DIST_TRY(splat_like(t, 1.0f, x, &one));
        DIST_TRY(select_cmp(t, XC_GT, x, z, one, z, &m)); /* x > 0 */
        if (f[1] != 0) {
            DIST_TRY(select_cmp(t, XC_LE, x, b, dy, z, &a)); /* the clip's select */
            return binop(t, XG_MUL, a, m, dx);
        }
        DIST_TRY(select_cmp(t, XC_LT, x, b, m, z, &m)); /* and x < c */
        return binop(t, XG_MUL, dy, m, dx);
    }
    }
}

static dist_status op_unary(xla_trace *t, int k, const float *f, int x, int *y) {
    int a, b;
    if (k >= DIST_UN_ELU) return op_unary_keras(t, k, f, x, y);
    switch (k) {
    case DIST_UN_NEG: return unary(t, XU_NEG, x, y);
    case DIST_UN_EXP: return unary(t, XU_EXP, x, y);
    case DIST_UN_LOG: return unary(t, XU_LOG, x, y);
    case DIST_UN_SQRT: return sqrt_of(t, x, y);
    case DIST_UN_SQUARE: return binop(t, XG_MUL, x, x, y);
    case DIST_UN_ABS: return unary(t, XU_ABS, x, y);
    case DIST_UN_SIGMOID: return unary(t, XU_LOGISTIC, x, y);
    case DIST_UN_TANH: return unary(t, XU_TANH, x, y);
    case DIST_UN_GELU: /* 0.5 x (1 + erf(x / sqrt 2)) */
        DIST_TRY(binop_c(t, XG_MUL, x, RSQRT_2, &a));
        DIST_TRY(unary(t, XU_ERF, a, &a));
        DIST_TRY(c_binop(t, XG_ADD, 1.0f, a, &a));
        DIST_TRY(binop_c(t, XG_MUL, x, 0.5f, &b));
        return binop(t, XG_MUL, b, a, y);
    default: /* DIST_UN_GELU_TANH: 0.5 x (1 + tanh(u)) as x sigmoid(2u) (ops.h) */
        DIST_TRY(gelu_tanh_u(t, x, &a, NULL));
        DIST_TRY(binop_c(t, XG_MUL, a, 2.0f, &a));
        DIST_TRY(unary(t, XU_LOGISTIC, a, &a));
        return binop(t, XG_MUL, x, a, y);
    }
}

/* dx = dy * f'(x), y = f(x) where TensorFlow's gradient reads the output */
static dist_status op_unary_grad(xla_trace *t, int k, const float *f, int x, int y, int dy,
                                 int *dx) {
    int a, b, c;
    if (k >= DIST_UN_ELU) return op_unary_keras_grad(t, k, f, x, y, dy, dx);
    switch (k) {
    case DIST_UN_NEG: return unary(t, XU_NEG, dy, dx);
    case DIST_UN_EXP: return binop(t, XG_MUL, dy, y, dx);
    case DIST_UN_LOG: return binop(t, XG_DIV, dy, x, dx);
    case DIST_UN_SQRT:
        DIST_TRY(binop_c(t, XG_MUL, dy, 0.5f, &a));
        return binop(t, XG_DIV, a, y, dx);
    case DIST_UN_SQUARE:
        DIST_TRY(c_binop(t, XG_MUL, 2.0f, x, &a));
        return binop(t, XG_MUL, dy, a, dx);
    case DIST_UN_ABS: DIST_TRY(unary(t, XU_SIGN, x, &a)); return binop(t, XG_MUL, dy, a, dx);
    case DIST_UN_SIGMOID:
        DIST_TRY(c_binop(t, XG_SUB, 1.0f, y, &a));
        DIST_TRY(binop(t, XG_MUL, y, a, &a));
        return binop(t, XG_MUL, dy, a, dx);
    case DIST_UN_TANH:
        DIST_TRY(binop(t, XG_MUL, y, y, &a));
        DIST_TRY(c_binop(t, XG_SUB, 1.0f, a, &a));
        return binop(t, XG_MUL, dy, a, dx);
    case DIST_UN_GELU: /* 0.5 (1 + erf(x / sqrt 2)) + x exp(-x^2 / 2) / sqrt(2 pi) */
        DIST_TRY(binop_c(t, XG_MUL, x, RSQRT_2, &a));
        DIST_TRY(unary(t, XU_ERF, a, &a));
        DIST_TRY(c_binop(t, XG_ADD, 1.0f, a, &a));
        DIST_TRY(binop_c(t, XG_MUL, a, 0.5f, &a));
        DIST_TRY(binop(t, XG_MUL, x, x, &b));
        DIST_TRY(binop_c(t, XG_MUL, b, -0.5f, &b));
        DIST_TRY(unary(t, XU_EXP, b, &b));
        DIST_TRY(binop(t, XG_MUL, x, b, &b));
        DIST_TRY(binop_c(t, XG_MUL, b, RSQRT_2PI, &b));
        DIST_TRY(binop(t, XG_ADD, a, b, &a));
        return binop(t, XG_MUL, dy, a, dx);
    default: { /* s + x (2 (e / (d d)) u'), e = exp(-2 |u|), d = 1 + e, s = sigmoid(2u) */
        int u, du, e, d, one;
        DIST_TRY(gelu_tanh_u(t, x, &u, &du));
        DIST_TRY(unary(t, XU_ABS, u, &e));
        DIST_TRY(binop_c(t, XG_MUL, e, -2.0f, &e));
        DIST_TRY(unary(t, XU_EXP, e, &e));
        DIST_TRY(binop_c(t, XG_ADD, e, 1.0f, &d));
        DIST_TRY(splat_like(t, 0.0f, x, &c));
        DIST_TRY(splat_like(t, 1.0f, x, &one));
        DIST_TRY(select_cmp(t, XC_GE, u, c, one, e, &a));
        DIST_TRY(binop(t, XG_DIV, a, d, &a)); /* s */
        DIST_TRY(binop(t, XG_MUL, d, d, &b));
        DIST_TRY(binop(t, XG_DIV, e, b, &b));
        DIST_TRY(c_binop(t, XG_MUL, 2.0f, b, &b));
        DIST_TRY(binop(t, XG_MUL, b, du, &b));
        DIST_TRY(binop(t, XG_MUL, x, b, &b));
        DIST_TRY(binop(t, XG_ADD, a, b, &a));
        return binop(t, XG_MUL, dy, a, dx);
    }
    }
}

/* a (op) b with both already broadcast; max and min as TensorFlow picks (a >= b ? a : b) */
static dist_status op_binary(xla_trace *t, int k, int a, int b, int *y) {
    switch (k) {
    case DIST_BIN_ADD: return binop(t, XG_ADD, a, b, y);
    case DIST_BIN_SUB: return binop(t, XG_SUB, a, b, y);
    case DIST_BIN_MUL: return binop(t, XG_MUL, a, b, y);
    case DIST_BIN_DIV: return binop(t, XG_DIV, a, b, y);
    /* stablehlo.maximum / minimum propagate NaN, as tf.maximum / tf.minimum */
    case DIST_BIN_MAX: return binop(t, XG_MAX, a, b, y);
    default: return binop(t, XG_MIN, a, b, y);
    }
}

/* The per-element gradient of a broadcast operand summed back to its shape s: over the axes
 * of dy it was broadcast along (missing ones and extent-1 ones). */
static dist_status unbroadcast(xla_trace *t, int g, const xshape *s, int *out) {
    xshape o = shape_of(t, g);
    int64_t mask = 0;
    for (int a = 0; a < o.ndim; a++) {
        int ai = a - (o.ndim - s->ndim);
        if (ai < 0 || (s->dims[ai] == 1 && o.dims[a] != 1)) mask |= (int64_t)1 << a;
    }
    if (!mask) return reshape_to(t, g, s, out);
    return reduce_to(t, XG_REDUCE_SUM, g, mask, s, out);
}

static dist_status op_binary_grad(xla_trace *t, int k, int a, int b, int dy, int *ga, int *gb) {
    int z, v;
    switch (k) {
    case DIST_BIN_ADD: *ga = *gb = dy; return DIST_OK;
    case DIST_BIN_SUB: *ga = dy; return unary(t, XU_NEG, dy, gb);
    case DIST_BIN_MUL: DIST_TRY(binop(t, XG_MUL, dy, b, ga)); return binop(t, XG_MUL, a, dy, gb);
    case DIST_BIN_DIV: /* g / b, g * ((-a / b) / b) */
        DIST_TRY(binop(t, XG_DIV, dy, b, ga));
        DIST_TRY(unary(t, XU_NEG, a, &v));
        DIST_TRY(binop(t, XG_DIV, v, b, &v));
        DIST_TRY(binop(t, XG_DIV, v, b, &v));
        return binop(t, XG_MUL, dy, v, gb);
    default: /* to a where a >= b (max) / a <= b (min), else to b */
        DIST_TRY(splat_like(t, 0.0f, dy, &z));
        xg_cmp c = k == DIST_BIN_MAX ? XC_GE : XC_LE;
        DIST_TRY(select_cmp(t, c, a, b, dy, z, ga));
        return select_cmp(t, c, a, b, z, dy, gb);
    }
}

static int64_t axes_mask(int mask, int ndim) { return (int64_t)mask & (((int64_t)1 << ndim) - 1); }

static int64_t reduced_count(const xshape *x, int64_t mask) {
    int64_t n = 1;
    for (int a = 0; a < x->ndim; a++)
        if (mask >> a & 1) n *= x->dims[a];
    return n;
}

/* The row statistics of BatchNorm's [4, C] (or [2, C]) tensors: row r as [1, C]. */
static dist_status row_of(xla_trace *t, int m, int r, int *out) {
    xshape s = shape_of(t, m);
    s.dims[0] = 1;
    DIST_TRY(node_of(t, XG_SLICE_ND, DIST_F32, &s, 1, &m, 0, out));
    t->g->nodes[*out].a.pad.lo[0] = r;
    return DIST_OK;
}

static dist_status concat_rows(xla_trace *t, const int *rows, int n, int64_t c, int *out) {
    xshape s = {2, {n, c}};
    return node_of(t, XG_CONCAT, DIST_F32, &s, n, rows, 0, out);
}

/* a [C] (or any shape of C elements) as [1, C] */
static dist_status channel_row(xla_trace *t, int a, int64_t c, int *out) {
    xshape s = {2, {1, c}};
    return reshape_to(t, a, &s, out);
}

/* a f32 scalar of any shape ([] or [1]) broadcast to s */
static dist_status scalar_to(xla_trace *t, int a, const xshape *s, int *out) {
    xshape sc = {0, {0}};
    DIST_TRY(reshape_to(t, a, &sc, &a));
    return node_of(t, XG_BCAST_DIMS, DIST_F32, s, 1, &a, 0, out);
}

/* mean, var (each [1, C]) -> [4, C] stats with clamped (or zeros when clamped < 0) */
static dist_status bn_stats_of(xla_trace *t, int mean, int var, int clamped, float eps, int64_t c,
                               int *out) {
    int inv, rows[4];
    DIST_TRY(binop_c(t, XG_ADD, var, eps, &inv));
    DIST_TRY(sqrt_of(t, inv, &inv));
    DIST_TRY(c_binop(t, XG_DIV, 1.0f, inv, &inv));
    if (clamped < 0) DIST_TRY(splat_like(t, 0.0f, mean, &clamped));
    rows[0] = mean, rows[1] = var, rows[2] = inv, rows[3] = clamped;
    return concat_rows(t, rows, 4, c, out);
}

static dist_status op_batch_norm(xla_trace *t, const dist_op *op, const dist_tensor *const *in,
                                 dist_tensor *const *out) {
    const dist_tensor *x0 = in[0];
    int64_t c = x0->shape[x0->ndim - 1], rows = dist_tensor_numel(x0) / (c ? c : 1);
    xshape x2s = {2, {rows, c}}, cs = {2, {1, c}};
    int x, v, w, st, mean, inv;
    switch (op->code) {
    case DIST_OPC_BN_STATS: {
        DIST_TRY(read_tensor(t, in[0], &x));
        DIST_TRY(reshape_to(t, x, &x2s, &x));
        int sum;
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, x, 1, &cs, &sum));
        if (op->k == DIST_BN_SUMS) {
            int sq, r[2];
            DIST_TRY(binop(t, XG_MUL, x, x, &sq));
            r[0] = sum;
            DIST_TRY(reduce_to(t, XG_REDUCE_SUM, sq, 1, &cs, &r[1]));
            DIST_TRY(concat_rows(t, r, 2, c, &v));
            return write_opt(t, out[0], v);
        }
        DIST_TRY(binop_c(t, XG_DIV, sum, (float)rows, &mean));
        DIST_TRY(bcast_right(t, mean, &x2s, &w));
        DIST_TRY(binop(t, XG_SUB, x, w, &w));
        DIST_TRY(binop(t, XG_MUL, w, w, &w));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, w, 1, &cs, &w));
        DIST_TRY(binop_c(t, XG_DIV, w, (float)rows, &w));
        DIST_TRY(bn_stats_of(t, mean, w, -1, op->f[0], c, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_BN_MOMENTS: {
        int sums, cnt, s0, s1, ex2, d, z, one, var, clamped;
        c = in[0]->shape[in[0]->ndim - 1];
        cs.dims[1] = c;
        xshape ss = {2, {2, c}};
        DIST_TRY(read_tensor(t, in[0], &sums));
        DIST_TRY(reshape_to(t, sums, &ss, &sums));
        DIST_TRY(read_tensor(t, in[1], &cnt));
        DIST_TRY(scalar_to(t, cnt, &cs, &cnt));
        DIST_TRY(row_of(t, sums, 0, &s0));
        DIST_TRY(row_of(t, sums, 1, &s1));
        DIST_TRY(binop(t, XG_DIV, s0, cnt, &mean));
        DIST_TRY(binop(t, XG_DIV, s1, cnt, &ex2));
        DIST_TRY(binop(t, XG_MUL, mean, mean, &d));
        DIST_TRY(binop(t, XG_SUB, ex2, d, &d));
        DIST_TRY(splat_like(t, 0.0f, d, &z));
        DIST_TRY(splat_like(t, 1.0f, d, &one));
        /* no rows anywhere: mean and variance 0 */
        DIST_TRY(select_cmp(t, XC_EQ, cnt, z, z, mean, &mean));
        DIST_TRY(select_cmp(t, XC_EQ, cnt, z, z, d, &d));
        DIST_TRY(select_cmp(t, XC_LT, d, z, z, d, &var));
        DIST_TRY(select_cmp(t, XC_LT, d, z, one, z, &clamped));
        DIST_TRY(bn_stats_of(t, mean, var, clamped, op->f[0], c, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_BN_INFER_STATS: {
        int var;
        c = dist_tensor_numel(in[0]);
        DIST_TRY(read_tensor(t, in[0], &mean));
        DIST_TRY(channel_row(t, mean, c, &mean));
        DIST_TRY(read_tensor(t, in[1], &var));
        DIST_TRY(channel_row(t, var, c, &var));
        DIST_TRY(bn_stats_of(t, mean, var, -1, op->f[0], c, &v));
        return write_opt(t, out[0], v);
    }
    default: break;
    }
    /* the ops on x with its stats: per-channel rows broadcast over x's rows */
    xshape ss = {2, {4, c}};
    DIST_TRY(read_tensor(t, in[0], &x));
    DIST_TRY(reshape_to(t, x, &x2s, &x));
    int sti = op->code == DIST_OPC_BN_APPLY ? 1 : 2, gti = sti + 1;
    DIST_TRY(read_tensor(t, in[sti], &st));
    DIST_TRY(reshape_to(t, st, &ss, &st));
    DIST_TRY(row_of(t, st, 0, &mean));
    DIST_TRY(row_of(t, st, 2, &inv));
    int g = -1, bmean, binv, bg = -1;
    if (op->nin > gti && in[gti]) {
        DIST_TRY(read_tensor(t, in[gti], &g));
        DIST_TRY(channel_row(t, g, c, &g));
        DIST_TRY(bcast_right(t, g, &x2s, &bg));
    }
    DIST_TRY(bcast_right(t, mean, &x2s, &bmean));
    DIST_TRY(bcast_right(t, inv, &x2s, &binv));
    if (op->code == DIST_OPC_BN_APPLY) { /* x s + (beta - mean s), s = inv gamma */
        int sc = inv, off;
        if (g >= 0) DIST_TRY(binop(t, XG_MUL, inv, g, &sc));
        DIST_TRY(binop(t, XG_MUL, mean, sc, &off));
        if (op->nin > 3 && in[3]) {
            int beta;
            DIST_TRY(read_tensor(t, in[3], &beta));
            DIST_TRY(channel_row(t, beta, c, &beta));
            DIST_TRY(binop(t, XG_SUB, beta, off, &off));
        } else {
            DIST_TRY(unary(t, XU_NEG, off, &off));
        }
        DIST_TRY(bcast_right(t, sc, &x2s, &sc));
        DIST_TRY(bcast_right(t, off, &x2s, &off));
        DIST_TRY(binop(t, XG_MUL, x, sc, &v));
        DIST_TRY(binop(t, XG_ADD, v, off, &v));
        if (op->relu) DIST_TRY(relu_of(t, v, &v)); /* relu_forward's node */
        return write_opt(t, out[0], v);
    }
    int dy, xc;
    DIST_TRY(read_tensor(t, in[1], &dy));
    DIST_TRY(reshape_to(t, dy, &x2s, &dy));
    if (op->relu) { /* dy masked by the fused ReLU's output: relu_backward's node */
        int yi = op->code == DIST_OPC_BN_GRAD_SUMS ? 5 : 6, ry[2];
        if (op->nin <= yi || !in[yi])
            return dist_error(DIST_INVALID_ARGUMENT, "%s: a fused ReLU's gradient needs y (in[%d])",
                              dist_op_name(op), yi);
        DIST_TRY(read_tensor(t, in[yi], &ry[0]));
        DIST_TRY(reshape_to(t, ry[0], &x2s, &ry[0]));
        ry[1] = dy;
        DIST_TRY(node_of(t, XG_RELU_GRAD, DIST_F32, &x2s, 2, ry, 0, &dy));
    }
    DIST_TRY(binop(t, XG_SUB, x, bmean, &xc));
    if (op->code == DIST_OPC_BN_GRAD_SUMS) {
        /* S = sum dy, T = sum dy (x - mean); out[0] = S, T inv; out[1] = a = S g, b = T g, or
         * under SYNC the gradients of the sums of x and x^2 */
        int S, T, r[2];
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, dy, 1, &cs, &S));
        DIST_TRY(binop(t, XG_MUL, dy, xc, &w));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, w, 1, &cs, &T));
        if (op->nout > 0 && out[0]) {
            r[0] = S;
            DIST_TRY(binop(t, XG_MUL, T, inv, &r[1]));
            DIST_TRY(concat_rows(t, r, 2, c, &v));
            DIST_TRY(write_opt(t, out[0], v));
        }
        if (op->nout < 2 || !out[1]) return DIST_OK;
        int a = S, b = T;
        if (g >= 0) {
            DIST_TRY(binop(t, XG_MUL, S, g, &a));
            DIST_TRY(binop(t, XG_MUL, T, g, &b));
        }
        if (op->k == DIST_BN_SYNC) { /* dmean = -a inv, dvar = clamped ? 0 : -0.5 inv^3 b */
            int dmean, dvar, cnt, clamped, z;
            DIST_TRY(binop(t, XG_MUL, a, inv, &dmean));
            DIST_TRY(unary(t, XU_NEG, dmean, &dmean));
            DIST_TRY(binop(t, XG_MUL, inv, inv, &dvar));
            DIST_TRY(binop(t, XG_MUL, dvar, inv, &dvar));
            DIST_TRY(c_binop(t, XG_MUL, -0.5f, dvar, &dvar));
            DIST_TRY(binop(t, XG_MUL, dvar, b, &dvar));
            DIST_TRY(row_of(t, st, 3, &clamped));
            DIST_TRY(splat_like(t, 0.0f, dvar, &z));
            DIST_TRY(select_cmp(t, XC_NE, clamped, z, z, dvar, &dvar));
            DIST_TRY(read_tensor(t, in[4], &cnt));
            DIST_TRY(scalar_to(t, cnt, &cs, &cnt));
            DIST_TRY(binop(t, XG_MUL, mean, dvar, &w));
            DIST_TRY(c_binop(t, XG_MUL, 2.0f, w, &w));
            DIST_TRY(binop(t, XG_SUB, dmean, w, &a));
            DIST_TRY(binop(t, XG_DIV, a, cnt, &a));
            DIST_TRY(binop(t, XG_DIV, dvar, cnt, &b));
        }
        r[0] = a, r[1] = b;
        DIST_TRY(concat_rows(t, r, 2, c, &v));
        return write_opt(t, out[1], v);
    }
    /* DIST_OPC_BN_GRAD_INPUT: dy g inv, plus the terms of the statistics' gradients */
    int gi = binv;
    if (bg >= 0) DIST_TRY(binop(t, XG_MUL, bg, binv, &gi));
    DIST_TRY(binop(t, XG_MUL, dy, gi, &v));
    if (op->k == DIST_BN_INFERENCE) return write_opt(t, out[0], v);
    int sums, a, b;
    xshape s2 = {2, {2, c}};
    DIST_TRY(read_tensor(t, in[4], &sums));
    DIST_TRY(reshape_to(t, sums, &s2, &sums));
    DIST_TRY(row_of(t, sums, 0, &a));
    DIST_TRY(row_of(t, sums, 1, &b));
    if (op->k == DIST_BN_SYNC) { /* + sums[0] + 2 x sums[1] */
        DIST_TRY(bcast_right(t, a, &x2s, &a));
        DIST_TRY(bcast_right(t, b, &x2s, &b));
        DIST_TRY(binop(t, XG_ADD, v, a, &v));
        DIST_TRY(c_binop(t, XG_MUL, 2.0f, x, &w));
        DIST_TRY(binop(t, XG_MUL, w, b, &w));
        DIST_TRY(binop(t, XG_ADD, v, w, &v));
        return write_opt(t, out[0], v);
    }
    /* LOCAL: + (-a inv) / rows + (-0.5 inv^3 b) 2 (x - mean) / rows */
    int dmean, dvar;
    DIST_TRY(binop(t, XG_MUL, a, inv, &dmean));
    DIST_TRY(unary(t, XU_NEG, dmean, &dmean));
    DIST_TRY(binop_c(t, XG_DIV, dmean, (float)rows, &dmean));
    DIST_TRY(binop(t, XG_MUL, inv, inv, &dvar));
    DIST_TRY(binop(t, XG_MUL, dvar, inv, &dvar));
    DIST_TRY(c_binop(t, XG_MUL, -0.5f, dvar, &dvar));
    DIST_TRY(binop(t, XG_MUL, dvar, b, &dvar));
    DIST_TRY(bcast_right(t, dmean, &x2s, &dmean));
    DIST_TRY(bcast_right(t, dvar, &x2s, &dvar));
    DIST_TRY(binop(t, XG_ADD, v, dmean, &v));
    DIST_TRY(c_binop(t, XG_MUL, 2.0f, xc, &w));
    DIST_TRY(binop(t, XG_MUL, dvar, w, &w));
    DIST_TRY(binop_c(t, XG_DIV, w, (float)rows, &w));
    DIST_TRY(binop(t, XG_ADD, v, w, &v));
    return write_opt(t, out[0], v);
}

/* Window sums of x (NHWC) and the count of each window's positions inside x (padding left
 * out: Keras's "same" average), as XG_REDUCE_WINDOW nodes of shape ys. */
static dist_status window_sum(xla_trace *t, int x, const dist_op *op, const xshape *ys, int *out) {
    DIST_TRY(node_of(t, XG_REDUCE_WINDOW, DIST_F32, ys, 1, &x, 0, out));
    dist_pool2d_desc *d = &t->g->nodes[*out].a.pool;
    memset(d, 0, sizeof *d);
    d->window_h = op->pool.window_h, d->window_w = op->pool.window_w;
    d->stride_h = op->pool.stride_h, d->stride_w = op->pool.stride_w;
    d->pad_top = op->pool.pad_top, d->pad_bottom = op->pool.pad_bottom;
    d->pad_left = op->pool.pad_left, d->pad_right = op->pool.pad_right;
    return DIST_OK;
}

static dist_status window_count(xla_trace *t, const xshape *xs, const dist_op *op, const xshape *ys,
                                int *out) {
    int ones;
    DIST_TRY(splat(t, 1.0f, DIST_F32, xs->ndim, xs->dims, &ones));
    return window_sum(t, ones, op, ys, out);
}

/* dx of the average pool: dy / count spread back over each window. The transpose of a
 * strided window sum is a stride-1 window sum over dy dilated by the stride and padded so
 * that window i covers the outputs whose windows hold position i. */
static dist_status avg_pool_grad(xla_trace *t, const dist_op *op, int dy, const xshape *xs,
                                 int *out) {
    xshape ys = shape_of(t, dy);
    int cnt, g, gp;
    DIST_TRY(window_count(t, xs, op, &ys, &cnt));
    DIST_TRY(binop(t, XG_DIV, dy, cnt, &g));
    int64_t wh = op->pool.window_h, ww = op->pool.window_w;
    int64_t lo_h = wh - 1 - op->pool.pad_top, lo_w = ww - 1 - op->pool.pad_left;
    xshape ps = ys;
    ps.dims[1] = xs->dims[1] + wh - 1;
    ps.dims[2] = xs->dims[2] + ww - 1;
    DIST_TRY(node_of(t, XG_PAD, DIST_F32, &ps, 1, &g, 0, &gp));
    xg_node *p = &t->g->nodes[gp];
    p->a.pad.lo[1] = lo_h, p->a.pad.lo[2] = lo_w;
    p->a.pad.interior[1] = op->pool.stride_h - 1, p->a.pad.interior[2] = op->pool.stride_w - 1;
    p->a.pad.hi[1] = ps.dims[1] - lo_h - ((ys.dims[1] - 1) * op->pool.stride_h + 1);
    p->a.pad.hi[2] = ps.dims[2] - lo_w - ((ys.dims[2] - 1) * op->pool.stride_w + 1);
    dist_op w = *op;
    w.pool.stride_h = w.pool.stride_w = 1;
    w.pool.pad_top = w.pool.pad_bottom = w.pool.pad_left = w.pool.pad_right = 0;
    return window_sum(t, gp, &w, xs, out);
}

/* Dropout's keep mask: dist_op_hash32 of the key and each element's index, in int32 nodes.
 * The counter (u[2]) is two runtime scalars of 16 bits each (exact in float32), so that every
 * step of a traced program, and each of k steps in one program, gets its own; the replica is
 * stablehlo.replica_id, the program being one for every replica. */
static dist_status dropout_mask(xla_trace *t, const dist_op *op, const dist_tensor *y, int *out) {
    uint32_t s = dist_op_mix32(op->u[1] ^ dist_op_mix32(op->u[0]));
    xshape sc = {0, {0}}, flat1 = {1, {dist_tensor_numel(y)}};
    int lo, hi, k, sixteen, v, r, idx, b;
    DIST_TRY(scalar_input(t, (float)(op->u[2] & 0xffffu), &lo));
    DIST_TRY(scalar_input(t, (float)(op->u[2] >> 16), &hi));
    DIST_TRY(node_of(t, XG_CONVERT, DIST_I32, &sc, 1, &lo, 0, &lo));
    DIST_TRY(node_of(t, XG_CONVERT, DIST_I32, &sc, 1, &hi, 0, &hi));
    DIST_TRY(isplat(t, 16, &sc, &sixteen));
    DIST_TRY(binop(t, XG_SHL, hi, sixteen, &hi));
    DIST_TRY(binop(t, XG_OR, hi, lo, &v));
    DIST_TRY(isplat(t, s, &sc, &k));
    DIST_TRY(binop(t, XG_XOR, v, k, &v));
    DIST_TRY(mix32(t, v, &v));
    DIST_TRY(node_of(t, XG_REPLICA_ID, DIST_I32, &sc, 0, NULL, 0, &r));
    DIST_TRY(binop(t, XG_XOR, r, v, &v));
    DIST_TRY(mix32(t, v, &v));
    DIST_TRY(node_of(t, XG_IOTA, DIST_I32, &flat1, 0, NULL, 0, &idx));
    DIST_TRY(node_of(t, XG_BCAST_DIMS, DIST_I32, &flat1, 1, &v, 0, &b));
    DIST_TRY(binop(t, XG_XOR, idx, b, &v));
    DIST_TRY(mix32(t, v, &v));
    /* u = (h >> 8) 2^-24: 24 bits, exact in float32 */
    int eight, u, rate, keep, zero;
    DIST_TRY(isplat(t, 8, &flat1, &eight));
    DIST_TRY(binop(t, XG_SHR, v, eight, &v));
    DIST_TRY(node_of(t, XG_CONVERT, DIST_F32, &flat1, 1, &v, 0, &u));
    DIST_TRY(binop_c(t, XG_MUL, u, 1.0f / 16777216.0f, &u));
    DIST_TRY(splat_like(t, op->f[0], u, &rate));
    DIST_TRY(splat_like(t, 1.0f / (1.0f - op->f[0]), u, &keep));
    DIST_TRY(splat_like(t, 0.0f, u, &zero));
    return select_cmp(t, XC_GE, u, rate, keep, zero, out);
}

/* The ids (any shape of N elements) as [N, 1] indices, and the mask of those inside [0, V)
 * broadcast to [N, D] (1.0 inside, 0.0 outside); ids outside are replaced by 0 in the indices
 * (StableHLO clamps a gather's start indices and leaves an out-of-range scatter to the
 * implementation: both would differ from ops.h's zero rows). */
static dist_status row_indices(xla_trace *t, int ids, int64_t v, int64_t d, int *idx, int *mask) {
    const int64_t n = xg_numel(&t->g->nodes[ids]);
    xshape flat = {1, {n}}, col = {2, {n, 1}}, nd = {2, {n, d}};
    int f, zero_i, v_i, ok, one, zero, m;
    DIST_TRY(reshape_to(t, ids, &flat, &f));
    DIST_TRY(isplat(t, 0, &flat, &zero_i));
    DIST_TRY(isplat(t, (uint32_t)v, &flat, &v_i));
    /* inside: ids >= 0 and ids < V, as 1.0 / 0.0 per id */
    DIST_TRY(splat(t, 1.0f, DIST_F32, 1, flat.dims, &one));
    DIST_TRY(splat(t, 0.0f, DIST_F32, 1, flat.dims, &zero));
    DIST_TRY(select_cmp(t, XC_GE, f, zero_i, one, zero, &ok));
    DIST_TRY(select_cmp(t, XC_LT, f, v_i, ok, zero, &ok));
    DIST_TRY(node_of(t, XG_BCAST_DIMS, DIST_F32, &nd, 1, &ok, 1, &m));
    *mask = m;
    /* indices: the id where inside, else 0 */
    int clamped;
    DIST_TRY(select_cmp(t, XC_NE, ok, zero, f, zero_i, &clamped));
    return reshape_to(t, clamped, &col, idx);
}

/* x where mask != 0, else 0 (selected, not multiplied: an Inf or NaN outside stays out) */
static dist_status masked(xla_trace *t, int x, int mask, int *out) {
    int zero;
    DIST_TRY(splat_like(t, 0.0f, x, &zero));
    return select_cmp(t, XC_NE, mask, zero, x, zero, out);
}

/* LAYER_NORM and LAYER_NORM_GRAD (ops.h) on x viewed as [rows, C]: row reductions over axis 1
 * broadcast back, in float32 throughout (the backward reads the statistics' float32 mean).
 * xv: the inputs' nodes (-1 for an absent gamma or beta). */
static dist_status op_layer_norm(xla_trace *t, const dist_op *op, const dist_tensor *const *in,
                                 const int *xv, dist_tensor *const *out) {
    const dist_tensor *x0 = in[0];
    const int64_t c = x0->ndim ? x0->shape[x0->ndim - 1] : 0;
    if (c <= 0)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: x needs a non-empty last axis",
                          dist_op_name(op));
    const int64_t rows = dist_tensor_numel(x0) / c;
    xshape xs = {2, {rows, c}}, rs = {2, {rows, 1}}, cs = {2, {1, c}};
    int x, w, v, mean, inv, binv, xh;
    DIST_TRY(reshape_to(t, xv[0], &xs, &x));
    const int gi = op->code == DIST_OPC_LAYER_NORM ? 1 : 3; /* gamma's slot */
    int bg = -1;
    if (op->nin > gi && xv[gi] >= 0) {
        DIST_TRY(channel_row(t, xv[gi], c, &w));
        DIST_TRY(bcast_right(t, w, &xs, &bg));
    }
    if (op->code == DIST_OPC_LAYER_NORM) {
        int xc;
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, x, 2, &rs, &mean));
        DIST_TRY(binop_c(t, XG_DIV, mean, (float)c, &mean));
        DIST_TRY(bcast_right(t, mean, &xs, &w));
        DIST_TRY(binop(t, XG_SUB, x, w, &xc));
        DIST_TRY(binop(t, XG_MUL, xc, xc, &w));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, w, 2, &rs, &w));
        DIST_TRY(binop_c(t, XG_DIV, w, (float)c, &w));
        DIST_TRY(binop_c(t, XG_ADD, w, op->f[0], &inv));
        DIST_TRY(sqrt_of(t, inv, &inv));
        DIST_TRY(c_binop(t, XG_DIV, 1.0f, inv, &inv));
        DIST_TRY(bcast_right(t, inv, &xs, &binv));
        DIST_TRY(binop(t, XG_MUL, xc, binv, &v));
        if (bg >= 0) DIST_TRY(binop(t, XG_MUL, v, bg, &v));
        if (op->nin > 2 && xv[2] >= 0) {
            DIST_TRY(channel_row(t, xv[2], c, &w));
            DIST_TRY(bcast_right(t, w, &xs, &w));
            DIST_TRY(binop(t, XG_ADD, v, w, &v));
        }
        DIST_TRY(write_opt(t, out[0], v));
        if (op->nout < 2 || !out[1]) return DIST_OK;
        xshape ss = {2, {rows, 2}};
        int cols[2] = {mean, inv};
        DIST_TRY(node_of(t, XG_CONCAT, DIST_F32, &ss, 2, cols, 1, &v));
        return write_opt(t, out[1], v);
    }
    /* the gradient: in: x, dy, stats, gamma */
    int dy, st, g, A, B, k;
    xshape ss = {2, {rows, 2}};
    DIST_TRY(reshape_to(t, xv[1], &xs, &dy));
    DIST_TRY(reshape_to(t, xv[2], &ss, &st));
    DIST_TRY(node_of(t, XG_SLICE_ND, DIST_F32, &rs, 1, &st, 0, &mean));
    DIST_TRY(node_of(t, XG_SLICE_ND, DIST_F32, &rs, 1, &st, 0, &inv));
    t->g->nodes[inv].a.pad.lo[1] = 1;
    DIST_TRY(bcast_right(t, mean, &xs, &w));
    DIST_TRY(bcast_right(t, inv, &xs, &binv));
    DIST_TRY(binop(t, XG_SUB, x, w, &xh));
    DIST_TRY(binop(t, XG_MUL, xh, binv, &xh));
    if (op->nout > 1 && out[1]) { /* dgamma = sum over the rows of dy xhat */
        DIST_TRY(binop(t, XG_MUL, dy, xh, &w));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, w, 1, &cs, &w));
        DIST_TRY(write_opt(t, out[1], w));
    }
    if (op->nout > 2 && out[2]) { /* dbeta = sum over the rows of dy */
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, dy, 1, &cs, &w));
        DIST_TRY(write_opt(t, out[2], w));
    }
    if (!out[0]) return DIST_OK;
    /* dx = inv ((g - A) - xhat B), g = dy gamma, A = mean(g), B = mean(g xhat) per row */
    g = dy;
    if (bg >= 0) DIST_TRY(binop(t, XG_MUL, dy, bg, &g));
    DIST_TRY(reduce_to(t, XG_REDUCE_SUM, g, 2, &rs, &A));
    DIST_TRY(binop_c(t, XG_DIV, A, (float)c, &A));
    DIST_TRY(binop(t, XG_MUL, g, xh, &w));
    DIST_TRY(reduce_to(t, XG_REDUCE_SUM, w, 2, &rs, &B));
    DIST_TRY(binop_c(t, XG_DIV, B, (float)c, &B));
    DIST_TRY(bcast_right(t, A, &xs, &A));
    DIST_TRY(bcast_right(t, B, &xs, &B));
    DIST_TRY(binop(t, XG_SUB, g, A, &v));
    DIST_TRY(binop(t, XG_MUL, xh, B, &k));
    DIST_TRY(binop(t, XG_SUB, v, k, &v));
    DIST_TRY(binop(t, XG_MUL, binv, v, &v));
    return write_opt(t, out[0], v);
}

/* The layer ops' kernels: each records its graph nodes (tb_run_op hands them over). */
static const dist_layer_kernels tb_layer_kernels = {
    .conv2d_forward = tb_conv2d_forward,
    .conv2d_backward_data = tb_conv2d_backward_data,
    .conv2d_backward_filter = tb_conv2d_backward_filter,
    .pool_backward_masks_relu = 0,
    .max_pool2d_forward = tb_pool_forward,
    .max_pool2d_backward = tb_pool_backward,
    .matmul = tb_matmul,
    .bias_add = tb_bias_add,
    .bias_grad = tb_bias_grad,
    .relu_forward = tb_relu_forward,
    .relu_backward = tb_relu_backward,
    .softmax_xent_forward = tb_xent_forward,
    .softmax_xent_backward = tb_xent_backward,
    .accuracy_count = tb_accuracy_count,
    .to_layout = tb_to_layout,
    .add = tb_add,
    .scale = tb_scale,
    .fill = tb_fill,
    .reduce_sum = tb_reduce_sum,
    .adam_update = tb_adam_update,
    .sgd_update = tb_sgd_update,
    .cast = tb_cast,
    .round = tb_round,
};

static int tb_supports_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                          dist_tensor *const *out) {
    (void)ctx;
    if (dist_op_is_layer(op->code)) return dist_layer_supports(&tb_layer_kernels, op);
    switch (op->code) {
    case DIST_OPC_UNARY:
    case DIST_OPC_UNARY_GRAD:
        if (op->k < 0 || op->k >= DIST_UN_COUNT) return 0;
        break;
    case DIST_OPC_BINARY:
    case DIST_OPC_BINARY_GRAD:
        if (op->k < 0 || op->k >= DIST_BIN_COUNT) return 0;
        /* a fused ReLU's gradient reads its output y (in[3]) */
        if (op->code == DIST_OPC_BINARY_GRAD && op->relu && (op->nin < 4 || !in || !in[3]))
            return 0;
        break;
    case DIST_OPC_REDUCE:
    case DIST_OPC_REDUCE_GRAD:
        if (op->k < DIST_RED_SUM || op->k > DIST_RED_MAX) return 0;
        break;
    case DIST_OPC_SOFTMAX:
    case DIST_OPC_SOFTMAX_GRAD:
        if (op->k != 0 && op->k != 1) return 0;
        break;
    case DIST_OPC_BN_STATS:
        if (op->k != DIST_BN_LOCAL && op->k != DIST_BN_SUMS) return 0;
        break;
    case DIST_OPC_BN_GRAD_SUMS:
    case DIST_OPC_BN_GRAD_INPUT:
        if (op->k != DIST_BN_INFERENCE && op->k != DIST_BN_LOCAL && op->k != DIST_BN_SYNC) return 0;
        break;
    case DIST_OPC_BN_APPLY: /* the tape rounds y with a ROUND node of its own (no dtype here) */
        if (op->dtype != DIST_F32) return 0;
        break;
    case DIST_OPC_CONCAT:
        if (op->nin < 1 || op->nin > DIST_OP_MAX_IN) return 0;
        break;
    case DIST_OPC_PAD:
        if (op->k != 0 && (op->k != 1 || op->nin != 2)) return 0;
        break;
    case DIST_OPC_ATTENTION: /* a fusion (the CPU's): the tape records its three ops here */
    case DIST_OPC_ATTENTION_GRAD:
    case DIST_OPC_COUNT: return 0;
    default:
        if (op->code < DIST_OPC_UNARY || op->code >= DIST_OPC_COUNT) return 0;
        break;
    }
    /* float32 tensors of rank up to the graph's; the gather's ids int32 */
    for (int i = 0; in && i < op->nin && i < DIST_OP_MAX_IN; i++) {
        const int ids = (op->code == DIST_OPC_GATHER && i == 1) ||
                        (op->code == DIST_OPC_GATHER_GRAD && i == 0);
        if (in[i] && (in[i]->dtype != (ids ? DIST_I32 : DIST_F32) || in[i]->ndim > XG_MAX_DIMS))
            return 0;
    }
    for (int i = 0; out && i < op->nout && i < DIST_OP_MAX_IN; i++)
        if (out[i] && (out[i]->dtype != DIST_F32 || out[i]->ndim > XG_MAX_DIMS)) return 0;
    return 1;
}

/* x with its axes r - 3 and r - 2 swapped (a BATCH_MATMUL operand's heads moved into or out
 * of the matrix): one XG_TRANSPOSE node of shape *s (NULL: x's shape swapped). */
static dist_status swap_heads(xla_trace *t, int x, const xshape *s, int *out) {
    xshape sw = shape_of(t, x);
    const int r = sw.ndim;
    dist_bmm_swap_heads(r, sw.dims);
    int v;
    DIST_TRY(node_of(t, XG_TRANSPOSE, DIST_F32, s ? s : &sw, 1, &x, 0, &v));
    for (int d = 0; d < r; d++) t->g->nodes[v].a.perm[d] = d;
    dist_bmm_swap_heads(r, t->g->nodes[v].a.perm);
    *out = v;
    return DIST_OK;
}

static dist_status tb_run_op(void *ctx, const dist_op *op, const dist_tensor *const *in,
                             dist_tensor *const *out) {
    xla_trace *t = ctx;
    if (dist_op_is_layer(op->code)) return dist_layer_run(&tb_layer_kernels, ctx, op, in, out);
    DIST_TRY(need_trace(t, dist_op_name(op)));
    if (!out || !tb_supports_op(ctx, op, in, out))
        return dist_error(DIST_UNSUPPORTED,
                          "%s: the tpu strategy's program does not take this op on these tensors "
                          "(op code %d, kind %d)",
                          dist_op_name(op), (int)op->code, op->k);
    int x[DIST_OP_MAX_IN], v, w;
    int nin = op->nin < DIST_OP_MAX_IN ? op->nin : DIST_OP_MAX_IN;
    if (op->code < DIST_OPC_BN_STATS || op->code > DIST_OPC_BN_GRAD_INPUT)
        for (int i = 0; i < nin; i++) DIST_TRY(read_opt(t, in[i], &x[i]));
    xshape ys = out[0] ? tensor_shape(out[0]) : (xshape){0, {0}};
    switch (op->code) {
    case DIST_OPC_UNARY:
        DIST_TRY(op_unary(t, op->k, op->f, x[0], &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_UNARY_GRAD:
        DIST_TRY(op_unary_grad(t, op->k, op->f, x[0], x[1], x[2], &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_BINARY:
        DIST_TRY(bcast_right(t, x[0], &ys, &x[0]));
        DIST_TRY(bcast_right(t, x[1], &ys, &x[1]));
        DIST_TRY(op_binary(t, op->k, x[0], x[1], &v));
        if (op->relu) DIST_TRY(relu_of(t, v, &v)); /* relu_forward's node */
        return write_opt(t, out[0], v);
    case DIST_OPC_BINARY_GRAD: {
        xshape as = shape_of(t, x[0]), bs = shape_of(t, x[1]), os = shape_of(t, x[2]);
        int a, b, dy = x[2];
        if (op->relu) { /* dy masked by the fused ReLU's output: relu_backward's node */
            int ry[2];
            DIST_TRY(reshape_to(t, x[3], &os, &ry[0]));
            ry[1] = dy;
            DIST_TRY(node_of(t, XG_RELU_GRAD, DIST_F32, &os, 2, ry, 0, &dy));
        }
        DIST_TRY(bcast_right(t, x[0], &os, &a));
        DIST_TRY(bcast_right(t, x[1], &os, &b));
        DIST_TRY(op_binary_grad(t, op->k, a, b, dy, &v, &w));
        if (op->nout > 0 && out[0]) {
            DIST_TRY(unbroadcast(t, v, &as, &v));
            DIST_TRY(write_opt(t, out[0], v));
        }
        if (op->nout > 1 && out[1]) {
            DIST_TRY(unbroadcast(t, w, &bs, &w));
            DIST_TRY(write_opt(t, out[1], w));
        }
        return DIST_OK;
    }
    case DIST_OPC_REDUCE: {
        xshape xs = shape_of(t, x[0]);
        int64_t mask = axes_mask(op->mask, xs.ndim);
        xshape ks = keepdims(&xs, mask);
        DIST_TRY(reduce_to(t, op->k == DIST_RED_MAX ? XG_REDUCE_MAX : XG_REDUCE_SUM, x[0], mask,
                           &ks, &v));
        if (op->k == DIST_RED_MEAN)
            DIST_TRY(binop_c(t, XG_DIV, v, (float)reduced_count(&xs, mask), &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_REDUCE_GRAD: {
        xshape xs = shape_of(t, x[0]);
        int64_t mask = axes_mask(op->mask, xs.ndim);
        xshape ks = keepdims(&xs, mask);
        int dy, y;
        DIST_TRY(reshape_to(t, x[2], &ks, &dy));
        if (op->k == DIST_RED_SUM) {
            DIST_TRY(bcast_right(t, dy, &xs, &v));
        } else if (op->k == DIST_RED_MEAN) {
            DIST_TRY(binop_c(t, XG_DIV, dy, (float)reduced_count(&xs, mask), &v));
            DIST_TRY(bcast_right(t, v, &xs, &v));
        } else { /* dy split evenly over the positions equal to the maximum */
            int one, zero, hit, cnt;
            DIST_TRY(reshape_to(t, x[1], &ks, &y));
            DIST_TRY(bcast_right(t, y, &xs, &y));
            DIST_TRY(splat_like(t, 1.0f, x[0], &one));
            DIST_TRY(splat_like(t, 0.0f, x[0], &zero));
            DIST_TRY(select_cmp(t, XC_EQ, x[0], y, one, zero, &hit));
            DIST_TRY(reduce_to(t, XG_REDUCE_SUM, hit, mask, &ks, &cnt));
            DIST_TRY(binop(t, XG_DIV, dy, cnt, &v));
            DIST_TRY(bcast_right(t, v, &xs, &v));
            DIST_TRY(binop(t, XG_MUL, hit, v, &v));
        }
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_TRANSPOSE:
        DIST_TRY(node_of(t, XG_TRANSPOSE, DIST_F32, &ys, 1, &x[0], 0, &v));
        for (int d = 0; d < ys.ndim; d++) t->g->nodes[v].a.perm[d] = op->v[d];
        return write_opt(t, out[0], v);
    case DIST_OPC_SLICE:
        DIST_TRY(node_of(t, XG_SLICE_ND, DIST_F32, &ys, 1, &x[0], 0, &v));
        for (int d = 0; d < ys.ndim; d++) t->g->nodes[v].a.pad.lo[d] = op->v[d];
        return write_opt(t, out[0], v);
    case DIST_OPC_PAD: {
        xshape xs = shape_of(t, x[0]);
        DIST_TRY(node_of(t, XG_PAD, DIST_F32, &ys, 1, &x[0], 0, &v));
        xg_node *p = &t->g->nodes[v];
        for (int d = 0; d < ys.ndim; d++) {
            p->a.pad.lo[d] = op->v[d];
            p->a.pad.hi[d] = ys.dims[d] - xs.dims[d] - op->v[d];
        }
        if (op->k == 1) DIST_TRY(binop(t, XG_ADD, x[1], v, &v)); /* added into in[1] */
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_CONCAT:
        DIST_TRY(node_of(t, XG_CONCAT, DIST_F32, &ys, nin, x, op->axis, &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_AVG_POOL2D: {
        xshape xs = shape_of(t, x[0]);
        int sum, cnt;
        DIST_TRY(window_sum(t, x[0], op, &ys, &sum));
        DIST_TRY(window_count(t, &xs, op, &ys, &cnt));
        DIST_TRY(binop(t, XG_DIV, sum, cnt, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_AVG_POOL2D_GRAD:
        DIST_TRY(avg_pool_grad(t, op, x[0], &ys, &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_SOFTMAX:
    case DIST_OPC_SOFTMAX_GRAD: {
        xshape xs = shape_of(t, x[0]);
        int64_t last = (int64_t)1 << (xs.ndim - 1);
        xshape ks = keepdims(&xs, last);
        int m, e, s;
        if (op->code == DIST_OPC_SOFTMAX_GRAD) { /* in: y, dy */
            if (op->k == 0) {                    /* y (dy - sum(dy y)) */
                DIST_TRY(binop(t, XG_MUL, x[1], x[0], &s));
                DIST_TRY(reduce_to(t, XG_REDUCE_SUM, s, last, &ks, &s));
                DIST_TRY(bcast_right(t, s, &xs, &s));
                DIST_TRY(binop(t, XG_SUB, x[1], s, &v));
                DIST_TRY(binop(t, XG_MUL, x[0], v, &v));
            } else { /* dy - exp(y) sum(dy) */
                DIST_TRY(reduce_to(t, XG_REDUCE_SUM, x[1], last, &ks, &s));
                DIST_TRY(bcast_right(t, s, &xs, &s));
                DIST_TRY(unary(t, XU_EXP, x[0], &e));
                DIST_TRY(binop(t, XG_MUL, e, s, &e));
                DIST_TRY(binop(t, XG_SUB, x[1], e, &v));
            }
            return write_opt(t, out[0], v);
        }
        DIST_TRY(reduce_to(t, XG_REDUCE_MAX, x[0], last, &ks, &m));
        DIST_TRY(bcast_right(t, m, &xs, &m));
        DIST_TRY(binop(t, XG_SUB, x[0], m, &m));
        DIST_TRY(unary(t, XU_EXP, m, &e));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, e, last, &ks, &s));
        if (op->k == 0) {
            DIST_TRY(bcast_right(t, s, &xs, &s));
            DIST_TRY(binop(t, XG_DIV, e, s, &v));
        } else {
            DIST_TRY(unary(t, XU_LOG, s, &s));
            DIST_TRY(bcast_right(t, s, &xs, &s));
            DIST_TRY(binop(t, XG_SUB, m, s, &v));
        }
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_SIGMOID_XENT: { /* max(x, 0) - x z + log1p(exp(-|x|)) */
        int z, m, l;
        DIST_TRY(splat_like(t, 0.0f, x[1], &z));
        DIST_TRY(select_cmp(t, XC_GE, x[1], z, x[1], z, &m));
        DIST_TRY(binop(t, XG_MUL, x[1], x[0], &v));
        DIST_TRY(binop(t, XG_SUB, m, v, &v));
        DIST_TRY(unary(t, XU_ABS, x[1], &l));
        DIST_TRY(unary(t, XU_NEG, l, &l));
        DIST_TRY(unary(t, XU_EXP, l, &l));
        DIST_TRY(unary(t, XU_LOG1P, l, &l));
        DIST_TRY(binop(t, XG_ADD, v, l, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_SIGMOID_XENT_GRAD: /* dz = dy -x, dx = dy (sigmoid(x) - z) */
        if (op->nout > 0 && out[0]) {
            DIST_TRY(unary(t, XU_NEG, x[1], &v));
            DIST_TRY(binop(t, XG_MUL, x[2], v, &v));
            DIST_TRY(write_opt(t, out[0], v));
        }
        if (op->nout > 1 && out[1]) {
            DIST_TRY(unary(t, XU_LOGISTIC, x[1], &v));
            DIST_TRY(binop(t, XG_SUB, v, x[0], &v));
            DIST_TRY(binop(t, XG_MUL, x[2], v, &v));
            DIST_TRY(write_opt(t, out[1], v));
        }
        return DIST_OK;
    case DIST_OPC_MSE: {
        xshape xs = shape_of(t, x[0]);
        int64_t k = xs.dims[xs.ndim - 1];
        xshape ks = keepdims(&xs, (int64_t)1 << (xs.ndim - 1));
        DIST_TRY(binop(t, XG_SUB, x[1], x[0], &v));
        DIST_TRY(binop(t, XG_MUL, v, v, &v));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, v, (int64_t)1 << (xs.ndim - 1), &ks, &v));
        DIST_TRY(binop_c(t, XG_DIV, v, (float)k, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_MSE_GRAD: { /* v = 2 (p - t) / k * dloss[row] */
        xshape xs = shape_of(t, x[0]);
        int64_t k = xs.dims[xs.ndim - 1];
        xshape ks = keepdims(&xs, (int64_t)1 << (xs.ndim - 1));
        int d;
        DIST_TRY(reshape_to(t, x[2], &ks, &d));
        DIST_TRY(bcast_right(t, d, &xs, &d));
        DIST_TRY(binop(t, XG_SUB, x[1], x[0], &v));
        DIST_TRY(c_binop(t, XG_MUL, 2.0f, v, &v));
        DIST_TRY(binop_c(t, XG_DIV, v, (float)k, &v));
        DIST_TRY(binop(t, XG_MUL, v, d, &v));
        if (op->nout > 1 && out[1]) DIST_TRY(write_opt(t, out[1], v));
        if (op->nout > 0 && out[0]) {
            DIST_TRY(unary(t, XU_NEG, v, &v));
            DIST_TRY(write_opt(t, out[0], v));
        }
        return DIST_OK;
    }
    case DIST_OPC_BN_STATS:
    case DIST_OPC_BN_MOMENTS:
    case DIST_OPC_BN_INFER_STATS:
    case DIST_OPC_BN_APPLY:
    case DIST_OPC_BN_GRAD_SUMS:
    case DIST_OPC_BN_GRAD_INPUT: return op_batch_norm(t, op, in, out);
    case DIST_OPC_LAYER_NORM:
    case DIST_OPC_LAYER_NORM_GRAD: return op_layer_norm(t, op, in, x, out);
    case DIST_OPC_DROPOUT_MASK:
        DIST_TRY(dropout_mask(t, op, out[0], &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_SUM_SQUARES: {
        xshape xs = shape_of(t, x[0]);
        DIST_TRY(binop(t, XG_MUL, x[0], x[0], &v));
        DIST_TRY(reduce_to(t, XG_REDUCE_SUM, v, ((int64_t)1 << xs.ndim) - 1, &ys, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_CLIP_VALUE: {
        int lo, hi;
        DIST_TRY(splat_like(t, op->f[0], x[0], &lo));
        DIST_TRY(splat_like(t, op->f[1], x[0], &hi));
        DIST_TRY(select_cmp(t, XC_LT, x[0], lo, lo, x[0], &v));
        DIST_TRY(select_cmp(t, XC_GT, v, hi, hi, v, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_CLIP_BY_NORM: { /* Keras 3's arithmetic (ops.h) */
        xshape sc = {0, {0}};
        xshape xs = shape_of(t, x[0]);
        const float c = op->f[0];
        int s, n, zero, cc, f;
        DIST_TRY(reshape_to(t, x[1], &sc, &s));
        DIST_TRY(sqrt_of(t, s, &n));
        if (op->k == 0) { /* x * c / max(norm, c), norm = s > 0 ? sqrt(s) : s */
            DIST_TRY(splat_like(t, 0.0f, s, &zero));
            DIST_TRY(select_cmp(t, XC_GT, s, zero, n, s, &n));
            DIST_TRY(splat_like(t, c, n, &cc));
            DIST_TRY(binop(t, XG_MAX, n, cc, &f)); /* stablehlo.maximum propagates NaN */
            DIST_TRY(node_of(t, XG_BCAST_DIMS, DIST_F32, &xs, 1, &f, 0, &f));
            DIST_TRY(c_binop(t, XG_MUL, c, x[0], &v));
            DIST_TRY(binop(t, XG_DIV, v, f, &v));
            return write_opt(t, out[0], v);
        }
        /* x * (c * min(1 / norm, 1 / c) + (norm - norm)) */
        int lo, hi, d;
        DIST_TRY(c_binop(t, XG_DIV, 1.0f, n, &lo));
        DIST_TRY(splat_like(t, 1.0f / c, lo, &hi));
        DIST_TRY(binop(t, XG_MIN, lo, hi, &f));
        DIST_TRY(c_binop(t, XG_MUL, c, f, &f));
        DIST_TRY(binop(t, XG_SUB, n, n, &d));
        DIST_TRY(binop(t, XG_ADD, f, d, &f));
        DIST_TRY(node_of(t, XG_BCAST_DIMS, DIST_F32, &xs, 1, &f, 0, &f));
        DIST_TRY(binop(t, XG_MUL, x[0], f, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_ALL_FINITE: { /* 1 - max(1 - is_finite(x)) > 0 ? 0 : 1 */
        xshape xs = shape_of(t, x[0]);
        int f, one, zero;
        DIST_TRY(unary(t, XU_IS_FINITE, x[0], &f));
        DIST_TRY(c_binop(t, XG_SUB, 1.0f, f, &f));
        DIST_TRY(reduce_to(t, XG_REDUCE_MAX, f, ((int64_t)1 << xs.ndim) - 1, &ys, &f));
        DIST_TRY(splat_like(t, 0.0f, f, &zero));
        DIST_TRY(splat_like(t, 1.0f, f, &one));
        /* an empty x reduces to -inf: finite */
        DIST_TRY(select_cmp(t, XC_GT, f, zero, zero, one, &v));
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_SCALE: /* the factor a runtime scalar */
        DIST_TRY(scaled(t, x[0], op->f[0], &v));
        return write_opt(t, out[0], v);
    case DIST_OPC_BATCH_MATMUL: { /* dot_general with the batch flattened to one axis */
        const dist_tensor *a = in[0], *b = in[1], *c = out[0];
        dist_bmm_geometry geo;
        DIST_TRY(dist_op_bmm_geometry(op, a, b, c, &geo));
        const int r = a->ndim, ta = op->k & DIST_BMM_TRANSPOSE_A ? 1 : 0,
                  tb = op->k & DIST_BMM_TRANSPOSE_B ? 1 : 0;
        const int64_t nb = geo.outer * geo.heads;
        /* an operand with its heads inside the matrix is read through a transpose of its axes
         * r - 3 and r - 2 (XLA folds it into the product) */
        int ab[2];
        for (int i = 0; i < 2; i++) {
            const dist_tensor *x_i = in[i];
            int v_i = x[i];
            xshape st = tensor_shape(x_i);
            if (op->k >> (2 + i) & 1) {
                dist_bmm_swap_heads(r, st.dims);
                DIST_TRY(swap_heads(t, v_i, &st, &v_i));
            }
            xshape fs = {3, {nb, st.dims[r - 2], st.dims[r - 1]}};
            DIST_TRY(reshape_to(t, v_i, &fs, &ab[i]));
        }
        xshape cs = {3, {nb, geo.m, geo.n}};
        DIST_TRY(node_of(t, XG_BATCH_MATMUL, DIST_F32, &cs, 2, ab, ta, &v));
        t->g->nodes[v].i[1] = tb;
        if (op->k & DIST_BMM_C_HEADS_INSIDE) { /* [.., H, M, N] to c's [.., M, H, N] */
            xshape ls = tensor_shape(c);
            dist_bmm_swap_heads(r, ls.dims);
            DIST_TRY(reshape_to(t, v, &ls, &v));
            DIST_TRY(swap_heads(t, v, NULL, &v));
        }
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_GATHER:
    case DIST_OPC_GATHER_GRAD: { /* stablehlo.gather, and stablehlo.scatter adding rows */
        const int fwd = op->code == DIST_OPC_GATHER;
        const dist_tensor *table = fwd ? in[0] : out[0];
        if (table->ndim < 1 || table->shape[0] < 1)
            return dist_error(DIST_INVALID_ARGUMENT, "%s: the table must be [V, D], V >= 1",
                              dist_op_name(op));
        const int64_t nv = table->shape[0], d = dist_tensor_numel(table) / nv;
        const int64_t n = dist_tensor_numel(in[fwd ? 1 : 0]);
        const dist_tensor *rows = fwd ? out[0] : in[1];
        if (dist_tensor_numel(rows) != n * d)
            return dist_error(DIST_INVALID_ARGUMENT, "%s: %s has %lld elements, %lld expected",
                              dist_op_name(op), fwd ? "the output" : "dy",
                              (long long)dist_tensor_numel(rows), (long long)(n * d));
        int idx, mask;
        DIST_TRY(row_indices(t, x[fwd ? 1 : 0], nv, d, &idx, &mask));
        if (fwd) { /* gathered rows, zeroed where the id was outside */
            xshape ts = {2, {nv, d}}, ys2 = {2, {n, d}};
            int tr[2];
            DIST_TRY(reshape_to(t, x[0], &ts, &tr[0]));
            tr[1] = idx;
            DIST_TRY(node_of(t, XG_GATHER_ROWS, DIST_F32, &ys2, 2, tr, 0, &v));
            DIST_TRY(masked(t, v, mask, &v));
        } else { /* dy's rows, zeroed where the id was outside, added at their ids */
            xshape ds = {2, {n, d}}, gs = {2, {nv, d}};
            int in2[2];
            DIST_TRY(reshape_to(t, x[1], &ds, &w));
            DIST_TRY(masked(t, w, mask, &w));
            in2[0] = idx;
            in2[1] = w;
            DIST_TRY(node_of(t, XG_SCATTER_ADD, DIST_F32, &gs, 2, in2, 0, &v));
        }
        return write_opt(t, out[0], v);
    }
    case DIST_OPC_SELECT: { /* in[0] != 0 ? in[1] : in[2], the condition broadcast */
        xshape sc = {0, {0}};
        int c, zero;
        DIST_TRY(reshape_to(t, x[0], &sc, &c));
        DIST_TRY(reshape_to(t, x[1], &ys, &v));
        DIST_TRY(reshape_to(t, x[2], &ys, &w));
        DIST_TRY(node_of(t, XG_BCAST_DIMS, DIST_F32, &ys, 1, &c, 0, &c));
        DIST_TRY(splat_like(t, 0.0f, c, &zero));
        DIST_TRY(select_cmp(t, XC_NE, c, zero, v, w, &v));
        return write_opt(t, out[0], v);
    }
    default: break; /* DIST_OPC_COUNT, and the layer ops: dispatched above */
    }
    return dist_error(DIST_UNSUPPORTED, "tpu: op code %d", (int)op->code);
}

static void tb_destroy(void *ctx) {
    xla_trace *t = ctx;
    for (int i = 0; i < t->nregions; i++) {
        release_dev(t, &t->regions[i]);
        free(t->regions[i].segs);
        free(t->regions[i].base);
    }
    free(t->regions);
    free(t->scalars);
    free(t->out_regions);
    free(t->state_regions);
    free(t);
}

static const struct dist_backend_i trace_iface = {
    .name = "xla-trace",
    .destroy = tb_destroy,
    .alloc = tb_alloc,
    .free = tb_free,
    .copy = tb_copy,
    .memset_zero = tb_memset_zero,
    .synchronize = tb_synchronize,
    .max_pool2d_workspace_bytes = tb_pool_ws,
    .all_finite = tb_all_finite,
    .supports_op = tb_supports_op,
    .run_op = tb_run_op,
};

dist_status xla_trace_backend_create(int num_devices, const xla_device_ops *ops,
                                     dist_backend **out) {
    DIST_CHECK_ARG(out && ops, "xla_trace_backend_create: NULL argument");
    DIST_CHECK_ARG(num_devices >= 1 && num_devices <= XLA_MAX_DEVICES, "tpu: %d devices (1..%d)",
                   num_devices, XLA_MAX_DEVICES);
    xla_trace *t = calloc(1, sizeof *t);
    dist_backend *be = calloc(1, sizeof *be);
    if (!t || !be) {
        free(t);
        free(be);
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory");
    }
    t->num_devices = num_devices;
    t->ops = *ops;
    be->iface = &trace_iface;
    be->ctx = t;
    be->device = (dist_device){DIST_DEVICE_CPU, 0};
    be->threads = 1;
    *out = be;
    return DIST_OK;
}

xla_trace *xla_trace_of(dist_backend *be) {
    return be && be->iface == &trace_iface ? be->ctx : NULL;
}

/* ---- trace control ------------------------------------------------------------------------ */

dist_status xla_trace_begin(xla_trace *t, xg_graph *g) {
    DIST_CHECK_ARG(!t->g, "tpu: a step is already being traced");
    xg_clear(g);
    t->g = g;
    t->nscalars = 0;
    for (int i = 0; i < t->nregions; i++) {
        xregion *r = &t->regions[i];
        r->nsegs = 0;
        r->state_node = -1;
        r->scratch = -1;
        r->is_arg = 0;
    }
    return DIST_OK;
}

dist_status xla_trace_bind_arg(xla_trace *t, const dist_tensor *x, int index) {
    DIST_CHECK_ARG(tracing(t), "tpu: bind_arg outside a trace");
    size_t bytes = dist_tensor_bytes(x);
    xregion *r = find_region(t, x->data, bytes);
    if (!r) return dist_error(DIST_INVALID_ARGUMENT, "tpu: an input outside the device memory");
    int64_t dims[XG_MAX_DIMS];
    for (int i = 0; i < x->ndim && i < XG_MAX_DIMS; i++) dims[i] = x->shape[i];
    int id;
    DIST_TRY(add_node(t, XG_ARG, x->dtype, x->ndim, dims, 0, NULL, &id));
    t->g->nodes[id].i[0] = index;
    xg_graph *g = t->g;
    if (g->num_args == g->cap_args) {
        int cap = g->cap_args ? g->cap_args * 2 : 8;
        int *a = realloc(g->args, (size_t)cap * sizeof *a);
        if (!a) return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
        g->args = a;
        g->cap_args = cap;
    }
    g->args[g->num_args++] = id;
    r->is_arg = 1;
    return region_write(r, (size_t)((char *)x->data - r->base), bytes, id, 0);
}

dist_status xla_trace_read(xla_trace *t, const dist_tensor *x, int *node) {
    DIST_CHECK_ARG(tracing(t), "tpu: read outside a trace");
    return read_tensor(t, x, node);
}

dist_status xla_trace_write_node(xla_trace *t, const dist_tensor *x, int node) {
    DIST_CHECK_ARG(tracing(t), "tpu: write outside a trace");
    return write_tensor(t, x, node);
}

dist_status xla_trace_end(xla_trace *t, int count, dist_tensor *const *step_outputs) {
    DIST_CHECK_ARG(tracing(t), "tpu: trace_end outside a trace");
    xg_graph *g = t->g;
    dist_status st = DIST_OK;
    int cap = 0;
    for (int i = 0; i < t->nregions; i++)
        if (t->regions[i].nsegs) cap++;
    cap += count;
    int64_t *outr = realloc(t->out_regions, (size_t)(cap ? cap : 1) * sizeof *outr);
    if (!outr) {
        xla_trace_abort(t);
        return dist_error(DIST_OUT_OF_MEMORY, "tpu: out of memory (trace)");
    }
    t->out_regions = outr;
    int k = 0;
    /* state the step wrote: outputs, donating the input of the same region */
    for (int i = 0; i < t->nregions && st == DIST_OK; i++) {
        xregion *r = &t->regions[i];
        if (!r->nsegs || r->is_arg || is_scratch(t, r)) continue;
        dist_dtype dt = t->g->nodes[r->segs[0].node].dtype;
        if (dt == DIST_U8) dt = DIST_F32;
        int v;
        st = region_read(t, r, 0, r->bytes, dt, &v);
        if (st) break;
        int alias = -1;
        for (int s = 0; s < g->num_states; s++)
            if (g->states[s] == r->state_node) alias = s;
        st = xg_add_output(g, v, alias);
        r->dtype = dt;
        outr[k++] = r->id;
    }
    for (int i = 0; i < count && st == DIST_OK; i++) {
        int v;
        st = read_tensor(t, step_outputs[i], &v);
        if (st) break;
        st = xg_add_output(g, v, -1);
        outr[k++] = -1;
    }
    t->g = NULL;
    return st;
}

void xla_trace_abort(xla_trace *t) { t->g = NULL; }

int xla_trace_num_scalars(const xla_trace *t) { return t->nscalars; }
const float *xla_trace_scalars(const xla_trace *t) { return t->scalars; }

int64_t xla_trace_state_region(const xla_trace *t, int node) {
    return node >= 0 && node < t->cap_state_regions ? t->state_regions[node] : -1;
}

int64_t xla_trace_output_region(const xla_trace *t, int output) { return t->out_regions[output]; }

dist_status xla_trace_region(xla_trace *t, int64_t id, xla_region_view *out) {
    xregion *r = region_by_id(t, id);
    if (!r) return dist_error(DIST_INTERNAL, "tpu: state buffer %lld is gone", (long long)id);
    out->base = r->base;
    out->bytes = r->bytes;
    out->dtype = r->dtype;
    out->device_buffers = r->dev;
    out->on_devices = r->on_devices;
    return DIST_OK;
}

void xla_trace_region_set_buffers(xla_trace *t, int64_t id, void *const *buffers, int donated) {
    xregion *r = region_by_id(t, id);
    if (!r) {
        for (int d = 0; d < t->num_devices; d++)
            if (buffers[d] && t->ops.release) t->ops.release(t->ops.user, buffers[d]);
        return;
    }
    if (donated) {
        for (int d = 0; d < t->num_devices; d++) {
            if (r->dev[d] && t->ops.release) t->ops.release(t->ops.user, r->dev[d]);
            r->dev[d] = NULL;
        }
    } else {
        release_dev(t, r);
    }
    for (int d = 0; d < t->num_devices; d++) r->dev[d] = buffers[d];
    r->on_devices = 1;
    r->host_valid = 0;
}

void xla_trace_region_uploaded(xla_trace *t, int64_t id, void *const *buffers) {
    xregion *r = region_by_id(t, id);
    if (!r) return;
    release_dev(t, r);
    for (int d = 0; d < t->num_devices; d++) r->dev[d] = buffers[d];
    r->on_devices = 1;
}
