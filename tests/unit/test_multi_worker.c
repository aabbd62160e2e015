/* multi_worker across real processes on 127.0.0.1: two workers x one replica against mirrored
 * with two replicas (bit for bit, over TCP, shared memory and MPI), the cluster-wide reduce,
 * gather and initial broadcast, dist_predict's rows over two workers, and a cluster that never
 * assembles.
 *
 * Workers are this test program executed again with "--worker ..." (fork + exec): a child
 * forked after oneDNN's OpenMP threads exist would hang, and exec gives every worker a fresh
 * process, as a real cluster has. */
#include "mpi_testutil.h"
#include "testutil.h"

#include <arpa/inet.h>
#include <dist/dist.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *g_self;

/* A port for a worker's TF_CONFIG, from the OS (bind to port 0). The port must be in the spec
 * before the worker starts, and the worker binds its own listener (the library cannot be handed
 * a socket), so the port is closed here and another process may take it in between:
 * run_two_workers repeats a run whose worker could not listen (EADDRINUSE) on fresh ports. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ck_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    close(fd);
    return ntohs(a.sin_port);
}

static void tf_config(char *buf, size_t cap, int nworkers, const int *ports, int index) {
    size_t n = (size_t)snprintf(buf, cap, "{\"cluster\":{\"worker\":[");
    for (int i = 0; i < nworkers; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s\"127.0.0.1:%d\"", i ? "," : "", ports[i]);
    snprintf(buf + n, cap - n, "]},\"task\":{\"type\":\"worker\",\"index\":%d}}", index);
}

/* ---- what a worker process does ---------------------------------------------------------- */

static dist_dataset *mnist_batches(dist_mnist *m, int64_t batch) {
    dist_tensor parts[2] = {*dist_mnist_train_images(m), *dist_mnist_train_labels(m)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    dist_dataset *ds = NULL, *n = NULL, *sh = NULL, *b = NULL;
    if (dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds) ||
        dist_dataset_map_image_normalize(ds, &n) || dist_dataset_shuffle(n, 8000, 3, 1, &sh) ||
        dist_dataset_batch(sh, batch, 0, &b))
        b = NULL;
    dist_dataset_destroy(ds);
    dist_dataset_destroy(n);
    dist_dataset_destroy(sh);
    return b;
}

typedef struct trainer {
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
} trainer;

static dist_status make_trainer(dist_strategy_options *so, int use_sgd, trainer *t) {
    memset(t, 0, sizeof *t);
    DIST_TRY_TEST(dist_strategy_create(so, &t->s));
    DIST_TRY_TEST(dist_strategy_scope_enter(t->s));
    int64_t shape[3] = {28, 28, 1};
    DIST_TRY_TEST(dist_model_create_mnist_cnn(&t->model));
    /* Each worker seeds differently: the chief's initial values must win (broadcast). */
    uint64_t seed = 7 + (uint64_t)dist_strategy_worker_id(t->s) * 1000;
    DIST_TRY_TEST(dist_model_build(t->model, 3, shape, seed));
    if (use_sgd) {
        dist_sgd_options o = DIST_SGD_OPTIONS_INIT;
        o.momentum = 0.9f;
        DIST_TRY_TEST(dist_optimizer_create_sgd(&o, &t->opt));
    } else {
        dist_adam_options o = DIST_ADAM_OPTIONS_INIT;
        DIST_TRY_TEST(dist_optimizer_create_adam(&o, &t->opt));
    }
    return dist_strategy_scope_exit(t->s);
}

static void free_trainer(trainer *t) {
    dist_optimizer_destroy(t->opt);
    dist_model_destroy(t->model);
    dist_strategy_destroy(t->s);
}

/* Trains `steps` steps of global batch 64 and leaves the weights in *weights (malloc'd). */
static dist_status train(trainer *t, int steps, float **weights, int64_t *count) {
    dist_mnist *m = NULL;
    DIST_TRY_TEST(dist_mnist_load(NULL, &m));
    dist_dataset *ds = mnist_batches(m, 64);
    if (!ds) return dist_error_for_test(DIST_INTERNAL, "pipeline");
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    DIST_TRY_TEST(dist_strategy_distribute_dataset(t->s, ds, &dds));
    DIST_TRY_TEST(dist_distributed_dataset_iterator(dds, &it));
    dist_classifier_step cs = {t->model, t->opt, 0, NULL};
    for (int i = 0; i < steps; i++) {
        dist_per_replica_element e;
        int end;
        DIST_TRY_TEST(dist_distributed_iterator_next(it, &e, &end));
        cs.global_batch_size = e.global_batch_size;
        dist_per_replica out;
        DIST_TRY_TEST(dist_strategy_run(t->s, dist_classifier_train_step, &cs, &e, &out));
    }
    *count = dist_model_num_params(t->model);
    *weights = malloc((size_t)*count * sizeof **weights);
    DIST_TRY_TEST(dist_model_get_weights(t->model, 0, *weights, *count));
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_mnist_destroy(m);
    return DIST_OK;
}

