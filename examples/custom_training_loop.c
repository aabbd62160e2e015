/* The custom-training-loop pattern of tf.distribute, in C, in six steps:
 *
 *   1. create a strategy (MirroredStrategy: one replica per CPU core, or per GPU);
 *   2. create the model and the optimizer inside the strategy's scope (mirrored variables);
 *   3. build an input pipeline batched by the GLOBAL batch size and distribute it;
 *   4. write the step: forward pass on a gradient tape, per-example loss scaled by the global
 *      batch (compute_average_loss), gradients, apply (the optimizer all-reduces them);
 *   5. run the step on every replica with strategy.run;
 *   6. reduce the per-replica results (strategy.reduce) for metrics.
 *
 * usage: custom_training_loop [steps]   (default: one epoch of the built-in MNIST subset) */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>

#define GLOBAL_BATCH 64

typedef struct train_state {
    dist_model *model;
    dist_optimizer *optimizer;
    int64_t global_batch; /* this step's global batch (the last one of an epoch is smaller) */
} train_state;

/* 4. The step. It runs once per replica, on that replica's thread and device; `in` holds the
 * replica's share of the global batch, already on its device. */
static dist_status train_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    train_state *s = user;
    dist_tape *tape = dist_replica_tape(rc); /* this replica's tape, reset for the step */
    dist_tensor *logits, *per_example_loss, *loss;
    DIST_RETURN_IF_ERROR(dist_model_call(s->model, tape, in->items[0], &logits));
    DIST_RETURN_IF_ERROR(
        dist_op_sparse_softmax_cross_entropy(tape, logits, in->items[1], &per_example_loss));
    /* Divide by the GLOBAL batch, not the replica's: summing the replicas' gradients then gives
     * the gradient of the mean loss over the whole batch. */
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(tape, per_example_loss, s->global_batch, &loss));
    DIST_RETURN_IF_ERROR(dist_model_compute_gradients(s->model, tape, loss));
    /* All-reduces (SUM) the gradient buffer across replicas, then applies Adam on every replica. */
    DIST_RETURN_IF_ERROR(dist_optimizer_apply_gradients(s->optimizer, s->model, tape));
    out->count = 1;
    out->items[0] = loss; /* this replica's share of the mean loss */
    return DIST_OK;
}

static int check(dist_status st, const char *what) {
    if (st == DIST_OK) return 0;
    fprintf(stderr, "custom_training_loop: %s: %s\n", what, dist_last_error());
    return 1;
}

int main(int argc, char **argv) {
    long max_steps = argc > 1 ? strtol(argv[1], NULL, 10) : 0;

    /* 1. The strategy. */
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    dist_strategy *strategy;
    if (check(dist_strategy_create(&so, &strategy), "creating the strategy")) return 1;
    printf("replicas in sync: %d\n", dist_strategy_num_replicas_in_sync(strategy));

    /* 2. Model and optimizer in the strategy's scope. */
    train_state state = {0};
    int64_t input_shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (check(dist_strategy_scope_enter(strategy), "entering the scope") ||
        check(dist_model_create_mnist_cnn(&state.model), "creating the model") ||
        check(dist_model_build(state.model, 3, input_shape, 42), "building the model") ||
        check(dist_optimizer_create_adam(&adam, &state.optimizer), "creating the optimizer") ||
        check(dist_strategy_scope_exit(strategy), "leaving the scope"))
        return 1;

    /* 3. Data: MNIST -> float32 [28,28,1] -> shuffle -> GLOBAL batch -> prefetch, distributed. */
    dist_mnist *mnist;
    if (check(dist_mnist_load(NULL, &mnist), "loading MNIST")) return 1;
    dist_tensor images = *dist_mnist_train_images(mnist), labels = *dist_mnist_train_labels(mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    if (check(dist_dataset_from_tensor_slices(parts, 2, 0, &ds), "slicing")) return 1;
    if (check(dist_dataset_map_image_normalize(ds, &next), "normalizing")) return 1;
    dist_dataset_destroy(ds), ds = next;
    if (check(dist_dataset_shuffle(ds, 10000, 42, 1, &next), "shuffling")) return 1;
    dist_dataset_destroy(ds), ds = next;
    if (check(dist_dataset_batch(ds, GLOBAL_BATCH, 0, &next), "batching")) return 1;
    dist_dataset_destroy(ds), ds = next;
    if (check(dist_dataset_prefetch(ds, 2, &next), "prefetching")) return 1;
    dist_dataset_destroy(ds), ds = next;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    if (check(dist_strategy_distribute_dataset(strategy, ds, &dds), "distributing") ||
        check(dist_distributed_dataset_iterator(dds, &it), "iterating"))
        return 1;

    /* 5 and 6. The loop: run the step on every replica, reduce the loss. */
    double loss_sum = 0;
    long steps = 0;
    for (;;) {
        dist_per_replica_element batch;
        dist_per_replica results;
        int end = 0;
        if (check(dist_distributed_iterator_next(it, &batch, &end), "reading a batch")) return 1;
        if (end || (max_steps > 0 && steps == max_steps)) break;
        state.global_batch = 0;
        for (int r = 0; r < batch.num_replicas; r++)
            state.global_batch += batch.replicas[r].items[0]->shape[0];
        if (check(dist_strategy_run(strategy, train_step, &state, &batch, &results),
                  "running the step"))
            return 1;
        dist_tensor *loss;
        if (check(dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &loss),
                  "reducing"))
            return 1;
        loss_sum += *(float *)loss->data;
        dist_tensor_destroy(loss);
        if (++steps % 25 == 0)
            printf("step %ld: mean loss %.4f\n", steps, loss_sum / 25), loss_sum = 0;
    }
    printf("trained %ld steps\n", steps);

    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_mnist_destroy(mnist);
    dist_optimizer_destroy(state.optimizer);
    dist_model_destroy(state.model);
    dist_strategy_destroy(strategy);
    return 0;
}
