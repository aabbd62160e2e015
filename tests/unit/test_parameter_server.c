/* The parameter_server strategy in one process: the ps tasks and a worker are threads with
 * their own strategies (their TF_CONFIG in options.cluster.spec), the test is the chief. Real
 * sockets on 127.0.0.1, the cluster token in DIST_CLUSTER_TOKEN. Pins TF's placement rules,
 * the round trip of values through the ps tasks, the coordinator's API and its errors. */
#include "testutil.h"

#include <dist/dist.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_TASKS 8

typedef struct cluster {
    int workers, ps;
    char spec[2048]; /* the "cluster" object */
    pthread_t threads[MAX_TASKS];
    int nthreads;
    dist_status served[MAX_TASKS];
    dist_partitioner partitioner;
    int use_partitioner;
    int linear; /* every task also makes the linear classifier's strategy variables */
    int bn;     /* the model: Conv2D + BatchNormalization + Dense instead of the seed CNN */
} cluster;

static dist_mnist *g_mnist;

/* Ports from the OS (bind to port 0). They must be in the cluster spec before the tasks
 * start, and each task binds its own listener (the library cannot be handed a socket), so the
 * picking sockets stay bound, not listening, with SO_REUSEADDR, until the next cluster: the
 * library's listener (SO_REUSEADDR too) may bind the same port beside them, while the kernel
 * gives the port to no other socket that binds port 0 or connects (a -j2 run once lost a port
 * to another test in the window that closing them left). Repeating a run, as run_all does,
 * would mean restarting the test's threads; holding the port needs no repeat. */
static int g_port_fds[MAX_TASKS];
static int g_port_count;

static void free_ports(int n, int *ports) {
    for (int i = 0; i < g_port_count; i++) close(g_port_fds[i]);
    g_port_count = 0;
    for (int i = 0; i < n; i++) ports[i] = dist_test_hold_port(&g_port_fds[g_port_count++]);
}

static void cluster_init(cluster *c, int workers, int ps) {
    memset(c, 0, sizeof *c);
    c->workers = workers;
    c->ps = ps;
    int ports[MAX_TASKS];
    free_ports(1 + workers + ps, ports);
    size_t n = (size_t)snprintf(c->spec, sizeof c->spec,
                                "{\"chief\":[\"127.0.0.1:%d\"],\"worker\":[", ports[0]);
    for (int i = 0; i < workers; i++)
        n += (size_t)snprintf(c->spec + n, sizeof c->spec - n, "%s\"127.0.0.1:%d\"", i ? "," : "",
                              ports[1 + i]);
    n += (size_t)snprintf(c->spec + n, sizeof c->spec - n, "],\"ps\":[");
    for (int j = 0; j < ps; j++)
        n += (size_t)snprintf(c->spec + n, sizeof c->spec - n, "%s\"127.0.0.1:%d\"", j ? "," : "",
                              ports[1 + workers + j]);
    snprintf(c->spec + n, sizeof c->spec - n, "]}");
    setenv("DIST_CLUSTER_TOKEN", "test_parameter_server-token-0123456789", 1);
}

static dist_strategy_options options_for(const cluster *c, const char *type, int index, char *buf,
                                         size_t cap) {
    snprintf(buf, cap, "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}", c->spec, type,
             index);
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_PARAMETER_SERVER;
    o.cluster.spec = buf;
    o.threads_per_replica = 1;
    o.cluster.connect_timeout_s = 30;
    if (c->use_partitioner) o.ps.variable_partitioner = &c->partitioner;
    return o;
}

/* ---- the tasks on threads ---- */

typedef struct task_arg {
    cluster *c;
    const char *type;
    int index;
    int slot;
} task_arg;

typedef struct worker_state {
    dist_model *model;
    dist_optimizer *opt;
    dist_classifier_step step;
    int calls;
    dist_variable *vars[2];  /* a linear classifier made of strategy variables */
    dist_optimizer *var_opt; /* trains them (dist_optimizer_apply_to_variables) */
} worker_state;

/* One step of softmax regression on strategy variables: logits = x @ kernel + bias. */
static dist_status linear_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                               dist_element *out) {
    worker_state *w = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *k = dist_variable_local(w->vars[0], rc), *b = dist_variable_local(w->vars[1], rc);
    DIST_TRY_TEST(dist_tape_watch(t, k));
    DIST_TRY_TEST(dist_tape_watch(t, b));
    int64_t flat[2] = {-1, 784};
    dist_tensor *x, *logits, *per, *loss, *g[2];
    DIST_TRY_TEST(dist_op_reshape(t, in->items[0], 2, flat, &x));
    DIST_TRY_TEST(dist_op_dense(t, x, k, b, DIST_ACT_NONE, &logits));
    DIST_TRY_TEST(dist_op_sparse_softmax_cross_entropy(t, logits, in->items[1], &per));
    DIST_TRY_TEST(dist_compute_average_loss(t, per, 32, &loss));
    DIST_TRY_TEST(dist_tape_alloc(t, DIST_F32, k->ndim, k->shape, &g[0]));
    DIST_TRY_TEST(dist_tape_alloc(t, DIST_F32, b->ndim, b->shape, &g[1]));
    dist_tensor *src[2] = {k, b};
    DIST_TRY_TEST(dist_tape_gradient(t, loss, 2, src, g));
    DIST_TRY_TEST(dist_optimizer_apply_to_variables(w->var_opt, t, 2, w->vars,
                                                    (const dist_tensor *const *)g));
    out->count = 1;
    out->items[0] = loss;
    return DIST_OK;
}

