/* The symbolic backend (trace_backend.h): regions with a host mirror, byte-range tracking of
 * traced values, and kernels that record graph nodes. */
#include "xla/trace_backend.h"

#include "core/error.h"

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
    .conv2d_forward = tb_conv2d_forward,
    .conv2d_backward_data = tb_conv2d_backward_data,
    .conv2d_backward_filter = tb_conv2d_backward_filter,
    .pool_backward_masks_relu = 0,
    .max_pool2d_workspace_bytes = tb_pool_ws,
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
    .all_finite = tb_all_finite,
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
