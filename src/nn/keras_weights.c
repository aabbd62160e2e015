/* Keras 3's .weights.h5 files (model.save_weights / load_weights), read and written with libhdf5.
 *
 * The layout Keras 3.15 writes (h5dump of the seed CNN's file): a group per layer,
 * "layers/<key>/vars", whose datasets "0", "1", ... are the layer's variables in order (kernel,
 * then bias) and whose string attribute "name" is the layer's name; "/vars" carries the model's
 * name. <key> is not the layer's name: it is the layer's class in snake case, numbered per class
 * in layer order (conv2d, conv2d_1, max_pooling2d, ...), which is how libdist names layers by
 * default, so a model built from JSON with other names still finds its variables. */
#include "core/error.h"
#include "dist/file.h"
#include "nn/keras_impl.h"
#include "nn/model_impl.h"

#include <errno.h>
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* HDF5 prints its error stack to stderr unless told not to, and the library never prints
 * unasked. The handler is process-wide (HDF5's own state): for the call it is replaced by one
 * that keeps the first failure's innermost message (HDF5 clears its stack at the next API call,
 * a cleanup's close included, so the message is taken when the failure happens), and put back
 * after it. */
typedef struct h5_quiet {
    H5E_auto2_t func;
    void *data;
    char msg[256]; /* the first failure's message since the last h5_error ("" = none) */
} h5_quiet;

/* The deepest description on the stack: the one that says what was wrong. */
static herr_t h5_innermost(unsigned n, const H5E_error2_t *e, void *user) {
    (void)n;
    if (e->desc && e->desc[0]) snprintf(user, 256, "%s", e->desc);
    return 0;
}

static herr_t h5_keep_message(hid_t stack, void *user) {
    h5_quiet *q = user;
    if (!q->msg[0]) H5Ewalk2(stack, H5E_WALK_DOWNWARD, h5_innermost, q->msg);
    return 0;
}

static void h5_quiet_begin(h5_quiet *q) {
    H5Eget_auto2(H5E_DEFAULT, &q->func, &q->data);
    q->msg[0] = '\0';
    H5Eset_auto2(H5E_DEFAULT, h5_keep_message, q);
}

static void h5_quiet_end(const h5_quiet *q) { H5Eset_auto2(H5E_DEFAULT, q->func, q->data); }

/* status with "<what>: <HDF5's message>" for the failure HDF5 reported since the last one. */
static dist_status h5_error(h5_quiet *q, dist_status status, const char *what) {
    dist_status st = dist_error(status, "%s%s%s", what, q->msg[0] ? ": " : "", q->msg);
    q->msg[0] = '\0';
    return st;
}

/* Forgets a failure that was expected (a probe with H5Lexists). */
static void h5_forget(h5_quiet *q) { q->msg[0] = '\0'; }

/* Keras's class names in snake case (the file's group names), per layer kind. */

/* The group key of layer i: its class, numbered among the layers of that class before it. */
static void keras_key(const dist_model *m, int i, char *buf, size_t size) {
    int count = 0;
    for (int j = 0; j < i; j++) count += m->layers[j].kind == m->layers[i].kind;
    if (count == 0)
        snprintf(buf, size, "%s", model_layer_key(m->layers[i].kind));
    else
        snprintf(buf, size, "%s_%d", model_layer_key(m->layers[i].kind), count);
}

/* The variables of layer l, in Keras's order (kernel, then bias; SeparableConv2D's
 * depthwise_kernel, pointwise_kernel, bias; BatchNormalization's gamma, beta, moving_mean,
 * moving_variance); returns how many. */
static int layer_vars(const model_layer *l, int vars[4]) {
    int n = 0;
    if (l->kernel_var >= 0) vars[n++] = l->kernel_var;
    if (l->pointwise_var >= 0) vars[n++] = l->pointwise_var; /* SeparableConv2D's, before bias */
    if (l->bias_var >= 0) vars[n++] = l->bias_var;
    if (l->moving_mean_var >= 0) vars[n++] = l->moving_mean_var;
    if (l->moving_variance_var >= 0) vars[n++] = l->moving_variance_var;
    return n;
}

/* The groups of layer l's variables under layers/<key>: one ("": <key>/vars) for every kind
 * but MultiHeadAttention, whose four EinsumDense sublayers each hold kernel and bias in
 * <key>/<sub>/vars, and the recurrent layers, whose cell holds theirs (<key>/cell/vars).
 * Returns the group count. */
typedef struct var_group {
    const char *sub; /* "" for the layer's own vars; may hold one '/' (outer/inner) */
    int n, vars[4];
} var_group;

static int layer_groups(const model_layer *l, var_group g[4]) {
    if (l->kind == LAYER_BIDIRECTIONAL) { /* <key>/{forward,backward}_layer/cell/vars */
        g[0].sub = "forward_layer/cell";
        g[0].n = layer_vars(l, g[0].vars);
        g[1].sub = "backward_layer/cell";
        g[1].n = 0;
        for (int k = 0; k < 3; k++)
            if (l->back_vars[k] >= 0) g[1].vars[g[1].n++] = l->back_vars[k];
        return 2;
    }
    if (l->kind == LAYER_SIMPLE_RNN || l->kind == LAYER_LSTM || l->kind == LAYER_GRU) {
        g[0].sub = "cell"; /* <key>/cell/vars: kernel, recurrent_kernel, bias */
        g[0].n = layer_vars(l, g[0].vars);
        return 1;
    }
    if (l->kind != LAYER_MHA) {
        g[0].sub = "";
        g[0].n = layer_vars(l, g[0].vars);
        return 1;
    }
    static const char *const subs[4] = {"query_dense", "key_dense", "value_dense", "output_dense"};
    for (int p = 0; p < 4; p++) {
        g[p].sub = subs[p];
        g[p].n = 0;
        for (int k = 0; k < 2; k++)
            if (l->mha_vars[2 * p + k] >= 0) g[p].vars[g[p].n++] = l->mha_vars[2 * p + k];
    }
    return 4;
}

static void group_key(const char *key, const var_group *g, char *buf, size_t size) {
    snprintf(buf, size, "%s%s%s", key, g->sub[0] ? "/" : "", g->sub);
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, size - at, "(");
    for (int d = 0; d < ndim && at < size; d++)
        at += (size_t)snprintf(buf + at, size - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < size) snprintf(buf + at, size - at, "%s)", ndim == 1 ? "," : "");
}

