/* The input pipeline: TF's documented results for batch, shuffle, shard/rebatch, cardinality,
 * and iterator checkpoints. */
#include "data/dataset.h"
#include "dist/data.h"
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* range(n) as int32 slices. */
static dist_dataset *range_ds(int n) {
    int64_t shape[1] = {n};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_I32, 1, shape, &t), DIST_OK);
    for (int i = 0; i < n; i++) ((int32_t *)t->data)[i] = i;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&t, 1, 1, &ds), DIST_OK);
    dist_tensor_destroy(t);
    return ds;
}

/* Replaces *ds by the result of a transformation (dropping the caller's old reference). */
#define CHAIN(ds, call)                                                                            \
    do {                                                                                           \
        dist_dataset *next_ = NULL;                                                                \
        dist_status st_ = (call);                                                                  \
        ck_assert_msg(st_ == DIST_OK, "%s: %s", #call, dist_last_error());                         \
        dist_dataset_destroy(ds);                                                                  \
        (ds) = next_;                                                                              \
    } while (0)

/* Renders every element of one pass as "[0,1] [2,3]" (values of item 0, int32). */
static void render(dist_iterator *it, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_msg(dist_iterator_next(it, &el, &eos) == DIST_OK, "%s", dist_last_error());
        if (eos) break;
        const dist_tensor *t = el.items[0];
        int64_t n = dist_tensor_numel(t);
        len += (size_t)snprintf(buf + len, size - len, "%s%s", len ? " " : "", t->ndim ? "[" : "");
        for (int64_t i = 0; i < n; i++)
            len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? "," : "",
                                    ((int32_t *)t->data)[i]);
        if (t->ndim) len += (size_t)snprintf(buf + len, size - len, "]");
    }
}

static void render_ds(dist_dataset *ds, char *buf, size_t size) {
    dist_iterator *it = NULL;
    ck_assert_msg(dist_iterator_create(ds, &it) == DIST_OK, "%s", dist_last_error());
    render(it, buf, size);
    dist_iterator_destroy(it);
}

START_TEST(test_batch_10_by_4_keeps_remainder_4_4_2) {
    dist_dataset *ds = range_ds(10);
    CHAIN(ds, dist_dataset_batch(ds, 4, 0, &next_));
    char buf[256];
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1,2,3] [4,5,6,7] [8,9]");
    ck_assert_int_eq(dist_dataset_cardinality(ds), 3);
    ck_assert_int_eq(dist_dataset_element_spec(ds)->shape[0][0], -1);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_batch_drop_remainder_drops_the_partial_batch) {
    dist_dataset *ds = range_ds(10);
    CHAIN(ds, dist_dataset_batch(ds, 4, 1, &next_));
    char buf[256];
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1,2,3] [4,5,6,7]");
    ck_assert_int_eq(dist_dataset_cardinality(ds), 2);
    ck_assert_int_eq(dist_dataset_element_spec(ds)->shape[0][0], 4);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_shuffle_buffer_1_is_identity) {
    dist_dataset *ds = range_ds(20);
    CHAIN(ds, dist_dataset_shuffle(ds, 1, 123, 1, &next_));
    char buf[256];
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19");
    dist_dataset_destroy(ds);
}
END_TEST

static void read_ints(dist_iterator *it, int *vals, int n) {
    for (int i = 0; i < n; i++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
        ck_assert_int_eq(eos, 0);
        vals[i] = *(int32_t *)el.items[0]->data;
    }
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
    ck_assert_int_eq(eos, 1);
}