/* The closure: the next batch of the worker's dataset through linear_step; returns the loss. */
static dist_status train_linear(dist_strategy *s, dist_distributed_iterator *it,
                                const dist_tensor *const *args, int n, void *user,
                                dist_tensor **res, int *nres) {
    (void)args, (void)n;
    dist_per_replica_element batch;
    int end = 0;
    DIST_TRY_TEST(dist_distributed_iterator_next(it, &batch, &end));
    if (end) {
        DIST_TRY_TEST(dist_distributed_iterator_reset(it));
        DIST_TRY_TEST(dist_distributed_iterator_next(it, &batch, &end));
    }
    dist_per_replica out;
    DIST_TRY_TEST(dist_strategy_run(s, linear_step, user, &batch, &out));
    DIST_TRY_TEST(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &res[0]));
    *nres = 1;
    return DIST_OK;
}

/* The same two variables (zeros) on every task that builds: the chief places them. */
static dist_status build_linear(dist_strategy *s, worker_state *w) {
    static float zeros[784 * 10];
    int64_t ks[2] = {784, 10}, bs[1] = {10};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    DIST_TRY_TEST(dist_strategy_scope_enter(s));
    DIST_TRY_TEST(dist_strategy_create_variable(s, "linear/kernel", 2, ks, zeros,
                                                DIST_AGGREGATION_MEAN, DIST_SYNC_ON_WRITE,
                                                &w->vars[0]));
    DIST_TRY_TEST(dist_strategy_create_variable(s, "linear/bias", 1, bs, zeros,
                                                DIST_AGGREGATION_MEAN, DIST_SYNC_ON_WRITE,
                                                &w->vars[1]));
    DIST_TRY_TEST(dist_optimizer_create_adam(&adam, &w->var_opt));
    return dist_strategy_scope_exit(s);
}

/* Fails on its third call: the coordinator reports it and cancels what is queued. */
static dist_status fail_on_third(dist_strategy *s, dist_distributed_iterator *it,
                                 const dist_tensor *const *args, int n, void *user,
                                 dist_tensor **res, int *nres) {
    (void)s, (void)it, (void)args, (void)n, (void)res;
    worker_state *w = user;
    *nres = 0;
    if (++w->calls == 3)
        return dist_error_for_test(DIST_INVALID_ARGUMENT, "boom on the third call");
    return DIST_OK;
}

/* Doubles its float argument. */
static dist_status twice(dist_strategy *s, dist_distributed_iterator *it,
                         const dist_tensor *const *args, int n, void *user, dist_tensor **res,
                         int *nres) {
    (void)s, (void)it, (void)user;
    if (n != 1 || args[0]->dtype != DIST_F32)
        return dist_error_for_test(DIST_INVALID_ARGUMENT, "twice wants one float32 tensor");
    DIST_TRY_TEST(dist_tensor_create(DIST_F32, args[0]->ndim, args[0]->shape, &res[0]));
    for (int64_t i = 0; i < dist_tensor_numel(args[0]); i++)
        ((float *)res[0]->data)[i] = 2 * ((const float *)args[0]->data)[i];
    *nres = 1;
    return DIST_OK;
}

