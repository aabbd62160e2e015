/* The classifier's training step as a parameter-server closure (dist/train.h). */
#include "core/error.h"
#include "dist/train.h"

dist_status dist_classifier_train_closure(dist_strategy *s, dist_distributed_iterator *it,
                                          const dist_tensor *const *args, int num_args, void *user,
                                          dist_tensor **results, int *num_results) {
    (void)args;
    (void)num_args;
    DIST_CHECK_ARG(s && user && results && num_results,
                   "dist_classifier_train_closure: NULL argument");
    DIST_CHECK_ARG(it, "dist_classifier_train_closure: schedule it with a per-worker dataset");
    dist_classifier_step *cs = user;
    dist_per_replica_element batch;
    int end = 0;
    DIST_TRY(dist_distributed_iterator_next(it, &batch, &end));
    if (end) { /* each worker repeats its own dataset (TF's dataset.repeat()) */
        DIST_TRY(dist_distributed_iterator_reset(it));
        DIST_TRY(dist_distributed_iterator_next(it, &batch, &end));
        if (end)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "dist_classifier_train_closure: the per-worker dataset is empty");
    }
    cs->global_batch_size = batch.global_batch_size;
    dist_per_replica out;
    DIST_TRY(dist_strategy_run(s, dist_classifier_train_step, cs, &batch, &out));
    int64_t shape[1] = {3};
    dist_tensor *r = NULL;
    DIST_TRY(dist_tensor_create(DIST_F32, 1, shape, &r));
    dist_status st = DIST_OK;
    for (int i = 0; i < 3 && st == DIST_OK; i++) {
        dist_tensor *v = NULL;
        st = dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, i, -1, &v);
        if (st == DIST_OK)
            ((float *)r->data)[i] = v->dtype == DIST_F32   ? *(const float *)v->data
                                    : v->dtype == DIST_I64 ? (float)*(const int64_t *)v->data
                                                           : (float)*(const int32_t *)v->data;
        dist_tensor_destroy(v);
    }
    if (st != DIST_OK) {
        dist_tensor_destroy(r);
        return st;
    }
    results[0] = r;
    *num_results = 1;
    return DIST_OK;
}
