/* Internal: dataset nodes, node iterators and element slots. */
#ifndef DIST_DATA_DATASET_H
#define DIST_DATA_DATASET_H

#include "dist/data.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

typedef enum node_kind {
    NODE_SLICES = 0,
    NODE_FILES, /* (file index, label) of a JPEG folder; decoded by a map above it */
    NODE_INTERLEAVE,
    NODE_MAP,
    NODE_FILTER,
    NODE_SHUFFLE,
    NODE_BATCH,
    NODE_REBATCH,
    NODE_REPEAT,
    NODE_TAKE,
    NODE_SKIP,
    NODE_SHARD,
    NODE_CACHE,
    NODE_PREFETCH,
    NODE_EXT /* a kind whose behaviour lives in its own file, behind node_ext_i */
} node_kind;

struct iter_ctx;
struct node_it;

/* The entries of a NODE_EXT node (the TFRecord source, parse_example): its iterator and the
 * context the node shares with its clones (auto-shard rewrites copy nodes above a leaf). */
typedef struct node_ext_i {
    const char *name;
    dist_status (*it_create)(const struct dist_dataset *ds, struct iter_ctx *ctx, uint64_t gen,
                             struct node_it **out);
    void (*retain)(void *ctx);  /* a clone takes a reference */
    void (*release)(void *ctx); /* the node's reference is dropped */
    /* Optional, for a source that reads a list of files (auto-shard FILE): how many, and a
     * copy of the node that reads files index, index + num, ... of them. NULL: not file based. */
    int (*file_count)(const struct dist_dataset *ds);
    dist_status (*file_subset)(const struct dist_dataset *ds, int num, int index,
                               struct dist_dataset **out);
} node_ext_i;

/* A list of files with labels, shared (reference counted) by the FILES node of a JPEG folder,
 * its FILE-sharded copies and the decode map. */
typedef struct file_table {
    atomic_int refs;
    int count;
    char **paths;
    int32_t *labels;
    int num_classes;
    char **class_names;
    int channels, height, width; /* decode options of the JPEG folder */
    dist_jpeg_size_policy size_policy;
    int64_t max_pixels; /* the header cap (dist_jpeg_read_header) */
} file_table;

/* Reads a JPEG header's size into *w, *h; DIST_FORMAT when the bytes are no JPEG or the header
 * claims more than max_pixels pixels, so that nothing is allocated for a hostile header. */
dist_status dist_jpeg_read_header(void *tj, const unsigned char *bytes, size_t n, const char *path,
                                  int64_t max_pixels, int *w, int *h);

file_table *file_table_retain(file_table *t);
void file_table_release(file_table *t);

/* Hooks of the internal map variant: per-thread state (the JPEG decoder keeps a TurboJPEG
 * handle and scratch buffers in it). */
typedef dist_status (*map_thread_fn)(const dist_element *in, dist_element *out, void *user,
                                     void *state);
typedef dist_status (*map_state_create_fn)(void *user, void **state);
typedef void (*map_state_destroy_fn)(void *state);
/* A map whose outputs' shapes vary: writes element `index` of the pass (from 0, counting the
 * map's inputs) into `out`, growing its buffers (slot_reserve) and setting count and shapes. */
typedef struct elem_slot elem_slot;
typedef dist_status (*map_slot_fn)(const dist_element *in, int64_t index, elem_slot *out,
                                   void *user, void *state);
/* A reference-counted context an internal node keeps alive (retain on clone, release). */
typedef struct owned_ctx {
    void *ctx;
    void (*retain)(void *ctx);
    void (*release)(void *ctx);
} owned_ctx;

typedef struct cache_store cache_store;
typedef struct dist_dataset dist_dataset;

/* An internal map whose function gets per-thread state (used by the JPEG folder source);
 * `table` is its `user` and is retained by the node. */
dist_status map_new_internal(dist_dataset *in, map_thread_fn tfn, map_state_create_fn create,
                             map_state_destroy_fn destroy, file_table *table,
                             const dist_element_spec *spec, int num_parallel, int skip_errors,
                             const char *name, dist_dataset **out);
/* A map node running `sfn` (outputs of varying shapes; `spec` may hold unknown dimensions),
 * on num_parallel threads (DIST_AUTOTUNE: tuned) with the input order kept; `owned` (taken
 * over, also on failure) is its `user`, released with the node. */