static dist_status mnist_fn(const dist_input_context *ctx, void *user, dist_dataset **out) {
    (void)user;
    dist_tensor images = *dist_mnist_train_images(g_mnist),
                labels = *dist_mnist_train_labels(g_mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    DIST_TRY_TEST(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    DIST_TRY_TEST(dist_dataset_map_image_normalize(ds, &next));
    dist_dataset_destroy(ds), ds = next;
    DIST_TRY_TEST(dist_dataset_batch(ds, 32 / ctx->num_replicas_in_sync, 1, &next));
    dist_dataset_destroy(ds), ds = next;
    *out = ds;
    return DIST_OK;
}

static dist_status build_model(dist_strategy *s, int bn, dist_model **m, dist_optimizer **opt) {
    int64_t shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    DIST_TRY_TEST(dist_strategy_scope_enter(s));
    if (bn) {
        dist_batch_norm_options bo = DIST_BATCH_NORM_OPTIONS_INIT;
        bo.momentum = 0.5f;
        DIST_TRY_TEST(dist_model_create("bn", m));
        DIST_TRY_TEST(dist_model_add_conv2d(*m, 4, 3, DIST_ACT_RELU));
        DIST_TRY_TEST(dist_model_add_batch_normalization(*m, &bo));
        DIST_TRY_TEST(dist_model_add_flatten(*m));
        DIST_TRY_TEST(dist_model_add_dense(*m, 10, DIST_ACT_NONE));
    } else {
        DIST_TRY_TEST(dist_model_create_mnist_cnn(m));
    }
    DIST_TRY_TEST(dist_model_build(*m, 3, shape, 7));
    DIST_TRY_TEST(dist_optimizer_create_adam(&adam, opt));
    return dist_strategy_scope_exit(s);
}

static dist_status register_all(dist_strategy *s, worker_state *w) {
    w->step = (dist_classifier_step){w->model, w->opt, 0, NULL};
    DIST_TRY_TEST(
        dist_strategy_register_function(s, "train", dist_classifier_train_closure, &w->step));
    DIST_TRY_TEST(dist_strategy_register_function(s, "fail_on_third", fail_on_third, w));
    DIST_TRY_TEST(dist_strategy_register_function(s, "twice", twice, w));
    DIST_TRY_TEST(dist_strategy_register_function(s, "train_linear", train_linear, w));
    return dist_strategy_register_dataset_function(s, "mnist", mnist_fn, NULL);
}

static void *task_main(void *arg) {
    task_arg *a = arg;
    char buf[4096];
    dist_strategy_options o = options_for(a->c, a->type, a->index, buf, sizeof buf);
    dist_strategy *s = NULL;
    dist_status st = dist_strategy_create(&o, &s);
    worker_state w = {0};
    if (st == DIST_OK && strcmp(a->type, "worker") == 0) {
        st = build_model(s, a->c->bn, &w.model, &w.opt);
        if (st == DIST_OK && a->c->linear) st = build_linear(s, &w);
        if (st == DIST_OK) st = register_all(s, &w);
    }
    if (st == DIST_OK) st = dist_strategy_serve(s);
    if (st != DIST_OK) fprintf(stderr, "%s/%d: %s\n", a->type, a->index, dist_last_error());
    a->c->served[a->slot] = st;
    dist_optimizer_destroy(w.opt);
    dist_optimizer_destroy(w.var_opt);
    for (int i = 0; i < 2; i++) dist_variable_destroy(w.vars[i]);
    dist_model_destroy(w.model);
    dist_strategy_destroy(s);
    free(a);
    return NULL;
}

static void start(cluster *c, const char *type, int index) {
    task_arg *a = malloc(sizeof *a);
    *a = (task_arg){c, type, index, c->nthreads};
    c->served[c->nthreads] = DIST_INTERNAL;
    ck_assert_int_eq(pthread_create(&c->threads[c->nthreads++], NULL, task_main, a), 0);
}

static void start_ps(cluster *c) {
    for (int j = 0; j < c->ps; j++) start(c, "ps", j);
}

/* The chief's side: a strategy, its model, a coordinator; shutdown ends every thread. */
typedef struct chief {
    char buf[4096];
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
    dist_coordinator *coord;
    worker_state w;
} chief;

static void chief_start(chief *ch, cluster *c) {
    memset(ch, 0, sizeof *ch);
    dist_strategy_options o = options_for(c, "chief", 0, ch->buf, sizeof ch->buf);
    ck_assert_msg(dist_strategy_create(&o, &ch->s) == DIST_OK, "%s", dist_last_error());
    ck_assert_str_eq(dist_strategy_task_type(ch->s), "chief");
    ck_assert_msg(build_model(ch->s, c->bn, &ch->model, &ch->opt) == DIST_OK, "%s",
                  dist_last_error());
    ch->w.model = ch->model;
    ch->w.opt = ch->opt;
    if (c->linear)
        ck_assert_msg(build_linear(ch->s, &ch->w) == DIST_OK, "%s", dist_last_error());
    ck_assert_msg(register_all(ch->s, &ch->w) == DIST_OK, "%s", dist_last_error());
    dist_coordinator_options co = DIST_COORDINATOR_OPTIONS_INIT;
    co.closure_timeout_s = 120;
    ck_assert_msg(dist_coordinator_create(ch->s, &co, &ch->coord) == DIST_OK, "%s",
                  dist_last_error());
}

/* One worker and `ps` ps tasks, the chief with its coordinator, and the worker's "mnist"
 * dataset (its handle in *ds); linear / bn as in cluster. */
static void start_training(cluster *c, chief *ch, int ps, int linear, int bn, int *ds) {
    cluster_init(c, 1, ps);
    c->linear = linear;
    c->bn = bn;
    start_ps(c);
    start(c, "worker", 0);
    chief_start(ch, c);
    *ds = -1;
    ck_assert_int_eq(dist_coordinator_create_per_worker_dataset(ch->coord, "mnist", ds), DIST_OK);
}

static void chief_stop(chief *ch, cluster *c) {
    ck_assert_int_eq(dist_coordinator_shutdown_cluster(ch->coord), DIST_OK);
    dist_coordinator_destroy(ch->coord);
    for (int i = 0; i < c->nthreads; i++) {
        pthread_join(c->threads[i], NULL);
        ck_assert_msg(c->served[i] == DIST_OK, "task thread %d ended with %s", i,
                      dist_status_name(c->served[i]));
    }
    dist_optimizer_destroy(ch->opt);
    dist_optimizer_destroy(ch->w.var_opt);
    for (int i = 0; i < 2; i++) dist_variable_destroy(ch->w.vars[i]);
    dist_model_destroy(ch->model);
    dist_strategy_destroy(ch->s);
}

/* ---- placement ---------------------------------------------------------------------------- */

START_TEST(test_variables_go_round_robin_over_the_ps_tasks_in_creation_order) {
    cluster c;
    cluster_init(&c, 1, 2);
    start_ps(&c);
    chief ch;
    chief_start(&ch, &c);
    /* TF: variable i on /job:ps/task:(i % num_ps) */
    static const char *const names[] = {"conv2d/kernel",  "conv2d/bias",  "conv2d_1/kernel",
                                        "conv2d_1/bias",  "dense/kernel", "dense/bias",
                                        "dense_1/kernel", "dense_1/bias"};
    ck_assert_int_eq(dist_strategy_num_placed_variables(ch.s), 8);
    for (int i = 0; i < 8; i++) {
        dist_placed_variable v;
        ck_assert_int_eq(dist_strategy_placed_variable(ch.s, i, &v), DIST_OK);
        ck_assert_str_eq(v.name, names[i]);
        ck_assert_int_eq(v.ps, i % 2);
        ck_assert_int_eq(v.num_shards, 1);
    }
    dist_placed_variable v;
    ck_assert_int_eq(dist_strategy_placed_variable(ch.s, 8, &v), DIST_INVALID_ARGUMENT);
    chief_stop(&ch, &c);
}
END_TEST

START_TEST(test_a_partitioner_splits_the_first_axis_and_every_shard_takes_the_next_ps) {
    cluster c;
    cluster_init(&c, 1, 2);
    c.use_partitioner = 1;
    ck_assert_int_eq(dist_partitioner_parse("fixed:3", &c.partitioner), DIST_OK);
    start_ps(&c);
    chief ch;
    chief_start(&ch, &c);
    /* conv2d/kernel [3,3,1,32]: 3 shards of 1 row on ps 0, 1, 0; conv2d/bias [32]: 11, 11, 10
     * rows on ps 1, 0, 1 (the counter goes on over shards, as in TF) */
    dist_placed_variable v;
    int64_t rows[6] = {1, 1, 1, 11, 11, 10}, first[6] = {0, 1, 2, 0, 11, 22};
    for (int i = 0; i < 6; i++) {
        ck_assert_int_eq(dist_strategy_placed_variable(ch.s, i, &v), DIST_OK);
        ck_assert_int_eq(v.ps, i % 2);
        ck_assert_int_eq(v.num_shards, 3);
        ck_assert_int_eq(v.shard, i % 3);
        ck_assert_int_eq(v.rows, rows[i]);
        ck_assert_int_eq(v.first_row, first[i]);
    }
    ck_assert_str_eq(v.name, "conv2d/bias/part_2");
    ck_assert_int_eq(dist_strategy_num_placed_variables(ch.s), 8 * 3);
    /* the values came back whole: the shards cover every element once */
    dist_model *plain;
    int64_t shape[3] = {28, 28, 1};
    ck_assert_int_eq(dist_model_create_mnist_cnn(&plain), DIST_OK);
    ck_assert_int_eq(dist_model_build(plain, 3, shape, 7), DIST_OK);
    int64_t n = dist_model_num_params(plain);
    float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(plain, 0, want, n), DIST_OK);
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, got, n), DIST_OK);
    ck_assert_int_eq(memcmp(want, got, (size_t)n * 4), 0);
    free(want);
    free(got);
    dist_model_destroy(plain);
    chief_stop(&ch, &c);
}
END_TEST

