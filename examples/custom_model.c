/* A model that is not a stack: a small residual network with SyncBatchNorm and a custom loss,
 * trained on MNIST under a mirrored strategy of two CPU replicas.
 *
 *   x [28,28,1] -> stem: Conv2D(8, 3, strides 2, same, relu)            -> s [14,14,8]
 *   s -> block_a: Conv2D(8, 3, same) -> BatchNormalization(sync) -> relu
 *     -> block_b: Conv2D(8, 3, same) -> BatchNormalization(sync)         -> f
 *   relu(s + f)  (the skip connection: dist_op_add_activation, the add and its ReLU in one op)
 *     -> head: AveragePooling2D(2) -> Flatten -> Dense(64, relu) -> Dense(10) -> logits
 *
 * The stem and the two blocks are Sequential models (each with its variables in one buffer and
 * its own optimizer); the head is written with tape ops on four strategy variables
 * (dist_strategy_create_variable: the two dense kernels and biases), trained by one Adam through
 * dist_optimizer_apply_to_variables, as Keras's optimizer.apply_gradients(zip(grads, vars)).
 * The step wires them together. The loss is cross-entropy with label smoothing 0.1, built
 * from the tape's math ops: (1 - e) * CE(y) + e * mean_k(-log_softmax(logits)_k).
 * SyncBatchNorm normalizes every replica's half of the batch with the statistics of the whole
 * global batch (all-reduced through the replica context), as Keras's synchronized=True; its
 * momentum is 0.9 rather than Keras's 0.99, so that the moving statistics used at test time
 * settle within the few hundred steps this example trains.
 *
 * Every op runs on every executor (the op set, src/backend/ops.h): the same network trains
 * under mirrored on CPU replicas and under tpu, compiled into one XLA program.
 *
 * usage: custom_model [epochs] [options]   (default 5 epochs); prints the test accuracy
 *   --strategy mirrored|tpu    (default mirrored: two CPU replicas; tpu: two devices of
 *                              --pjrt-plugin PATH, the partial last batch dropped)
 *   --dropout RATE             a Dropout layer after block_b's BatchNormalization (default 0)
 *   --global-clipnorm NORM     Keras's global_clipnorm on every optimizer (default off)
 *   --steps N                  train N steps only, print each step's loss (%.9g), no test */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GLOBAL_BATCH 32
#define SMOOTHING 0.1f
#define NPARTS 3 /* stem, block_a, block_b */
#define NHEAD 4  /* head: dense/kernel [392, 64], dense/bias, dense_1/kernel [64, 10], dense_1/bias */

static float g_dropout, g_clipnorm; /* --dropout, --global-clipnorm */

typedef struct net {
    dist_model *part[NPARTS];
    dist_optimizer *opt[NPARTS];
    dist_variable *head[NHEAD];
    dist_optimizer *head_opt;
    int64_t global_batch;
    /* every part's variables and gradient views per replica, for one gradient pass */
    int nvars;
    dist_tensor *vars[2][64];
    dist_tensor grad_views[2][64];
    dist_tensor *grads[2][64];
} net;

/* The forward pass of the whole network on this replica's tape. */
static dist_status forward(net *n, dist_replica_ctx *rc, dist_tape *t, const dist_tensor *x,
                           dist_tensor **logits) {
    dist_tensor *s, *a, *f, *h, *pooled, *flat, *hidden;
    DIST_RETURN_IF_ERROR(dist_model_call(n->part[0], t, x, &s));
    DIST_RETURN_IF_ERROR(dist_model_call(n->part[1], t, s, &a));
    DIST_RETURN_IF_ERROR(dist_op_relu(t, a, &a));
    DIST_RETURN_IF_ERROR(dist_model_call(n->part[2], t, a, &f));
    /* the skip connection and its ReLU, one op (the bits of dist_op_add then dist_op_relu) */
    DIST_RETURN_IF_ERROR(dist_op_add_activation(t, s, f, DIST_ACT_RELU, &h));
    /* the head: this replica's copies of the strategy variables */
    dist_tensor *w[NHEAD];
    for (int i = 0; i < NHEAD; i++) w[i] = dist_variable_local(n->head[i], rc);
    DIST_RETURN_IF_ERROR(dist_op_avg_pool2d(t, h, 2, 2, 2, 2, DIST_PADDING_VALID, &pooled));
    DIST_RETURN_IF_ERROR(dist_op_flatten(t, pooled, &flat));
    DIST_RETURN_IF_ERROR(dist_op_dense(t, flat, w[0], w[1], DIST_ACT_RELU, &hidden));
    return dist_op_dense(t, hidden, w[2], w[3], DIST_ACT_LINEAR, logits);
}