dist_status map_new_slots(dist_dataset *in, map_slot_fn sfn, map_state_create_fn create,
                          map_state_destroy_fn destroy, owned_ctx owned,
                          const dist_element_spec *spec, int num_parallel, const char *name,
                          dist_dataset **out);

struct dist_dataset {
    atomic_int refs;
    node_kind kind;
    dist_dataset *input; /* NULL for sources */
    dist_element_spec spec;
    int64_t cardinality;
    char *desc;  /* whole-chain description */
    char *label; /* this stage's own text, e.g. "batch(64,0)" */
    union {
        struct {
            int count;
            dist_tensor t[DIST_ELEMENT_MAX]; /* views (borrowed or over owned copies) */
            void *owned[DIST_ELEMENT_MAX];
            int64_t n;
        } slices;
        struct {
            file_table *table;
            int32_t *indices; /* the table rows this node yields (a FILE shard is a subset) */
            int count;
            int skipped_at_create;
        } files;
        struct {
            char **paths;
            int count;
            dist_file_reader_fn reader;
            void *user;
            owned_ctx owned; /* internal readers: `user`, kept alive (ctx NULL: borrowed) */
            int cycle_length, block_length, num_parallel, skip_bad;
        } interleave;
        struct {
            dist_map_fn fn;
            map_thread_fn tfn;
            map_state_create_fn state_create;
            map_state_destroy_fn state_destroy;
            map_slot_fn sfn; /* internal maps whose output shapes vary */
            void *user;
            file_table *table;             /* the JPEG decode map's `user`, kept alive */
            owned_ctx owned;               /* other internal maps' `user`, kept alive */
            int num_parallel, skip_errors; /* num_parallel DIST_AUTOTUNE: tuned */
        } map;
        struct {
            dist_filter_fn fn;
            void *user;
        } filter;
        struct {
            int64_t buffer_size;
            uint64_t seed;
            int reshuffle;
        } shuffle;
        struct {
            int64_t size;
            int drop_remainder;
        } batch;
        struct {
            int num_replicas;
        } rebatch;
        struct {
            int64_t count; /* repeat, take, skip */
        } count;
        struct {
            int64_t num, index;
        } shard;
        struct {
            char *filename;     /* NULL: memory */
            cache_store *store; /* memory cache, shared by iterators */
        } cache;
        struct {
            int buffer_size; /* DIST_AUTOTUNE: tuned */
        } prefetch;
        struct {
            const node_ext_i *iface;
            void *ctx;
        } ext;
    } u;
};

