/* Sources over in-memory arrays: tensor slices, and IDX files read whole into slices. */
#include "core/error.h"
#include "data/dataset.h"
#include "dist/idx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shape_text(const dist_tensor *t, char *buf, size_t size) {
    dist_shape_str(t, buf, size);
}

dist_status dist_dataset_from_tensor_slices(dist_tensor *const *tensors, int count, int copy,
                                            dist_dataset **out) {
    DIST_CHECK_ARG(out != NULL && tensors != NULL, "from_tensor_slices: NULL argument");
    DIST_CHECK_ARG(count >= 1 && count <= DIST_ELEMENT_MAX,
                   "from_tensor_slices: count %d is outside 1..%d", count, DIST_ELEMENT_MAX);
    int64_t n = -1;
    char label[256];
    size_t len = (size_t)snprintf(label, sizeof label, "slices(");
    for (int i = 0; i < count; i++) {
        const dist_tensor *t = tensors[i];
        DIST_CHECK_ARG(t != NULL, "from_tensor_slices: tensor %d is NULL", i);
        DIST_CHECK_ARG(t->device.kind == DIST_DEVICE_CPU && t->layout == DIST_LAYOUT_PLAIN,
                       "from_tensor_slices: tensor %d is not a plain host tensor", i);
        DIST_CHECK_ARG(t->ndim >= 1, "from_tensor_slices: tensor %d is a scalar (rank 0)", i);
        DIST_CHECK_ARG(n < 0 || t->shape[0] == n,
                       "from_tensor_slices: tensor %d has %lld rows but tensor 0 has %lld", i,
                       (long long)t->shape[0], (long long)n);
        n = t->shape[0];
        char sh[96];
        shape_text(t, sh, sizeof sh);
        if (len < sizeof label)
            len += (size_t)snprintf(label + len, sizeof label - len, "%s%s%s", i ? "," : "",
                                    dist_dtype_name(t->dtype), sh);
    }
    if (len < sizeof label) snprintf(label + len, sizeof label - len, ")");

    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_SLICES, NULL, &ds, "%s", label));
    dist_status st = DIST_OK;
    ds->u.slices.count = count;
    ds->u.slices.n = n;
    ds->cardinality = n;
    ds->spec.count = count;
    for (int i = 0; i < count; i++) {
        const dist_tensor *t = tensors[i];
        ds->u.slices.t[i] = dist_tensor_view(t->data, t->dtype, t->ndim, t->shape);
        if (copy) {
            size_t bytes = dist_tensor_bytes(t);
            void *p = malloc(bytes ? bytes : 1);
            if (!p) {
                st = dist_error(DIST_OUT_OF_MEMORY, "from_tensor_slices: cannot copy %zu bytes",
                                bytes);
                goto fail;
            }
            if (bytes) memcpy(p, t->data, bytes);
            ds->u.slices.owned[i] = p;
            ds->u.slices.t[i].data = p;
        }
        ds->spec.dtype[i] = t->dtype;
        ds->spec.ndim[i] = t->ndim - 1;
        for (int d = 1; d < t->ndim; d++) ds->spec.shape[i][d - 1] = t->shape[d];
    }
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

/* Takes ownership of the tensors' data buffers into a copy-mode slices node. */
static dist_status slices_adopt(dist_tensor **tensors, int count, const char *label,
                                dist_dataset **out) {
    dist_dataset *ds = NULL;
    DIST_TRY(dist_dataset_from_tensor_slices(tensors, count, 0, &ds));
    for (int i = 0; i < count; i++) {
        ds->u.slices.owned[i] = tensors[i]->data;
        tensors[i]->owns = 0;
    }
    /* The description names the files, not the shapes: a restored iterator must not accept a
     * pipeline over other files. */
    free(ds->label);
    free(ds->desc);
    ds->desc = NULL;
    ds->label = strdup(label);
    dist_status st =
        ds->label ? node_finish(ds) : dist_error(DIST_OUT_OF_MEMORY, "idx: out of memory");
    if (st != DIST_OK) {
        dist_dataset_destroy(ds);
        return st;
    }
    *out = ds;
    return DIST_OK;
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

dist_status dist_dataset_from_idx(const char *images_path, const char *labels_path,
                                  dist_dataset **out) {
    DIST_CHECK_ARG(images_path && out, "from_idx: NULL argument");
    dist_tensor *t[2] = {NULL, NULL};
    dist_status st = DIST_OK;
    DIST_TRY_GOTO(dist_idx_read(images_path, &t[0]), st, done);
    if (labels_path) {
        DIST_TRY_GOTO(dist_idx_read(labels_path, &t[1]), st, done);
        if (t[0]->ndim < 1 || t[1]->ndim < 1 || t[0]->shape[0] != t[1]->shape[0]) {
            st = dist_error(DIST_FORMAT, "from_idx: '%s' has %lld examples but '%s' has %lld",
                            images_path, (long long)(t[0]->ndim ? t[0]->shape[0] : 0), labels_path,
                            (long long)(t[1]->ndim ? t[1]->shape[0] : 0));
            goto done;
        }
    }
    if (t[0]->ndim < 1) {
        st = dist_error(DIST_FORMAT, "from_idx: '%s' is a scalar, not a list of examples",
                        images_path);
        goto done;
    }
    char label[600];
    snprintf(label, sizeof label, "idx(%s%s%s)", base_name(images_path), labels_path ? "," : "",
             labels_path ? base_name(labels_path) : "");
    DIST_TRY_GOTO(slices_adopt(t, labels_path ? 2 : 1, label, out), st, done);
done:
    dist_tensor_destroy(t[0]);
    dist_tensor_destroy(t[1]);
    return st;
}

/* ---- iterator: zero-copy views into the arrays ---------------------------------------------- */

typedef struct slices_it {
    node_it base;
    int64_t next;
    dist_tensor view[DIST_ELEMENT_MAX];
    size_t row_bytes[DIST_ELEMENT_MAX];
} slices_it;

static dist_status slices_next(node_it *base, dist_element *out, int *eos) {
    slices_it *it = (slices_it *)base;
    const dist_dataset *ds = base->ds;
    if (it->next >= ds->u.slices.n) {
        *eos = 1;
        out->count = 0;
        return DIST_OK;
    }
    out->count = ds->u.slices.count;
    for (int i = 0; i < out->count; i++) {
        it->view[i].data = (char *)ds->u.slices.t[i].data + (size_t)it->next * it->row_bytes[i];
        out->items[i] = &it->view[i];
    }
    it->next++;
    *eos = 0;
    return DIST_OK;
}

static void slices_destroy(node_it *base) { free(base); }

static const node_it_vt slices_vt = {slices_next, slices_destroy, NULL};

dist_status slices_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    slices_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "slices: out of memory");
    it->base = (node_it){&slices_vt, ds, ctx, gen, 0};
    it->base.stable = 1; /* views into the node's arrays, which the dataset owns or borrows */
    for (int i = 0; i < ds->u.slices.count; i++) {
        const dist_tensor *t = &ds->u.slices.t[i];
        it->view[i] = dist_tensor_view(NULL, t->dtype, t->ndim - 1, t->shape + 1);
        it->row_bytes[i] = dist_tensor_bytes(&it->view[i]);
    }
    *out = &it->base;
    return DIST_OK;
}