/* ---- writing ------------------------------------------------------------------------------ */

/* A scalar variable-length UTF-8 string attribute, as h5py writes Keras's "name". */
static int write_name_attr(hid_t obj, const char *value) {
    hid_t type = H5Tcopy(H5T_C_S1), space = H5Screate(H5S_SCALAR), attr = H5I_INVALID_HID;
    int ok = type >= 0 && space >= 0 && H5Tset_size(type, H5T_VARIABLE) >= 0 &&
             H5Tset_cset(type, H5T_CSET_UTF8) >= 0 &&
             (attr = H5Acreate2(obj, "name", type, space, H5P_DEFAULT, H5P_DEFAULT)) >= 0 &&
             H5Awrite(attr, type, &value) >= 0;
    if (attr >= 0) H5Aclose(attr);
    if (space >= 0) H5Sclose(space);
    if (type >= 0) H5Tclose(type);
    return ok;
}

/* "<parent>/vars" with its name attribute; the group is returned open (or < 0). */
static hid_t create_vars_group(hid_t parent, const char *name) {
    hid_t g = H5Gcreate2(parent, "vars", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return g;
    if (!write_name_attr(g, name)) {
        H5Gclose(g);
        return H5I_INVALID_HID;
    }
    return g;
}

static int write_dataset(hid_t group, const char *name, const model_var *v, const float *data) {
    hsize_t dims[4];
    for (int d = 0; d < v->ndim; d++) dims[d] = (hsize_t)v->shape[d];
    hid_t space = H5Screate_simple(v->ndim, dims, NULL), ds = H5I_INVALID_HID;
    int ok = space >= 0 &&
             (ds = H5Dcreate2(group, name, H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT,
                              H5P_DEFAULT)) >= 0 &&
             H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data) >= 0;
    if (ds >= 0) H5Dclose(ds);
    if (space >= 0) H5Sclose(space);
    return ok;
}