/* Cross-entropy with label smoothing, per example. */
static dist_status smoothed_loss(dist_tape *t, const dist_tensor *logits, const dist_tensor *labels,
                                 dist_tensor **per_example) {
    dist_tensor *ce, *logp, *mean_logp, *a, *b;
    int last = -1;
    DIST_RETURN_IF_ERROR(dist_op_sparse_softmax_cross_entropy(t, logits, labels, &ce));
    DIST_RETURN_IF_ERROR(dist_op_log_softmax(t, logits, &logp));
    DIST_RETURN_IF_ERROR(dist_op_reduce_mean_axes(t, logp, 1, &last, 0, &mean_logp));
    DIST_RETURN_IF_ERROR(dist_op_scale(t, ce, 1.0f - SMOOTHING, &a));
    DIST_RETURN_IF_ERROR(dist_op_scale(t, mean_logp, -SMOOTHING, &b));
    return dist_op_add(t, a, b, per_example);
}

static dist_status train_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    net *n = user;
    dist_tape *t = dist_replica_tape(rc);
    /* the replica copies of this process (under tpu one: the step is traced on replica 0) */
    int r = dist_replica_id_in_sync_group(rc);
    dist_tensor *logits, *per_example, *loss;
    /* the tape computes gradients for what it watches: the head's copies (the models' own
     * variables are watched by dist_model_call) */
    for (int i = 0; i < NHEAD; i++)
        DIST_RETURN_IF_ERROR(dist_tape_watch(t, dist_variable_local(n->head[i], rc)));
    DIST_RETURN_IF_ERROR(forward(n, rc, t, in->items[0], &logits));
    DIST_RETURN_IF_ERROR(smoothed_loss(t, logits, in->items[1], &per_example));
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(t, per_example, n->global_batch, &loss));
    /* one backward pass for every variable: the parts' into their gradient buffers, the
     * head's into tensors of the tape's arena */
    dist_tensor *sources[64 + NHEAD], *grads[64 + NHEAD];
    for (int k = 0; k < n->nvars; k++) {
        sources[k] = n->vars[r][k];
        grads[k] = n->grads[r][k];
    }
    for (int i = 0; i < NHEAD; i++) {
        dist_tensor *w = dist_variable_local(n->head[i], rc);
        sources[n->nvars + i] = w;
        DIST_RETURN_IF_ERROR(dist_tape_alloc(t, DIST_F32, w->ndim, w->shape, &grads[n->nvars + i]));
    }
    DIST_RETURN_IF_ERROR(dist_tape_gradient(t, loss, n->nvars + NHEAD, sources, grads));
    for (int p = 0; p < NPARTS; p++) /* all-reduce each part's gradients, then Adam */
        DIST_RETURN_IF_ERROR(dist_optimizer_apply_gradients(n->opt[p], n->part[p], t));
    /* the head's gradients: all-reduced together, then Adam on every replica's copies */
    DIST_RETURN_IF_ERROR(dist_optimizer_apply_to_variables(
        n->head_opt, t, NHEAD, n->head, (const dist_tensor *const *)(grads + n->nvars)));
    out->count = 1;
    out->items[0] = loss;
    return DIST_OK;
}

/* Inference: the tape does not record, so BatchNormalization uses its moving statistics. */
static dist_status eval_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                             dist_element *out) {
    net *n = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *logits, *correct;
    dist_tape_set_recording(t, 0);
    dist_status st = forward(n, rc, t, in->items[0], &logits);
    if (st == DIST_OK) st = dist_op_accuracy_count(t, logits, in->items[1], &correct);
    dist_tape_set_recording(t, 1);
    DIST_RETURN_IF_ERROR(st);
    out->count = 1;
    out->items[0] = correct;
    return DIST_OK;
}

