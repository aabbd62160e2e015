/* Dataset nodes: reference counting, descriptions, introspection, cloning. */
#include "data/dataset.h"

#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

file_table *file_table_retain(file_table *t) {
    if (t) atomic_fetch_add(&t->refs, 1);
    return t;
}

void file_table_release(file_table *t) {
    if (!t || atomic_fetch_sub(&t->refs, 1) != 1) return;
    for (int i = 0; i < t->count; i++) free(t->paths[i]);
    for (int i = 0; i < t->num_classes; i++) free(t->class_names[i]);
    free(t->paths);
    free(t->labels);
    free(t->class_names);
    free(t);
}

dist_status node_new(node_kind kind, dist_dataset *input, dist_dataset **out, const char *fmt,
                     ...) {
    DIST_CHECK_ARG(out != NULL, "dataset: out is NULL");
    dist_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return dist_error(DIST_OUT_OF_MEMORY, "dataset: out of memory");
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    ds->label = strdup(buf);
    if (!ds->label) {
        free(ds);
        return dist_error(DIST_OUT_OF_MEMORY, "dataset: out of memory");
    }
    atomic_init(&ds->refs, 1);
    ds->kind = kind;
    ds->input = input ? dist_dataset_retain(input) : NULL;
    if (input) {
        ds->spec = input->spec;
        ds->cardinality = input->cardinality;
    }
    *out = ds;
    return DIST_OK;
}

dist_status node_finish(dist_dataset *ds) {
    const char *below = ds->input ? ds->input->desc : NULL;
    size_t n = strlen(ds->label) + (below ? strlen(below) + 4 : 0) + 1;
    ds->desc = malloc(n);
    if (!ds->desc) return dist_error(DIST_OUT_OF_MEMORY, "dataset: out of memory");
    if (below)
        snprintf(ds->desc, n, "%s <- %s", ds->label, below);
    else
        snprintf(ds->desc, n, "%s", ds->label);
    return DIST_OK;
}

dist_dataset *dist_dataset_retain(dist_dataset *ds) {
    if (ds) atomic_fetch_add(&ds->refs, 1);
    return ds;
}

void dist_dataset_destroy(dist_dataset *ds) {
    while (ds) {
        if (atomic_fetch_sub(&ds->refs, 1) != 1) return;
        dist_dataset *input = ds->input;
        switch (ds->kind) {
        case NODE_SLICES:
            for (int i = 0; i < ds->u.slices.count; i++) free(ds->u.slices.owned[i]);
            break;
        case NODE_FILES:
            file_table_release(ds->u.files.table);
            free(ds->u.files.indices);
            break;
        case NODE_INTERLEAVE:
            for (int i = 0; i < ds->u.interleave.count; i++) free(ds->u.interleave.paths[i]);
            free(ds->u.interleave.paths);
            if (ds->u.interleave.owned.release)
                ds->u.interleave.owned.release(ds->u.interleave.owned.ctx);
            break;
        case NODE_MAP:
            file_table_release(ds->u.map.table);
            if (ds->u.map.owned.release) ds->u.map.owned.release(ds->u.map.owned.ctx);
            break;
        case NODE_CACHE:
            free(ds->u.cache.filename);
            cache_store_free(ds->u.cache.store);
            break;
        case NODE_EXT: ds->u.ext.iface->release(ds->u.ext.ctx); break;
        default: break;
        }
        free(ds->label);
        free(ds->desc);
        free(ds);
        ds = input; /* drop the reference this node held, iteratively */
    }
}

int64_t dist_dataset_cardinality(const dist_dataset *ds) {
    return ds ? ds->cardinality : DIST_CARDINALITY_UNKNOWN;
}

const dist_element_spec *dist_dataset_element_spec(const dist_dataset *ds) {
    return ds ? &ds->spec : NULL;
}

const char *dist_dataset_describe(const dist_dataset *ds) { return ds && ds->desc ? ds->desc : ""; }

static const file_table *find_table(const dist_dataset *ds) {
    for (; ds; ds = ds->input)
        if (ds->kind == NODE_FILES) return ds->u.files.table;
    return NULL;
}

int dist_dataset_class_count(const dist_dataset *ds) {
    const file_table *t = find_table(ds);
    return t ? t->num_classes : 0;
}

const char *dist_dataset_class_name(const dist_dataset *ds, int index) {
    const file_table *t = find_table(ds);
    if (!t || index < 0 || index >= t->num_classes) return NULL;
    return t->class_names[index];
}

dist_status node_clone_over(const dist_dataset *node, dist_dataset *new_input, dist_dataset **out) {
    DIST_CHECK_ARG(node->input != NULL, "dataset: cannot clone a source over an input");
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(node->kind, new_input, &ds, "%s", node->label));
    ds->spec = node->spec;
    ds->u = node->u;
    /* Cardinality of a rewritten chain: recompute the simple cases, else unknown. */
    int64_t n = new_input->cardinality;
    switch (node->kind) {
    case NODE_MAP:
        file_table_retain(ds->u.map.table);
        if (ds->u.map.owned.retain) ds->u.map.owned.retain(ds->u.map.owned.ctx);
        ds->cardinality = node->u.map.skip_errors ? DIST_CARDINALITY_UNKNOWN : n;
        break;
    case NODE_CACHE:
        ds->u.cache.filename = node->u.cache.filename ? strdup(node->u.cache.filename) : NULL;
        ds->u.cache.store = NULL;
        ds->cardinality = n;
        break;
    case NODE_SHUFFLE:
    case NODE_PREFETCH: ds->cardinality = n; break;
    case NODE_EXT:
        ds->u.ext.iface->retain(ds->u.ext.ctx);
        ds->cardinality = DIST_CARDINALITY_UNKNOWN;
        break;
    default: ds->cardinality = DIST_CARDINALITY_UNKNOWN; break;
    }
    dist_status st = node_finish(ds);
    if (st != DIST_OK) {
        dist_dataset_destroy(ds);
        return st;
    }
    *out = ds;
    return DIST_OK;
}

dist_status node_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    switch (ds->kind) {
    case NODE_SLICES: return slices_it_create(ds, ctx, gen, out);
    case NODE_FILES: return files_it_create(ds, ctx, gen, out);
    case NODE_INTERLEAVE: return interleave_it_create(ds, ctx, gen, out);
    case NODE_MAP: return map_it_create(ds, ctx, gen, out);
    case NODE_FILTER: return filter_it_create(ds, ctx, gen, out);
    case NODE_SHUFFLE: return shuffle_it_create(ds, ctx, gen, out);
    case NODE_BATCH: return batch_it_create(ds, ctx, gen, out);
    case NODE_REBATCH: return rebatch_it_create(ds, ctx, gen, out);
    case NODE_REPEAT:
    case NODE_TAKE:
    case NODE_SKIP:
    case NODE_SHARD: return count_it_create(ds, ctx, gen, out);
    case NODE_CACHE: return cache_it_create(ds, ctx, gen, out);
    case NODE_PREFETCH: return prefetch_it_create(ds, ctx, gen, out);
    case NODE_EXT: return ds->u.ext.iface->it_create(ds, ctx, gen, out);
    }
    return dist_error(DIST_INTERNAL, "dataset: unknown node kind %d", (int)ds->kind);
}

void node_it_destroy(node_it *it) {
    if (it) it->vt->destroy(it);
}
