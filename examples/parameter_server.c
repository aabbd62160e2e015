/* ParameterServerStrategy with the cluster coordinator, in C (dist/ps.h).
 *
 * Every task of the cluster runs this program with its TF_CONFIG (jobs chief, worker, ps)
 * and the same cluster token in $DIST_CLUSTER_TOKEN:
 *   - ps tasks hold the variables and apply the optimizer;
 *   - workers build the same model, then serve the closures the chief schedules;
 *   - the chief builds the model (its initial values go to the ps tasks), schedules `steps`
 *     training steps as closures, waits for them, fetches the last loss, and evaluates the
 *     model it reads back from the ps tasks on the test set.
 *
 * usage: parameter_server [steps]   (default 200)
 * tests/cli/ps_cluster.py starts a local cluster of it: ps_cluster.py --workers 2 --ps 1 --
 *   ./parameter_server 200 */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PER_WORKER_BATCH 64

typedef struct task {
    dist_model *model;
    dist_optimizer *optimizer;
    dist_mnist *mnist;
} task;

static int check(dist_status st, const char *what) {
    if (st == DIST_OK) return 0;
    fprintf(stderr, "parameter_server: %s: %s\n", what, dist_last_error());
    return 1;
}

/* The per-worker dataset: this worker's own shuffle of the training images, batched per
 * replica. Each worker calls it with its input context. */