static int check(dist_status st, const char *what) {
    if (st == DIST_OK) return 0;
    fprintf(stderr, "custom_model: %s: %s\n", what, dist_last_error());
    return 1;
}

/* The head's variables in the strategy's scope. Their initial values are Keras's Dense
 * initializers (glorot_uniform kernels, zero biases), drawn here by a throwaway Sequential
 * model of the same shapes outside the scope; any initializer would do. */
static dist_status create_head(dist_strategy *s, net *n) {
    dist_model *init;
    int64_t in[3] = {14, 14, 8};
    DIST_RETURN_IF_ERROR(dist_model_create("head", &init));
    dist_status st = dist_model_add_average_pool2d(init, 2, 0, DIST_PADDING_VALID);
    if (st == DIST_OK) st = dist_model_add_flatten(init);
    if (st == DIST_OK) st = dist_model_add_dense(init, 64, DIST_ACT_RELU);
    if (st == DIST_OK) st = dist_model_add_dense(init, 10, DIST_ACT_LINEAR);
    if (st == DIST_OK) st = dist_model_build(init, 3, in, 45);
    float *w = malloc((size_t)dist_model_num_params(init) * sizeof *w);
    if (st == DIST_OK && !w) st = DIST_OUT_OF_MEMORY;
    if (st == DIST_OK) st = dist_model_get_weights(init, 0, w, dist_model_num_params(init));
    if (st == DIST_OK) st = dist_strategy_scope_enter(s);
    int64_t off = 0;
    for (int i = 0; i < NHEAD && st == DIST_OK; i++) {
        const dist_tensor *v = dist_model_variable(init, 0, i);
        st = dist_strategy_create_variable(s, dist_model_variable_name(init, i), v->ndim, v->shape,
                                           w + off, DIST_AGGREGATION_MEAN, DIST_SYNC_ON_WRITE,
                                           &n->head[i]);
        off += dist_tensor_numel(v);
    }
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (st == DIST_OK) st = dist_optimizer_create_adam(&adam, &n->head_opt);
    if (st == DIST_OK && g_clipnorm > 0)
        st = dist_optimizer_set_clipping(n->head_opt, 0, 0, g_clipnorm);
    if (st == DIST_OK) st = dist_strategy_scope_exit(s);
    free(w);
    dist_model_destroy(init);
    return st;
}

static dist_status build_parts(net *n) {
    dist_conv2d_options c = DIST_CONV2D_OPTIONS_INIT;
    dist_batch_norm_options bn = DIST_BATCH_NORM_OPTIONS_INIT;
    bn.synchronized = 1;
    bn.momentum = 0.9f;
    const char *names[NPARTS] = {"stem", "block_a", "block_b"};
    for (int p = 0; p < NPARTS; p++) DIST_RETURN_IF_ERROR(dist_model_create(names[p], &n->part[p]));
    c.filters = 8;
    c.padding = DIST_PADDING_SAME;
    c.stride_h = c.stride_w = 2;
    c.activation = DIST_ACT_RELU;
    DIST_RETURN_IF_ERROR(dist_model_add_conv2d_ex(n->part[0], &c));
    c.stride_h = c.stride_w = 1;
    c.activation = DIST_ACT_LINEAR;
    for (int p = 1; p <= 2; p++) {
        DIST_RETURN_IF_ERROR(dist_model_add_conv2d_ex(n->part[p], &c));
        DIST_RETURN_IF_ERROR(dist_model_add_batch_normalization(n->part[p], &bn));
    }
    DIST_RETURN_IF_ERROR(dist_model_add_dropout(n->part[2], g_dropout, 46));
    int64_t image[3] = {28, 28, 1}, features[3] = {14, 14, 8};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    for (int p = 0; p < NPARTS; p++) {
        DIST_RETURN_IF_ERROR(dist_model_build(n->part[p], 3, p == 0 ? image : features, 42 + p));
        DIST_RETURN_IF_ERROR(dist_optimizer_create_adam(&adam, &n->opt[p]));
        if (g_clipnorm > 0)
            DIST_RETURN_IF_ERROR(dist_optimizer_set_clipping(n->opt[p], 0, 0, g_clipnorm));
    }
    return DIST_OK;
}

