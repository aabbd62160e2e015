/* The replica context API: dist_get_replica_context / dist_in_cross_replica_context where TF's
 * get_replica_context / in_cross_replica_context answer, merge_call (a value summed across the
 * replicas inside a step, then used; failures on either side), distribute_values_from_function
 * and distribute_dataset's input options. merge_call across workers: unit.multi_worker. */
#include "dist/strategy.h"
#include "testutil.h"

#include <stdatomic.h>
#include <string.h>
#include <time.h>

static dist_strategy *make(dist_strategy_kind kind, const char *devices) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = kind;
    o.devices = devices;
    o.threads_per_replica = 1;
    o.collective_timeout_s = 20;
    dist_strategy *s = NULL;
    dist_status st = dist_strategy_create(&o, &s);
    ck_assert_msg(st == DIST_OK, "create: %s", dist_last_error());
    return s;
}

/* A float32 [2] tensor of the replica's tape holding a, b. */
static dist_status pair(dist_replica_ctx *rc, float a, float b, dist_tensor **out) {
    float v[2] = {a, b};
    int64_t shape[1] = {2};
    dist_tensor host = dist_tensor_view(v, DIST_F32, 1, shape);
    return dist_tape_upload(dist_replica_tape(rc), &host, out);
}

typedef struct merge_state {
    atomic_int calls;
    atomic_int wrong_context; /* a merge function that saw a replica context */
    int fail;                 /* the merge function fails */
} merge_state;

/* Sums every replica's values (dist_strategy_reduce) and writes the sum into each. */
static dist_status sum_into_each(dist_strategy *s, dist_per_replica *values, void *user) {
    merge_state *m = user;
    atomic_fetch_add(&m->calls, 1);
    if (dist_get_replica_context() != NULL || !dist_in_cross_replica_context())
        atomic_fetch_add(&m->wrong_context, 1);
    if (m->fail) return dist_error_for_test(DIST_INVALID_ARGUMENT, "the merge function refused");
    for (int i = 0; i < values->count; i++) {
        dist_tensor *sum = NULL;
        DIST_TRY_TEST(dist_strategy_reduce(s, DIST_REDUCE_SUM, values, i, -1, &sum));
        for (int r = 0; r < values->num_replicas; r++)
            memcpy(values->values[r][i]->data, sum->data, dist_tensor_bytes(sum));
        dist_tensor_destroy(sum);
    }
    return DIST_OK;
}

typedef struct step_state {
    merge_state merge;
    dist_replica_ctx *seen[8];
    int cross_inside[8];
    int fail_replica; /* this replica fails before merge_call; -1 none */
    int odd_count;    /* replica 1 gives another number of tensors */
} step_state;

/* Replica r gives [r + 1, 10 (r + 1)]; after the merge each holds the sum and returns it times
 * its own replica id + 1, computed on its tape (the merged value used by the step). */
static dist_status merging_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    (void)in;
    step_state *st = user;
    int r = dist_replica_id_in_sync_group(rc);
    st->seen[r] = dist_get_replica_context();
    st->cross_inside[r] = dist_in_cross_replica_context();
    if (r == st->fail_replica)
        return dist_error_for_test(DIST_INVALID_ARGUMENT, "this replica gives up");
    dist_tensor *v = NULL, *w = NULL, *scaled = NULL;
    DIST_TRY_TEST(pair(rc, (float)(r + 1), 10.0f * (float)(r + 1), &v));
    DIST_TRY_TEST(pair(rc, 1.0f, 2.0f, &w));
    dist_tensor *args[2] = {v, w};
    int count = st->odd_count && r == 1 ? 1 : 2;
    DIST_TRY_TEST(dist_replica_merge_call(rc, sum_into_each, &st->merge, args, count));
    /* a second merge in the same step meets again */
    DIST_TRY_TEST(dist_replica_merge_call(rc, sum_into_each, &st->merge, &w, 1));
    DIST_TRY_TEST(dist_op_scale(dist_replica_tape(rc), v, (float)(r + 1), &scaled));
    out->count = 2;
    out->items[0] = scaled;
    out->items[1] = w;
    return DIST_OK;
}

