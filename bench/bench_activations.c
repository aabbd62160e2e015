/* Keras's activations on the CPU backend at one thread: each as the tape runs it (the op, then
 * its gradient through dist_tape_gradient_with), on N float32 values drawn from N(0, 2), and
 * the same through TensorFlow in the same run (bench/tf_activations.py, with --tf PYTHON),
 * the two alternating for R rounds; medians of the rounds, each round the best of K calls.
 *
 * Usage: bench_activations [--n 2097152] [--rounds 5] [--calls 5] [--tf PYTHON]
 * Prints one table row per activation: libdist forward / backward ms, TensorFlow's, ratios. */
#include "dist/dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct act {
    const char *name; /* TensorFlow's side names it the same (tf_activations.py) */
    dist_activation a;
    float alpha; /* < 0: the enum's; else dist_op_elu / dist_op_leaky_relu with it */
} act;

static const act acts[] = {
    {"relu", DIST_ACT_RELU, -1},
    {"sigmoid", DIST_ACT_SIGMOID, -1},
    {"tanh", DIST_ACT_TANH, -1},
    {"gelu", DIST_ACT_GELU, -1},
    {"elu", DIST_ACT_ELU, -1},
    {"selu", DIST_ACT_SELU, -1},
    {"softplus", DIST_ACT_SOFTPLUS, -1},
    {"softsign", DIST_ACT_SOFTSIGN, -1},
    {"mish", DIST_ACT_MISH, -1},
    {"relu6", DIST_ACT_RELU6, -1},
    {"leaky_relu", DIST_ACT_LEAKY_RELU, -1},
    {"hard_sigmoid", DIST_ACT_HARD_SIGMOID, -1},
    {"hard_silu", DIST_ACT_HARD_SILU, -1},
};

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != DIST_OK) {                                                                   \
            fprintf(stderr, "bench_activations: %s: %s\n", #call, dist_last_error());              \
            exit(2);                                                                               \
        }                                                                                          \
    } while (0)

/* best of `calls` forward and backward times (ms) of one activation */
static void time_one(dist_backend *be, const act *ac, const float *host, const float *seed,
                     int64_t n, int calls, double *fwd, double *bwd) {
    dist_tape *t;
    CHECK(dist_tape_create(be, &t));
    *fwd = *bwd = 1e30;
    for (int c = 0; c < calls; c++) {
        dist_tape_reset(t);
        dist_tensor hx = dist_tensor_view((float *)host, DIST_F32, 1, &n);
        dist_tensor hs = dist_tensor_view((float *)seed, DIST_F32, 1, &n);
        dist_tensor *x, *s, *y, *g;
        CHECK(dist_tape_upload(t, &hx, &x));
        CHECK(dist_tape_upload(t, &hs, &s));
        CHECK(dist_tape_alloc(t, DIST_F32, 1, &n, &g));
        CHECK(dist_tape_watch(t, x));
        dist_backend_synchronize(be);
        double t0 = now();
        CHECK(dist_op_activation(t, x, ac->a, &y));
        dist_backend_synchronize(be);
        double t1 = now();
        CHECK(dist_tape_gradient_with(t, y, s, 1, &x, &g));
        dist_backend_synchronize(be);
        double t2 = now();
        if (1e3 * (t1 - t0) < *fwd) *fwd = 1e3 * (t1 - t0);
        if (1e3 * (t2 - t1) < *bwd) *bwd = 1e3 * (t2 - t1);
    }
    dist_tape_destroy(t);
}

int main(int argc, char **argv) {
    int64_t n = 2097152;
    int rounds = 5, calls = 5;
    const char *tf = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--n") && i + 1 < argc)
            n = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--calls") && i + 1 < argc)
            calls = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tf") && i + 1 < argc)
            tf = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--n N] [--rounds R] [--calls K] [--tf PYTHON]\n", argv[0]);
            return 1;
        }
    }
    if (n <= 0 || rounds <= 0 || rounds > 64 || calls <= 0) return 1;
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    dist_backend *be;
    CHECK(dist_backend_create(&o, &be));
    float *x = malloc((size_t)n * sizeof *x), *s = malloc((size_t)n * sizeof *s);
    if (!x || !s) return 2;
    uint64_t r = 88172645463325252ull;
    for (int64_t i = 0; i < n; i++) { /* N(0, 2) by Box-Muller, dy uniform in [-1, 1) */
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double u1 = ((double)(r >> 11) + 1.0) / 9007199254740993.0;
        r ^= r << 13, r ^= r >> 7, r ^= r << 17;
        double u2 = (double)(r >> 11) / 9007199254740992.0;
        x[i] = (float)(2.0 * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
        s[i] = (float)(2.0 * u2 - 1.0);
    }
    const int na = (int)(sizeof acts / sizeof acts[0]);
    double ours[16][2][64], theirs[16][2][64];
    int have_tf = tf != NULL;
    for (int k = 0; k < rounds; k++) {
        for (int a = 0; a < na; a++)
            time_one(be, &acts[a], x, s, n, calls, &ours[a][0][k], &ours[a][1][k]);
        if (!have_tf) continue;
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s %s/bench/tf_activations.py --n %lld --calls %d", tf,
                 DIST_SOURCE_DIR, (long long)n, calls);
        FILE *p = popen(cmd, "r");
        if (!p) return 2;
        char name[64];
        double f, b;
        int got = 0;
        while (fscanf(p, "%63s %lf %lf", name, &f, &b) == 3)
            for (int a = 0; a < na; a++)
                if (!strcmp(name, acts[a].name)) theirs[a][0][k] = f, theirs[a][1][k] = b, got++;
        if (pclose(p) != 0 || got != na) {
            fprintf(stderr, "bench_activations: %s gave %d of %d rows\n", cmd, got, na);
            return 2;
        }
    }
    printf("Keras activations, %lld float32 values, 1 thread, median of %d rounds (best of %d "
           "calls each)\n",
           (long long)n, rounds, calls);
    printf(
        "| activation | libdist fwd ms | libdist bwd ms | TF fwd ms | TF bwd ms | fwd TF/libdist "
        "| bwd TF/libdist |\n|---|---|---|---|---|---|---|\n");
    for (int a = 0; a < na; a++) {
        double f = median(ours[a][0], rounds), b = median(ours[a][1], rounds);
        if (!have_tf) {
            printf("| %s | %.2f | %.2f | | | | |\n", acts[a].name, f, b);
            continue;
        }
        double tf_f = median(theirs[a][0], rounds), tf_b = median(theirs[a][1], rounds);
        printf("| %s | %.2f | %.2f | %.2f | %.2f | %.2fx | %.2fx |\n", acts[a].name, f, b, tf_f,
               tf_b, tf_f / f, tf_b / b);
    }
    free(x);
    free(s);
    dist_backend_destroy(be);
    return 0;
}
