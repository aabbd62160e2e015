/* Step graphs: record, compare, capture, replay (step_graphs.h). */
#include "backend/step_graphs.h"

#include "core/error.h"

#include <stdlib.h>
#include <string.h>

#define MAX_ARGS_BYTES 1024

/* One recorded command: its function, then its argument bytes, padded to 8. */
typedef struct rec_header {
    step_rec_fn fn;
    uint32_t bytes;
    uint32_t reserved; /* zero */
} rec_header;

static size_t padded(size_t n) { return (n + 7) & ~(size_t)7; }

void step_rec_init(step_recorder *r, const step_rec_graph_ops *ops, void *device) {
    memset(r, 0, sizeof *r);
    r->ops = ops;
    r->device = device;
}

static void entry_clear(step_recorder *r, step_rec_entry *e) {
    if (e->graph) r->ops->destroy(r->device, e->graph);
    free(e->bytes);
    memset(e, 0, sizeof *e);
}

void step_rec_release(step_recorder *r) {
    for (int i = 0; i < STEP_REC_CACHE; i++) entry_clear(r, &r->cache[i]);
    free(r->buf);
    r->buf = NULL;
    r->len = r->cap = 0;
    r->recording = 0;
}

static dist_status run_now(step_recorder *r, step_rec_fn fn, const void *args) {
    return fn(r->device, args);
}

dist_status step_rec_submit(step_recorder *r, step_rec_fn fn, const void *args,
                            size_t args_bytes) {
    if (args_bytes > MAX_ARGS_BYTES)
        return dist_error(DIST_INTERNAL, "step graphs: a command of %zu argument bytes (at most %d)",
                          args_bytes, MAX_ARGS_BYTES);
    r->stats.commands++;
    if (!r->recording) return run_now(r, fn, args);
    size_t need = sizeof(rec_header) + padded(args_bytes);
    if (r->len + need > r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 4096;
        while (cap < r->len + need) cap *= 2;
        unsigned char *nb = realloc(r->buf, cap);
        if (!nb) return dist_error(DIST_OUT_OF_MEMORY, "step graphs: out of host memory");
        r->buf = nb;
        r->cap = cap;
    }
    rec_header h;
    memset(&h, 0, sizeof h);
    h.fn = fn;
    h.bytes = (uint32_t)args_bytes;
    unsigned char *p = r->buf + r->len;
    memcpy(p, &h, sizeof h);
    memset(p + sizeof h, 0, padded(args_bytes));
    memcpy(p + sizeof h, args, args_bytes);
    r->len += need;
    return DIST_OK;
}

dist_status step_rec_begin(step_recorder *r) {
    if (r->recording)
        return dist_error(DIST_INVALID_USAGE, "step graphs: a step began inside another step");
    r->recording = 1;
    return DIST_OK;
}

dist_status step_rec_end(step_recorder *r) {
    dist_status st = step_rec_flush(r);
    r->recording = 0;
    return st;
}

void step_rec_discard(step_recorder *r) {
    r->len = 0;
    r->recording = 0;
}

/* Runs every command of the segment in order, stopping at the first failure. */
static dist_status run_segment(step_recorder *r, const unsigned char *bytes, size_t len) {
    for (size_t off = 0; off < len;) {
        rec_header h;
        memcpy(&h, bytes + off, sizeof h);
        DIST_TRY(run_now(r, h.fn, bytes + off + sizeof h));
        off += sizeof h + padded(h.bytes);
    }
    return DIST_OK;
}

/* FNV-1a, 64 bits: a fast first comparison; equal hashes are confirmed byte by byte. */
static uint64_t hash_bytes(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ull;
    }
    return h;
}

static step_rec_entry *lookup(step_recorder *r, uint64_t hash) {
    for (int i = 0; i < STEP_REC_CACHE; i++) {
        step_rec_entry *e = &r->cache[i];
        if (e->bytes && e->hash == hash && e->len == r->len && memcmp(e->bytes, r->buf, r->len) == 0)
            return e;
    }
    return NULL;
}