START_TEST(test_weights_set_on_the_chief_are_what_the_ps_tasks_hold) {
    cluster c;
    cluster_init(&c, 1, 2);
    start_ps(&c);
    chief ch;
    chief_start(&ch, &c);
    int64_t n = dist_model_num_params(ch.model);
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    for (int64_t i = 0; i < n; i++) x[i] = (float)(i % 1000) * 1e-3f - 0.5f;
    ck_assert_int_eq(dist_model_set_weights(ch.model, x, n), DIST_OK);
    memset(y, 0, (size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, y, n), DIST_OK);
    ck_assert_int_eq(memcmp(x, y, (size_t)n * 4), 0);
    /* the optimizer's slots live on the ps tasks: zeros before any update */
    ck_assert_int_eq(dist_optimizer_get_slot(ch.opt, ch.model, 0, y, n), DIST_OK);
    for (int64_t i = 0; i < n; i++) ck_assert(y[i] == 0.0f);
    free(x);
    free(y);
    chief_stop(&ch, &c);
}
END_TEST

/* ---- the coordinator ---------------------------------------------------------------------- */

START_TEST(test_scheduled_training_steps_lower_the_loss_and_update_the_ps) {
    cluster c;
    chief ch;
    int ds;
    start_training(&c, &ch, 1, 0, 0, &ds);
    enum { STEPS = 60 };
    dist_remote_value *rv[STEPS];
    for (int i = 0; i < STEPS; i++)
        ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "train", ds, NULL, 0, &rv[i]),
                         DIST_OK);
    ck_assert_msg(dist_coordinator_join(ch.coord) == DIST_OK, "%s", dist_last_error());
    int done = 0;
    ck_assert_int_eq(dist_coordinator_done(ch.coord, &done), DIST_OK);
    ck_assert_int_eq(done, 1);
    double first = 0, last = 0;
    for (int i = 0; i < 10; i++) {
        const dist_tensor *a, *b;
        ck_assert_int_eq(dist_remote_value_fetch(rv[i], 0, &a), DIST_OK);
        ck_assert_int_eq(dist_remote_value_fetch(rv[STEPS - 10 + i], 0, &b), DIST_OK);
        ck_assert_int_eq(dist_tensor_numel(a), 3);
        ck_assert(((const float *)a->data)[2] == 32.0f); /* the examples of the step */
        first += ((const float *)a->data)[0];
        last += ((const float *)b->data)[0];
    }
    ck_assert_msg(last < 0.7 * first, "the loss went from %g to %g", first / 10, last / 10);
    for (int i = 0; i < STEPS; i++) dist_remote_value_release(rv[i]);
    dist_coordinator_stats st;
    dist_coordinator_get_stats(ch.coord, &st);
    ck_assert_int_eq(st.scheduled, STEPS);
    ck_assert_int_eq(st.completed, STEPS);
    ck_assert_int_eq(st.requeued, 0);
    /* the ps applied one Adam update per step: its update count is the optimizer's iterations */
    int64_t n = dist_model_num_params(ch.model);
    float *m = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_optimizer_get_slot(ch.opt, ch.model, 0, m, n), DIST_OK);
    ck_assert_int_eq(dist_optimizer_iterations(ch.opt), STEPS);
    free(m);
    chief_stop(&ch, &c);
}
END_TEST

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The worker's closure summary, caught from the log (the task threads share the callback). */
static pthread_mutex_t g_summary_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_summary[1024];

static void catch_summary(dist_log_level level, const char *msg, void *user) {
    (void)level, (void)user;
    if (!strstr(msg, "closures; per closure")) return;
    pthread_mutex_lock(&g_summary_mu);
    snprintf(g_summary, sizeof g_summary, "%s", msg);
    pthread_mutex_unlock(&g_summary_mu);
}

/* A worker that the chief shuts down logs where its closures' time went: one line with the
 * closures it ran and each phase's mean and most, which add up to no more than the time the
 * closures had. */
