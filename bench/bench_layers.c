/* Per-layer forward and backward times of the seed CNN on one CPU thread, for the scaling
 * model (bench/scaling_model.py, docs/scaling.md): how long each layer's backward takes and in
 * which order the layers' gradients become ready, which decides how much of an all-reduce a
 * bucketed, overlapped reduction could hide.
 *
 * Each layer runs alone on a tape with the seed CNN's shapes and ops (the ones dist_model
 * calls: conv2d_max_pool2d for Conv2D + MaxPooling2D, flatten + dense, dense + the mean sparse
 * cross-entropy for the last): forward with recording, then dist_tape_gradient_with on the
 * layer's output with a random output gradient (the last layer: dist_tape_gradient of the loss)
 * for its kernel, bias and input (the first layer's input needs none, as in training). Median
 * of --repeats timings after warm-up, per batch size.
 *
 * usage: bench_layers [--batch-sizes 4,8,16,32,64] [--repeats 200] [--threads 1] [--json]
 * --json prints one JSON object (the model's input); otherwise a table. */
#include <dist/dist.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define NLAYERS 4
#define MAX_BATCHES 16

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static unsigned long long g_rng = 0x9e3779b97f4a7c15ull;
static float urand(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 16777216.0)) - 0.5f;
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        dist_status st_ = (call);                                                                  \
        if (st_ != DIST_OK) {                                                                      \
            fprintf(stderr, "bench_layers: %s: %s\n", #call, dist_last_error());                   \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

typedef struct layer {
    const char *name;
    int ndim_in;
    int64_t in[4];      /* input shape without the batch */
    int ndim_k;
    int64_t k[4];       /* kernel shape */
    int64_t units;      /* bias length */
    int input_grad;     /* whether the input's gradient is computed (all but the first) */
    dist_tensor *kernel, *bias, *gk, *gb;
} layer;

static void random_fill(dist_backend *be, dist_tensor *t, float scale) {
    int64_t n = dist_tensor_numel(t);
    float *h = malloc((size_t)n * sizeof *h);
    if (!h) exit(1);
    for (int64_t i = 0; i < n; i++) h[i] = scale * urand();
    CHECK(dist_backend_from_host(be, h, (size_t)n * sizeof *h, t));
    free(h);
}

static dist_tensor *upload_random(dist_tape *tape, int ndim, const int64_t *shape, float scale) {
    dist_tensor *host;
    CHECK(dist_tensor_create(DIST_F32, ndim, shape, &host));
    float *h = host->data;
    for (int64_t i = 0; i < dist_tensor_numel(host); i++) h[i] = scale * urand();
    dist_tensor *dev;
    CHECK(dist_tape_upload(tape, host, &dev));
    dist_tensor_destroy(host);
    return dev;
}

/* One forward + backward of layer l at batch b; adds the two times to *fwd and *bwd. */
static void run_layer(dist_tape *tape, layer *L, int l, int64_t b, const int32_t *labels,
                      double *fwd, double *bwd) {
    dist_tape_reset(tape);
    int64_t shape[5] = {b};
    memcpy(shape + 1, L->in, (size_t)L->ndim_in * sizeof(int64_t));
    dist_tensor *x = upload_random(tape, L->ndim_in + 1, shape, 1.0f);
    CHECK(dist_tape_watch(tape, L->kernel));
    CHECK(dist_tape_watch(tape, L->bias));
    if (L->input_grad) CHECK(dist_tape_watch(tape, x));
    dist_tensor *gx = NULL;
    if (L->input_grad) CHECK(dist_tape_alloc(tape, DIST_F32, L->ndim_in + 1, shape, &gx));
    double t0 = now_s();
    dist_tensor *y = NULL, *loss = NULL;
    if (l < 2) {
        CHECK(dist_op_conv2d_max_pool2d(tape, x, L->kernel, L->bias, 1, 1, DIST_PADDING_VALID,
                                        DIST_ACT_RELU, 2, 2, 2, 2, DIST_PADDING_VALID, &y));
    } else if (l == 2) {
        dist_tensor *flat;
        CHECK(dist_op_flatten(tape, x, &flat));
        CHECK(dist_op_dense(tape, flat, L->kernel, L->bias, DIST_ACT_RELU, &y));
    } else {
        dist_tensor *logits, *per, *lab;
        CHECK(dist_op_dense(tape, x, L->kernel, L->bias, DIST_ACT_NONE, &logits));
        dist_tensor hl = dist_tensor_view((void *)labels, DIST_I32, 1, (int64_t[]){b});
        CHECK(dist_tape_upload(tape, &hl, &lab));
        CHECK(dist_op_sparse_softmax_cross_entropy(tape, logits, lab, &per));
        CHECK(dist_op_reduce_mean(tape, per, &loss));
    }
    dist_tensor *dy = NULL;
    if (!loss) dy = upload_random(tape, y->ndim, y->shape, 0.01f);
    CHECK(dist_backend_synchronize(dist_tape_backend(tape)));
    double t1 = now_s();
    dist_tensor *src[3] = {L->kernel, L->bias, x};
    dist_tensor *dst[3] = {L->gk, L->gb, gx};
    int n = L->input_grad ? 3 : 2;
    if (loss) CHECK(dist_tape_gradient(tape, loss, n, src, dst));
    else CHECK(dist_tape_gradient_with(tape, y, dy, n, src, dst));
    CHECK(dist_backend_synchronize(dist_tape_backend(tape)));
    double t2 = now_s();
    *fwd += t1 - t0;
    *bwd += t2 - t1;
}

int main(int argc, char **argv) {
    int64_t batches[MAX_BATCHES] = {4, 8, 16, 32, 64};
    int nb = 5, repeats = 200, threads = 1, json = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batch-sizes") == 0 && i + 1 < argc) {
            nb = 0;
            for (char *p = strtok(argv[++i], ","); p && nb < MAX_BATCHES; p = strtok(NULL, ","))
                batches[nb++] = atoll(p);
        } else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc) {
            repeats = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
            threads = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--json") == 0) {
            json = 1;
        } else {
            fprintf(stderr, "usage: bench_layers [--batch-sizes 4,8,16,32,64] [--repeats 200] "
                            "[--threads 1] [--json]\n");
            return 2;
        }
    }
    if (nb < 1 || repeats < 1 || threads < 1) {
        fprintf(stderr, "bench_layers: batch sizes, repeats and threads must be positive\n");
        return 2;
    }
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    bo.threads = threads;
    dist_backend *be;
    CHECK(dist_backend_create(&bo, &be));
    dist_tape *tape;
    CHECK(dist_tape_create(be, &tape));
    /* The seed CNN: Conv2D(32,3x3,relu) -> MaxPool -> Conv2D(64,3x3,relu) -> MaxPool ->
     * Flatten -> Dense(64,relu) -> Dense(10). */
    layer L[NLAYERS] = {
        {"conv2d", 3, {28, 28, 1}, 4, {3, 3, 1, 32}, 32, 0, NULL, NULL, NULL, NULL},
        {"conv2d_1", 3, {13, 13, 32}, 4, {3, 3, 32, 64}, 64, 1, NULL, NULL, NULL, NULL},
        {"dense", 3, {5, 5, 64}, 2, {1600, 64}, 64, 1, NULL, NULL, NULL, NULL},
        {"dense_1", 1, {64}, 2, {64, 10}, 10, 1, NULL, NULL, NULL, NULL},
    };
    int64_t params = 0;
    for (int l = 0; l < NLAYERS; l++) {
        CHECK(dist_backend_alloc_tensor(be, DIST_F32, L[l].ndim_k, L[l].k, &L[l].kernel));
        CHECK(dist_backend_alloc_tensor(be, DIST_F32, 1, &L[l].units, &L[l].bias));
        CHECK(dist_backend_alloc_tensor(be, DIST_F32, L[l].ndim_k, L[l].k, &L[l].gk));
        CHECK(dist_backend_alloc_tensor(be, DIST_F32, 1, &L[l].units, &L[l].gb));
        random_fill(be, L[l].kernel, 0.1f);
        random_fill(be, L[l].bias, 0.01f);
        params += dist_tensor_numel(L[l].kernel) + L[l].units;
    }
    int32_t labels[4096];
    for (int i = 0; i < 4096; i++) labels[i] = i % 10;
    double *fw = malloc((size_t)repeats * sizeof *fw), *bw = malloc((size_t)repeats * sizeof *bw);
    if (!fw || !bw) return 1;
    if (json) printf("{\"threads\": %d, \"params\": %lld, \"layers\": [", threads, (long long)params);
    else printf("%-9s %6s %10s %14s %14s\n", "layer", "batch", "params", "forward_us", "backward_us");
    for (int l = 0; l < NLAYERS; l++) {
        int64_t lp = dist_tensor_numel(L[l].kernel) + L[l].units;
        if (json)
            printf("%s\n  {\"name\": \"%s\", \"params\": %lld, \"batches\": {", l ? "," : "",
                   L[l].name, (long long)lp);
        for (int bi = 0; bi < nb; bi++) {
            if (batches[bi] < 1 || batches[bi] > 4096) {
                fprintf(stderr, "bench_layers: batch sizes take 1 to 4096\n");
                return 2;
            }
            for (int r = 0; r < 10; r++) {
                double f = 0, b = 0;
                run_layer(tape, &L[l], l, batches[bi], labels, &f, &b);
            }
            for (int r = 0; r < repeats; r++) {
                fw[r] = bw[r] = 0;
                run_layer(tape, &L[l], l, batches[bi], labels, &fw[r], &bw[r]);
            }
            qsort(fw, (size_t)repeats, sizeof *fw, cmp_double);
            qsort(bw, (size_t)repeats, sizeof *bw, cmp_double);
            double f = 1e6 * fw[repeats / 2], b = 1e6 * bw[repeats / 2];
            if (json)
                printf("%s\"%lld\": {\"forward_us\": %.1f, \"backward_us\": %.1f}", bi ? ", " : "",
                       (long long)batches[bi], f, b);
            else
                printf("%-9s %6lld %10lld %14.1f %14.1f\n", L[l].name, (long long)batches[bi],
                       (long long)lp, f, b);
        }
        if (json) printf("}}");
    }
    if (json) printf("\n]}\n");
    free(fw);
    free(bw);
    for (int l = 0; l < NLAYERS; l++) {
        dist_backend_free_tensor(be, L[l].kernel);
        dist_backend_free_tensor(be, L[l].bias);
        dist_backend_free_tensor(be, L[l].gk);
        dist_backend_free_tensor(be, L[l].gb);
    }
    dist_tape_destroy(tape);
    dist_backend_destroy(be);
    return 0;
}