/* Allocates a node with one reference, retaining `input`; label is formatted. */
dist_status node_new(node_kind kind, dist_dataset *input, dist_dataset **out, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Finishes a node: computes the description from its label and input. */
dist_status node_finish(dist_dataset *ds);
/* A copy of a single-input node over another input (auto-shard rewrites). */
dist_status node_clone_over(const dist_dataset *node, dist_dataset *new_input, dist_dataset **out);

/* ---- element slots: an element copy that owns growable buffers --------------------------- */

struct elem_slot {
    int count;
    dist_tensor t[DIST_ELEMENT_MAX];
    size_t cap[DIST_ELEMENT_MAX];
};

/* Copies `src` into `slot`, growing buffers only when an item is larger than ever before. */
dist_status slot_copy(elem_slot *slot, const dist_element *src);
/* Points `out` at the slot's tensors. */
void slot_view(elem_slot *slot, dist_element *out);
void slot_free(elem_slot *slot);
/* Makes item i's buffer hold at least `bytes` (its contents are kept). */
dist_status slot_reserve(elem_slot *slot, int i, size_t bytes);
/* Preallocates the slot's tensors for a fully known spec. */
dist_status slot_alloc_spec(elem_slot *slot, const dist_element_spec *spec);

/* ---- iterators ----------------------------------------------------------------------------- */

/* The values AUTOTUNE stages chose, by stage (the dataset node), kept across the passes of one
 * dist_iterator. */
#define AUTOTUNE_SLOTS 16
typedef struct autotune_slot {
    const dist_dataset *node;
    int value;
} autotune_slot;

/* A prefetch's consumer demand: elements asked for, and the nanoseconds it spent waiting for
 * them on an empty buffer. A tuned map below it grows only while that consumer waits. */
typedef struct demand_slot {
    const dist_dataset *node;
    atomic_llong asks, wait_ns;
} demand_slot;

/* Shared by all node iterators of one dist_iterator. */
typedef struct iter_ctx {
    atomic_llong skipped;
    const dist_dataset *top; /* the dataset the dist_iterator reads */
    pthread_mutex_t tune_mu;
    int tune_count;
    autotune_slot tune[AUTOTUNE_SLOTS];
    int demand_count;
    demand_slot demand[AUTOTUNE_SLOTS];
} iter_ctx;

/* The value a stage's tuner starts from: the one it reached in an earlier pass, else `first`. */
int data_autotune_start(iter_ctx *ctx, const dist_dataset *node, int first);
/* Records a stage's new value (thread-safe). */
void data_autotune_record(iter_ctx *ctx, const dist_dataset *node, int value);
/* CLOCK_MONOTONIC in nanoseconds. */
int64_t data_now_ns(void);
/* The demand slot of prefetch `node` (made on first use; NULL when the table is full). */
demand_slot *data_autotune_demand(iter_ctx *ctx, const dist_dataset *node);
/* The prefetch nearest above `node` on the way from the iterator's dataset (ctx->top) down to
 * it: the stage whose consumer `node`'s output ends up feeding; NULL when there is none. */
const dist_dataset *data_autotune_prefetch_above(const iter_ctx *ctx, const dist_dataset *node);
/* The online cores, bounded to 1..DIST_AUTOTUNE_MAP_MAX: a map's parallelism cap. */
int data_autotune_map_max(void);

typedef struct node_it node_it;
typedef struct node_it_vt {
    dist_status (*next)(node_it *it, dist_element *out, int *eos);
    void (*destroy)(node_it *it);
    /* Optional: right after next() gave an element held in the iterator's own slot, moves that
     * slot's buffers (the element) into `dst` and takes dst's old buffers in exchange, for a
     * consumer that would copy the element into dst (prefetch): no copy, no allocation. */
    void (*take)(node_it *it, elem_slot *dst);
} node_it_vt;

struct node_it {
    const node_it_vt *vt;
    const dist_dataset *ds;
    iter_ctx *ctx;
    uint64_t gen; /* which pass: mixes the epoch and the repetitions above this node */
    /* non-zero: the data of every element this iterator returns stays valid and unchanged while
     * its dataset lives (views into a slices source's arrays), so a consumer may keep the
     * views instead of copies */
    int stable;
};

/* Makes the iterator of node `ds` for pass `gen`. */
dist_status node_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
void node_it_destroy(node_it *it);
static inline dist_status node_it_next(node_it *it, dist_element *out, int *eos) {
    return it->vt->next(it, out, eos);
}

/* Per-kind iterator constructors (one file per kind). */
dist_status slices_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status files_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status interleave_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen,
                                 node_it **out);
dist_status map_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status filter_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status shuffle_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status batch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status rebatch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status count_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status cache_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
dist_status prefetch_it_create(const dist_dataset *ds, iter_ctx *ctx, uint64_t gen, node_it **out);
/* The bytes of element buffers a prefetch iterator's ring holds now (its own memory, whatever
 * the rest of the process allocates or frees meanwhile). DIST_INVALID_ARGUMENT when `it` is
 * not a prefetch iterator. */
dist_status prefetch_it_held_bytes(node_it *it, int64_t *bytes);

void cache_store_free(cache_store *s);

/* FILE sharding: a copy of a file-based source keeping files i with i % num == index. */
dist_status files_node_subset(const dist_dataset *leaf, int num, int index, dist_dataset **out);
/* The interleave node (paths taken over, also on failure; `owned` too: its ctx is kept alive
 * with the node and its FILE shards, NULL ctx for a borrowed `user`). */
dist_status interleave_new(char **paths, int n, dist_file_reader_fn reader, void *user,
                           owned_ctx owned, int cycle, int block, int parallel, int skip_bad,
                           const dist_element_spec *spec, const char *label, dist_dataset **out);
dist_status interleave_node_subset(const dist_dataset *leaf, int num, int index,
                                   dist_dataset **out);

/* splitmix64: the seed mixer and the stream behind shuffle. */
static inline uint64_t data_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ULL;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
}

/* A thread's error, carried to the consumer thread (the message is thread-local). */
typedef struct carried_error {
    dist_status status;
    char message[512];
} carried_error;

void carried_error_capture(carried_error *e, dist_status st);
dist_status carried_error_raise(const carried_error *e);

#endif