/* --worker train SPEC STEPS SGD OUT: trains, writes the weights to OUT. */
static int worker_train(const char *spec, int steps, int use_sgd, const char *out) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    /* "mpi": the cluster is the MPI world of the mpiexec that started this process */
    if (strcmp(spec, "mpi") == 0)
        so.cluster.transport = DIST_TRANSPORT_MPI;
    else
        so.cluster.spec = spec;
    trainer t;
    float *w = NULL;
    int64_t n = 0;
    dist_status st = make_trainer(&so, use_sgd, &t);
    if (st == DIST_OK) st = train(&t, steps, &w, &n);
    if (st != DIST_OK) {
        fprintf(stderr, "worker: %s\n", dist_last_error());
        return 1;
    }
    char path[512];
    /* under MPI every rank gets the same arguments: the rank names the file */
    if (so.cluster.transport == DIST_TRANSPORT_MPI)
        snprintf(path, sizeof path, "%s.%d", out, dist_strategy_worker_id(t.s));
    else
        snprintf(path, sizeof path, "%s", out);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(w, sizeof *w, (size_t)n, f) == (size_t)n;
    if (f) fclose(f);
    free(w);
    free_trainer(&t);
    return ok ? 0 : 1;
}

/* --worker collectives SPEC OUT: cross-worker reduce (SUM, MEAN, MEAN over an uneven axis),
 * gather of uneven rows, an ON_READ variable; writes "name value" lines to OUT. */
static dist_status rows_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                             dist_element *outputs) {
    int id = dist_replica_id_in_sync_group(rc); /* global */
    int rows = id + 1;                          /* worker 0: 1 row, worker 1: 2 rows */
    float v[2] = {(float)(10 * id + 1), (float)(10 * id + 2)};
    int64_t shape[1] = {rows};
    dist_tensor host = dist_tensor_view(v, DIST_F32, 1, shape);
    DIST_TRY_TEST(dist_tape_upload(dist_replica_tape(rc), &host, &outputs->items[0]));
    /* a [2, rows] value for gather along axis 1: row 0 the values, row 1 their negatives */
    float w[4] = {v[0], v[1], -v[0], -v[1]};
    if (rows == 1) w[1] = -v[0];
    int64_t shape2[2] = {2, rows};
    dist_tensor host2 = dist_tensor_view(w, DIST_F32, 2, shape2);
    DIST_TRY_TEST(dist_tape_upload(dist_replica_tape(rc), &host2, &outputs->items[1]));
    outputs->count = 2;
    dist_variable *var = user;
    float mine = (float)(id + 1);
    dist_tensor one = dist_tensor_view(&mine, DIST_F32, 0, NULL);
    dist_tensor *dv;
    DIST_TRY_TEST(dist_tape_upload(dist_replica_tape(rc), &one, &dv));
    return dist_variable_assign(var, rc, dv);
}

/* A trainable strategy variable w [2]: replica `id` (global) contributes the loss
 * sum((w - (id + 1) * [1, 2])^2) / 2, whose gradient is w - (id + 1) * [1, 2]; their SUM
 * over both workers is 2w - [3, 6], and SGD (lr 0.1) takes w from the chief's [0, 0] (not
 * worker 1's [5, 5]) to [0.3, 0.6] on both. */
typedef struct trainable {
    dist_variable *w;
    dist_optimizer *sgd;
} trainable;

