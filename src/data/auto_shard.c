/* Auto-sharding for multi-worker input, with tf.data.experimental.AutoShardPolicy's meanings,
 * plus the per-replica rebatching tf.distribute applies to a globally batched dataset. */
#include "core/error.h"
#include "data/dataset.h"

#include <string.h>
#include <strings.h>

dist_status dist_auto_shard_policy_parse(const char *text, dist_auto_shard_policy *out) {
    DIST_CHECK_ARG(text && out, "auto-shard policy: NULL argument");
    static const char *const names[] = {"off", "auto", "file", "data"};
    for (int i = 0; i < 4; i++)
        if (strcasecmp(text, names[i]) == 0) {
            *out = (dist_auto_shard_policy)i;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "auto-shard policy '%s': expected off, auto, file or data", text);
}

static int file_count(const dist_dataset *leaf) {
    if (leaf->kind == NODE_FILES) return leaf->u.files.count;
    if (leaf->kind == NODE_INTERLEAVE) return leaf->u.interleave.count;
    if (leaf->kind == NODE_EXT && leaf->u.ext.iface->file_count)
        return leaf->u.ext.iface->file_count(leaf);
    return -1;
}

/* Rebuilds `top`'s chain down to `leaf` over a FILE-sharded copy of the leaf. */
static dist_status shard_by_file(dist_dataset *top, int num, int index, dist_dataset **out) {
    dist_dataset *chain[256];
    int depth = 0;
    dist_dataset *leaf = top;
    while (leaf->input) {
        if (depth == 256)
            return dist_error(DIST_UNSUPPORTED, "auto-shard: pipeline deeper than 256 stages");
        chain[depth++] = leaf;
        leaf = leaf->input;
    }
    int files = file_count(leaf);
    if (files < 0)
        return dist_error(DIST_NOT_FOUND,
                          "auto-shard FILE: the source '%s' is not file based (use DATA)",
                          leaf->label);
    if (files < num)
        return dist_error(
            DIST_INVALID_ARGUMENT,
            "auto-shard FILE: the source '%s' has %d file(s), fewer than the %d workers; set the "
            "policy to DATA or split the input into more files",
            leaf->label, files, num);
    dist_dataset *cur = NULL;
    if (leaf->kind == NODE_FILES)
        DIST_TRY(files_node_subset(leaf, num, index, &cur));
    else if (leaf->kind == NODE_INTERLEAVE)
        DIST_TRY(interleave_node_subset(leaf, num, index, &cur));
    else
        DIST_TRY(leaf->u.ext.iface->file_subset(leaf, num, index, &cur));
    for (int i = depth - 1; i >= 0; i--) {
        dist_dataset *next = NULL;
        dist_status st = node_clone_over(chain[i], cur, &next);
        dist_dataset_destroy(cur);
        if (st != DIST_OK) return st;
        cur = next;
    }
    *out = cur;
    return DIST_OK;
}

dist_status dist_dataset_auto_shard(dist_dataset *in, dist_auto_shard_policy policy,
                                    int num_workers, int worker_index, int num_replicas_in_sync,
                                    dist_dataset **out) {
    DIST_CHECK_ARG(in && out, "auto-shard: NULL argument");
    DIST_CHECK_ARG(policy >= DIST_AUTO_SHARD_OFF && policy <= DIST_AUTO_SHARD_DATA,
                   "auto-shard: unknown policy %d", (int)policy);
    DIST_CHECK_ARG(num_workers >= 1, "auto-shard: num_workers %d must be >= 1", num_workers);
    DIST_CHECK_ARG(worker_index >= 0 && worker_index < num_workers,
                   "auto-shard: worker_index %d is outside 0..%d", worker_index, num_workers - 1);
    /* A trailing prefetch stays last. */
    dist_dataset *prefetches[16];
    int np = 0;
    dist_dataset *inner = in;
    while (inner->kind == NODE_PREFETCH && np < 16) {
        prefetches[np++] = inner;
        inner = inner->input;
    }
    dist_dataset *cur = dist_dataset_retain(inner), *next = NULL;
    dist_status st = DIST_OK;
    int by_data = 0;
    if (num_workers > 1 && policy != DIST_AUTO_SHARD_OFF) {
        dist_dataset *leaf = inner;
        while (leaf->input) leaf = leaf->input;
        if (policy == DIST_AUTO_SHARD_DATA ||
            (policy == DIST_AUTO_SHARD_AUTO && file_count(leaf) < 0)) {
            by_data = 1;
        } else {
            DIST_TRY_GOTO(shard_by_file(inner, num_workers, worker_index, &next), st, fail);
            dist_dataset_destroy(cur);
            cur = next;
        }
    }
    if (num_replicas_in_sync > 1) {
        DIST_TRY_GOTO(dist_dataset_rebatch(cur, num_replicas_in_sync, &next), st, fail);
        dist_dataset_destroy(cur);
        cur = next;
    }
    if (by_data) {
        DIST_TRY_GOTO(dist_dataset_shard(cur, num_workers, worker_index, &next), st, fail);
        dist_dataset_destroy(cur);
        cur = next;
    }
    for (int i = np - 1; i >= 0; i--) {
        DIST_TRY_GOTO(dist_dataset_prefetch(cur, prefetches[i]->u.prefetch.buffer_size, &next), st,
                      fail);
        dist_dataset_destroy(cur);
        cur = next;
    }
    *out = cur;
    return DIST_OK;
fail:
    dist_dataset_destroy(cur);
    return st;
}