START_TEST(test_merge_call_sums_across_replicas_and_the_step_uses_the_sum) {
    const struct {
        dist_strategy_kind kind;
        const char *devices;
        int replicas;
    } cases[3] = {{DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1", 2},
                  {DIST_STRATEGY_ONE_DEVICE, "cpu:0", 1},
                  {DIST_STRATEGY_CENTRAL_STORAGE, "cpu:0,cpu:1", 2}};
    for (int c = 0; c < 3; c++) {
        dist_strategy *s = make(cases[c].kind, cases[c].devices);
        int n = cases[c].replicas;
        step_state st;
        memset(&st, 0, sizeof st);
        st.fail_replica = -1;
        ck_assert_ptr_null(dist_get_replica_context());
        ck_assert_int_eq(dist_in_cross_replica_context(), 0);
        ck_assert_int_eq(dist_strategy_scope_enter(s), DIST_OK);
        ck_assert_int_eq(dist_in_cross_replica_context(), 1); /* in the scope, outside run */
        dist_per_replica out;
        dist_status rs = dist_strategy_run(s, merging_step, &st, NULL, &out);
        ck_assert_msg(rs == DIST_OK, "run: %s", dist_last_error());
        ck_assert_int_eq(dist_strategy_scope_exit(s), DIST_OK);
        /* the sum over replicas: [1 + 2, 10 + 20] (mirrored), [1, 10] (one replica) */
        float sum0 = n == 2 ? 3.0f : 1.0f, sum1 = n == 2 ? 30.0f : 10.0f;
        for (int r = 0; r < n; r++) {
            const float *v = out.values[r][0]->data, *w = out.values[r][1]->data;
            ck_assert_float_eq(v[0], sum0 * (float)(r + 1));
            ck_assert_float_eq(v[1], sum1 * (float)(r + 1));
            /* w was summed twice: [1, 2] -> n [1, 2] -> n^2 [1, 2] */
            ck_assert_float_eq(w[0], (float)(n * n));
            ck_assert_float_eq(w[1], 2.0f * (float)(n * n));
            ck_assert_ptr_nonnull(st.seen[r]); /* the step's own context */
            ck_assert_int_eq(st.cross_inside[r], 0);
        }
        ck_assert_int_eq(atomic_load(&st.merge.calls),
                         2); /* once per merge_call, not per replica */
        ck_assert_int_eq(atomic_load(&st.merge.wrong_context), 0);
        if (n == 2) ck_assert_ptr_ne(st.seen[0], st.seen[1]);
        ck_assert_ptr_eq(dist_replica_strategy(st.seen[0]), s);
        ck_assert_ptr_null(dist_get_replica_context()); /* left again after the run */
        dist_strategy_destroy(s);
    }
}
END_TEST

START_TEST(test_merge_call_failures_reach_every_replica_without_a_hang) {
    dist_strategy *s = make(DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1");
    step_state st;
    /* the merge function fails: both replicas return its error */
    memset(&st, 0, sizeof st);
    st.fail_replica = -1;
    st.merge.fail = 1;
    ck_assert_int_eq(dist_strategy_run(s, merging_step, &st, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "the merge function refused"));
    ck_assert_int_eq(atomic_load(&st.merge.calls), 1);
    /* a replica fails before merge_call: the other does not wait forever */
    for (int bad = 0; bad < 2; bad++) {
        memset(&st, 0, sizeof st);
        st.fail_replica = bad;
        ck_assert_int_eq(dist_strategy_run(s, merging_step, &st, NULL, NULL),
                         DIST_INVALID_ARGUMENT);
        ck_assert_msg(strstr(dist_last_error(), "gives up") != NULL, "%s", dist_last_error());
        ck_assert_int_eq(atomic_load(&st.merge.calls), 0);
    }
    /* replicas disagreeing on the number of tensors */
    memset(&st, 0, sizeof st);
    st.fail_replica = -1;
    st.odd_count = 1;
    ck_assert_int_eq(dist_strategy_run(s, merging_step, &st, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "replica 1 gave 1 tensors, replica 0 2"));
    /* and the strategy still runs merges afterwards */
    memset(&st, 0, sizeof st);
    st.fail_replica = -1;
    ck_assert_int_eq(dist_strategy_run(s, merging_step, &st, NULL, NULL), DIST_OK);
    ck_assert_int_eq(atomic_load(&st.merge.calls), 2);
    dist_strategy_destroy(s);
}
END_TEST

static dist_status nested_merge(dist_strategy *s, dist_per_replica *values, void *user) {
    (void)s, (void)values;
    dist_replica_ctx *rc = user;
    return dist_replica_merge_call(rc, nested_merge, rc, NULL, 0);
}

static dist_status nesting_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    (void)in, (void)user, (void)out;
    DIST_TRY_TEST(dist_replica_merge_call(rc, nested_merge, rc, NULL, 0));
    return DIST_OK;
}

START_TEST(test_merge_call_refuses_bad_arguments_and_nesting) {
    dist_strategy *s = make(DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1");
    ck_assert_int_eq(dist_strategy_run(s, nesting_step, NULL, NULL, NULL), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "called from a merge function"));
    ck_assert_int_eq(dist_replica_merge_call(NULL, nested_merge, NULL, NULL, 0),
                     DIST_INVALID_ARGUMENT);
    dist_strategy_destroy(s);
}
END_TEST

/* Replica id r gets [r, 100 + r] as two tensors. */
static dist_status values_of(const dist_value_context *ctx, void *user, dist_element *out) {
    int *calls = user;
    (*calls)++;
    if (ctx->num_replicas_in_sync != 2) return dist_error_for_test(DIST_INTERNAL, "not 2 replicas");
    int64_t one[1] = {1};
    DIST_TRY_TEST(dist_tensor_create(DIST_F32, 1, one, &out->items[0]));
    out->count = 1;
    DIST_TRY_TEST(dist_tensor_create(DIST_I32, 0, NULL, &out->items[1]));
    out->count = 2;
    *(float *)out->items[0]->data = (float)ctx->replica_id_in_sync_group;
    *(int32_t *)out->items[1]->data = 100 + ctx->replica_id_in_sync_group;
    return DIST_OK;
}

static dist_status echo_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                             dist_element *out) {
    (void)rc, (void)user;
    *out = *in;
    return DIST_OK;
}