static dist_status trainable_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                  dist_element *outputs) {
    (void)in, (void)outputs;
    trainable *tr = user;
    dist_tape *t = dist_replica_tape(rc);
    dist_tensor *w = dist_variable_local(tr->w, rc);
    DIST_TRY_TEST(dist_tape_watch(t, w));
    int id = dist_replica_id_in_sync_group(rc);
    float c[2] = {(float)(id + 1), (float)(2 * (id + 1))};
    int64_t shape[1] = {2};
    dist_tensor hc = dist_tensor_view(c, DIST_F32, 1, shape);
    dist_tensor *dc, *d, *sq, *sum, *loss, *g;
    DIST_TRY_TEST(dist_tape_upload(t, &hc, &dc));
    DIST_TRY_TEST(dist_op_sub(t, w, dc, &d));
    DIST_TRY_TEST(dist_op_square(t, d, &sq));
    DIST_TRY_TEST(dist_op_reduce_sum(t, sq, &sum));
    DIST_TRY_TEST(dist_op_scale(t, sum, 0.5f, &loss));
    DIST_TRY_TEST(dist_tape_alloc(t, DIST_F32, 1, shape, &g));
    DIST_TRY_TEST(dist_tape_gradient(t, loss, 1, &w, &g));
    return dist_optimizer_apply_to_variables(tr->sgd, t, 1, &tr->w, (const dist_tensor *const *)&g);
}

/* merge_call under multi_worker: replica id (global) gives [id + 1, 10 (id + 1)]; the merge
 * function runs once on each worker over its one replica, and its dist_strategy_reduce spans
 * both workers: [3, 30] everywhere. */
static dist_status sum_over_workers(dist_strategy *s, dist_per_replica *values, void *user) {
    (void)user;
    dist_tensor *sum = NULL;
    DIST_TRY_TEST(dist_strategy_reduce(s, DIST_REDUCE_SUM, values, 0, -1, &sum));
    for (int r = 0; r < values->num_replicas; r++)
        memcpy(values->values[r][0]->data, sum->data, dist_tensor_bytes(sum));
    dist_tensor_destroy(sum);
    return DIST_OK;
}

static dist_status merging_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                                dist_element *outputs) {
    (void)in, (void)user;
    int id = dist_replica_id_in_sync_group(rc);
    float v[2] = {(float)(id + 1), 10.0f * (float)(id + 1)};
    int64_t shape[1] = {2};
    dist_tensor host = dist_tensor_view(v, DIST_F32, 1, shape);
    DIST_TRY_TEST(dist_tape_upload(dist_replica_tape(rc), &host, &outputs->items[0]));
    outputs->count = 1;
    return dist_replica_merge_call(rc, sum_over_workers, NULL, &outputs->items[0], 1);
}

static int worker_collectives(const char *spec, const char *out) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    so.cluster.spec = spec;
    dist_strategy *s = NULL;
    dist_variable *var = NULL;
    dist_per_replica pr;
    dist_tensor *sum = NULL, *mean = NULL, *mean_axis = NULL, *gathered = NULL, *by_col = NULL;
    float init = 0, on_read = 0, trained[2] = {0};
    trainable tr = {0};
    dist_sgd_options sgd = DIST_SGD_OPTIONS_INIT;
    sgd.learning_rate = 0.1f;
    dist_status st = dist_strategy_create(&so, &s);
    if (!st) st = dist_strategy_scope_enter(s);
    if (!st)
        st = dist_strategy_create_variable(s, "counter", 0, NULL, &init, DIST_AGGREGATION_SUM,
                                           DIST_SYNC_ON_READ, &var);
    /* each worker starts from its own value: the chief's is the variable's */
    float w0[2] = {dist_strategy_is_chief(s) ? 0.0f : 5.0f,
                   dist_strategy_is_chief(s) ? 0.0f : 5.0f};
    int64_t wshape[1] = {2};
    if (!st)
        st = dist_strategy_create_variable(s, "w", 1, wshape, w0, DIST_AGGREGATION_MEAN,
                                           DIST_SYNC_ON_WRITE, &tr.w);
    if (!st) st = dist_optimizer_create_sgd(&sgd, &tr.sgd);
    if (!st) st = dist_strategy_scope_exit(s);
    if (!st) st = dist_strategy_run(s, trainable_step, &tr, NULL, NULL);
    if (!st) st = dist_variable_read(tr.w, trained, 2);
    if (!st) st = dist_strategy_run(s, rows_step, var, NULL, &pr);
    if (!st) st = dist_strategy_reduce(s, DIST_REDUCE_SUM, &pr, 0, 0, &sum);
    if (!st) st = dist_strategy_reduce(s, DIST_REDUCE_MEAN, &pr, 0, 0, &mean_axis);
    if (!st) st = dist_strategy_gather(s, &pr, 0, 0, &gathered);
    if (!st) st = dist_strategy_gather(s, &pr, 1, -1, &by_col);
    if (!st) st = dist_variable_read(var, &on_read, 1);
    dist_per_replica merged;
    if (!st) st = dist_strategy_run(s, merging_step, NULL, NULL, &merged);
    (void)mean;
    if (st) {
        fprintf(stderr, "worker: %s\n", dist_last_error());
        return 1;
    }
    FILE *f = fopen(out, "w");
    if (!f) return 1;
    fprintf(f, "replicas_in_sync %d\nworkers %d\nworker_id %d\nchief %d\n",
            dist_strategy_num_replicas_in_sync(s), dist_strategy_num_workers(s),
            dist_strategy_worker_id(s), dist_strategy_is_chief(s));
    fprintf(f, "sum_axis0 %g\nmean_axis0 %g\ngathered_rows %lld\n", *(float *)sum->data,
            *(float *)mean_axis->data, (long long)gathered->shape[0]);
    for (int64_t i = 0; i < gathered->shape[0]; i++)
        fprintf(f, "gathered %g\n", ((float *)gathered->data)[i]);
    fprintf(f, "by_column [%lld x %lld]", (long long)by_col->shape[0], (long long)by_col->shape[1]);
    for (int64_t i = 0; i < dist_tensor_numel(by_col); i++)
        fprintf(f, " %g", ((float *)by_col->data)[i]);
    fprintf(f, "\n");
    fprintf(f, "on_read_sum %g\n", on_read);
    fprintf(f, "trained %g %g\n", trained[0], trained[1]);
    fprintf(f, "merged %g %g\n", ((float *)merged.values[0][0]->data)[0],
            ((float *)merged.values[0][0]->data)[1]);
    fclose(f);
    dist_optimizer_destroy(tr.sgd);
    dist_variable_destroy(tr.w);
    dist_tensor_destroy(sum);
    dist_tensor_destroy(mean_axis);
    dist_tensor_destroy(gathered);
    dist_tensor_destroy(by_col);
    dist_variable_destroy(var);
    dist_strategy_destroy(s);
    return 0;
}