/* A slot for a new segment: a free one, else the least recently used (its graph destroyed). */
static step_rec_entry *insert(step_recorder *r, uint64_t hash) {
    step_rec_entry *victim = &r->cache[0];
    for (int i = 0; i < STEP_REC_CACHE; i++) {
        step_rec_entry *e = &r->cache[i];
        if (!e->bytes) {
            victim = e;
            break;
        }
        if (e->last_use < victim->last_use) victim = e;
    }
    entry_clear(r, victim);
    victim->bytes = malloc(r->len);
    if (!victim->bytes) return NULL; /* not cached: the segment just runs eagerly */
    memcpy(victim->bytes, r->buf, r->len);
    victim->len = r->len;
    victim->hash = hash;
    return victim;
}

/* Captures the segment into a graph and launches it. A device that refuses the capture (an
 * operation that cannot be captured) gets the segment run eagerly instead, which is still
 * correct: nothing ran while capturing. */
static dist_status capture_and_launch(step_recorder *r, step_rec_entry *e) {
    dist_status st = r->ops->capture_begin(r->device);
    if (st == DIST_OK) {
        st = run_segment(r, r->buf, r->len);
        void *graph = NULL;
        dist_status end = r->ops->capture_end(r->device, st == DIST_OK, &graph);
        if (st == DIST_OK) st = end;
        if (st == DIST_OK) {
            e->graph = graph;
            r->stats.captured++;
            return r->ops->launch(r->device, graph);
        }
    }
    e->failed = 1;
    r->stats.capture_failures++;
    dist_log(DIST_LOG_WARN,
             "step graphs: the device could not capture a segment of %zu bytes (%s); it runs "
             "without a graph from now on",
             r->len, dist_last_error());
    r->stats.eager_segments++;
    return run_segment(r, r->buf, r->len);
}

static dist_status flush_segment(step_recorder *r) {
    if (!r->ops) {
        r->stats.eager_segments++;
        return run_segment(r, r->buf, r->len);
    }
    uint64_t hash = hash_bytes(r->buf, r->len);
    step_rec_entry *e = lookup(r, hash);
    if (!e) e = insert(r, hash);
    if (!e) {
        r->stats.eager_segments++;
        return run_segment(r, r->buf, r->len);
    }
    e->last_use = ++r->clock;
    e->seen++;
    if (e->graph) {
        if (r->ops->launch(r->device, e->graph) == DIST_OK) {
            r->stats.replayed++;
            return DIST_OK;
        }
        /* A graph that does not launch is not tried again: the segment runs as commands, which
         * fail in turn if the device is broken. */
        dist_log(DIST_LOG_WARN, "step graphs: a graph failed to launch (%s); it runs without one",
                 dist_last_error());
        r->ops->destroy(r->device, e->graph);
        e->graph = NULL;
        e->failed = 1;
        r->stats.eager_segments++;
        return run_segment(r, r->buf, r->len);
    }
    if (!r->captures_off && r->stats.captured >= STEP_REC_THRASH_CAPTURES &&
        r->stats.replayed < r->stats.captured) {
        r->captures_off = 1;
        dist_log(DIST_LOG_INFO,
                 "step graphs: %lld segments were captured and only %lld replays followed: the "
                 "steps do not repeat, so no more are captured",
                 (long long)r->stats.captured, (long long)r->stats.replayed);
    }
    if (e->seen >= 2 && !e->failed && !r->captures_off) return capture_and_launch(r, e);
    r->stats.eager_segments++;
    return run_segment(r, r->buf, r->len);
}

dist_status step_rec_flush(step_recorder *r) {
    if (r->len == 0) return DIST_OK;
    dist_status st = flush_segment(r);
    r->len = 0;
    return st;
}
