#include "core/error.h"
#include "data/dataset.h"
dist_status interleave_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) { (void)ds; (void)ctx; (void)gen; (void)out; return dist_error(DIST_UNSUPPORTED, "todo"); }
dist_status cache_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out) { (void)ds; (void)ctx; (void)gen; (void)out; return dist_error(DIST_UNSUPPORTED, "todo"); }
void cache_store_free(cache_store *s) { (void)s; }
dist_status interleave_node_subset(const dist_dataset *leaf, int num, int index, dist_dataset **out) { (void)leaf; (void)num; (void)index; (void)out; return dist_error(DIST_UNSUPPORTED, "todo"); }