/* 7 images (pixel = (i * 31 + p) % 17 / 17) in global batches of 3: over two workers of one
 * replica each, a batch of 3 is 2 + 1 rows and the last batch of 1 is 1 + 0. */
enum { PREDICT_N = 7 };

static dist_status predict_logits(const dist_strategy_options *so, dist_tensor **out) {
    static float x[PREDICT_N * 784];
    for (int i = 0; i < PREDICT_N; i++)
        for (int p = 0; p < 784; p++) x[i * 784 + p] = (float)((i * 31 + p) % 17) / 17.0f;
    dist_strategy *s = NULL;
    dist_model *m = NULL;
    dist_dataset *ds = NULL, *batched = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_tensor tx = dist_tensor_view(x, DIST_F32, 4, (int64_t[]){PREDICT_N, 28, 28, 1});
    dist_tensor *parts[1] = {&tx};
    dist_status st = dist_strategy_create(so, &s);
    if (!st) st = dist_strategy_scope_enter(s);
    if (!st) st = dist_model_create_mnist_cnn(&m);
    if (!st) st = dist_model_build(m, 3, (int64_t[]){28, 28, 1}, 11);
    if (!st) st = dist_strategy_scope_exit(s);
    if (!st) st = dist_dataset_from_tensor_slices(parts, 1, 0, &ds);
    if (!st) st = dist_dataset_batch(ds, 3, 0, &batched);
    if (!st) st = dist_strategy_distribute_dataset(s, batched, &dds);
    if (!st) st = dist_predict(s, m, dds, 0, DIST_PREDICT_LOGITS, out);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(batched);
    dist_dataset_destroy(ds);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    return st;
}

/* --worker predict SPEC OUT: dist_predict's logits over both workers, written to OUT. */
static int worker_predict(const char *spec, const char *out) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    so.cluster.spec = spec;
    dist_tensor *logits = NULL;
    if (predict_logits(&so, &logits)) {
        fprintf(stderr, "worker: %s\n", dist_last_error());
        return 1;
    }
    FILE *f = fopen(out, "wb");
    size_t n = (size_t)dist_tensor_numel(logits);
    int ok = f && logits->shape[0] == PREDICT_N && fwrite(logits->data, sizeof(float), n, f) == n;
    if (f) fclose(f);
    dist_tensor_destroy(logits);
    return ok ? 0 : 1;
}

