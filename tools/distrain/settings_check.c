/* Workers that disagree on a setting would train different things, or wait on each other
 * until the collective deadline: the settings travel as one int64 vector per replica,
 * gathered over the cluster with the public strategy API, and are compared on every worker. */
#include "settings_check.h"

#include <dist/replica.h>
#include <dist/tape.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

enum {
    SET_SEED,
    SET_OPTIMIZER,
    SET_LEARNING_RATE,
    SET_MIXED_PRECISION,
    SET_BATCH_SIZE,
    SET_EPOCHS,
    SET_STEPS,
    SET_VALIDATION_SPLIT,
    SET_TRANSPORT,
    SET_COUNT
};

static const char *const flag_of[SET_COUNT] = {
    "--seed",   "--optimizer",       "--learning-rate",    "--mixed-precision", "--batch-size",
    "--epochs", "--steps-per-epoch", "--validation-split", "--transport"};

static const char *const optimizers[] = {"adam", "sgd"};
static const char *const precisions[] = {"none", "fp16", "bf16"};
static const char *const transports[] = {"auto", "tcp", "shm", "mpi", "tls"};

static int64_t index_of(const char *v, const char *const *names, int n) {
    for (int i = 0; v && i < n; i++)
        if (strcmp(v, names[i]) == 0) return i;
    return 0;
}

/* Doubles travel as their bits: equal settings give equal integers. */
static int64_t bits_of(double x) {
    int64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

static double double_of(int64_t b) {
    double x;
    memcpy(&x, &b, sizeof x);
    return x;
}

static void settings_of(const distrain_options *o, int64_t *v) {
    v[SET_SEED] = (int64_t)o->seed;
    v[SET_OPTIMIZER] = index_of(o->optimizer, optimizers, 2);
    v[SET_LEARNING_RATE] = bits_of(o->learning_rate);
    v[SET_MIXED_PRECISION] = index_of(o->mixed_precision, precisions, 3);
    v[SET_BATCH_SIZE] = o->batch_size;
    v[SET_EPOCHS] = o->epochs;
    v[SET_STEPS] = o->max_steps;
    v[SET_VALIDATION_SPLIT] = bits_of(o->validation_split);
    v[SET_TRANSPORT] = index_of(o->transport, transports, 5);
}

static void format_value(int k, int64_t v, char *buf, size_t size) {
    switch (k) {
    case SET_OPTIMIZER: snprintf(buf, size, "%s", optimizers[v >= 0 && v < 2 ? v : 0]); break;
    case SET_MIXED_PRECISION: snprintf(buf, size, "%s", precisions[v >= 0 && v < 3 ? v : 0]); break;
    case SET_TRANSPORT: snprintf(buf, size, "%s", transports[v >= 0 && v < 5 ? v : 0]); break;
    case SET_LEARNING_RATE:
        if (double_of(v) > 0)
            snprintf(buf, size, "%g", double_of(v));
        else
            snprintf(buf, size, "the optimizer's default");
        break;
    case SET_VALIDATION_SPLIT: snprintf(buf, size, "%g", double_of(v)); break;
    case SET_SEED: snprintf(buf, size, "%" PRIu64, (uint64_t)v); break;
    case SET_STEPS:
        if (v == 0) {
            snprintf(buf, size, "the whole epoch");
            break;
        }
        /* fall through */
    default: snprintf(buf, size, "%" PRId64, v); break;
    }
}

static dist_status settings_step(dist_replica_ctx *rc, const dist_element *inputs, void *user,
                                 dist_element *outputs) {
    (void)inputs;
    int64_t shape[1] = {SET_COUNT};
    dist_tensor host = dist_tensor_view(user, DIST_I64, 1, shape);
    dist_tensor *t = NULL;
    dist_status st = dist_tape_upload(dist_replica_tape(rc), &host, &t);
    if (st) return st;
    outputs->count = 1;
    outputs->items[0] = t;
    return DIST_OK;
}

int distrain_check_settings(dist_strategy *s, const distrain_options *o) {
    if (dist_strategy_num_workers(s) < 2) return 0;
    int64_t mine[SET_COUNT];
    settings_of(o, mine);
    dist_per_replica pr;
    dist_tensor *all = NULL;
    dist_status st = dist_strategy_run(s, settings_step, mine, NULL, &pr);
    if (!st) st = dist_strategy_gather(s, &pr, 0, 0, &all);
    if (st) {
        fprintf(stderr, "distrain: comparing the workers' settings: %s\n", dist_last_error());
        return 1;
    }
    const int64_t *v = all->data;
    int64_t rows = all->shape[0] / SET_COUNT;
    int per_worker = dist_strategy_num_local_replicas(s);
    int rc = 0;
    for (int64_t r = 1; r < rows && !rc; r++) {
        for (int k = 0; k < SET_COUNT; k++) {
            if (v[r * SET_COUNT + k] == v[k]) continue;
            char a[64], b[64];
            format_value(k, v[k], a, sizeof a);
            format_value(k, v[r * SET_COUNT + k], b, sizeof b);
            fprintf(stderr,
                    "distrain: %s differs between workers: %s on worker 0, %s on worker %lld; "
                    "every worker must be started with the same settings\n",
                    flag_of[k], a, b, (long long)(r / (per_worker > 0 ? per_worker : 1)));
            rc = 2;
            break;
        }
    }
    dist_tensor_destroy(all);
    return rc;
}