START_TEST(test_shuffle_is_a_permutation_within_the_buffer_window) {
    /* TF's buffer semantics: output i is drawn from inputs [0, i + buffer_size). */
    enum { N = 1000, B = 16 };
    dist_dataset *ds = range_ds(N);
    CHAIN(ds, dist_dataset_shuffle(ds, B, 7, 1, &next_));
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    static int vals[N];
    int seen[N] = {0};
    read_ints(it, vals, N);
    int moved = 0;
    for (int i = 0; i < N; i++) {
        ck_assert_int_lt(vals[i], i + B);
        seen[vals[i]]++;
        moved += vals[i] != i;
    }
    for (int i = 0; i < N; i++) ck_assert_int_eq(seen[i], 1);
    ck_assert_int_gt(moved, N / 2);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_shuffle_seed_and_reshuffle_each_iteration) {
    enum { N = 50 };
    int a[N], b[N], c[N], d[N];
    dist_dataset *re = range_ds(N), *fixed = range_ds(N);
    CHAIN(re, dist_dataset_shuffle(re, N, 42, 1, &next_));
    CHAIN(fixed, dist_dataset_shuffle(fixed, N, 42, 0, &next_));
    dist_iterator *it = NULL, *it2 = NULL;
    ck_assert_int_eq(dist_iterator_create(re, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(re, &it2), DIST_OK);
    read_ints(it, a, N);
    read_ints(it2, b, N);
    ck_assert_mem_eq(a, b, sizeof a); /* same seed, same epoch: same order */
    ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
    ck_assert_int_eq(dist_iterator_epoch(it), 1);
    read_ints(it, c, N);
    ck_assert(memcmp(a, c, sizeof a) != 0); /* reshuffled in epoch 1 */
    dist_iterator_destroy(it);
    dist_iterator_destroy(it2);
    ck_assert_int_eq(dist_iterator_create(fixed, &it), DIST_OK);
    read_ints(it, c, N);
    ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
    read_ints(it, d, N);
    ck_assert_mem_eq(c, d, sizeof c); /* reshuffle_each_iteration = 0: same order each epoch */
    dist_iterator_destroy(it);
    dist_dataset_destroy(re);
    dist_dataset_destroy(fixed);
}
END_TEST

/* TF's distributed input guide, "Sharding": 12 elements, 2 workers, 2 replicas in sync,
 * global batch 4. */
static void auto_shard_render(dist_auto_shard_policy policy, int worker, char *buf, size_t size) {
    dist_dataset *ds = range_ds(12);
    CHAIN(ds, dist_dataset_batch(ds, 4, 0, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, 2, &next_));
    CHAIN(ds, dist_dataset_auto_shard(ds, policy, 2, worker, 2, &next_));
    ck_assert_msg(strncmp(dist_dataset_describe(ds), "prefetch(2)", 11) == 0, "%s",
                  dist_dataset_describe(ds));
    render_ds(ds, buf, size);
    dist_dataset_destroy(ds);
}

START_TEST(test_auto_shard_data_12_elements_2_workers_batch_4) {
    char buf[256];
    auto_shard_render(DIST_AUTO_SHARD_DATA, 0, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [4,5] [8,9]");
    auto_shard_render(DIST_AUTO_SHARD_DATA, 1, buf, sizeof buf);
    ck_assert_str_eq(buf, "[2,3] [6,7] [10,11]");
    /* AUTO on in-memory slices falls back to DATA. */
    auto_shard_render(DIST_AUTO_SHARD_AUTO, 0, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [4,5] [8,9]");
}
END_TEST

START_TEST(test_auto_shard_off_every_worker_sees_everything) {
    char buf[256];
    auto_shard_render(DIST_AUTO_SHARD_OFF, 1, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [2,3] [4,5] [6,7] [8,9] [10,11]");
}
END_TEST

START_TEST(test_auto_shard_file_without_files_is_not_found) {
    dist_dataset *ds = range_ds(12), *out = NULL;
    ck_assert_int_eq(dist_dataset_auto_shard(ds, DIST_AUTO_SHARD_FILE, 2, 0, 2, &out),
                     DIST_NOT_FOUND);
    ck_assert_ptr_null(out);
    dist_dataset_destroy(ds);
    dist_auto_shard_policy p;
    ck_assert_int_eq(dist_auto_shard_policy_parse("data", &p), DIST_OK);
    ck_assert_int_eq(p, DIST_AUTO_SHARD_DATA);
    ck_assert_int_eq(dist_auto_shard_policy_parse("bogus", &p), DIST_INVALID_ARGUMENT);
}
END_TEST

START_TEST(test_rebatch_splits_global_batches_like_the_tf_guide) {
    char buf[256];
    dist_dataset *ds = range_ds(6);
    CHAIN(ds, dist_dataset_batch(ds, 4, 0, &next_));
    CHAIN(ds, dist_dataset_rebatch(ds, 2, &next_));
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [2,3] [4] [5]");
    dist_dataset_destroy(ds);
    ds = range_ds(8);
    CHAIN(ds, dist_dataset_batch(ds, 4, 0, &next_));
    CHAIN(ds, dist_dataset_rebatch(ds, 3, &next_));
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [2,3] [] [4,5] [6,7] []");
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_take_skip_repeat_shard) {
    char buf[256];
    dist_dataset *ds = range_ds(10);
    CHAIN(ds, dist_dataset_skip(ds, 3, &next_));
    CHAIN(ds, dist_dataset_take(ds, 4, &next_));
    CHAIN(ds, dist_dataset_repeat(ds, 2, &next_));
    ck_assert_int_eq(dist_dataset_cardinality(ds), 8);
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "3 4 5 6 3 4 5 6");
    dist_dataset_destroy(ds);
    ds = range_ds(10);
    CHAIN(ds, dist_dataset_shard(ds, 3, 1, &next_));
    ck_assert_int_eq(dist_dataset_cardinality(ds), 3);
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "1 4 7");
    dist_dataset_destroy(ds);
}
END_TEST

static dist_status keep_even(const dist_element *in, int *keep, void *user) {
    (void)user;
    *keep = (*(int32_t *)in->items[0]->data % 2) == 0;
    return DIST_OK;
}

START_TEST(test_cardinality_follows_tf) {
    dist_dataset *ds = range_ds(10);
    CHAIN(ds, dist_dataset_repeat(ds, -1, &next_));
    ck_assert_int_eq(dist_dataset_cardinality(ds), DIST_CARDINALITY_INFINITE);
    CHAIN(ds, dist_dataset_take(ds, 25, &next_));
    ck_assert_int_eq(dist_dataset_cardinality(ds), 25);
    CHAIN(ds, dist_dataset_filter(ds, keep_even, NULL, "even", &next_));
    ck_assert_int_eq(dist_dataset_cardinality(ds), DIST_CARDINALITY_UNKNOWN);
    char buf[256];
    render_ds(ds, buf, sizeof buf);
    ck_assert_str_eq(buf, "0 2 4 6 8 0 2 4 6 8 0 2 4");
    dist_dataset_destroy(ds);
}
END_TEST

/* The distrain pipeline: MNIST-like u8 images and labels -> normalize -> shuffle -> batch ->
 * prefetch; save at element k, restore in a fresh iterator, compare with an uninterrupted run. */
static dist_dataset *mnist_like(int n, int with_prefetch) {
    int64_t ishape[3] = {n, 28, 28}, lshape[1] = {n};
    dist_tensor *img = NULL, *lab = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_U8, 3, ishape, &img), DIST_OK);
    ck_assert_int_eq(dist_tensor_create(DIST_U8, 1, lshape, &lab), DIST_OK);
    for (int i = 0; i < n; i++) {
        ((uint8_t *)lab->data)[i] = (uint8_t)(i % 10);
        for (int p = 0; p < 784; p++)
            ((uint8_t *)img->data)[(size_t)i * 784 + p] = (uint8_t)(i + p);
    }
    dist_tensor *both[2] = {img, lab};
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(both, 2, 1, &ds), DIST_OK);
    dist_tensor_destroy(img);
    dist_tensor_destroy(lab);
    CHAIN(ds, dist_dataset_map_image_normalize(ds, &next_));
    CHAIN(ds, dist_dataset_shuffle(ds, 100, 2026, 1, &next_));
    CHAIN(ds, dist_dataset_batch(ds, 16, 0, &next_));
    if (with_prefetch) CHAIN(ds, dist_dataset_prefetch(ds, 2, &next_));
    return ds;
}