static int worker_main(int argc, char **argv) {
    if (argc >= 7 && strcmp(argv[2], "train") == 0)
        return worker_train(argv[3], atoi(argv[4]), atoi(argv[5]), argv[6]);
    if (argc >= 5 && strcmp(argv[2], "collectives") == 0)
        return worker_collectives(argv[3], argv[4]);
    if (argc >= 5 && strcmp(argv[2], "predict") == 0) return worker_predict(argv[3], argv[4]);
    fprintf(stderr, "worker: bad arguments\n");
    return 2;
}

/* ---- the parent's side ------------------------------------------------------------------- */

/* Starts this program again with args, its stderr in the file `err`. */
static pid_t spawn_logged(char *const *args, const char *err) {
    fflush(NULL);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (!freopen(err, "w", stderr)) _exit(126);
        execv(g_self, args);
        _exit(127);
    }
    return pid;
}

/* The first 4 KiB of a file ("" when it cannot be read). */
static const char *head_of(const char *path) {
    static char buf[4096];
    buf[0] = 0;
    FILE *f = fopen(path, "r");
    if (f) {
        buf[fread(buf, 1, sizeof buf - 1, f)] = 0;
        fclose(f);
    }
    return buf;
}

static int wait_exit(pid_t pid) {
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* Runs two workers, args[i] with its TF_CONFIG at args[i][3], on fresh ports, and fails the test
 * with the stderr of a worker that did not exit 0. A run in which a worker could not listen
 * because another process took its port (free_port) is repeated, at most twice. */
static void run_two_workers(char **args[2]) {
    char spec[2][256], err[2][96];
    for (int attempt = 0;; attempt++) {
        int ports[2] = {free_port(), free_port()};
        pid_t pid[2];
        for (int i = 0; i < 2; i++) {
            tf_config(spec[i], sizeof spec[i], 2, ports, i);
            args[i][3] = spec[i];
            snprintf(err[i], sizeof err[i], "/tmp/dist_mw_err_%d_%d.txt", (int)getpid(), i);
            pid[i] = spawn_logged(args[i], err[i]);
        }
        int code[2], failed = -1, taken = 0;
        for (int i = 0; i < 2; i++) {
            code[i] = wait_exit(pid[i]);
            if (code[i] == 0) continue;
            if (failed < 0) failed = i;
            taken |= strstr(head_of(err[i]), "Address already in use") != NULL;
        }
        if (failed >= 0 && (!taken || attempt >= 2))
            ck_abort_msg("worker %d exited with %d: %s", failed, code[failed],
                         head_of(err[failed]));
        for (int i = 0; i < 2; i++) unlink(err[i]);
        if (failed < 0) return;
    }
}

static float *read_floats(const char *path, int64_t n) {
    float *w = malloc((size_t)n * sizeof *w);
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "%s missing", path);
    ck_assert_int_eq(fread(w, sizeof *w, (size_t)n, f), (size_t)n);
    fclose(f);
    return w;
}

/* Two worker processes x one replica, each with one compute thread, then mirrored with two
 * replicas (one thread each) in this process: same seed, same batches, global batch 64. */
static double workers_vs_mirrored(int use_sgd, int steps) {
    char path[2][64], steps_s[16], sgd_s[8];
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    snprintf(sgd_s, sizeof sgd_s, "%d", use_sgd);
    char *args[2][8];
    for (int i = 0; i < 2; i++) {
        snprintf(path[i], sizeof path[i], "/tmp/dist_mw_%d_%d.bin", (int)getpid(), i);
        char *a[] = {(char *)g_self, "--worker", "train", NULL, steps_s, sgd_s, path[i], NULL};
        memcpy(args[i], a, sizeof a);
    }
    run_two_workers((char **[2]){args[0], args[1]});

    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    trainer t;
    ck_assert_msg(make_trainer(&so, use_sgd, &t) == DIST_OK, "%s", dist_last_error());
    float *mirrored = NULL;
    int64_t n = 0;
    ck_assert_msg(train(&t, steps, &mirrored, &n) == DIST_OK, "%s", dist_last_error());
    float *w0 = read_floats(path[0], n), *w1 = read_floats(path[1], n);
    /* all workers hold bitwise identical weights */
    ck_assert_msg(memcmp(w0, w1, (size_t)n * sizeof *w0) == 0, "worker 1's weights differ");
    double worst = 0;
    for (int v = 0; v < dist_model_num_variables(t.model); v++) {
        const dist_tensor *var = dist_model_variable(t.model, 0, v);
        int64_t off = (float *)var->data - (float *)dist_model_params(t.model, 0)->data;
        double err = dist_test_rel_err(w0 + off, mirrored + off, dist_tensor_numel(var));
        if (err > worst) worst = err;
    }
    free(w0);
    free(w1);
    free(mirrored);
    unlink(path[0]);
    unlink(path[1]);
    free_trainer(&t);
    return worst;
}