START_TEST(test_a_worker_logs_where_its_closures_time_went) {
    g_summary[0] = 0;
    dist_set_log_callback(catch_summary, DIST_LOG_INFO, NULL);
    double t0 = now_seconds();
    cluster c;
    chief ch;
    int ds;
    start_training(&c, &ch, 1, 0, 0, &ds);
    enum { STEPS = 40 };
    for (int i = 0; i < STEPS; i++)
        ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "train", ds, NULL, 0, NULL), DIST_OK);
    ck_assert_msg(dist_coordinator_join(ch.coord) == DIST_OK, "%s", dist_last_error());
    chief_stop(&ch, &c);
    double elapsed_ms = 1000.0 * (now_seconds() - t0);
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
    const char *want = "parameter_server worker/0: 40 closures; per closure, mean (most) in ms:";
    ck_assert_msg(strncmp(g_summary, want, strlen(want)) == 0, "summary: '%s'", g_summary);
    static const char *const phases[] = {"waiting for the chief", "pulling", "computing", "pushing",
                                         "acknowledgements",      "replying"};
    double total_ms = 0;
    for (size_t p = 0; p < sizeof phases / sizeof *phases; p++) {
        const char *at = strstr(g_summary, phases[p]);
        ck_assert_msg(at != NULL, "no '%s' in '%s'", phases[p], g_summary);
        double mean = -1, most = -1;
        ck_assert_int_eq(sscanf(at + strlen(phases[p]), " %lf (%lf)", &mean, &most), 2);
        ck_assert_msg(mean >= 0 && mean <= most, "%s: mean %g, most %g", phases[p], mean, most);
        /* the first closure follows no result: 39 waits */
        total_ms += mean * (p == 0 ? STEPS - 1 : STEPS);
    }
    /* a step of the seed CNN computes for more than 0.1 ms, and pulls 122k floats */
    double compute = 0, pull = 0;
    sscanf(strstr(g_summary, "computing") + strlen("computing"), " %lf", &compute);
    sscanf(strstr(g_summary, "pulling") + strlen("pulling"), " %lf", &pull);
    ck_assert_msg(compute > 0.1 && pull > 0, "computing %g ms, pulling %g ms", compute, pull);
    /* every phase is counted once: together they fit in the test's own time */
    ck_assert_msg(total_ms <= elapsed_ms, "phases %g ms, the run %g ms", total_ms, elapsed_ms);
}
END_TEST

/* Strategy variables trained by an optimizer: the worker pushes its gradients, the ps tasks
 * apply Adam where the variables live, the loss falls, and the chief reads the trained values
 * and the slots (with one update per step) from the ps tasks. */
START_TEST(test_strategy_variables_train_on_the_ps_tasks) {
    cluster c;
    chief ch;
    int ds;
    start_training(&c, &ch, 2, 1, 0, &ds);
    enum { STEPS = 40 };
    dist_remote_value *rv[STEPS];
    for (int i = 0; i < STEPS; i++)
        ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "train_linear", ds, NULL, 0, &rv[i]),
                         DIST_OK);
    ck_assert_msg(dist_coordinator_join(ch.coord) == DIST_OK, "%s", dist_last_error());
    double first = 0, last = 0;
    for (int i = 0; i < 5; i++) {
        const dist_tensor *a, *b;
        ck_assert_int_eq(dist_remote_value_fetch(rv[i], 0, &a), DIST_OK);
        ck_assert_int_eq(dist_remote_value_fetch(rv[STEPS - 5 + i], 0, &b), DIST_OK);
        first += *(const float *)a->data;
        last += *(const float *)b->data;
    }
    /* from ln(10) = 2.30 at zero weights: measured 2.26 -> 1.47 over the first and last 5 */
    ck_assert_msg(last < 0.8 * first, "the loss went from %g to %g", first / 5, last / 5);
    for (int i = 0; i < STEPS; i++) dist_remote_value_release(rv[i]);
    /* the chief never stepped: what it reads is what the ps tasks hold */
    float *k = malloc(7850 * sizeof *k);
    ck_assert_int_eq(dist_variable_read(ch.w.vars[0], k, 7840), DIST_OK);
    double moved = 0;
    for (int i = 0; i < 7840; i++) moved = fmax(moved, fabs(k[i]));
    ck_assert_msg(moved > 1e-3, "the kernel on the ps tasks did not move (%g)", moved);
    ck_assert_msg(dist_optimizer_get_variables_slot(ch.w.var_opt, 2, ch.w.vars, 0, k, 7850) ==
                      DIST_OK,
                  "%s", dist_last_error());
    ck_assert_int_eq(dist_optimizer_iterations(ch.w.var_opt), STEPS);
    free(k);
    chief_stop(&ch, &c);
}
END_TEST

/* BatchNormalization's moving statistics are non-trainable: the worker pushes the change its
 * training calls made to them (added on the ps) instead of gradients, so the ps tasks, and
 * through them the chief, hold statistics that moved; gamma and beta train. */
START_TEST(test_moving_statistics_reach_the_ps_tasks) {
    cluster c;
    chief ch;
    int ds;
    start_training(&c, &ch, 2, 0, 1, &ds);
    int64_t n = dist_model_num_params(ch.model);
    float *before = malloc((size_t)n * 4), *after = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, before, n), DIST_OK);
    for (int i = 0; i < 10; i++)
        ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "train", ds, NULL, 0, NULL), DIST_OK);
    ck_assert_msg(dist_coordinator_join(ch.coord) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, after, n), DIST_OK);
    int64_t off = 0;
    int checked = 0;
    for (int v = 0; v < dist_model_num_variables(ch.model); v++) {
        const char *name = dist_model_variable_name(ch.model, v);
        int64_t k = dist_tensor_numel(dist_model_variable(ch.model, 0, v));
        double moved = 0;
        for (int64_t i = 0; i < k; i++) moved = fmax(moved, fabs(after[off + i] - before[off + i]));
        ck_assert_msg(moved > 1e-3, "'%s' on the ps tasks did not move (%g)", name, moved);
        if (strstr(name, "moving_mean")) {
            /* ReLU outputs: their mean is positive, the initial one 0 */
            for (int64_t i = 0; i < k; i++) ck_assert(after[off + i] >= 0);
            checked++;
        }
        off += k;
    }
    ck_assert_int_eq(checked, 1);
    free(before);
    free(after);
    chief_stop(&ch, &c);
}
END_TEST