/* The whole file, built in memory (HDF5's core driver without a backing store). */
static dist_status build_image(h5_quiet *q, const dist_model *m, const float *params, void **image,
                               size_t *size) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS), file = H5I_INVALID_HID, layers = H5I_INVALID_HID;
    dist_status st = DIST_OK;
    if (fapl < 0 || H5Pset_fapl_core(fapl, 1 << 20, 0) < 0) {
        st = h5_error(q, DIST_INTERNAL, "HDF5: setting up an in-memory file");
        goto out;
    }
    file = H5Fcreate("libdist-keras-weights", H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    if (file < 0) {
        st = h5_error(q, DIST_IO, "HDF5: creating the file in memory");
        goto out;
    }
    layers = H5Gcreate2(file, "layers", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (layers < 0) {
        st = h5_error(q, DIST_IO, "HDF5: creating group 'layers'");
        goto out;
    }
    for (int i = 0; i < m->nlayers && st == DIST_OK; i++) {
        const model_layer *l = &m->layers[i];
        char key[64];
        keras_key(m, i, key, sizeof key);
        hid_t lg = H5Gcreate2(layers, key, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        var_group groups[4];
        int ng = layer_groups(l, groups), ok = lg >= 0;
        /* MultiHeadAttention: its own (empty) vars, then a group per sublayer */
        if (ok && groups[0].sub[0]) {
            hid_t own = create_vars_group(lg, l->name);
            ok = own >= 0;
            if (own >= 0) H5Gclose(own);
        }
        for (int gi = 0; gi < ng && ok; gi++) {
            const var_group *g = &groups[gi];
            /* a sublayer of a sublayer (Bidirectional's forward_layer/cell): the outer one
             * first, with its own (empty) vars, as Keras writes it */
            const char *slash = strchr(g->sub, '/');
            if (slash) {
                char outer[64];
                snprintf(outer, sizeof outer, "%.*s", (int)(slash - g->sub), g->sub);
                hid_t og = H5Gcreate2(lg, outer, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
                hid_t own = og >= 0 ? create_vars_group(og, outer) : H5I_INVALID_HID;
                ok = own >= 0;
                if (own >= 0) H5Gclose(own);
                if (og >= 0) H5Gclose(og);
                if (!ok) break;
            }
            hid_t sg =
                g->sub[0] ? H5Gcreate2(lg, g->sub, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT) : lg;
            hid_t vg = sg >= 0 ? create_vars_group(sg, !g->sub[0] ? l->name
                                                       : slash    ? slash + 1
                                                                  : g->sub)
                               : H5I_INVALID_HID;
            ok = vg >= 0;
            for (int k = 0; k < g->n && ok; k++) {
                char ds[16];
                snprintf(ds, sizeof ds, "%d", k);
                ok = write_dataset(vg, ds, &m->vars[g->vars[k]],
                                   params + m->vars[g->vars[k]].offset);
            }
            if (vg >= 0) H5Gclose(vg);
            if (g->sub[0] && sg >= 0) H5Gclose(sg);
        }
        if (!ok) {
            char what[128];
            snprintf(what, sizeof what, "HDF5: writing layer '%s' (layers/%s/vars)", l->name, key);
            st = h5_error(q, DIST_IO, what);
        }
        if (lg >= 0) H5Gclose(lg);
    }
    if (st == DIST_OK) {
        hid_t root = create_vars_group(file, m->name);
        if (root < 0) st = h5_error(q, DIST_IO, "HDF5: writing group 'vars'");
        if (root >= 0) H5Gclose(root);
    }
    if (st == DIST_OK && H5Fflush(file, H5F_SCOPE_GLOBAL) < 0)
        st = h5_error(q, DIST_IO, "HDF5: flushing the file");
    if (st == DIST_OK) {
        ssize_t n = H5Fget_file_image(file, NULL, 0);
        void *buf = n > 0 ? malloc((size_t)n) : NULL;
        if (n <= 0) {
            st = h5_error(q, DIST_IO, "HDF5: reading the file image");
        } else if (!buf) {
            st = dist_error(DIST_OUT_OF_MEMORY, "out of memory for a %lld-byte file", (long long)n);
        } else if (H5Fget_file_image(file, buf, (size_t)n) != n) {
            free(buf);
            st = h5_error(q, DIST_IO, "HDF5: reading the file image");
        } else {
            *image = buf;
            *size = (size_t)n;
        }
    }
out:
    if (layers >= 0) H5Gclose(layers);
    if (file >= 0) H5Fclose(file);
    if (fapl >= 0) H5Pclose(fapl);
    return st;
}

dist_status keras_weights_image(dist_model *m, void **image, size_t *size) {
    DIST_CHECK_ARG(m->built, "model '%s' is not built", m->name);
    float *params = malloc((size_t)m->nparams * sizeof *params);
    if (!params) return dist_error(DIST_OUT_OF_MEMORY, "model '%s': out of memory", m->name);
    dist_status st = dist_model_get_weights(m, 0, params, m->nparams);
    if (st == DIST_OK) {
        h5_quiet q;
        h5_quiet_begin(&q);
        st = build_image(&q, m, params, image, size);
        h5_quiet_end(&q);
    }
    free(params);
    return st;
}

dist_status dist_model_save_keras_weights(dist_model *m, const char *path) {
    DIST_CHECK_ARG(m && path, "dist_model_save_keras_weights: NULL argument");
    void *image = NULL;
    size_t size = 0;
    dist_status st = keras_weights_image(m, &image, &size);
    if (st == DIST_OK) st = dist_file_write_atomic(path, image, size);
    free(image);
    if (st != DIST_OK) return dist_error_context(st, "saving Keras weights to '%s'", path);
    return DIST_OK;
}

/* ---- reading ------------------------------------------------------------------------------ */

/* Reads dataset `name` of group `vg` into dst after checking that it is a float array of v's
 * shape. */
static dist_status read_variable(h5_quiet *q, hid_t vg, const char *name, const model_layer *l,
                                 const char *key, const model_var *v, float *dst) {
    dist_status st = DIST_OK;
    hid_t ds = H5Dopen2(vg, name, H5P_DEFAULT), space = H5I_INVALID_HID, type = H5I_INVALID_HID;
    char what[256];
    snprintf(what, sizeof what, "layer '%s' (layers/%s/vars/%s, '%s')", l->name, key, name,
             v->name);
    if (ds < 0) return h5_error(q, DIST_FORMAT, what);
    space = H5Dget_space(ds);
    type = H5Dget_type(ds);
    if (space < 0 || type < 0) {
        st = h5_error(q, DIST_FORMAT, what);
        goto out;
    }
    if (H5Tget_class(type) != H5T_FLOAT) {
        st = dist_error(DIST_FORMAT, "%s: the file holds a non-float dataset", what);
        goto out;
    }
    int nd = H5Sget_simple_extent_ndims(space);
    hsize_t dims[8] = {0};
    if (nd < 0 || nd > 8 || H5Sget_simple_extent_dims(space, dims, NULL) < 0) {
        st = nd > 8 ? dist_error(DIST_FORMAT, "%s: the file's dataset has %d dimensions", what, nd)
                    : h5_error(q, DIST_FORMAT, what);
        goto out;
    }
    int same = nd == v->ndim;
    for (int d = 0; d < nd && same; d++) same = (int64_t)dims[d] == v->shape[d];
    if (!same) {
        int64_t fs[8];
        for (int d = 0; d < nd; d++) fs[d] = (int64_t)dims[d];
        char a[96], b[96];
        shape_str(nd, fs, a, sizeof a);
        shape_str(v->ndim, v->shape, b, sizeof b);
        st = dist_error(DIST_FORMAT, "%s: the file has shape %s, the model %s", what, a, b);
        goto out;
    }
    if (H5Dread(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, dst) < 0) {
        snprintf(what + strlen(what), sizeof what - strlen(what), ": reading the values");
        st = h5_error(q, DIST_FORMAT, what);
    }
out:
    if (type >= 0) H5Tclose(type);
    if (space >= 0) H5Sclose(space);
    H5Dclose(ds);
    return st;
}

/* 1 when group `path` under loc, or a group below it (`depth` levels), holds variables (a
 * non-empty vars group): a recurrent layer's cell/vars, a Bidirectional's
 * forward_layer/cell/vars, MultiHeadAttention's query_dense/vars. */
static int holds_vars(h5_quiet *q, hid_t loc, const char *path, int depth) {
    char vars[160];
    snprintf(vars, sizeof vars, "%s/vars", path);
    H5G_info_t vi;
    if (H5Lexists(loc, vars, H5P_DEFAULT) > 0 &&
        H5Gget_info_by_name(loc, vars, &vi, H5P_DEFAULT) >= 0 && vi.nlinks > 0)
        return 1;
    h5_forget(q);
    if (depth == 0) return 0;
    hid_t g = H5Gopen2(loc, path, H5P_DEFAULT);
    if (g < 0) { /* a dataset, not a group */
        h5_forget(q);
        return 0;
    }
    H5G_info_t gi;
    int found = 0;
    if (H5Gget_info(g, &gi) >= 0)
        for (hsize_t i = 0; i < gi.nlinks && !found; i++) {
            char key[64];
            if (H5Lget_name_by_idx(g, ".", H5_INDEX_NAME, H5_ITER_INC, i, key, sizeof key,
                                   H5P_DEFAULT) < 0)
                break;
            if (strcmp(key, "vars") != 0) found = holds_vars(q, g, key, depth - 1);
        }
    h5_forget(q);
    H5Gclose(g);
    return found;
}

/* Every layer of the file that holds variables (in its vars group or in groups below it) must
 * be one of the model's: *found receives the first other group key (1), or nothing (0); -1 on
 * an HDF5 error. */
static int find_extra_layer(h5_quiet *q, const dist_model *m, hid_t layers, char *found,
                            size_t size) {
    H5G_info_t gi;
    if (H5Gget_info(layers, &gi) < 0) return -1;
    for (hsize_t i = 0; i < gi.nlinks; i++) {
        char key[64];
        ssize_t n = H5Lget_name_by_idx(layers, ".", H5_INDEX_NAME, H5_ITER_INC, i, key, sizeof key,
                                       H5P_DEFAULT);
        if (n < 0) return -1;
        if (!holds_vars(q, layers, key, 3)) continue;
        int mine = 0;
        for (int l = 0; l < m->nlayers && !mine; l++) {
            char k[64];
            keras_key(m, l, k, sizeof k);
            mine = strcmp(k, key) == 0;
        }
        if (!mine) {
            snprintf(found, size, "%s", key);
            return 1;
        }
    }
    return 0;
}

static dist_status read_file(h5_quiet *q, const dist_model *m, hid_t file, float *params) {
    hid_t layers = H5Gopen2(file, "layers", H5P_DEFAULT);
    if (layers < 0)
        return h5_error(q, DIST_FORMAT, "no group 'layers' (not a Keras 3 weights file?)");
    dist_status st = DIST_OK;
    for (int i = 0; i < m->nlayers && st == DIST_OK; i++) {
        const model_layer *l = &m->layers[i];
        var_group groups[4];
        int ng = layer_groups(l, groups);
        char lkey[64];
        keras_key(m, i, lkey, sizeof lkey);
        for (int g = 0; g < ng && st == DIST_OK; g++) {
            const int *vars = groups[g].vars, n = groups[g].n;
            if (n == 0) continue;
            char key[128], path[160];
            group_key(lkey, &groups[g], key, sizeof key);
            snprintf(path, sizeof path, "%s/vars", key);
            if (H5Lexists(layers, lkey, H5P_DEFAULT) <= 0 ||
                H5Lexists(layers, key, H5P_DEFAULT) <= 0 ||
                H5Lexists(layers, path, H5P_DEFAULT) <= 0) {
                h5_forget(q);
                st = dist_error(DIST_FORMAT, "layer '%s': the file has no group layers/%s/vars",
                                l->name, key);
                break;
            }
            hid_t vg = H5Gopen2(layers, path, H5P_DEFAULT);
            H5G_info_t gi;
            if (vg < 0 || H5Gget_info(vg, &gi) < 0) {
                char what[160];
                snprintf(what, sizeof what, "layer '%s' (layers/%s/vars)", l->name, key);
                st = h5_error(q, DIST_FORMAT, what);
            } else if (gi.nlinks != (hsize_t)n) {
                st = dist_error(
                    DIST_FORMAT,
                    "layer '%s' (layers/%s/vars): the file has %llu variables, the model "
                    "%d",
                    l->name, key, (unsigned long long)gi.nlinks, n);
            }
            for (int k = 0; k < n && st == DIST_OK; k++) {
                char ds[16];
                snprintf(ds, sizeof ds, "%d", k);
                const model_var *v = &m->vars[vars[k]];
                st = read_variable(q, vg, ds, l, key, v, params + v->offset);
            }
            if (vg >= 0) H5Gclose(vg);
        }
    }
    if (st == DIST_OK) {
        char extra[64] = "";
        int r = find_extra_layer(q, m, layers, extra, sizeof extra);
        if (r < 0)
            st = h5_error(q, DIST_FORMAT, "listing the file's layers");
        else if (r > 0)
            st = dist_error(DIST_FORMAT,
                            "the file has variables for layer group layers/%s, which model '%s' "
                            "does not have",
                            extra, m->name);
    }
    H5Gclose(layers);
    return st;
}

/* Read-only, with every object of the file closed when the file is (HDF5's "strong" close): a
 * damaged file that fails half way leaves nothing open behind it. */
static hid_t open_read_only(const char *path) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    if (fapl < 0) return fapl;
    hid_t file = H5I_INVALID_HID;
    if (H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG) >= 0)
        file = H5Fopen(path, H5F_ACC_RDONLY, fapl);
    H5Pclose(fapl);
    return file;
}

dist_status dist_model_load_keras_weights(dist_model *m, const char *path) {
    DIST_CHECK_ARG(m && path, "dist_model_load_keras_weights: NULL argument");
    DIST_CHECK_ARG(m->built, "model '%s' is not built", m->name);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        int e = errno;
        return dist_error_errno(e == ENOENT ? DIST_NOT_FOUND : DIST_IO, e,
                                "loading Keras weights: cannot open '%s'", path);
    }
    int empty = fgetc(probe) == EOF;
    fclose(probe);
    /* HDF5 would call an empty file one it "cannot open" */
    if (empty)
        return dist_error(DIST_FORMAT, "'%s' is empty (0 bytes): not an HDF5 Keras weights file",
                          path);
    float *params = calloc((size_t)m->nparams, sizeof *params);
    if (!params) return dist_error(DIST_OUT_OF_MEMORY, "model '%s': out of memory", m->name);
    h5_quiet q;
    h5_quiet_begin(&q);
    dist_status st = DIST_OK;
    hid_t file = H5I_INVALID_HID;
    htri_t is_h5 = H5Fis_hdf5(path);
    if (is_h5 == 0) {
        h5_forget(&q);
        st = dist_error(DIST_FORMAT, "not an HDF5 file (no HDF5 signature)");
    } else if (is_h5 < 0 || (file = open_read_only(path)) < 0) {
        st = h5_error(&q, DIST_FORMAT, "HDF5 cannot open it");
    } else {
        st = read_file(&q, m, file, params);
    }
    if (file >= 0 && H5Fclose(file) < 0 && st == DIST_OK) st = h5_error(&q, DIST_FORMAT, "closing");
    h5_quiet_end(&q);
    /* Everything was read and checked: only now does the model change. */
    if (st == DIST_OK) st = dist_model_set_weights(m, params, m->nparams);
    free(params);
    if (st != DIST_OK) return dist_error_context(st, "loading Keras weights from '%s'", path);
    return DIST_OK;
}