static dist_status no_value(const dist_value_context *ctx, void *user, dist_element *out) {
    (void)user, (void)out;
    if (ctx->replica_id_in_sync_group == 1)
        return dist_error_for_test(DIST_NOT_FOUND, "no value here");
    int64_t one[1] = {1};
    DIST_TRY_TEST(dist_tensor_create(DIST_F32, 1, one, &out->items[0]));
    out->count = 1;
    return DIST_OK;
}

START_TEST(test_values_from_function_reach_each_replica_through_run) {
    dist_strategy *s = make(DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1");
    dist_per_replica_element v;
    int calls = 0;
    ck_assert_int_eq(dist_strategy_distribute_values_from_function(s, values_of, &calls, &v),
                     DIST_OK);
    ck_assert_int_eq(calls, 2);
    ck_assert_int_eq(v.num_replicas, 2);
    dist_per_replica out;
    ck_assert_int_eq(dist_strategy_run(s, echo_step, NULL, &v, &out), DIST_OK);
    for (int r = 0; r < 2; r++) {
        ck_assert_float_eq(*(const float *)out.values[r][0]->data, (float)r);
        ck_assert_int_eq(*(const int32_t *)out.values[r][1]->data, 100 + r);
    }
    dist_per_replica_element_release(&v);
    ck_assert_int_eq(v.num_replicas, 0);
    /* a function that fails for replica 1: named, and replica 0's value freed (ASan) */
    ck_assert_int_eq(dist_strategy_distribute_values_from_function(s, no_value, NULL, &v),
                     DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "replica 1"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "no value here"));
    dist_strategy_destroy(s);
}
END_TEST

static dist_status counting_copy(const dist_element *in, dist_element *out, void *user) {
    atomic_fetch_add((atomic_int *)user, 1);
    memcpy(out->items[0]->data, in->items[0]->data, dist_tensor_bytes(in->items[0]));
    return DIST_OK;
}

