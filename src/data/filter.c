/* filter: keeps the elements a user predicate accepts. */
#include "core/error.h"
#include "data/dataset.h"

#include <stdlib.h>

dist_status dist_dataset_filter(dist_dataset *in, dist_filter_fn pred, void *user, const char *name,
                                dist_dataset **out) {
    DIST_CHECK_ARG(in && pred && out, "filter: NULL argument");
    dist_dataset *ds = NULL;
    DIST_TRY(node_new(NODE_FILTER, in, &ds, "filter(%s)", name ? name : "fn"));
    ds->u.filter.fn = pred;
    ds->u.filter.user = user;
    ds->cardinality = DIST_CARDINALITY_UNKNOWN; /* as TF's FilterDataset */
    dist_status st = node_finish(ds);
    if (st != DIST_OK)
        dist_dataset_destroy(ds);
    else
        *out = ds;
    return st;
}

typedef struct filter_it {
    node_it base;
    node_it *input;
} filter_it;

static dist_status filter_next(node_it *base, dist_element *out, int *eos) {
    filter_it *it = (filter_it *)base;
    const dist_dataset *ds = base->ds;
    for (;;) {
        DIST_TRY(node_it_next(it->input, out, eos));
        if (*eos) return DIST_OK;
        int keep = 0;
        DIST_TRY(ds->u.filter.fn(out, &keep, ds->u.filter.user));
        if (keep) return DIST_OK;
    }
}

static void filter_destroy(node_it *base) {
    filter_it *it = (filter_it *)base;
    node_it_destroy(it->input);
    free(it);
}

static const node_it_vt filter_vt = {filter_next, filter_destroy, NULL};

dist_status filter_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) {
    filter_it *it = calloc(1, sizeof *it);
    if (!it) return dist_error(DIST_OUT_OF_MEMORY, "filter: out of memory");
    it->base = (node_it){&filter_vt, ds, ctx, gen, 0};
    dist_status st = node_it_create(ds->input, ctx, gen, &it->input);
    if (st != DIST_OK) {
        free(it);
        return st;
    }
    it->base.stable = it->input->stable; /* it passes its input's elements through */
    *out = &it->base;
    return DIST_OK;
}