START_TEST(test_image_normalize_shapes_and_values) {
    dist_dataset *ds = mnist_like(40, 0);
    const dist_element_spec *s = dist_dataset_element_spec(ds);
    ck_assert_int_eq(s->count, 2);
    ck_assert_int_eq(s->dtype[0], DIST_F32);
    ck_assert_int_eq(s->ndim[0], 4);
    ck_assert_int_eq(s->shape[0][3], 1);
    ck_assert_int_eq(s->dtype[1], DIST_I32);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
    ck_assert_int_eq(el.items[0]->shape[0], 16);
    for (int b = 0; b < 16; b++) {
        int32_t label = ((int32_t *)el.items[1]->data)[b];
        const float *px = (const float *)el.items[0]->data + (size_t)b * 784;
        /* pixel p of example i is (i + p) mod 256 and its label i mod 10 */
        int i0 = (int)(px[0] * 255.0f + 0.5f);
        ck_assert_int_eq(label, i0 % 10);
        ck_assert_float_eq_tol(px[5], (float)((i0 + 5) % 256) / 255.0f, 1e-6);
    }
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

static void element_digest(const dist_element *el, uint64_t *h) {
    for (int i = 0; i < el->count; i++) {
        const unsigned char *p = el->items[i]->data;
        size_t n = dist_tensor_bytes(el->items[i]);
        for (size_t k = 0; k < n; k++) *h = (*h ^ p[k]) * 1099511628211ULL;
        *h ^= (uint64_t)el->items[i]->shape[0];
    }
}

START_TEST(test_save_restore_resumes_the_rest_of_the_epoch_exactly) {
    enum { N = 200, K = 5 };
    dist_dataset *ds = mnist_like(N, 1);
    /* uninterrupted: epoch 0 then epoch 1, one digest per batch */
    uint64_t ref[2][16];
    int nref[2] = {0, 0};
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    for (int e = 0; e < 2; e++) {
        if (e) ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
        for (;;) {
            dist_element el;
            int eos = 0;
            ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
            if (eos) break;
            uint64_t h = 1469598103934665603ULL;
            element_digest(&el, &h);
            ref[e][nref[e]++] = h;
        }
    }
    dist_iterator_destroy(it);
    ck_assert_int_eq(nref[0], 13);
    ck_assert(memcmp(ref[0], ref[1], sizeof(uint64_t) * 13) != 0);

    /* interrupted in epoch 1 after K batches */
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
    for (int k = 0; k < K; k++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
    }
    void *state = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_iterator_save(it, &state, &n), DIST_OK);
    dist_iterator_destroy(it); /* mid-epoch, with the prefetch thread running */

    dist_dataset *again = mnist_like(N, 1);
    ck_assert_int_eq(dist_iterator_create(again, &it), DIST_OK);
    ck_assert_msg(dist_iterator_restore(it, state, n) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_iterator_epoch(it), 1);
    ck_assert_int_eq(dist_iterator_position(it), K);
    int k = K;
    for (;; k++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
        if (eos) break;
        uint64_t h = 1469598103934665603ULL;
        element_digest(&el, &h);
        ck_assert_msg(h == ref[1][k], "batch %d differs after restore", k);
    }
    ck_assert_int_eq(k, nref[1]);
    dist_iterator_destroy(it);
    dist_iterator_state_free(state);
    dist_dataset_destroy(again);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_restore_into_another_pipeline_names_the_mismatch) {
    dist_dataset *a = range_ds(10), *b = range_ds(10);
    CHAIN(a, dist_dataset_batch(a, 4, 0, &next_));
    CHAIN(b, dist_dataset_batch(b, 5, 0, &next_));
    dist_iterator *ia = NULL, *ib = NULL;
    ck_assert_int_eq(dist_iterator_create(a, &ia), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(b, &ib), DIST_OK);
    void *state = NULL;
    size_t n = 0;
    ck_assert_int_eq(dist_iterator_save(ia, &state, &n), DIST_OK);
    ck_assert_int_eq(dist_iterator_restore(ib, state, n), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "batch(4,0)") &&
                      strstr(dist_last_error(), "batch(5,0)"),
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_iterator_restore(ib, "not json", 8), DIST_FORMAT);
    dist_iterator_state_free(state);
    dist_iterator_destroy(ia);
    dist_iterator_destroy(ib);
    dist_dataset_destroy(a);
    dist_dataset_destroy(b);
}
END_TEST

static dist_status square_fn(const dist_element *in, dist_element *out, void *user) {
    int32_t v = *(int32_t *)in->items[0]->data;
    if (user && v == 13) return DIST_FORMAT; /* an element that fails */
    *(int32_t *)out->items[0]->data = v * v;
    return DIST_OK;
}

static int fail_at_13;

static dist_dataset *squares(int n, int threads, int skip) {
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    o.num_parallel = threads;
    o.skip_errors = skip;
    o.name = "square";
    dist_dataset *ds = range_ds(n);
    CHAIN(ds, dist_dataset_map(ds, square_fn, n == 100000 ? NULL : &fail_at_13, &o, &next_));
    return ds;
}

