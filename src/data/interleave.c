/* A list of files read with (parallel) interleave, with TF's InterleaveDataset order:
 * cycle_length open files, block_length elements from each in turn, a finished file replaced by
 * the next path in its cycle position. num_parallel > 1 reads each open file ahead on its own
 * thread (a prefetch over it, AUTOTUNE'd: a buffer of 2 woke the threads for every small
 * TFRecord record, 6x slower on raw MNIST records than 1.2 M/s), which keeps the order. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dist_status interleave_new(char **paths, int n, dist_file_reader_fn reader, void *user,
                           owned_ctx owned, int cycle, int block, int parallel, int skip_bad,
                           const dist_element_spec *spec, const char *label, dist_dataset **out) {
    dist_dataset *ds = NULL;
    dist_status st = node_new(NODE_INTERLEAVE, NULL, &ds, "%s", label);
    if (st != DIST_OK) {
        for (int i = 0; i < n; i++) free(paths[i]);
        free(paths);
        if (owned.release) owned.release(owned.ctx);
        return st;
    }
    ds->u.interleave.paths = paths;
    ds->u.interleave.count = n;
    ds->u.interleave.reader = reader;
    ds->u.interleave.user = user;
    ds->u.interleave.owned = owned;
    ds->u.interleave.cycle_length = cycle;
    ds->u.interleave.block_length = block;
    ds->u.interleave.num_parallel = parallel;
    ds->u.interleave.skip_bad = skip_bad;
    ds->cardinality = n == 0 ? 0 : DIST_CARDINALITY_UNKNOWN;
    if (spec) ds->spec = *spec;
    DIST_TRY_GOTO(node_finish(ds), st, fail);
    *out = ds;
    return DIST_OK;
fail:
    dist_dataset_destroy(ds);
    return st;
}

static char **copy_paths(const char *const *paths, int n, int num, int index, int *kept) {
    char **v = calloc((size_t)(n ? n : 1), sizeof *v);
    if (!v) return NULL;
    int k = 0;
    for (int i = index; i < n; i += num) {
        v[k] = strdup(paths[i]);
        if (!v[k]) {
            for (int j = 0; j < k; j++) free(v[j]);
            free(v);
            return NULL;
        }
        k++;
    }
    *kept = k;
    return v;
}

dist_status dist_dataset_from_files(const char *const *paths, int n, dist_file_reader_fn reader,
                                    void *user, const dist_interleave_options *opts,
                                    dist_dataset **out) {
    dist_interleave_options o = DIST_INTERLEAVE_OPTIONS_INIT;
    if (opts) o = *opts;
    DIST_CHECK_ARG(out && reader && (paths || n == 0) && n >= 0, "from_files: bad argument");
    DIST_CHECK_ARG(o.version == DIST_INTERLEAVE_OPTIONS_VERSION,
                   "from_files: options version %d, expected %d", o.version,
                   DIST_INTERLEAVE_OPTIONS_VERSION);
    DIST_CHECK_ARG(o.cycle_length >= 1 && o.block_length >= 1,
                   "from_files: cycle_length %d and block_length %d "
                   "must be >= 1",
                   o.cycle_length, o.block_length);
    for (int i = 0; i < n; i++) DIST_CHECK_ARG(paths[i] != NULL, "from_files: path %d is NULL", i);
    int kept = 0;
    char **v = copy_paths(paths, n, 1, 0, &kept);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "from_files: out of memory");
    char label[600];
    snprintf(label, sizeof label, "files(%d,%s,%d,%d%s)", n, o.name ? o.name : "reader",
             o.cycle_length, o.block_length, o.skip_bad ? ",skip_bad" : "");
    return interleave_new(v, kept, reader, user, (owned_ctx){NULL, NULL, NULL}, o.cycle_length,
                          o.block_length, o.num_parallel, o.skip_bad, o.element_spec, label, out);
}

dist_status interleave_node_subset(const dist_dataset *leaf, int num, int index,
                                   dist_dataset **out) {
    int kept = 0;
    char **v = copy_paths((const char *const *)leaf->u.interleave.paths, leaf->u.interleave.count,
                          num, index, &kept);
    if (!v) return dist_error(DIST_OUT_OF_MEMORY, "auto-shard: out of memory");
    char label[700];
    snprintf(label, sizeof label, "%s.file_shard(%d,%d)", leaf->label, num, index);
    owned_ctx owned = leaf->u.interleave.owned;
    if (owned.retain) owned.retain(owned.ctx);
    return interleave_new(v, kept, leaf->u.interleave.reader, leaf->u.interleave.user, owned,
                          leaf->u.interleave.cycle_length, leaf->u.interleave.block_length,
                          leaf->u.interleave.num_parallel, leaf->u.interleave.skip_bad,
                          leaf->spec.count ? &leaf->spec : NULL, label, out);
}

/* ---- iterator
 * ------------------------------------------------------------------------------------- */