/* The variables of every part and views of their gradients, per replica. */
static dist_status list_variables(net *n, int replicas) {
    for (int r = 0; r < replicas; r++) {
        int k = 0;
        for (int p = 0; p < NPARTS; p++) {
            dist_model *m = n->part[p];
            const float *params = dist_model_params(m, r)->data;
            float *grads = dist_model_grads(m, r)->data;
            for (int i = 0; i < dist_model_num_variables(m); i++, k++) {
                if (k == 64) {
                    fprintf(stderr, "custom_model: more than 64 variables\n");
                    return DIST_INVALID_ARGUMENT;
                }
                const dist_tensor *v = dist_model_variable(m, r, i);
                n->vars[r][k] = (dist_tensor *)v;
                n->grad_views[r][k] = dist_tensor_view(grads + ((const float *)v->data - params),
                                                       DIST_F32, v->ndim, v->shape);
                n->grad_views[r][k].device = v->device;
                n->grads[r][k] = &n->grad_views[r][k];
            }
        }
        n->nvars = k;
    }
    return DIST_OK;
}

/* images and labels -> normalized float32 -> (shuffled) -> GLOBAL batches, distributed. */
static dist_status pipeline(dist_strategy *s, const dist_tensor *images, const dist_tensor *labels,
                            int shuffle, int drop_remainder, dist_dataset **ds,
                            dist_distributed_dataset **dds) {
    dist_tensor x = *images, y = *labels;
    dist_tensor *parts[2] = {&x, &y};
    dist_dataset *d, *next;
    DIST_RETURN_IF_ERROR(dist_dataset_from_tensor_slices(parts, 2, 0, &d));
    DIST_RETURN_IF_ERROR(dist_dataset_map_image_normalize(d, &next));
    dist_dataset_destroy(d), d = next;
    if (shuffle) {
        DIST_RETURN_IF_ERROR(dist_dataset_shuffle(d, 10000, 7, 1, &next));
        dist_dataset_destroy(d), d = next;
    }
    DIST_RETURN_IF_ERROR(dist_dataset_batch(d, GLOBAL_BATCH, drop_remainder, &next));
    dist_dataset_destroy(d), d = next;
    *ds = d;
    return dist_strategy_distribute_dataset(s, d, dds);
}

/* The test accuracy over the test batches (under tpu the partial last batch is dropped: the
 * accuracy is over the examples evaluated). */
static int evaluate(dist_strategy *strategy, net *n, dist_distributed_dataset *test) {
    dist_distributed_iterator *it;
    double correct = 0;
    int64_t total = 0;
    if (check(dist_distributed_dataset_iterator(test, &it), "iterating")) return 1;
    for (;;) {
        dist_per_replica_element batch;
        dist_per_replica results;
        int end = 0;
        if (check(dist_distributed_iterator_next(it, &batch, &end), "reading a batch")) return 1;
        if (end) break;
        for (int r = 0; r < batch.num_replicas; r++) total += batch.replicas[r].items[0]->shape[0];
        dist_tensor *count;
        if (check(dist_strategy_run(strategy, eval_step, n, &batch, &results), "evaluating") ||
            check(dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &count),
                  "reducing"))
            return 1;
        correct += *(float *)count->data;
        dist_tensor_destroy(count);
    }
    dist_distributed_iterator_destroy(it);
    printf("test accuracy: %.4f (%.0f of %lld)\n", correct / (double)(total ? total : 1), correct,
           (long long)total);
    return 0;
}