START_TEST(test_two_workers_match_mirrored_two_replicas_after_20_sgd_steps) {
    double worst = workers_vs_mirrored(1, 20);
    ck_assert_msg(worst <= 1e-5, "2 workers vs mirrored: %.3g (relative, worst variable)", worst);
}
END_TEST

START_TEST(test_two_workers_match_mirrored_with_adam_for_20_steps) {
    /* Two summands meet in the same order in both (a + b is exact-commutative), so even
     * Adam, which amplifies rounding noise, stays together. */
    double worst = workers_vs_mirrored(0, 20);
    ck_assert_msg(worst <= 1e-5, "2 workers vs mirrored with Adam: %.3g", worst);
}
END_TEST

/* Two workers over `transport` ("tcp", "shm", or "mpi": started by mpiexec); returns the
 * weights of worker 0 after `steps` SGD steps and checks worker 1 holds the same bits. */
static float *two_workers(const char *transport, int steps, int64_t n) {
    char steps_s[16], path[2][96];
    snprintf(steps_s, sizeof steps_s, "%d", steps);
    pid_t pid[2];
    int nproc = 2;
    if (strcmp(transport, "mpi") == 0) {
#ifdef DIST_TEST_MPIEXEC
        char prefix[64];
        snprintf(prefix, sizeof prefix, "/tmp/dist_mw_mpi_%d", (int)getpid());
        for (int i = 0; i < 2; i++) snprintf(path[i], sizeof path[i], "%s.%d", prefix, i);
        dist_test_mpi_environment();
        char *args[] = {DIST_TEST_MPIEXEC,
                        "-n",
                        "2",
                        (char *)g_self,
                        "--worker",
                        "train",
                        "mpi",
                        steps_s,
                        "1",
                        prefix,
                        NULL};
        pid[0] = fork();
        ck_assert_int_ge(pid[0], 0);
        if (pid[0] == 0) {
            execv(DIST_TEST_MPIEXEC, args);
            _exit(127);
        }
        nproc = 1;
#else
        ck_abort_msg("libdist was built without MPI");
#endif
    } else {
        setenv("DIST_COLLECTIVE_TRANSPORT", transport, 1);
        char *args[2][8];
        for (int i = 0; i < 2; i++) {
            snprintf(path[i], sizeof path[i], "/tmp/dist_mw_%s_%d_%d.bin", transport, (int)getpid(),
                     i);
            char *a[] = {(char *)g_self, "--worker", "train", NULL, steps_s, "1", path[i], NULL};
            memcpy(args[i], a, sizeof a);
        }
        run_two_workers((char **[2]){args[0], args[1]});
        unsetenv("DIST_COLLECTIVE_TRANSPORT");
        nproc = 0;
    }
    for (int i = 0; i < nproc; i++)
        ck_assert_msg(wait_exit(pid[i]) == 0, "%s worker %d failed", transport, i);
    float *w0 = read_floats(path[0], n), *w1 = read_floats(path[1], n);
    ck_assert_msg(memcmp(w0, w1, (size_t)n * sizeof *w0) == 0, "%s: worker 1's weights differ",
                  transport);
    free(w1);
    unlink(path[0]);
    unlink(path[1]);
    return w0;
}

static int64_t bits_differ(const float *a, const float *b, int64_t n) {
    int64_t d = 0;
    for (int64_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof *a) != 0;
    return d;
}

/* The proof that the reshaped core keeps training exact: the same seed CNN, seed and
 * batches, 20 SGD (momentum) steps of global batch 64 as 2 x 32, give the same weights bit
 * for bit whether the two replicas are threads of one process (mirrored, in-process) or two
 * processes meeting over TCP, shared memory or MPI. (one_device on the whole batch of 64 is
 * a different float summation inside the kernels, not only in the all-reduce: it agrees to
 * 1e-5, which test_strategy.c pins; bits cannot match there.) */