START_TEST(test_parallel_map_keeps_order_and_errors) {
    char a[4096], b[4096];
    dist_dataset *one = squares(13, 1, 0), *four = squares(13, 4, 0); /* 0..12: none fails */
    render_ds(one, a, sizeof a);
    render_ds(four, b, sizeof b);
    ck_assert_str_eq(a, b);
    ck_assert_str_eq(a, "0 1 4 9 16 25 36 49 64 81 100 121 144");
    dist_dataset_destroy(one);
    dist_dataset_destroy(four);

    dist_dataset *bad = squares(20, 3, 0);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(bad, &it), DIST_OK);
    dist_status st = DIST_OK;
    int count = 0;
    for (;;) {
        dist_element el;
        int eos = 0;
        st = dist_iterator_next(it, &el, &eos);
        if (st != DIST_OK || eos) break;
        count++;
    }
    ck_assert_int_eq(st, DIST_FORMAT);
    ck_assert_int_eq(count, 13);
    dist_iterator_destroy(it);
    dist_dataset_destroy(bad);

    dist_dataset *skip = squares(20, 3, 1);
    ck_assert_int_eq(dist_iterator_create(skip, &it), DIST_OK);
    render(it, a, sizeof a);
    ck_assert_ptr_null(strstr(a, " 169 "));
    ck_assert_int_eq(dist_iterator_skipped(it), 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(skip);
}
END_TEST

/* A prefetch over a batch takes the batch's buffers instead of copying them (the batch gets
 * the ring slot's in exchange): every batch, the short last one, and the next epoch's full
 * ones arrive as without the prefetch, at fixed depths and AUTOTUNE. */
START_TEST(test_prefetch_over_batch_gives_the_batches_unchanged) {
    static char want[8192], got[8192];
    dist_dataset *plain = range_ds(103);
    CHAIN(plain, dist_dataset_batch(plain, 10, 0, &next_));
    render_ds(plain, want, sizeof want);
    ck_assert_ptr_nonnull(strstr(want, "[100,101,102]"));
    const int depths[3] = {1, 3, DIST_AUTOTUNE};
    for (int d = 0; d < 3; d++) {
        dist_dataset *ds = NULL;
        ck_assert_int_eq(dist_dataset_prefetch(plain, depths[d], &ds), DIST_OK);
        dist_iterator *it = NULL;
        ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
        for (int epoch = 0; epoch < 3; epoch++) {
            render(it, got, sizeof got);
            ck_assert_str_eq(got, want);
            ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
        }
        dist_iterator_destroy(it);
        dist_dataset_destroy(ds);
    }
    dist_dataset_destroy(plain);
}
END_TEST

START_TEST(test_prefetch_destroyed_mid_epoch_joins_cleanly) {
    dist_dataset *ds = squares(100000, 2, 0);
    CHAIN(ds, dist_dataset_prefetch(ds, 4, &next_));
    for (int round = 0; round < 20; round++) {
        dist_iterator *it = NULL;
        ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
        for (int i = 0; i < round; i++) {
            dist_element el;
            int eos = 0;
            ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
            ck_assert_int_eq(*(int32_t *)el.items[0]->data, i * i);
        }
        dist_iterator_destroy(it);
    }
    dist_dataset_destroy(ds);
}
END_TEST

/* An AUTOTUNE'd prefetch sizes its ring for the largest bound (64 elements of 1 MB here) but
 * holds only about `limit` + 2 elements' buffers: a slot never filled takes the buffers of the
 * one the consumer released. Before, every slot got its own as the indices went round (65 MB).
 * The prefetch's own buffers are counted (prefetch_it_held_bytes), not the process's heap,
 * which other threads grow and shrink meanwhile; so the test drives the node iterator itself. */
START_TEST(test_autotuned_prefetch_keeps_buffers_for_its_bound_not_its_capacity) {
    int64_t shape[2] = {256, 1024};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_F32, 2, shape, &t), DIST_OK);
    for (int64_t i = 0; i < 256 * 1024; i++) ((float *)t->data)[i] = (float)(i % 1000);
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&t, 1, 1, &ds), DIST_OK);
    dist_tensor_destroy(t);
    CHAIN(ds, dist_dataset_batch(ds, 256, 0, &next_)); /* one element of 1 MB */
    CHAIN(ds, dist_dataset_repeat(ds, 150, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, DIST_AUTOTUNE, &next_));
    iter_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    atomic_init(&ctx.skipped, 0);
    ctx.top = ds;
    pthread_mutex_init(&ctx.tune_mu, NULL);
    node_it *it = NULL;
    ck_assert_int_eq(node_it_create(ds, &ctx, 0, &it), DIST_OK);
    int count = 0;
    for (;;) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(node_it_next(it, &el, &eos), DIST_OK);
        if (eos) break;
        ck_assert_int_eq(el.items[0]->shape[0], 256);
        ck_assert(((float *)el.items[0]->data)[1001] == 1.0f);
        count++;
    }
    ck_assert_int_eq(count, 150);
    const int64_t element = (int64_t)1 << 20;
    int64_t held = 0;
    ck_assert_int_eq(prefetch_it_held_bytes(it, &held), DIST_OK);
    int bound = data_autotune_start(&ctx, ds, 0); /* the deepest it went: it only grows */
    ck_assert_int_ge(bound, 1);
    ck_assert_msg(held >= element && held <= (bound + 3) * element,
                  "the prefetch holds %lld bytes (%lld MB) after 150 elements of 1 MB, with a "
                  "bound of %d elements",
                  (long long)held, (long long)(held >> 20), bound);
    node_it_destroy(it);
    pthread_mutex_destroy(&ctx.tune_mu);
    dist_dataset_destroy(ds);
}
END_TEST

/* A producer that refills several slots at once, after the consumer took several, reuses the
 * buffers of every slot the consumer released, not only the last one: with the bound at 8 and
 * bursts of 4, it used to allocate about 3 new buffers a burst until the ring's 65 slots each
 * had their own (the CI run under load that held 19 buffers for a bound of 8). */
