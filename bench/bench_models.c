/* Training throughput of the benchmark zoo (bench/models/: the seed CNN, ResNet-20, the MLP and
 * the Transformer text classifier, each a Keras JSON written by bench/models/zoo.py) in libdist:
 * the model from dist_model_from_keras_json, synthetic data of its input shape (float32 normal
 * images; int32 token ids for an int32 input) with random labels, a custom training loop of
 * dist_classifier_train_step with Adam(1e-3) at the batch the issue names (flops.txt), under
 *   1t:        one_device, 1 thread
 *   2t:        one_device, 2 threads
 *   mirrored2: mirrored, 2 CPU replicas of 1 thread (the global batch split between them)
 * Each configuration: a warm-up of --warmup steps, then --repeats timed runs of --steps steps;
 * prints each run and the median in examples/s, the model's training FLOPs per example (counted
 * by zoo.py from the layer shapes: 2 per multiply-add of Conv2D, Dense and attention, forward,
 * backward-data and backward-weights) and the FLOP rate against the FP32 FMA peak measured at
 * start (fma_peak.c; --no-peak skips it). A model libdist refuses prints the refusal
 * (dist_last_error()) on a "REFUSED model=NAME: ..." line and is skipped; the exit status is
 * then 3.
 *
 * Machine-readable lines for bench/bench_models.py:
 *   RESULT model=NAME config=CFG batch=B examples_per_sec=X runs=a,b,c flops_per_example=F
 *   REFUSED model=NAME: message
 *
 * usage: bench_models [--models seed_cnn,resnet20,mlp,transformer,lstm] [--configs 1t,2t,mirrored2]
 *                     [--steps N] [--warmup N] [--repeats R] [--models-dir DIR] [--no-peak]
 *                     [--mixed-precision]   (each configuration in float32 and mixed_bfloat16)
 *                     [--mixed-precision-only] (mixed_bfloat16 only: for profiling it)
 *                     [--profile N] (then N steps under the op profile: a PROFILE table of
 *                                    ms per step per op, forward and backward)
 *                     [--batch B] (every model at batch B instead of its zoo batch)
 * (run from anywhere; the zoo is found through the source tree) */
#include "fma_peak.h"

#include <dist/dist.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef DIST_SOURCE_DIR
#define DIST_SOURCE_DIR "."
#endif

#define MAX_REPEATS 64
#define CLASSES_MAX 1000

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(const double *v, int n) {
    double c[MAX_REPEATS];
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    return n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
}

/* One line of bench/models/flops.txt. */
typedef struct zoo_entry {
    char name[64];
    int ndim;
    int64_t shape[4];
    int int_input; /* int32 token ids */
    int64_t batch;
    double flops;
    int64_t params;
} zoo_entry;

static int read_zoo(const char *dir, zoo_entry *z, int max) {
    char path[4096];
    snprintf(path, sizeof path, "%s/flops.txt", dir);
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return -1;
    }
    char line[512];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        if (line[0] == '#') continue;
        char shape[64], dtype[16];
        zoo_entry *e = &z[n];
        long long b, p;
        if (sscanf(line, "%63s %63s %15s %lld %lf %lld", e->name, shape, dtype, &b, &e->flops,
                   &p) != 6)
            continue;
        e->batch = b;
        e->params = p;
        e->int_input = strcmp(dtype, "int32") == 0;
        e->ndim = 0;
        for (char *tok = strtok(shape, "x"); tok && e->ndim < 4; tok = strtok(NULL, "x"))
            e->shape[e->ndim++] = atoll(tok);
        n++;
    }
    fclose(f);
    return n;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) {
        free(s);
        s = NULL;
    }
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Synthetic data: `count` examples of the model's input and random labels below `classes`. */
typedef struct synth {
    void *x;
    int32_t *y;
    int64_t count;
} synth;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int synth_make(const zoo_entry *z, int64_t classes, int64_t count, synth *d) {
    int64_t per = 1;
    for (int i = 0; i < z->ndim; i++) per *= z->shape[i];
    d->count = count;
    d->x = malloc((size_t)(per * count) * 4);
    d->y = malloc((size_t)count * sizeof *d->y);
    if (!d->x || !d->y) return -1;
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t i = 0; i < per * count; i++) {
        if (z->int_input) {
            ((int32_t *)d->x)[i] = (int32_t)(rng_next(&s) % 20000);
        } else { /* a sum of 4 uniforms: roughly normal, mean 0, variance 1/3 */
            double u = 0;
            for (int k = 0; k < 4; k++) u += (double)(rng_next(&s) >> 11) / 9007199254740992.0;
            ((float *)d->x)[i] = (float)(u - 2.0);
        }
    }
    for (int64_t i = 0; i < count; i++) d->y[i] = (int32_t)(rng_next(&s) % (uint64_t)classes);
    return 0;
}