START_TEST(test_mirrored_and_two_workers_over_tcp_shm_and_mpi_agree_bit_for_bit) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.devices = "cpu:0,cpu:1";
    so.threads_per_replica = 1;
    trainer t;
    ck_assert_msg(make_trainer(&so, 1, &t) == DIST_OK, "%s", dist_last_error());
    float *mirrored = NULL, *init = malloc(sizeof(float) * (size_t)dist_model_num_params(t.model));
    int64_t n = dist_model_num_params(t.model);
    ck_assert_int_eq(dist_model_get_weights(t.model, 0, init, n), DIST_OK);
    ck_assert_msg(train(&t, 20, &mirrored, &n) == DIST_OK, "%s", dist_last_error());
    ck_assert_msg(dist_test_rel_err(mirrored, init, n) > 1e-3, "training did not move the weights");
    static const char *const transports[] = {"tcp", "shm", "mpi"};
    for (int i = 0; i < 3; i++) {
        float *w = two_workers(transports[i], 20, n);
        int64_t d = bits_differ(w, mirrored, n);
        ck_assert_msg(d == 0, "%s: %lld of %lld weights differ from mirrored (relative %g)",
                      transports[i], (long long)d, (long long)n, dist_test_rel_err(w, mirrored, n));
        free(w);
    }
    free(init);
    free(mirrored);
    free_trainer(&t);
}
END_TEST

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "%s missing", path);
    static char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Worker 0's replica has 1 row [1], worker 1's has 2 rows [11, 12]. */
START_TEST(test_reduce_gather_variables_and_their_training_span_the_workers) {
    char path[2][64];
    char *args[2][6];
    for (int i = 0; i < 2; i++) {
        snprintf(path[i], sizeof path[i], "/tmp/dist_mw_c_%d_%d.txt", (int)getpid(), i);
        char *a[] = {(char *)g_self, "--worker", "collectives", NULL, path[i], NULL};
        memcpy(args[i], a, sizeof a);
    }
    run_two_workers((char **[2]){args[0], args[1]});
    const char *expect[2] = {"replicas_in_sync 2\nworkers 2\nworker_id 0\nchief 1\n"
                             "sum_axis0 24\nmean_axis0 8\ngathered_rows 3\n"
                             "gathered 1\ngathered 11\ngathered 12\n"
                             "by_column [2 x 3] 1 11 12 -1 -11 -12\non_read_sum 3\n"
                             "trained 0.3 0.6\nmerged 3 30\n",
                             "replicas_in_sync 2\nworkers 2\nworker_id 1\nchief 0\n"
                             "sum_axis0 24\nmean_axis0 8\ngathered_rows 3\n"
                             "gathered 1\ngathered 11\ngathered 12\n"
                             "by_column [2 x 3] 1 11 12 -1 -11 -12\non_read_sum 3\n"
                             "trained 0.3 0.6\nmerged 3 30\n"};
    for (int i = 0; i < 2; i++) {
        ck_assert_str_eq(slurp(path[i]), expect[i]);
        unlink(path[i]);
    }
}
END_TEST

/* Every worker gets all 7 rows in dataset order, equal to one_device's in this process. */
START_TEST(test_predict_over_two_workers_gives_every_row_in_order_on_each) {
    char path[2][64];
    char *args[2][6];
    for (int i = 0; i < 2; i++) {
        snprintf(path[i], sizeof path[i], "/tmp/dist_mw_p_%d_%d.bin", (int)getpid(), i);
        char *a[] = {(char *)g_self, "--worker", "predict", NULL, path[i], NULL};
        memcpy(args[i], a, sizeof a);
    }
    run_two_workers((char **[2]){args[0], args[1]});
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_ONE_DEVICE;
    so.devices = "cpu:0";
    so.threads_per_replica = 1;
    dist_tensor *want = NULL;
    ck_assert_msg(predict_logits(&so, &want) == DIST_OK, "%s", dist_last_error());
    for (int i = 0; i < 2; i++) {
        float *got = read_floats(path[i], PREDICT_N * 10);
        for (int k = 0; k < PREDICT_N * 10; k++)
            ck_assert_msg(fabsf(got[k] - ((float *)want->data)[k]) <= 1e-5f,
                          "worker %d, row %d, class %d: %g vs %g", i, k / 10, k % 10, got[k],
                          ((float *)want->data)[k]);
        free(got);
        unlink(path[i]);
    }
    dist_tensor_destroy(want);
}
END_TEST