/* Two workers' steps that begin from the same moving statistics (each pulls before either
 * pushes: the step waits on a barrier): the ps tasks hold the statistics with both steps'
 * changes added, as TF's update of a ps variable, assign_sub((var - value) * (1 - momentum)).
 * An assignment of each worker's values kept only the last push, so the ps's statistics went
 * back and forth between the workers' own chains of updates, each with about half of the steps,
 * and a two-worker model evaluated with stale statistics. */
typedef struct bn_worker {
    cluster *c;
    int index;
    pthread_barrier_t *bar; /* NULL: no other worker to wait for */
    const char *devices;    /* the worker's replicas (NULL: one) */
    pthread_mutex_t mu;
    dist_model *model;
    dist_classifier_step step;
    int64_t n;
    float *pulled, *after; /* every variable of replica 0, in the model's layout */
    float *after1;         /* replica 1's, with devices */
    int waited;            /* passed the barrier */
    int have_pulled;       /* the first replica in read the pulled values */
    dist_status st;
    char err[512];
} bn_worker;

static void model_values(const dist_model *m, int replica, float *out) {
    int64_t off = 0;
    for (int v = 0; v < dist_model_num_variables(m); v++) {
        const dist_tensor *t = dist_model_variable(m, replica, v);
        memcpy(out + off, t->data, (size_t)dist_tensor_numel(t) * 4);
        off += dist_tensor_numel(t);
    }
}

static dist_status barrier_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *out) {
    bn_worker *w = user;
    /* what ps_run pulled (into every replica), read by the first replica to get here, before
     * any replica's step has moved replica 0's statistics (a later reader could see them
     * after replica 0's forward) */
    pthread_mutex_lock(&w->mu);
    if (!w->have_pulled) model_values(w->model, 0, w->pulled);
    w->have_pulled = 1;
    pthread_mutex_unlock(&w->mu);
    if (w->bar) pthread_barrier_wait(w->bar); /* the other worker has pulled too */
    w->waited = 1;
    return dist_classifier_train_step(rc, in, &w->step, out);
}

/* Worker w->index's batch: 32 images of its own shard of the training set. */
static dist_status shard_fn(const dist_input_context *ctx, void *user, dist_dataset **out) {
    (void)user;
    dist_dataset *ds, *next;
    DIST_TRY_TEST(mnist_fn(ctx, NULL, &ds));
    DIST_TRY_TEST(dist_dataset_shard(ds, ctx->num_input_pipelines, ctx->input_pipeline_id, &next));
    dist_dataset_destroy(ds);
    *out = next;
    return DIST_OK;
}

static dist_status bn_worker_steps(bn_worker *w, dist_strategy **s) {
    char buf[4096];
    dist_strategy_options o = options_for(w->c, "worker", w->index, buf, sizeof buf);
    o.devices = w->devices;
    DIST_TRY_TEST(dist_strategy_create(&o, s));
    dist_optimizer *opt = NULL;
    DIST_TRY_TEST(build_model(*s, 1, &w->model, &opt));
    w->step = (dist_classifier_step){w->model, opt, 32, NULL};
    w->n = dist_model_num_params(w->model);
    w->pulled = malloc((size_t)w->n * 4);
    w->after = malloc((size_t)w->n * 4);
    w->after1 = malloc((size_t)w->n * 4);
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    dist_per_replica_element batch;
    dist_per_replica res;
    int end = 0;
    dist_status st = dist_strategy_distribute_datasets_from_function(*s, shard_fn, NULL, &dds);
    if (st == DIST_OK) st = dist_distributed_dataset_iterator(dds, &it);
    if (st == DIST_OK) st = dist_distributed_iterator_next(it, &batch, &end);
    if (st == DIST_OK) st = dist_strategy_run(*s, barrier_step, w, &batch, &res);
    if (st == DIST_OK) model_values(w->model, 0, w->after);
    if (st == DIST_OK && w->devices) model_values(w->model, 1, w->after1);
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_optimizer_destroy(opt);
    return st;
}

static void *bn_worker_main(void *arg) {
    bn_worker *w = arg;
    dist_strategy *s = NULL;
    w->st = bn_worker_steps(w, &s);
    if (w->st != DIST_OK) snprintf(w->err, sizeof w->err, "%s", dist_last_error());
    if (!w->waited && w->bar) pthread_barrier_wait(w->bar); /* the other does not wait forever */
    dist_model_destroy(w->model);
    dist_strategy_destroy(s); /* reads the replies of its pushes: they are applied */
    return NULL;
}