START_TEST(test_a_prefetch_refilled_in_bursts_reuses_the_released_buffers) {
    int64_t shape[2] = {64, 256};
    dist_tensor *t = NULL;
    ck_assert_int_eq(dist_tensor_create(DIST_F32, 2, shape, &t), DIST_OK);
    for (int64_t i = 0; i < 64 * 256; i++) ((float *)t->data)[i] = (float)(i % 1000);
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&t, 1, 1, &ds), DIST_OK);
    dist_tensor_destroy(t);
    CHAIN(ds, dist_dataset_batch(ds, 64, 0, &next_)); /* one element of 64 KB */
    CHAIN(ds, dist_dataset_repeat(ds, 160, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, DIST_AUTOTUNE, &next_));
    iter_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    atomic_init(&ctx.skipped, 0);
    ctx.top = ds;
    pthread_mutex_init(&ctx.tune_mu, NULL);
    data_autotune_record(&ctx, ds, 8); /* as an earlier pass would have left it */
    node_it *it = NULL;
    ck_assert_int_eq(node_it_create(ds, &ctx, 0, &it), DIST_OK);
    int count = 0;
    for (;;) {
        if (count % 4 == 0) { /* the producer fills the buffer up again: 4 slots at once */
            struct timespec pause = {0, 20 * 1000 * 1000};
            nanosleep(&pause, NULL);
        }
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(node_it_next(it, &el, &eos), DIST_OK);
        if (eos) break;
        ck_assert(((float *)el.items[0]->data)[1001] == 1.0f);
        count++;
    }
    ck_assert_int_eq(count, 160);
    const int64_t element = (int64_t)64 << 10;
    int64_t held = 0;
    ck_assert_int_eq(prefetch_it_held_bytes(it, &held), DIST_OK);
    int bound = data_autotune_start(&ctx, ds, 0);
    ck_assert_msg(held <= (bound + 3) * element,
                  "the prefetch holds %lld buffers of 64 KB with a bound of %d elements",
                  (long long)(held / element), bound);
    node_it_destroy(it);
    pthread_mutex_destroy(&ctx.tune_mu);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_prefetch_held_bytes_refuses_an_iterator_of_another_kind) {
    dist_dataset *ds = range_ds(3);
    iter_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    atomic_init(&ctx.skipped, 0);
    ctx.top = ds;
    pthread_mutex_init(&ctx.tune_mu, NULL);
    node_it *it = NULL;
    ck_assert_int_eq(node_it_create(ds, &ctx, 0, &it), DIST_OK);
    int64_t held = -1;
    ck_assert_int_eq(prefetch_it_held_bytes(it, &held), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(held, -1);
    node_it_destroy(it);
    pthread_mutex_destroy(&ctx.tune_mu);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_transformations_take_their_own_reference) {
    dist_dataset *src = range_ds(5), *b = NULL;
    ck_assert_int_eq(dist_dataset_batch(src, 2, 0, &b), DIST_OK);
    dist_dataset_destroy(src); /* b keeps the source alive */
    char buf[64];
    render_ds(b, buf, sizeof buf);
    ck_assert_str_eq(buf, "[0,1] [2,3] [4]");
    dist_dataset_destroy(b);
}
END_TEST

/* A file reader for the interleave tests: path "k" -> k repeated 6 times (TF's example
 * Dataset.range(1, 6).interleave(lambda x: from_tensors(x).repeat(6), 2, 4)). "bad" fails. */
static dist_status repeat6_reader(const char *path, void *user, dist_dataset **out) {
    (void)user;
    if (strcmp(path, "bad") == 0) return DIST_IO;
    int64_t shape[1] = {6};
    dist_tensor *t = NULL;
    dist_status st = dist_tensor_create(DIST_I32, 1, shape, &t);
    if (st != DIST_OK) return st;
    for (int i = 0; i < 6; i++) ((int32_t *)t->data)[i] = atoi(path);
    st = dist_dataset_from_tensor_slices(&t, 1, 1, out);
    dist_tensor_destroy(t);
    return st;
}

static void interleave_render(const char *const *paths, int n, int parallel, int skip, char *buf,
                              size_t size) {
    dist_interleave_options o = DIST_INTERLEAVE_OPTIONS_INIT;
    o.cycle_length = 2;
    o.block_length = 4;
    o.num_parallel = parallel;
    o.skip_bad = skip;
    o.name = "repeat6";
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_files(paths, n, repeat6_reader, NULL, &o, &ds), DIST_OK);
    render_ds(ds, buf, size);
    dist_dataset_destroy(ds);
}

START_TEST(test_interleave_matches_tf_documented_order) {
    const char *paths[5] = {"1", "2", "3", "4", "5"};
    const char *tf = "1 1 1 1 2 2 2 2 1 1 2 2 3 3 3 3 4 4 4 4 3 3 4 4 5 5 5 5 5 5";
    char buf[512];
    interleave_render(paths, 5, 1, 0, buf, sizeof buf);
    ck_assert_str_eq(buf, tf);
    interleave_render(paths, 5, 4, 0, buf, sizeof buf);
    ck_assert_str_eq(buf, tf);
}
END_TEST

START_TEST(test_interleave_bad_file_errors_or_is_skipped) {
    const char *paths[3] = {"1", "bad", "2"};
    char buf[512];
    interleave_render(paths, 3, 1, 1, buf, sizeof buf);
    ck_assert_str_eq(buf, "1 1 1 1 2 2 2 2 1 1 2 2");
    dist_interleave_options o = DIST_INTERLEAVE_OPTIONS_INIT;
    dist_dataset *ds = NULL;
    ck_assert_int_eq(dist_dataset_from_files(paths, 3, repeat6_reader, NULL, &o, &ds), DIST_OK);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    dist_element el;
    int eos = 0;
    ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
    ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_IO);
    ck_assert_msg(strstr(dist_last_error(), "file 'bad'"), "%s", dist_last_error());
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

static int g_map_calls;

static dist_status count_calls(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    __atomic_fetch_add(&g_map_calls, 1, __ATOMIC_RELAXED);
    *(int32_t *)out->items[0]->data = *(int32_t *)in->items[0]->data + 100;
    return DIST_OK;
}

static dist_status identity_fn(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    *(int32_t *)out->items[0]->data = *(int32_t *)in->items[0]->data;
    return DIST_OK;
}