/* range(8) as float [1] elements, counted as the pipeline makes them, in global batches of 2. */
static dist_dataset *counted_batches(float *x, atomic_int *made) {
    for (int i = 0; i < 8; i++) x[i] = (float)i;
    int64_t shape[2] = {8, 1};
    dist_tensor t = dist_tensor_view(x, DIST_F32, 2, shape), *tp = &t;
    dist_dataset *ds = NULL, *m = NULL, *b = NULL;
    ck_assert_int_eq(dist_dataset_from_tensor_slices(&tp, 1, 0, &ds), DIST_OK);
    dist_element_spec spec = {.count = 1, .dtype = {DIST_F32}, .ndim = {1}, .shape = {{1}}};
    dist_map_options mo = DIST_MAP_OPTIONS_INIT;
    mo.output_spec = &spec;
    ck_assert_int_eq(dist_dataset_map(ds, counting_copy, made, &mo, &m), DIST_OK);
    ck_assert_int_eq(dist_dataset_batch(m, 2, 0, &b), DIST_OK);
    dist_dataset_destroy(ds);
    dist_dataset_destroy(m);
    return b;
}

/* Reads the first global batch; returns the elements the pipeline has made once `want` are
 * made or 5 s have passed. */
static int made_after_first(dist_strategy *s, dist_dataset *b, const dist_input_options *o,
                            atomic_int *made, int want) {
    dist_distributed_dataset *dds = NULL;
    ck_assert_int_eq(dist_strategy_distribute_dataset_with_options(s, b, o, &dds), DIST_OK);
    dist_distributed_iterator *it = NULL;
    ck_assert_int_eq(dist_distributed_dataset_iterator(dds, &it), DIST_OK);
    dist_per_replica_element e;
    int end = 0;
    ck_assert_int_eq(dist_distributed_iterator_next(it, &e, &end), DIST_OK);
    ck_assert_float_eq(*(const float *)e.replicas[0].items[0]->data, 0.0f);
    ck_assert_float_eq(*(const float *)e.replicas[1].items[0]->data, 1.0f);
    for (int k = 0; k < 500 && atomic_load(made) < want; k++)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    int n = atomic_load(made);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    return n;
}

START_TEST(test_input_options_buffer_ahead_and_keep_cpu_batches_on_the_host) {
    dist_strategy *s = make(DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1");
    float x[8];
    atomic_int made;
    atomic_init(&made, 0);
    dist_dataset *b = counted_batches(x, &made);
    /* no buffer: the pipeline made the one batch that was taken */
    ck_assert_int_eq(made_after_first(s, b, NULL, &made, 2), 2);
    /* 3 batches ahead (and the host batches of CPU replicas): 4 batches = every element */
    atomic_store(&made, 0);
    dist_input_options o = DIST_INPUT_OPTIONS_INIT;
    o.per_replica_buffer_size = 3;
    o.fetch_to_device = 0;
    ck_assert_int_eq(made_after_first(s, b, &o, &made, 8), 8);
    dist_distributed_dataset *dds = NULL;
    o.per_replica_buffer_size = 0;
    ck_assert_int_eq(dist_strategy_distribute_dataset_with_options(s, b, &o, &dds),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "per_replica_buffer_size 0"));
    o = (dist_input_options)DIST_INPUT_OPTIONS_INIT;
    o.version = 7;
    ck_assert_int_eq(dist_strategy_distribute_dataset_with_options(s, b, &o, &dds),
                     DIST_INVALID_ARGUMENT);
    dist_dataset_destroy(b);
    dist_strategy_destroy(s);
}
END_TEST

int main(void) {
    Suite *s = suite_create("replica_context");
    TCase *tc = tcase_create("replica_context");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_merge_call_sums_across_replicas_and_the_step_uses_the_sum);
    tcase_add_test(tc, test_merge_call_failures_reach_every_replica_without_a_hang);
    tcase_add_test(tc, test_merge_call_refuses_bad_arguments_and_nesting);
    tcase_add_test(tc, test_values_from_function_reach_each_replica_through_run);
    tcase_add_test(tc, test_input_options_buffer_ahead_and_keep_cpu_batches_on_the_host);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