typedef struct interleave_it {
    node_it base;
    int cycle;
    node_it **cur;
    dist_dataset **cur_ds; /* the datasets the open iterators borrow */
    int *file_of;          /* which path each cycle position reads */
    int cycle_index, block_index, num_open, next_file, end_of_input;
} interleave_it;

static void close_slot(interleave_it *it, int i) {
    node_it_destroy(it->cur[i]);
    dist_dataset_destroy(it->cur_ds[i]);
    it->cur[i] = NULL;
    it->cur_ds[i] = NULL;
    it->num_open--;
}

static void advance(interleave_it *it) {
    it->cycle_index = (it->cycle_index + 1) % it->cycle;
    it->block_index = 0;
}

static dist_status open_file(interleave_it *it, int file, node_it **out, dist_dataset **out_ds) {
    const dist_dataset *ds = it->base.ds;
    dist_dataset *sub = NULL, *pre = NULL;
    const char *path = ds->u.interleave.paths[file];
    dist_clear_error();
    dist_status st = ds->u.interleave.reader(path, ds->u.interleave.user, &sub);
    if (st != DIST_OK) return dist_error_context(st, "file '%s'", path);
    if (!sub) return dist_error(DIST_INTERNAL, "file '%s': the reader returned no dataset", path);
    if (ds->u.interleave.num_parallel > 1) {
        st = dist_dataset_prefetch(sub, DIST_AUTOTUNE, &pre);
        dist_dataset_destroy(sub);
        if (st != DIST_OK) return st;
        sub = pre;
    }
    st = node_it_create(sub, it->base.ctx, data_mix64(it->base.gen ^ (uint64_t)file), out);
    if (st != DIST_OK) {
        dist_dataset_destroy(sub);
        return dist_error_context(st, "file '%s'", path);
    }
    *out_ds = sub;
    return DIST_OK;
}

static dist_status interleave_next(node_it *base, dist_element *out, int *eos) {
    interleave_it *it = (interleave_it *)base;
    const dist_dataset *ds = base->ds;
    *eos = 0;
    while (!it->end_of_input || it->num_open > 0) {
        int ci = it->cycle_index;
        if (it->cur[ci]) {
            int sub_eos = 0;
            dist_status st = node_it_next(it->cur[ci], out, &sub_eos);
            if (st != DIST_OK) {
                st = dist_error_context(st, "file '%s'", ds->u.interleave.paths[it->file_of[ci]]);
                if (!ds->u.interleave.skip_bad) return st;
                atomic_fetch_add(&base->ctx->skipped, 1);
                dist_log(DIST_LOG_WARN, "dataset: skipping the rest of a file: %s",
                         dist_last_error());
                sub_eos = 1;
            }
            if (!sub_eos) {
                if (++it->block_index == ds->u.interleave.block_length) advance(it);
                return DIST_OK;
            }
            close_slot(it, ci);
            advance(it);
        } else if (!it->end_of_input) {
            if (it->next_file >= ds->u.interleave.count) {
                it->end_of_input = 1;
                continue;
            }
            int file = it->next_file++;
            node_it *sub = NULL;
            dist_dataset *sub_ds = NULL;
            dist_status st = open_file(it, file, &sub, &sub_ds);
            if (st != DIST_OK) {
                if (!ds->u.interleave.skip_bad) return st;
                atomic_fetch_add(&base->ctx->skipped, 1);
                dist_log(DIST_LOG_WARN, "dataset: skipping a file: %s", dist_last_error());
                continue;
            }
            it->cur[ci] = sub;
            it->cur_ds[ci] = sub_ds;
            it->file_of[ci] = file;
            it->num_open++;
        } else {
            advance(it);
        }
    }
    *eos = 1;
    return DIST_OK;
}

static void interleave_destroy(node_it *base) {
    interleave_it *it = (interleave_it *)base;
    for (int i = 0; i < it->cycle; i++)
        if (it->cur[i]) close_slot(it, i);
    free(it->cur);
    free(it->cur_ds);
    free(it->file_of);
    free(it);
}

static const node_it_vt interleave_vt = {interleave_next, interleave_destroy, NULL};

dist_status interleave_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen,
                                 node_it **out) {
    interleave_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "interleave: out of memory");
    it->base = (node_it){&interleave_vt, ds, ctx, gen, 0};
    it->cycle = ds->u.interleave.cycle_length;
    it->cur = calloc((size_t)it->cycle, sizeof *it->cur);
    it->cur_ds = calloc((size_t)it->cycle, sizeof *it->cur_ds);
    it->file_of = calloc((size_t)it->cycle, sizeof *it->file_of);
    if (!it->cur || !it->cur_ds || !it->file_of) {
        free(it->cur);
        free(it->cur_ds);
        free(it->file_of);
        free(it);
        return dist_error(DIST_OUT_OF_MEMORY, "interleave: out of memory");
    }
    *out = &it->base;
    return DIST_OK;
}