static dist_status keep_all(const dist_element *in, int *keep, void *user) {
    (void)in, (void)user;
    *keep = 1;
    return DIST_OK;
}

/* Over an in-memory source (and take, filter and repeat above it) the shuffle buffer keeps
 * views of the source's rows instead of copies: the same order as over a map's copies, each
 * element's data the source's own row, valid after later elements were drawn. */
START_TEST(test_shuffle_over_a_memory_source_keeps_views_in_the_same_order) {
    enum { N = 300, B = 64, E = 3 };
    static int32_t rows[N];
    for (int i = 0; i < N; i++) rows[i] = i;
    int64_t shape[1] = {N};
    dist_tensor t = dist_tensor_view(rows, DIST_I32, 1, shape);
    dist_tensor *tp = &t;
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    dist_dataset *views = NULL, *copies = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&tp, 1, 0, &views), DIST_OK);
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&tp, 1, 0, &copies), DIST_OK);
    CHAIN(views, dist_dataset_take(views, N - 10, &next_));
    CHAIN(views, dist_dataset_filter(views, keep_all, NULL, "keep_all", &next_));
    CHAIN(views, dist_dataset_shuffle(views, B, 5, 1, &next_));
    CHAIN(views, dist_dataset_repeat(views, 2, &next_));
    CHAIN(copies, dist_dataset_take(copies, N - 10, &next_));
    CHAIN(copies, dist_dataset_map(copies, identity_fn, NULL, &o, &next_));
    CHAIN(copies, dist_dataset_shuffle(copies, B, 5, 1, &next_));
    CHAIN(copies, dist_dataset_repeat(copies, 2, &next_));
    dist_iterator *a = NULL, *b = NULL;
    ck_assert_int_eq(dist_iterator_create(views, &a), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(copies, &b), DIST_OK);
    static const int32_t *seen[2 * (N - 10)];
    for (int e = 0; e < E; e++) {
        int n = 0, moved = 0;
        for (;;) {
            dist_element ea, eb;
            int enda = 0, endb = 0;
            ck_assert_int_eq(dist_iterator_next(a, &ea, &enda), DIST_OK);
            ck_assert_int_eq(dist_iterator_next(b, &eb, &endb), DIST_OK);
            ck_assert_int_eq(enda, endb);
            if (enda) break;
            const int32_t *p = ea.items[0]->data;
            ck_assert_int_eq(*p, *(int32_t *)eb.items[0]->data);
            ck_assert_ptr_eq(p, &rows[*p]); /* the source's row itself: no copy */
            ck_assert_int_eq(ea.items[0]->ndim, 0);
            ck_assert_int_eq(ea.items[0]->owns, 0);
            moved += *p != n % (N - 10);
            seen[n++] = p;
        }
        ck_assert_int_eq(n, 2 * (N - 10));
        ck_assert_int_gt(moved, N / 2);
        /* each pass of the repeat is a permutation of the first N - 10 rows */
        int count[N] = {0};
        for (int i = 0; i < n; i++) count[*seen[i]]++;
        for (int i = 0; i < N; i++) ck_assert_int_eq(count[i], i < N - 10 ? 2 : 0);
        ck_assert_int_eq(dist_iterator_reset(a), DIST_OK);
        ck_assert_int_eq(dist_iterator_reset(b), DIST_OK);
    }
    dist_iterator_destroy(a);
    dist_iterator_destroy(b);
    dist_dataset_destroy(views);
    dist_dataset_destroy(copies);
}
END_TEST