#define TRY(call, what)                                                                            \
    do {                                                                                           \
        if ((call) != DIST_OK) {                                                                   \
            snprintf(err, err_size, "%s: %s", what, dist_last_error());                            \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* Trains `z` under one configuration and fills runs[0..repeats) with examples/s; 0 on success,
 * else -1 with the reason in err. refused is set when dist_model_from_keras_json said no. */
/* --profile N: after the timed runs, N more steps under the op profile (dist/tape.h) */
static int profile_steps;

static int run_config(const zoo_entry *z, const char *json, const char *config,
                      dist_dtype_policy policy, int warmup, int steps, int repeats, double *runs,
                      int *refused, char *err, size_t err_size) {
    int rc = -1;
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    if (strcmp(config, "1t") == 0 || strcmp(config, "2t") == 0) {
        so.kind = DIST_STRATEGY_ONE_DEVICE;
        so.devices = "cpu:0";
        so.threads_per_replica = config[0] - '0';
    } else if (strcmp(config, "mirrored2") == 0) {
        so.kind = DIST_STRATEGY_MIRRORED;
        so.devices = "cpu:0,cpu:1";
        so.threads_per_replica = 1;
    } else {
        snprintf(err, err_size, "unknown configuration %s (1t, 2t, mirrored2)", config);
        return -1;
    }
    dist_strategy *s = NULL;
    dist_model *m = NULL;
    dist_optimizer *opt = NULL;
    dist_dataset *ds = NULL, *next = NULL;
    dist_distributed_dataset *dds = NULL;
    dist_distributed_iterator *it = NULL;
    synth d = {0};
    *refused = 0;
    TRY(dist_strategy_create(&so, &s), "strategy");
    TRY(dist_strategy_scope_enter(s), "scope");
    dist_status st = dist_model_from_keras_json(json, 35, &m);
    if (st != DIST_OK) {
        *refused = 1;
        snprintf(err, err_size, "%s", dist_last_error());
        dist_strategy_scope_exit(s);
        goto out;
    }
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    st = dist_optimizer_create_adam(&ao, &opt);
    dist_strategy_scope_exit(s);
    TRY(st, "adam");
    TRY(dist_model_set_dtype_policy(m, policy), "dtype policy");
    int64_t oshape[4];
    int ond = dist_model_output_shape(m, oshape);
    int64_t classes = ond > 0 ? oshape[ond - 1] : 10;
    if (classes < 1 || classes > CLASSES_MAX) classes = 10;
    /* 8 distinct batches, cycled: enough that no step reads what the last one left in cache */
    if (synth_make(z, classes, 8 * z->batch, &d)) {
        snprintf(err, err_size, "out of memory for the synthetic data");
        goto out;
    }
    int64_t xshape[5] = {d.count}, yshape[1] = {d.count};
    for (int i = 0; i < z->ndim; i++) xshape[1 + i] = z->shape[i];
    dist_tensor parts[2] = {
        dist_tensor_view(d.x, z->int_input ? DIST_I32 : DIST_F32, 1 + z->ndim, xshape),
        dist_tensor_view(d.y, DIST_I32, 1, yshape)};
    dist_tensor *ptrs[2] = {&parts[0], &parts[1]};
    TRY(dist_dataset_from_tensor_slices(ptrs, 2, 0, &ds), "dataset");
    TRY(dist_dataset_batch(ds, z->batch, 1, &next), "batch");
    dist_dataset_destroy(ds);
    ds = next;
    next = NULL;
    TRY(dist_dataset_repeat(ds, -1, &next), "repeat");
    dist_dataset_destroy(ds);
    ds = next;
    next = NULL;
    TRY(dist_dataset_prefetch(ds, 2, &next), "prefetch");
    dist_dataset_destroy(ds);
    ds = next;
    next = NULL;
    TRY(dist_strategy_distribute_dataset(s, ds, &dds), "distribute");
    TRY(dist_distributed_dataset_iterator(dds, &it), "iterator");
    dist_classifier_step cs = {m, opt, z->batch, NULL};
    for (int r = -1; r < repeats; r++) {
        int n = r < 0 ? warmup : steps;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            dist_per_replica_element e;
            dist_per_replica out;
            int end = 0;
            TRY(dist_distributed_iterator_next(it, &e, &end), "next batch");
            TRY(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out), "train step");
            if (i == n - 1) { /* the loss of the run's last step must be finite */
                dist_tensor *loss = NULL;
                TRY(dist_strategy_reduce(s, DIST_REDUCE_SUM, &out, 0, -1, &loss), "reduce");
                float l = *(const float *)loss->data;
                dist_tensor_destroy(loss);
                if (!isfinite(l)) {
                    snprintf(err, err_size, "loss %g after %d steps", (double)l, n);
                    goto out;
                }
            }
        }
        if (r >= 0) runs[r] = (double)z->batch * steps / (now_s() - t0);
    }
    if (profile_steps > 0) {
        /* the op profile over further steps: per op, ms per step forward and backward */
        dist_op_profile_start();
        double t0 = now_s();
        for (int i = 0; i < profile_steps; i++) {
            dist_per_replica_element e;
            dist_per_replica out;
            int end = 0;
            TRY(dist_distributed_iterator_next(it, &e, &end), "next batch");
            TRY(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out), "train step");
        }
        double step_ms = 1e3 * (now_s() - t0) / profile_steps;
        dist_op_profile_stop();
        dist_op_profile_entry ent[64];
        int n = dist_op_profile_read(ent, 64);
        if (n > 64) n = 64;
        /* replicas run side by side: per replica, so the ops add up to one replica's step */
        double per = 1.0 / profile_steps / dist_strategy_num_local_replicas(s), sum = 0;
        printf("PROFILE model=%s config=%s policy=%s step_ms=%.3f steps=%d\n", z->name, config,
               dist_dtype_policy_name(policy), step_ms, profile_steps);
        printf("  %-26s %9s %9s %9s %7s %7s\n", "op", "fwd ms", "bwd ms", "total ms", "% step",
               "calls");
        for (int i = 0; i < n; i++) {
            double f = 1e3 * ent[i].forward_s * per, b = 1e3 * ent[i].backward_s * per;
            sum += f + b;
            printf("  %-26s %9.3f %9.3f %9.3f %6.1f%% %7.1f\n", ent[i].op, f, b, f + b,
                   100.0 * (f + b) / step_ms, (double)ent[i].forward_calls * per);
        }
        printf("  %-26s %9s %9s %9.3f %6.1f%%\n", "(optimizer, reduction, rest)", "", "",
               step_ms - sum, 100.0 * (step_ms - sum) / step_ms);
    }
    rc = 0;
