/* The tpu strategy's compiled step against the C engine, in one run.
 *
 * usage: bench_tpu [--plugin PATH] [--steps N] [--warmup W] [--repeats R]
 *
 * Each configuration trains the MNIST CNN (global batch 64, Adam) from the same seed: W warm-up
 * steps (the tpu rows compile there), then N timed steps; configurations are interleaved, R
 * rounds, and the table gives the median images/s. Rows: one_device and mirrored on the oneDNN
 * engine (this machine's cores), and tpu on a PJRT plugin with 1 and 2 devices (default: XLA's
 * CPU plugin from the pjrt venv, $DIST_PJRT_PLUGIN, or --plugin). */
#include <dist/dist.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define GLOBAL_BATCH 64

typedef struct state {
    dist_model *model;
    dist_optimizer *optimizer;
} state;

static dist_status train_step(dist_replica_ctx *rc, const dist_element *in, void *user,
                              dist_element *out) {
    state *s = user;
    dist_tape *tape = dist_replica_tape(rc);
    dist_tensor *logits, *per_example, *loss;
    DIST_RETURN_IF_ERROR(dist_model_call(s->model, tape, in->items[0], &logits));
    DIST_RETURN_IF_ERROR(
        dist_op_sparse_softmax_cross_entropy(tape, logits, in->items[1], &per_example));
    DIST_RETURN_IF_ERROR(dist_compute_average_loss(tape, per_example, GLOBAL_BATCH, &loss));
    DIST_RETURN_IF_ERROR(dist_model_compute_gradients(s->model, tape, loss));
    DIST_RETURN_IF_ERROR(dist_optimizer_apply_gradients(s->optimizer, s->model, tape));
    out->count = 1;
    out->items[0] = loss;
    return DIST_OK;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

typedef struct config {
    const char *name;
    dist_strategy_kind kind;
    const char *devices;
    int cores;
    int spe;          /* steps per execution (dist_strategy_run_steps) */
    const char *form; /* $DIST_TPU_STEPS_FORM */
} config;

/* k batches copied out of the iterator (its views are overwritten by the next batch) */
static dist_per_replica_element group_el[16];
static dist_tensor *group_owned[16][DIST_MAX_REPLICAS][2];

static int copy_batch(const dist_per_replica_element *b, int j) {
    group_el[j] = *b;
    for (int r = 0; r < b->num_replicas; r++)
        for (int i = 0; i < b->replicas[r].count && i < 2; i++) {
            const dist_tensor *t = b->replicas[r].items[i];
            dist_tensor **o = &group_owned[j][r][i];
            if (*o && dist_tensor_bytes(*o) != dist_tensor_bytes(t)) {
                dist_tensor_destroy(*o);
                *o = NULL;
            }
            if (!*o && dist_tensor_create(t->dtype, t->ndim, t->shape, o)) return 1;
            memcpy((*o)->data, t->data, dist_tensor_bytes(t));
            group_el[j].replicas[r].items[i] = *o;
        }
    return 0;
}

/* images/s of `steps` timed steps after `warmup`; compile seconds out for tpu. -1 on error. */
static double run(const config *c, const char *plugin, int warmup, int steps,
                  const dist_mnist *mnist, double *compile_s) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = c->kind;
    so.devices = c->devices;
    so.tpu.pjrt_plugin = plugin;
    so.tpu.cores = c->cores;
    if (c->form)
        setenv("DIST_TPU_STEPS_FORM", c->form, 1);
    else
        unsetenv("DIST_TPU_STEPS_FORM");
    dist_strategy *strategy;
    state st = {0};
    int64_t input_shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (dist_strategy_create(&so, &strategy) || dist_strategy_scope_enter(strategy) ||
        dist_model_create_mnist_cnn(&st.model) || dist_model_build(st.model, 3, input_shape, 42) ||
        dist_optimizer_create_adam(&adam, &st.optimizer) || dist_strategy_scope_exit(strategy)) {
        fprintf(stderr, "bench_tpu: %s: %s\n", c->name, dist_last_error());
        return -1;
    }
    dist_tensor images = *dist_mnist_train_images(mnist), labels = *dist_mnist_train_labels(mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    if (dist_dataset_from_tensor_slices(parts, 2, 0, &ds) ||
        dist_dataset_map_image_normalize(ds, &next))
        return -1;
    dist_dataset_destroy(ds), ds = next;
    if (dist_dataset_repeat(ds, -1, &next)) return -1;
    dist_dataset_destroy(ds), ds = next;
    if (dist_dataset_batch(ds, GLOBAL_BATCH, 1, &next)) return -1;
    dist_dataset_destroy(ds), ds = next;
    if (dist_dataset_prefetch(ds, 2, &next)) return -1;
    dist_dataset_destroy(ds), ds = next;
    if (dist_strategy_distribute_dataset(strategy, ds, &dds) ||
        dist_distributed_dataset_iterator(dds, &it))
        return -1;
    double t0 = 0;
    int k = c->spe > 1 ? c->spe : 1;
    for (int s = 0; s < warmup + steps; s += k) {
        if (s >= warmup && t0 == 0) t0 = now_s();
        const dist_per_replica_element *in[16];
        dist_per_replica results;
        int end = 0;
        for (int j = 0; j < k; j++) {
            dist_per_replica_element batch;
            if (dist_distributed_iterator_next(it, &batch, &end) || end || copy_batch(&batch, j)) {
                fprintf(stderr, "bench_tpu: %s: %s\n", c->name,
                        end ? "data ended" : dist_last_error());
                return -1;
            }
            in[j] = &group_el[j];
        }
        if (dist_strategy_run_steps(strategy, train_step, &st, k, in, &results)) {
            fprintf(stderr, "bench_tpu: %s: %s\n", c->name, dist_last_error());
            return -1;
        }
    }
    double dt = now_s() - t0;
    *compile_s = 0;
    dist_tpu_stats ts;
    if (c->kind == DIST_STRATEGY_TPU && !dist_tpu_strategy_stats(strategy, &ts))
        *compile_s = ts.compile_seconds;
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_optimizer_destroy(st.optimizer);
    dist_model_destroy(st.model);
    dist_strategy_destroy(strategy);
    return (double)steps * GLOBAL_BATCH / dt;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int main(int argc, char **argv) {
    const char *plugin = getenv("DIST_PJRT_PLUGIN");
    char def[1024];
    const char *home = getenv("HOME");
    snprintf(def, sizeof def, "%s/.cache/libdist/venv-pjrt/plugins/pjrt_c_api_cpu_plugin.so",
             home ? home : "");
    if (!plugin || !*plugin) plugin = def;
    int steps = 200, warmup = 24, repeats = 3;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--plugin") && i + 1 < argc)
            plugin = argv[++i];
        else if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--plugin PATH] [--steps N] [--warmup W] [--repeats R]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 8 || steps % 8 || warmup < 16 || warmup % 8 || repeats < 1 || repeats > 15) {
        fprintf(stderr, "bench_tpu: steps and warmup multiples of 8 (the 8-step rows), warmup "
                        ">= 16 (their first executions compile), repeats 1..15\n");
        return 2;
    }
    dist_mnist *mnist;
    if (dist_mnist_load(NULL, &mnist)) {
        fprintf(stderr, "bench_tpu: %s\n", dist_last_error());
        return 1;
    }
    const config configs[] = {
        {"one_device (oneDNN, all cores)", DIST_STRATEGY_ONE_DEVICE, "cpu:0", 0, 1, NULL},
        {"mirrored 2 replicas (oneDNN)", DIST_STRATEGY_MIRRORED, "cpu:0,cpu:1", 0, 1, NULL},
        {"tpu, XLA CPU plugin, 1 device", DIST_STRATEGY_TPU, NULL, 1, 1, NULL},
        {"tpu, XLA CPU plugin, 2 devices", DIST_STRATEGY_TPU, NULL, 2, 1, NULL},
        {"tpu, 2 devices, 8 steps/execution unrolled", DIST_STRATEGY_TPU, NULL, 2, 8, "unrolled"},
        {"tpu, 2 devices, 8 steps/execution loop", DIST_STRATEGY_TPU, NULL, 2, 8, "loop"},
    };
    enum { NC = sizeof configs / sizeof configs[0] };
    double ips[NC][15], comp[NC][15];
    for (int r = 0; r < repeats; r++)
        for (int c = 0; c < NC; c++) {
            ips[c][r] = run(&configs[c], plugin, warmup, steps, mnist, &comp[c][r]);
            if (ips[c][r] < 0) return 1;
            fprintf(stderr, "round %d: %-32s %8.0f images/s\n", r + 1, configs[c].name, ips[c][r]);
        }
    printf("\n%d timed steps after %d warm-up steps, global batch 64, Adam; median of %d\n\n",
           steps, warmup, repeats);
    printf("| configuration | images/s | compile s (all programs) |\n|---|---|---|\n");
    for (int c = 0; c < NC; c++) {
        qsort(ips[c], (size_t)repeats, sizeof(double), cmp);
        qsort(comp[c], (size_t)repeats, sizeof(double), cmp);
        if (configs[c].kind == DIST_STRATEGY_TPU)
            printf("| %s | %.0f | %.2f |\n", configs[c].name, ips[c][repeats / 2],
                   comp[c][repeats / 2]);
        else
            printf("| %s | %.0f | - |\n", configs[c].name, ips[c][repeats / 2]);
    }
    dist_mnist_destroy(mnist);
    return 0;
}