int main(int argc, char **argv) {
    int epochs = 5, tpu = 0;
    long max_steps = -1;
    const char *plugin = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--strategy") && v) {
            tpu = !strcmp(v, "tpu");
            if (!tpu && strcmp(v, "mirrored")) break;
        } else if (!strcmp(a, "--pjrt-plugin") && v) {
            plugin = v;
        } else if (!strcmp(a, "--dropout") && v) {
            g_dropout = (float)atof(v);
        } else if (!strcmp(a, "--global-clipnorm") && v) {
            g_clipnorm = (float)atof(v);
        } else if (!strcmp(a, "--steps") && v) {
            max_steps = atol(v);
        } else if (a[0] != '-' && i == 1) {
            epochs = atoi(a);
            continue;
        } else {
            fprintf(stderr, "custom_model: unknown or incomplete option '%s' (see the file's "
                            "header for the usage)\n", a);
            return 2;
        }
        i++;
    }
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT; /* mirrored */
    if (tpu) {
        so.kind = DIST_STRATEGY_TPU;
        so.tpu.pjrt_plugin = plugin;
        so.tpu.cores = 2;
    } else {
        so.devices = "cpu:0,cpu:1";
        so.threads_per_replica = 1;
    }
    dist_strategy *strategy;
    if (check(dist_strategy_create(&so, &strategy), "creating the strategy")) return 1;
    int replicas = dist_strategy_num_replicas_in_sync(strategy);
    printf("replicas in sync: %d\n", replicas);

    net n = {0};
    if (check(dist_strategy_scope_enter(strategy), "entering the scope") ||
        check(build_parts(&n), "building the network") ||
        check(dist_strategy_scope_exit(strategy), "leaving the scope") ||
        check(create_head(strategy, &n), "creating the head's variables") ||
        check(list_variables(&n, dist_model_num_replicas(n.part[0])), "listing the variables"))
        return 1;

    dist_mnist *mnist;
    dist_dataset *train_ds, *test_ds;
    dist_distributed_dataset *train, *test;
    if (check(dist_mnist_load(NULL, &mnist), "loading MNIST") ||
        check(pipeline(strategy, dist_mnist_train_images(mnist), dist_mnist_train_labels(mnist), 1,
                       tpu, &train_ds, &train),
              "the training data") ||
        check(pipeline(strategy, dist_mnist_test_images(mnist), dist_mnist_test_labels(mnist), 0,
                       tpu, &test_ds, &test),
              "the test data"))
        return 1;

    long total_steps = 0;
    for (int e = 0; e < epochs && total_steps != max_steps; e++) {
        dist_distributed_iterator *it;
        if (check(dist_distributed_dataset_iterator(train, &it), "iterating")) return 1;
        double loss_sum = 0;
        long steps = 0;
        for (;;) {
            dist_per_replica_element batch;
            dist_per_replica results;
            int end = 0;
            if (check(dist_distributed_iterator_next(it, &batch, &end), "reading a batch"))
                return 1;
            if (end || total_steps == max_steps) break;
            n.global_batch = 0;
            for (int r = 0; r < batch.num_replicas; r++)
                n.global_batch += batch.replicas[r].items[0]->shape[0];
            dist_tensor *loss;
            if (check(dist_strategy_run(strategy, train_step, &n, &batch, &results), "training") ||
                check(dist_strategy_reduce(strategy, DIST_REDUCE_SUM, &results, 0, -1, &loss),
                      "reducing"))
                return 1;
            loss_sum += *(float *)loss->data;
            steps++;
            if (max_steps >= 0) printf("step %ld: loss %.9g\n", ++total_steps, *(float *)loss->data);
            dist_tensor_destroy(loss);
        }
        dist_distributed_iterator_destroy(it);
        printf("epoch %d: mean loss %.4f over %ld steps\n", e + 1, loss_sum / (double)steps, steps);
    }

    if (max_steps < 0 && evaluate(strategy, &n, test)) return 1;

    dist_distributed_dataset_destroy(test);
    dist_distributed_dataset_destroy(train);
    dist_dataset_destroy(test_ds);
    dist_dataset_destroy(train_ds);
    dist_mnist_destroy(mnist);
    for (int p = 0; p < NPARTS; p++) {
        dist_optimizer_destroy(n.opt[p]);
        dist_model_destroy(n.part[p]);
    }
    for (int i = 0; i < NHEAD; i++) dist_variable_destroy(n.head[i]);
    dist_optimizer_destroy(n.head_opt);
    dist_strategy_destroy(strategy);
    return 0;
}