out:
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(next);
    dist_dataset_destroy(ds);
    dist_optimizer_destroy(opt);
    dist_model_destroy(m);
    dist_strategy_destroy(s);
    free(d.x);
    free(d.y);
    return rc;
}

static int in_list(const char *list, const char *name) {
    size_t n = strlen(name);
    for (const char *p = list; p && *p;) {
        const char *c = strchr(p, ',');
        size_t len = c ? (size_t)(c - p) : strlen(p);
        if (len == n && strncmp(p, name, n) == 0) return 1;
        p = c ? c + 1 : NULL;
    }
    return 0;
}

/* Warnings and errors, and the mixed_bfloat16 path each distinct kernel call took (INFO, one
 * line per call shape: cpu_bf16_choice.c), on stderr: the table's bfloat16 rows say why. */
static void bench_log(dist_log_level level, const char *message, void *user) {
    (void)user;
    if (level <= DIST_LOG_WARN || strncmp(message, "mixed_bfloat16:", 15) == 0)
        fprintf(stderr, "%s\n", message);
}

int main(int argc, char **argv) {
    const char *models = "seed_cnn,resnet20,mlp,transformer,lstm", *configs = "1t,2t,mirrored2";
    const char *dir = DIST_SOURCE_DIR "/bench/models";
    int steps = 20, warmup = 5, repeats = 3, peak_on = 1, mixed = 0;
    long long batch_override = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--models") == 0 && v)
            models = argv[++i];
        else if (strcmp(a, "--configs") == 0 && v)
            configs = argv[++i];
        else if (strcmp(a, "--models-dir") == 0 && v)
            dir = argv[++i];
        else if (strcmp(a, "--steps") == 0 && v)
            steps = atoi(argv[++i]);
        else if (strcmp(a, "--warmup") == 0 && v)
            warmup = atoi(argv[++i]);
        else if (strcmp(a, "--repeats") == 0 && v)
            repeats = atoi(argv[++i]);
        else if (strcmp(a, "--no-peak") == 0)
            peak_on = 0;
        else if (strcmp(a, "--mixed-precision") == 0)
            mixed = 1;
        else if (strcmp(a, "--mixed-precision-only") == 0)
            mixed = 2;
        else if (strcmp(a, "--profile") == 0 && v)
            profile_steps = atoi(argv[++i]);
        else if (strcmp(a, "--batch") == 0 && v)
            batch_override = atoll(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--models a,b] [--configs 1t,2t,mirrored2] [--steps N] "
                    "[--warmup N] [--repeats R] [--models-dir DIR] [--no-peak] "
                    "[--mixed-precision | --mixed-precision-only] [--profile N] [--batch B]\n",
                    argv[0]);
            return 2;
        }
    }
    dist_set_log_callback(bench_log, DIST_LOG_INFO, NULL);
    if (steps < 1 || warmup < 0 || repeats < 1 || repeats > MAX_REPEATS || batch_override < 0) {
        fprintf(stderr,
                "bench_models: --steps >= 1, --warmup >= 0, 1 <= --repeats <= %d, --batch >= 0\n",
                MAX_REPEATS);
        return 2;
    }
    zoo_entry zoo[16];
    int nz = read_zoo(dir, zoo, 16);
    if (nz <= 0) {
        fprintf(stderr, "bench_models: no zoo in %s/flops.txt (bench/models/zoo.py writes it)\n",
                dir);
        return 1;
    }
    if (batch_override > 0)
        for (int k = 0; k < nz; k++) zoo[k].batch = batch_override;
    const char *isa = "none";
    double peak = peak_on ? dist_bench_fma_peak(5, 0.1, &isa) : 0;
    if (peak_on) printf("FP32 FMA peak of one core: %.1f GFLOP/s (%s)\n", peak * 1e-9, isa);
    printf("%-12s %-10s %-15s %6s %12s %8s %7s  %s\n", "model", "config", "policy", "batch",
           "examples/s", "GFLOP/s", "% peak", "runs");
    int status = 0;
    for (int k = 0; k < nz; k++) {
        const zoo_entry *z = &zoo[k];
        if (!in_list(models, z->name)) continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.json", dir, z->name);
        char *json = slurp(path);
        if (!json) {
            fprintf(stderr, "bench_models: cannot read %s\n", path);
            return 1;
        }
        int refused_once = 0;
        for (const char *c = configs; c && *c && !refused_once;) {
            char cfg[32];
            const char *comma = strchr(c, ',');
            size_t len = comma ? (size_t)(comma - c) : strlen(c);
            if (len >= sizeof cfg) len = sizeof cfg - 1;
            memcpy(cfg, c, len);
            cfg[len] = '\0';
            c = comma ? comma + 1 : NULL;
            for (int p = mixed == 2; p <= (mixed != 0); p++) {
                dist_dtype_policy pol = p ? DIST_POLICY_MIXED_BFLOAT16 : DIST_POLICY_FLOAT32;
                double runs[MAX_REPEATS];
                int refused = 0;
                char err[2048] = "";
                if (run_config(z, json, cfg, pol, warmup, steps, repeats, runs, &refused, err,
                               sizeof err)) {
                    if (refused) {
                        printf("REFUSED model=%s: %s\n", z->name, err);
                        refused_once = 1;
                        status = 3;
                        break;
                    }
                    fprintf(stderr, "bench_models: %s %s: %s\n", z->name, cfg, err);
                    return 1;
                }
                double med = median(runs, repeats), rate = med * z->flops;
                int cores = strcmp(cfg, "1t") == 0 ? 1 : 2;
                char list[1024] = "";
                for (int r = 0; r < repeats; r++)
                    snprintf(list + strlen(list), sizeof list - strlen(list), "%s%.1f",
                             r ? "," : "", runs[r]);
                printf("%-12s %-10s %-15s %6lld %12.1f %8.1f %6.1f%%  %s\n", z->name, cfg,
                       dist_dtype_policy_name(pol), (long long)z->batch, med, rate * 1e-9,
                       peak > 0 ? 100.0 * rate / (peak * cores) : 0.0, list);
                printf("RESULT model=%s config=%s policy=%s batch=%lld examples_per_sec=%.1f "
                       "runs=%s flops_per_example=%.0f\n",
                       z->name, cfg, dist_dtype_policy_name(pol), (long long)z->batch, med, list,
                       z->flops);
                fflush(stdout);
            }
        }
        free(json);
    }
    return status;
}