START_TEST(test_memory_cache_serves_the_second_epoch) {
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    dist_dataset *ds = range_ds(10);
    CHAIN(ds, dist_dataset_map(ds, count_calls, NULL, &o, &next_));
    CHAIN(ds, dist_dataset_cache(ds, NULL, &next_));
    CHAIN(ds, dist_dataset_shuffle(ds, 10, 1, 1, &next_));
    g_map_calls = 0;
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    int a[10], b[10];
    read_ints(it, a, 10);
    ck_assert_int_eq(g_map_calls, 10);
    ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
    read_ints(it, b, 10);
    ck_assert_int_eq(g_map_calls, 10); /* epoch 1 came from the cache */
    int sa = 0, sb = 0;
    for (int i = 0; i < 10; i++) sa += a[i], sb += b[i];
    ck_assert_int_eq(sa, 1045);
    ck_assert_int_eq(sb, 1045);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

/* A map whose cost varies with the value (busy work, so threads finish out of order). */
static dist_status slow_square_fn(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    int32_t v = *(int32_t *)in->items[0]->data;
    volatile uint32_t x = (uint32_t)v;
    for (int i = 0; i < 200 * (v % 7); i++) x = x * 1664525u + 1013904223u;
    *(int32_t *)out->items[0]->data = v * v + (int32_t)(x & 0);
    return DIST_OK;
}

static dist_dataset *slow_squares(int n, int parallel, int prefetch) {
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    o.num_parallel = parallel;
    dist_dataset *ds = range_ds(n);
    CHAIN(ds, dist_dataset_map(ds, slow_square_fn, NULL, &o, &next_));
    CHAIN(ds, dist_dataset_batch(ds, 7, 0, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, prefetch, &next_));
    return ds;
}

/* Two epochs of AUTOTUNE against fixed settings: the same batches, in the same order. */
START_TEST(test_autotune_yields_what_fixed_settings_yield_in_the_same_order) {
    static char fixed[65536], tuned[65536], wide[65536];
    dist_dataset *a = slow_squares(3000, 1, 1),
                 *b = slow_squares(3000, DIST_AUTOTUNE, DIST_AUTOTUNE),
                 *c = slow_squares(3000, 3, 8);
    ck_assert_str_eq(dist_dataset_describe(b), "prefetch(AUTOTUNE) <- batch(7,0) <- map <- "
                                               "slices(int32(3000,))");
    dist_iterator *ia = NULL, *ib = NULL, *ic = NULL;
    ck_assert_int_eq(dist_iterator_create(a, &ia), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(b, &ib), DIST_OK);
    ck_assert_int_eq(dist_iterator_create(c, &ic), DIST_OK);
    for (int epoch = 0; epoch < 2; epoch++) {
        render(ia, fixed, sizeof fixed);
        render(ib, tuned, sizeof tuned);
        render(ic, wide, sizeof wide);
        ck_assert_str_eq(fixed, tuned);
        ck_assert_str_eq(fixed, wide);
        ck_assert_ptr_nonnull(strstr(tuned, " [8976016,8982009,8988004,8994001]")); /* 2996^2.. */
        ck_assert_int_eq(dist_iterator_reset(ia), DIST_OK);
        ck_assert_int_eq(dist_iterator_reset(ib), DIST_OK);
        ck_assert_int_eq(dist_iterator_reset(ic), DIST_OK);
    }
    dist_autotune_state t;
    ck_assert_int_eq(dist_iterator_autotune(ib, &t), DIST_OK);
    ck_assert_int_eq(t.prefetch_stages, 1);
    ck_assert_int_eq(t.map_stages, 1);
    ck_assert_int_ge(t.prefetch_buffer, 1);
    ck_assert_int_le(t.prefetch_buffer, DIST_AUTOTUNE_PREFETCH_MAX);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    ck_assert_int_ge(t.map_parallel, 1);
    ck_assert_int_le(t.map_parallel, cores < DIST_AUTOTUNE_MAP_MAX ? cores : DIST_AUTOTUNE_MAP_MAX);
    ck_assert_int_eq(dist_iterator_autotune(ia, &t), DIST_OK);
    ck_assert_int_eq(t.prefetch_stages + t.map_stages, 0); /* fixed settings are not tuned */
    dist_iterator_destroy(ia);
    dist_iterator_destroy(ib);
    dist_iterator_destroy(ic);
    dist_dataset_destroy(a);
    dist_dataset_destroy(b);
    dist_dataset_destroy(c);
}
END_TEST

/* A consumer that never waits on its own work starves a 1-thread map: it grows, within the
 * cores. */
START_TEST(test_autotune_grows_a_starved_map_within_the_cores) {
    dist_dataset *ds = slow_squares(7 * 400, DIST_AUTOTUNE, DIST_AUTOTUNE);
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    char buf[65536];
    render(it, buf, sizeof buf);
    dist_autotune_state t;
    ck_assert_int_eq(dist_iterator_autotune(it, &t), DIST_OK);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores >= 2) ck_assert_int_ge(t.map_parallel, 2);
    ck_assert_int_le(t.map_parallel, cores < DIST_AUTOTUNE_MAP_MAX ? cores : DIST_AUTOTUNE_MAP_MAX);
    ck_assert_int_ge(t.prefetch_buffer, 1);
    ck_assert_int_le(t.prefetch_buffer, DIST_AUTOTUNE_PREFETCH_MAX);
    /* the next epoch starts where this one ended */
    int before = t.map_parallel;
    ck_assert_int_eq(dist_iterator_reset(it), DIST_OK);
    ck_assert_int_eq(dist_iterator_autotune(it, &t), DIST_OK);
    ck_assert_int_eq(t.map_parallel, before);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

static dist_status sleepy_copy(const dist_element *in, dist_element *out, void *user) {
    struct timespec ts = {0, *(const long *)user};
    nanosleep(&ts, NULL);
    *(int32_t *)out->items[0]->data = *(int32_t *)in->items[0]->data;
    return DIST_OK;
}

/* range(n) -> a map sleeping `ns` per element on `parallel` threads -> prefetch(AUTOTUNE); the
 * consumer sleeps `pause_ns` after every `every`th element; returns what AUTOTUNE chose. */
static dist_autotune_state tuned_run(int n, long ns, int parallel, int every, long pause_ns) {
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_I32;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    if (parallel) o.num_parallel = parallel;
    dist_dataset *ds = range_ds(n);
    CHAIN(ds, dist_dataset_map(ds, sleepy_copy, &ns, &o, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, DIST_AUTOTUNE, &next_));
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    for (int i = 0; i < n; i++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
        ck_assert_int_eq(*(int32_t *)el.items[0]->data, i);
        if (pause_ns && i % every == every - 1) nanosleep(&(struct timespec){0, pause_ns}, NULL);
    }
    dist_autotune_state t;
    ck_assert_int_eq(dist_iterator_autotune(it, &t), DIST_OK);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
    return t;
}

/* The tuned prefetch buffer of a map of the default parallelism, with a pause every 8th. */
static int tuned_prefetch(int n, long ns, long pause_ns) {
    return tuned_run(n, ns, 0, 8, pause_ns).prefetch_buffer;
}

/* The tuned parallelism of an AUTOTUNE map whose consumer sleeps `consumer_ns` per element. */
static int tuned_map_below_prefetch(int n, long ns, long consumer_ns) {
    return tuned_run(n, ns, DIST_AUTOTUNE, 1, consumer_ns).map_parallel;
}

/* Below a prefetch the map always looks behind (the prefetch's thread asks as soon as it has
 * room), so its tuner follows the pipeline's consumer: a consumer slower than one map thread
 * (4 ms against 0.2 ms per element, as a training step on the same cores) never waits, and the
 * map keeps one thread; a consumer that takes each element at once waits, and the map grows. */
START_TEST(test_autotune_map_below_a_prefetch_follows_the_pipelines_consumer) {
    ck_assert_int_eq(tuned_map_below_prefetch(100, 200000, 4000000), 1);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores >= 2) ck_assert_int_ge(tuned_map_below_prefetch(400, 500000, 0), 2);
}
END_TEST