START_TEST(test_two_workers_moving_statistics_updates_add_up_on_the_ps) {
    cluster c;
    cluster_init(&c, 2, 1);
    c.bn = 1;
    start_ps(&c);
    start(&c, "worker", 0);
    start(&c, "worker", 1);
    chief ch;
    chief_start(&ch, &c);
    /* two more clients with the workers' identities step outside the coordinator */
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, 2);
    bn_worker w[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        w[i] = (bn_worker){.c = &c, .index = i, .bar = &bar, .mu = PTHREAD_MUTEX_INITIALIZER};
        ck_assert_int_eq(pthread_create(&t[i], NULL, bn_worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&bar);
    for (int i = 0; i < 2; i++) ck_assert_msg(w[i].st == DIST_OK, "worker %d: %s", i, w[i].err);
    int64_t n = dist_model_num_params(ch.model);
    ck_assert_int_eq(n, w[0].n);
    float *ps = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, ps, n), DIST_OK);
    int64_t off = 0;
    int checked = 0;
    for (int v = 0; v < dist_model_num_variables(ch.model); v++) {
        const char *name = dist_model_variable_name(ch.model, v);
        int64_t k = dist_tensor_numel(dist_model_variable(ch.model, 0, v));
        if (!dist_model_variable_trainable(ch.model, v)) {
            double apart = 0;
            for (int64_t i = off; i < off + k; i++) {
                /* both began from the chief's initial statistics */
                ck_assert_float_eq(w[0].pulled[i], w[1].pulled[i]);
                float d0 = w[0].after[i] - w[0].pulled[i], d1 = w[1].after[i] - w[1].pulled[i];
                double want = (double)w[0].pulled[i] + d0 + d1;
                apart = fmax(apart, fabs(w[0].after[i] - w[1].after[i]));
                ck_assert_msg(fabs(ps[i] - want) <= 1e-5 * (1 + fabs(want)),
                              "'%s'[%lld] on the ps: %g; the workers began from %g and made "
                              "%g and %g (both changes: %g)",
                              name, (long long)(i - off), ps[i], w[0].pulled[i], w[0].after[i],
                              w[1].after[i], want);
            }
            /* their batches differ: so do their statistics */
            ck_assert_msg(apart > 1e-4, "'%s': both workers made the same statistics", name);
            checked++;
        }
        off += k;
    }
    ck_assert_int_eq(checked, 2);
    free(ps);
    for (int i = 0; i < 2; i++) {
        free(w[i].pulled);
        free(w[i].after);
        free(w[i].after1);
    }
    chief_stop(&ch, &c);
}
END_TEST

/* A worker with two replicas, each with its own half of the batch: the ps adds the mean of
 * their changes to the moving statistics (TF's AggregatingVariable, MEAN, reduces a worker's
 * replicas' assign_sub deltas), and both replicas end the step with that mean, not replica
 * 0's own statistics alone. */
START_TEST(test_a_workers_replicas_push_the_mean_of_their_statistics) {
    cluster c;
    cluster_init(&c, 1, 1);
    c.bn = 1;
    start_ps(&c);
    start(&c, "worker", 0);
    chief ch;
    chief_start(&ch, &c);
    bn_worker w = {.c = &c, .index = 0, .devices = "cpu:0,cpu:1", .mu = PTHREAD_MUTEX_INITIALIZER};
    bn_worker_main(&w);
    ck_assert_msg(w.st == DIST_OK, "%s", w.err);
    int64_t n = dist_model_num_params(ch.model);
    float *ps = malloc((size_t)n * 4);
    ck_assert_int_eq(dist_model_get_weights(ch.model, 0, ps, n), DIST_OK);
    int64_t off = 0;
    int checked = 0;
    for (int v = 0; v < dist_model_num_variables(ch.model); v++) {
        const char *name = dist_model_variable_name(ch.model, v);
        int64_t k = dist_tensor_numel(dist_model_variable(ch.model, 0, v));
        if (!dist_model_variable_trainable(ch.model, v)) {
            double moved = 0;
            for (int64_t i = off; i < off + k; i++) {
                ck_assert_msg(w.after[i] == w.after1[i],
                              "'%s'[%lld]: replica 0 has %g, replica 1 %g (not their mean)", name,
                              (long long)(i - off), w.after[i], w.after1[i]);
                ck_assert_msg(fabs(ps[i] - w.after[i]) <= 1e-6 * (1 + fabs(w.after[i])),
                              "'%s'[%lld] on the ps: %g, the replicas' mean %g", name,
                              (long long)(i - off), ps[i], w.after[i]);
                moved = fmax(moved, fabs(w.after[i] - w.pulled[i]));
            }
            ck_assert_msg(moved > 1e-4, "'%s' did not move", name);
            checked++;
        }
        off += k;
    }
    ck_assert_int_eq(checked, 2);
    free(ps);
    free(w.pulled);
    free(w.after);
    free(w.after1);
    chief_stop(&ch, &c);
}
END_TEST

START_TEST(test_arguments_and_results_travel_as_tensors) {
    cluster c;
    cluster_init(&c, 1, 1);
    start_ps(&c);
    start(&c, "worker", 0);
    chief ch;
    chief_start(&ch, &c);
    float x[4] = {1, -2, 3.5f, 0};
    int64_t shape[2] = {2, 2};
    dist_tensor t = dist_tensor_view(x, DIST_F32, 2, shape);
    const dist_tensor *args[1] = {&t};
    dist_remote_value *rv;
    ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "twice", -1, args, 1, &rv), DIST_OK);
    const dist_tensor *r;
    ck_assert_msg(dist_remote_value_fetch(rv, 0, &r) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(r->ndim, 2);
    ck_assert_int_eq(r->shape[1], 2);
    ck_assert(((const float *)r->data)[2] == 7.0f);
    ck_assert_int_eq(dist_remote_value_num_results(rv), 1);
    ck_assert_int_eq(dist_remote_value_fetch(rv, 1, &r), DIST_INVALID_ARGUMENT);
    dist_remote_value_release(rv);
    chief_stop(&ch, &c);
}
END_TEST