static dist_status make_dataset(const dist_input_context *ctx, void *user, dist_dataset **out) {
    task *t = user;
    int64_t per_replica = 0;
    DIST_RETURN_IF_ERROR(
        dist_input_context_per_replica_batch_size(ctx, PER_WORKER_BATCH, &per_replica));
    dist_tensor images = *dist_mnist_train_images(t->mnist);
    dist_tensor labels = *dist_mnist_train_labels(t->mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    DIST_RETURN_IF_ERROR(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    dist_status st = dist_dataset_map_image_normalize(ds, &next);
    dist_dataset_destroy(ds), ds = next;
    if (st == DIST_OK)
        st = dist_dataset_shuffle(ds, 10000, 7 + (uint64_t)ctx->input_pipeline_id, 1, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st == DIST_OK) st = dist_dataset_batch(ds, per_replica, 1, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st != DIST_OK) {
        dist_dataset_destroy(ds);
        return st;
    }
    *out = ds;
    return DIST_OK;
}

/* The closure: one training step on this worker's next batch. Before run() the worker pulls
 * the variables from the ps tasks; apply_gradients pushes the gradients to them. Returns
 * [loss, correct, examples]. */
static dist_status train_closure(dist_strategy *s, dist_distributed_iterator *it,
                                 const dist_tensor *const *args, int num_args, void *user,
                                 dist_tensor **results, int *num_results) {
    (void)args, (void)num_args;
    task *t = user;
    dist_per_replica_element batch;
    int end = 0;
    DIST_RETURN_IF_ERROR(dist_distributed_iterator_next(it, &batch, &end));
    if (end) { /* repeat: the next epoch of this worker's dataset */
        DIST_RETURN_IF_ERROR(dist_distributed_iterator_reset(it));
        DIST_RETURN_IF_ERROR(dist_distributed_iterator_next(it, &batch, &end));
    }
    dist_classifier_step step = {t->model, t->optimizer, 0, NULL};
    dist_per_replica out;
    DIST_RETURN_IF_ERROR(dist_strategy_run(s, dist_classifier_train_step, &step, &batch, &out));
    int64_t shape[1] = {3};
    DIST_RETURN_IF_ERROR(dist_tensor_create(DIST_F32, 1, shape, &results[0]));
    *num_results = 1;
    for (int i = 0; i < 3; i++) {
        dist_tensor *v;
        DIST_RETURN_IF_ERROR(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, i, -1, &v));
        ((float *)results[0]->data)[i] =
            v->dtype == DIST_F32 ? *(float *)v->data : (float)*(int64_t *)v->data;
        dist_tensor_destroy(v);
    }
    return DIST_OK;
}

/* The chief's evaluation: the variables as the ps tasks hold them, on the test set. */
static int evaluate(dist_strategy *s, task *t) {
    dist_tensor images = *dist_mnist_test_images(t->mnist);
    dist_tensor labels = *dist_mnist_test_labels(t->mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    if (check(dist_dataset_from_tensor_slices(parts, 2, 0, &ds), "test data")) return 1;
    if (check(dist_dataset_map_image_normalize(ds, &next), "test data")) return 1;
    dist_dataset_destroy(ds), ds = next;
    if (check(dist_dataset_batch(ds, 256, 0, &next), "test data")) return 1;
    dist_dataset_destroy(ds), ds = next;
    dist_distributed_dataset *dds;
    if (check(dist_strategy_distribute_dataset(s, ds, &dds), "test data")) return 1;
    dist_logs logs;
    int rc = check(dist_evaluate(s, t->model, dds, NULL, NULL, 0, &logs), "evaluating");
    double acc = 0, loss = 0;
    if (!rc && dist_logs_get(&logs, "accuracy", &acc) && dist_logs_get(&logs, "loss", &loss))
        printf("test accuracy %.4f, test loss %.4f\n", acc, loss);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    return rc;
}

static int run_chief(dist_strategy *s, task *t, long steps) {
    dist_coordinator *c;
    int ds = -1;
    if (check(dist_coordinator_create(s, NULL, &c), "creating the coordinator")) return 1;
    int rc = check(dist_coordinator_create_per_worker_dataset(c, "mnist", &ds), "dataset");
    dist_remote_value *last = NULL;
    double loss = 0, correct = 0, seen = 0;
    for (long i = 0; i < steps && !rc; i++) {
        dist_remote_value *v;
        rc = check(dist_coordinator_schedule(c, "train", ds, NULL, 0, &v), "scheduling");
        if (rc) break;
        dist_remote_value_release(last);
        last = v;
        if ((i + 1) % 50 == 0 || i + 1 == steps) {
            rc = check(dist_coordinator_join(c), "joining");
            const dist_tensor *r;
            if (!rc) rc = check(dist_remote_value_fetch(last, 0, &r), "fetching");
            if (!rc) {
                const float *f = r->data;
                loss = f[0], correct = f[1], seen = f[2];
                printf("step %ld: loss %.4f, batch accuracy %.4f\n", i + 1, loss, correct / seen);
            }
        }
    }
    dist_remote_value_release(last);
    dist_coordinator_stats st;
    dist_coordinator_get_stats(c, &st);
    printf("closures: %lld scheduled, %lld completed, %lld re-queued\n", (long long)st.scheduled,
           (long long)st.completed, (long long)st.requeued);
    if (!rc) rc = evaluate(s, t);
    if (check(dist_coordinator_shutdown_cluster(c), "shutting down")) rc = 1;
    dist_coordinator_destroy(c);
    return rc;
}

/* The library's log (a re-queued closure, a worker that rejoined) on stderr. */
static void print_log(dist_log_level level, const char *message, void *user) {
    (void)user;
    fprintf(stderr, "%s: %s\n",
            level == DIST_LOG_ERROR  ? "error"
            : level == DIST_LOG_WARN ? "warning"
                                     : "info",
            message);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress lines as they happen, also into a pipe */
    dist_set_log_callback(print_log, DIST_LOG_INFO, NULL);
    long steps = argc > 1 ? strtol(argv[1], NULL, 10) : 200;
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_PARAMETER_SERVER;
    dist_strategy *s;
    if (check(dist_strategy_create(&so, &s), "creating the strategy")) return 1;
    const char *role = dist_strategy_task_type(s);
    task t = {0};
    int rc = 0;
    /* every task registers the same names: the chief schedules them, workers run them */
    if (check(dist_mnist_load(NULL, &t.mnist), "loading MNIST") ||
        check(dist_strategy_register_function(s, "train", train_closure, &t), "registering") ||
        check(dist_strategy_register_dataset_function(s, "mnist", make_dataset, &t), "registering"))
        rc = 1;
    if (!rc && strcmp(role, "ps") == 0) {
        rc = check(dist_strategy_serve(s), "serving the variables");
    } else if (!rc) {
        int64_t shape[3] = {28, 28, 1};
        dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
        rc = check(dist_strategy_scope_enter(s), "scope") ||
             check(dist_model_create_mnist_cnn(&t.model), "model") ||
             check(dist_model_build(t.model, 3, shape, 42), "building the model") ||
             check(dist_optimizer_create_adam(&adam, &t.optimizer), "optimizer") ||
             check(dist_strategy_scope_exit(s), "scope");
        if (!rc && strcmp(role, "worker") == 0)
            rc = check(dist_strategy_serve(s), "serving closures");
        else if (!rc)
            rc = run_chief(s, &t, steps);
    }
    printf("%s/%d: done\n", role, dist_strategy_task_index(s));
    dist_optimizer_destroy(t.optimizer);
    dist_model_destroy(t.model);
    dist_mnist_destroy(t.mnist);
    dist_strategy_destroy(s);
    return rc;
}