/* A bursty consumer (3 ms pauses) of a steady producer (0.1 ms per element): the producer fills
 * the buffer during a pause and the consumer then empties it, so the buffer grows. A producer
 * slower than the consumer (1 ms per element, no pauses) never fills it: depth would not help,
 * and the buffer stays small (at most 4 allows for the consumer being descheduled twice). */
START_TEST(test_autotune_prefetch_grows_for_a_bursty_consumer_not_for_a_slow_producer) {
    int bursty = tuned_prefetch(240, 100000, 3000000);
    ck_assert_int_gt(bursty, 1);
    ck_assert_int_le(bursty, DIST_AUTOTUNE_PREFETCH_MAX);
    int slow = tuned_prefetch(100, 1000000, 0);
    ck_assert_int_le(slow, 4);
}
END_TEST

static dist_status fill_33mib(const dist_element *in, dist_element *out, void *user) {
    (void)user;
    memset(out->items[0]->data, *(int32_t *)in->items[0]->data, dist_tensor_bytes(out->items[0]));
    return DIST_OK;
}

/* Elements of 33 MiB: two would pass the 64 MiB budget, so the buffer stays at 1 however
 * long the consumer waits. */
START_TEST(test_autotune_prefetch_keeps_to_the_memory_budget) {
    dist_element_spec spec = {0};
    spec.count = 1;
    spec.dtype[0] = DIST_U8;
    spec.ndim[0] = 1;
    spec.shape[0][0] = (int64_t)33 << 20;
    dist_map_options o = DIST_MAP_OPTIONS_INIT;
    o.output_spec = &spec;
    dist_dataset *ds = range_ds(8);
    CHAIN(ds, dist_dataset_map(ds, fill_33mib, NULL, &o, &next_));
    CHAIN(ds, dist_dataset_prefetch(ds, DIST_AUTOTUNE, &next_));
    dist_iterator *it = NULL;
    ck_assert_int_eq(dist_iterator_create(ds, &it), DIST_OK);
    for (int i = 0; i < 8; i++) {
        dist_element el;
        int eos = 0;
        ck_assert_int_eq(dist_iterator_next(it, &el, &eos), DIST_OK);
        ck_assert_int_eq(((uint8_t *)el.items[0]->data)[12345], i);
    }
    dist_autotune_state t;
    ck_assert_int_eq(dist_iterator_autotune(it, &t), DIST_OK);
    ck_assert_int_eq(t.prefetch_buffer, 1);
    dist_iterator_destroy(it);
    dist_dataset_destroy(ds);
}
END_TEST

START_TEST(test_prefetch_refuses_0_and_minus_2_naming_autotune) {
    dist_dataset *ds = range_ds(3), *out = NULL;
    ck_assert_int_eq(dist_dataset_prefetch(ds, 0, &out), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_dataset_prefetch(ds, -2, &out), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "DIST_AUTOTUNE"));
    ck_assert_ptr_null(out);
    dist_dataset_destroy(ds);
}
END_TEST

static Suite *data_suite(void) {
    Suite *s = suite_create("data");
    TCase *tc = tcase_create("pipeline");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_batch_10_by_4_keeps_remainder_4_4_2);
    tcase_add_test(tc, test_batch_drop_remainder_drops_the_partial_batch);
    tcase_add_test(tc, test_shuffle_buffer_1_is_identity);
    tcase_add_test(tc, test_shuffle_is_a_permutation_within_the_buffer_window);
    tcase_add_test(tc, test_shuffle_seed_and_reshuffle_each_iteration);
    tcase_add_test(tc, test_shuffle_over_a_memory_source_keeps_views_in_the_same_order);
    tcase_add_test(tc, test_auto_shard_data_12_elements_2_workers_batch_4);
    tcase_add_test(tc, test_auto_shard_off_every_worker_sees_everything);
    tcase_add_test(tc, test_auto_shard_file_without_files_is_not_found);
    tcase_add_test(tc, test_rebatch_splits_global_batches_like_the_tf_guide);
    tcase_add_test(tc, test_take_skip_repeat_shard);
    tcase_add_test(tc, test_cardinality_follows_tf);
    tcase_add_test(tc, test_image_normalize_shapes_and_values);
    tcase_add_test(tc, test_save_restore_resumes_the_rest_of_the_epoch_exactly);
    tcase_add_test(tc, test_restore_into_another_pipeline_names_the_mismatch);
    tcase_add_test(tc, test_parallel_map_keeps_order_and_errors);
    tcase_add_test(tc, test_prefetch_destroyed_mid_epoch_joins_cleanly);
    tcase_add_test(tc, test_prefetch_over_batch_gives_the_batches_unchanged);
    tcase_add_test(tc, test_autotuned_prefetch_keeps_buffers_for_its_bound_not_its_capacity);
    tcase_add_test(tc, test_a_prefetch_refilled_in_bursts_reuses_the_released_buffers);
    tcase_add_test(tc, test_prefetch_held_bytes_refuses_an_iterator_of_another_kind);
    tcase_add_test(tc, test_autotune_yields_what_fixed_settings_yield_in_the_same_order);
    tcase_add_test(tc, test_autotune_grows_a_starved_map_within_the_cores);
    tcase_add_test(tc, test_autotune_map_below_a_prefetch_follows_the_pipelines_consumer);
    tcase_add_test(tc, test_autotune_prefetch_grows_for_a_bursty_consumer_not_for_a_slow_producer);
    tcase_add_test(tc, test_autotune_prefetch_keeps_to_the_memory_budget);
    tcase_add_test(tc, test_prefetch_refuses_0_and_minus_2_naming_autotune);
    tcase_add_test(tc, test_transformations_take_their_own_reference);
    tcase_add_test(tc, test_interleave_matches_tf_documented_order);
    tcase_add_test(tc, test_interleave_bad_file_errors_or_is_skipped);
    tcase_add_test(tc, test_memory_cache_serves_the_second_epoch);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return dist_test_run(data_suite()); }