/* worker/1 never starts: worker/0 gives up after the connect deadline, naming it. */
START_TEST(test_a_worker_that_never_joins_is_named_after_the_deadline) {
    char spec[256];
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.cluster.spec = spec;
    so.cluster.connect_timeout_s = 2;
    dist_strategy *s = NULL;
    struct timespec t0, t1;
    dist_status st;
    /* worker/0 listens on its own port: taken by another process meanwhile, pick again */
    for (int attempt = 0;; attempt++) {
        int ports[2] = {free_port(), free_port()};
        tf_config(spec, sizeof spec, 2, ports, 0);
        clock_gettime(CLOCK_MONOTONIC, &t0);
        st = dist_strategy_create(&so, &s);
        clock_gettime(CLOCK_MONOTONIC, &t1);
        if (st == DIST_OK || attempt >= 2 || !strstr(dist_last_error(), "Address already in use"))
            break;
    }
    ck_assert_int_eq(st, DIST_TIMEOUT);
    ck_assert_ptr_null(s);
    ck_assert_msg(strstr(dist_last_error(), "worker/1") != NULL, "%s", dist_last_error());
    double took = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
    ck_assert_msg(took >= 0.9 * so.cluster.connect_timeout_s &&
                      took < dist_test_timeout_bound(so.cluster.connect_timeout_s),
                  "gave up after %.1f s (connect timeout %g s)", took,
                  so.cluster.connect_timeout_s);
}
END_TEST

START_TEST(test_invalid_cluster_specs_are_refused_with_tensorflows_message) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0";
    so.cluster.spec = "{\"cluster\":{\"worker\":[\"127.0.0.1:1\"]},\"task\":{\"type\":\"worker\","
                      "\"index\":3}}";
    dist_strategy *s = NULL;
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "TF_CONFIG") != NULL, "%s", dist_last_error());
    so.cluster.spec = "{\"cluster\":{\"ps\":[\"127.0.0.1:1\"],\"worker\":[\"127.0.0.1:2\"]},"
                      "\"task\":{\"type\":\"ps\",\"index\":0}}";
    ck_assert_int_eq(dist_strategy_create(&so, &s), DIST_INVALID_ARGUMENT);
    ck_assert_msg(strstr(dist_last_error(), "parameter_server") != NULL, "%s", dist_last_error());
}
END_TEST

/* No cluster: one local worker, which is the chief; its replicas are all there is. */
START_TEST(test_without_a_cluster_multi_worker_is_one_local_worker) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_MULTI_WORKER;
    so.devices = "cpu:0,cpu:1";
    so.cluster.spec = "";
    dist_strategy *s = NULL;
    ck_assert_msg(dist_strategy_create(&so, &s) == DIST_OK, "%s", dist_last_error());
    ck_assert_int_eq(dist_strategy_num_workers(s), 1);
    ck_assert_int_eq(dist_strategy_is_chief(s), 1);
    ck_assert_int_eq(dist_strategy_num_replicas_in_sync(s), 2);
    ck_assert_str_eq(dist_strategy_name(s), "multi_worker");
    dist_strategy_destroy(s);
}
END_TEST

int main(int argc, char **argv) {
    /* workers are this program again: they inherit the cluster token */
    setenv("DIST_CLUSTER_TOKEN", "test_multi_worker cluster token", 0);
    g_self = "/proc/self/exe";
    static char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        g_self = self;
    }
    if (argc >= 2 && strcmp(argv[1], "--worker") == 0) return worker_main(argc, argv);
    signal(SIGPIPE, SIG_IGN);
    Suite *s = suite_create("multi_worker");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_invalid_cluster_specs_are_refused_with_tensorflows_message);
    tcase_add_test(tc, test_without_a_cluster_multi_worker_is_one_local_worker);
    tcase_add_test(tc, test_a_worker_that_never_joins_is_named_after_the_deadline);
    tcase_add_test(tc, test_reduce_gather_variables_and_their_training_span_the_workers);
    tcase_add_test(tc, test_predict_over_two_workers_gives_every_row_in_order_on_each);
    tcase_add_test(tc, test_two_workers_match_mirrored_two_replicas_after_20_sgd_steps);
    tcase_add_test(tc, test_two_workers_match_mirrored_with_adam_for_20_steps);
    tcase_add_test(tc, test_mirrored_and_two_workers_over_tcp_shm_and_mpi_agree_bit_for_bit);
    suite_add_tcase(s, tc);
    return dist_test_run(s);
}