START_TEST(test_an_unregistered_function_is_refused_by_its_name) {
    cluster c;
    cluster_init(&c, 1, 1);
    start_ps(&c);
    chief ch;
    chief_start(&ch, &c);
    ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "nope", -1, NULL, 0, NULL),
                     DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'nope'"));
    int ds;
    ck_assert_int_eq(dist_coordinator_create_per_worker_dataset(ch.coord, "nodata", &ds),
                     DIST_NOT_FOUND);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "'nodata'"));
    ck_assert_int_eq(dist_strategy_register_function(ch.s, "twice", twice, NULL),
                     DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_strategy_serve(ch.s), DIST_INVALID_USAGE);
    chief_stop(&ch, &c);
}
END_TEST

START_TEST(test_a_failed_closure_fails_join_cancels_the_queue_and_is_reported_once) {
    cluster c;
    cluster_init(&c, 1, 1);
    start_ps(&c);
    start(&c, "worker", 0);
    chief ch;
    chief_start(&ch, &c);
    enum { N = 30 };
    dist_remote_value *rv[N];
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "fail_on_third", -1, NULL, 0, &rv[i]),
                         DIST_OK);
    ck_assert_int_eq(dist_coordinator_join(ch.coord), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "boom on the third call"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "fail_on_third"));
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "worker/0"));
    const dist_tensor *r;
    ck_assert_int_eq(dist_remote_value_fetch(rv[0], 0, &r), DIST_INVALID_ARGUMENT); /* no result */
    ck_assert_int_eq(dist_remote_value_fetch(rv[2], 0, &r), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_remote_value_fetch(rv[N - 1], 0, &r), DIST_CANCELLED);
    for (int i = 0; i < N; i++) dist_remote_value_release(rv[i]);
    /* reported once: the coordinator goes on */
    ck_assert_int_eq(dist_coordinator_join(ch.coord), DIST_OK);
    ck_assert_int_eq(dist_coordinator_schedule(ch.coord, "fail_on_third", -1, NULL, 0, NULL),
                     DIST_OK);
    ck_assert_int_eq(dist_coordinator_join(ch.coord), DIST_OK);
    chief_stop(&ch, &c);
}
END_TEST

/* ---- the cluster -------------------------------------------------------------------------- */

static dist_status create_with(const char *tf_config, dist_strategy **s) {
    dist_strategy_options o = DIST_STRATEGY_OPTIONS_INIT;
    o.kind = DIST_STRATEGY_PARAMETER_SERVER;
    o.cluster.spec = tf_config;
    return dist_strategy_create(&o, s);
}

START_TEST(test_a_cluster_without_ps_or_worker_is_refused_with_tfs_messages) {
    setenv("DIST_CLUSTER_TOKEN", "test_parameter_server-token-0123456789", 1);
    dist_strategy *s = NULL;
    ck_assert_int_eq(create_with("{\"cluster\":{\"chief\":[\"h:1\"],\"worker\":[\"h:2\"]},"
                                 "\"task\":{\"type\":\"chief\",\"index\":0}}",
                                 &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "There must be at least one ps.");
    ck_assert_int_eq(create_with("{\"cluster\":{\"chief\":[\"h:1\"],\"ps\":[\"h:2\"]},"
                                 "\"task\":{\"type\":\"chief\",\"index\":0}}",
                                 &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(dist_last_error(), "There must be at least one worker.");
    ck_assert_int_eq(create_with("{\"cluster\":{\"worker\":[\"h:1\"],\"ps\":[\"h:2\"]},"
                                 "\"task\":{\"type\":\"worker\",\"index\":0}}",
                                 &s),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "no chief"));
    ck_assert_int_eq(create_with("", &s), DIST_INVALID_ARGUMENT);
    ck_assert_ptr_nonnull(strstr(dist_last_error(), "Cluster spec must be non-empty"));
    ck_assert_ptr_null(s);
}
END_TEST

int main(void) {
    dist_set_log_callback(NULL, DIST_LOG_WARN, NULL);
    if (dist_mnist_load(NULL, &g_mnist) != DIST_OK) {
        fprintf(stderr, "no MNIST: %s\n", dist_last_error());
        return 1;
    }
    Suite *s = suite_create("parameter_server");
    TCase *tc = tcase_create("placement");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_variables_go_round_robin_over_the_ps_tasks_in_creation_order);
    tcase_add_test(tc, test_a_partitioner_splits_the_first_axis_and_every_shard_takes_the_next_ps);
    tcase_add_test(tc, test_weights_set_on_the_chief_are_what_the_ps_tasks_hold);
    tcase_add_test(tc, test_a_cluster_without_ps_or_worker_is_refused_with_tfs_messages);
    suite_add_tcase(s, tc);
    TCase *co = tcase_create("coordinator");
    tcase_set_timeout(co, 300);
    tcase_add_test(co, test_scheduled_training_steps_lower_the_loss_and_update_the_ps);
    tcase_add_test(co, test_a_worker_logs_where_its_closures_time_went);
    tcase_add_test(co, test_strategy_variables_train_on_the_ps_tasks);
    tcase_add_test(co, test_moving_statistics_reach_the_ps_tasks);
    tcase_add_test(co, test_two_workers_moving_statistics_updates_add_up_on_the_ps);
    tcase_add_test(co, test_a_workers_replicas_push_the_mean_of_their_statistics);
    tcase_add_test(co, test_arguments_and_results_travel_as_tensors);
    tcase_add_test(co, test_an_unregistered_function_is_refused_by_its_name);
    tcase_add_test(co, test_a_failed_closure_fails_join_cancels_the_queue_and_is_reported_once);
    suite_add_tcase(s, co);
    int rc = dist_test_run(s);
    dist_mnist_destroy(g_mnist);
    return rc;
}
