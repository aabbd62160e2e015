/* Training throughput of the seed CNN (batch 64): libdist one_device on 1 thread, one_device
 * on every core, mirrored with one CPU replica per core, multi_worker with one worker process
 * per core on loopback (this program run again as the workers), against the same model in PyTorch
 * (bench/torch_cnn.py, run in this benchmark) at the same thread counts. Prints a table with
 * the median of several repeats, the ratios the targets are stated in, and the fraction of
 * the FP32 peak.
 *
 * With --mixed-precision: the dtype policies instead, float32 against mixed_bfloat16 (its
 * native bfloat16 kernels where the CPU has AVX512_BF16 or AMX, and its rounding path) and
 * mixed_float16 (dynamic loss scale), and float32 on oneDNN's Winograd forwards
 * (DIST_CPU_WINOGRAD=1, --conv-algorithm winograd), one_device on 1 thread and mirrored over every
 * core, the policies' repeats interleaved so that drift of the machine hits all alike; TensorFlow's
 * Keras fit at 1 thread in float32 and mixed_bfloat16 in the same rounds when it is found.
 *
 * With --gpu: one GPU instead. libdist one_device on gpu:0 with CUDA graphs on and off (both
 * strategies alive, repeats interleaved) at each batch size, max(20, images / batch) steps per
 * repeat, against PyTorch eager on the same GPU (bench/torch_cnn_gpu.py) with its data on the
 * GPU and copied from pinned host memory each step. Prints a table, the graph counters, and
 * "RESULT batch=B config=C images_per_sec=X" lines; exits 77 without a GPU, 1 when the graphs
 * were not replayed, a loss is not finite, or a measurement failed.
 *
 * TensorFlow's Keras fit (bench/tf_keras_fit.py) runs beside them when a Python with TensorFlow
 * is found (--tf PYTHON, else ~/.cache/libdist/venv-tf/bin/python): 1 thread, every core, and
 * MirroredStrategy over one logical CPU per core. Every repeat is a round over all
 * configurations (each reference a fresh process), so the machine's drift hits all alike. The
 * FP32 peak is measured at start (fma_peak.c).
 *
 * usage: bench_train [--steps N] [--repeats R] [--no-torch] [--python PATH] [--no-tf]
 *                    [--tf PYTHON] [--mixed-precision]
 *        bench_train --gpu [--batch-sizes 64,1024] [--images 65536] [--repeats 3] [--no-torch]
 *                    [--python python3]
 *        (run from anywhere; the PyTorch scripts are found through the source tree) */
#include "backend/cpu/cpu_internal.h"
#include "fma_peak.h"

#include <arpa/inet.h>
#include <dist/dist.h>
#include <math.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef DIST_SOURCE_DIR
#define DIST_SOURCE_DIR "."
#endif

#define FLOP_PER_IMAGE 14.8e6 /* training: forward + backward of the seed CNN */
/* "% of FP32 peak" is against the FMA peak measured at start (fma_peak.c): one core's for
 * 1-thread rows, cores x one core's for the others. The fixed figure used before, 222e9 per
 * core on AVX-512 (PERFORMANCE.md's Zen 5) and half of it on AVX2, was 15% above what this
 * AVX2 Zen 3 measures (~96 GFLOP/s). */
#define MAX_REPEATS 32

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CHECK(call)                                                                                \
    do {                                                                                           \
        if ((call) != DIST_OK) {                                                                   \
            fprintf(stderr, "bench_train: %s: %s\n", #call, dist_last_error());                    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* One model, its optimizer and its input pipeline on a strategy: the training of every
 * libdist measurement here. MNIST through the tf.data-like pipeline (tensor slices ->
 * shuffle -> normalize -> batch -> repeat -> prefetch), dist_classifier_train_step with Adam. */
typedef struct trainer {
    dist_strategy *s;
    dist_model *model;
    dist_optimizer *opt;
    dist_loss_scale_optimizer *lso;
    dist_dataset *ds;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    dist_classifier_step cs;
    dist_per_replica out; /* the last step's outputs */
    double input_wait_s;  /* time spent waiting for the input pipeline, all steps so far */
} trainer;

/* Frees what trainer_create made (any part of it may be missing). */
static void trainer_destroy(trainer *t) {
    dist_distributed_iterator_destroy(t->it);
    dist_distributed_dataset_destroy(t->dds);
    dist_dataset_destroy(t->ds);
    dist_loss_scale_optimizer_destroy(t->lso);
    dist_optimizer_destroy(t->opt);
    dist_model_destroy(t->model);
    dist_strategy_destroy(t->s);
    memset(t, 0, sizeof *t);
}

/* After a transformation of *ds into *next returned st: on success *ds becomes *next (read
 * here, after the call that set it). */
static dist_status pipeline_then(dist_status st, dist_dataset **ds, dist_dataset **next) {
    if (st != DIST_OK) return st;
    dist_dataset_destroy(*ds);
    *ds = *next;
    *next = NULL;
    return DIST_OK;
}

/* A model, Adam and the pipeline of global batches of `batch` on a new strategy; on failure
 * everything made is freed and dist_last_error() says why. */
static dist_status trainer_create(const dist_strategy_options *so, int64_t batch,
                                  dist_dtype_policy policy, const dist_mnist *mnist, trainer *t) {
    memset(t, 0, sizeof *t);
    dist_status st = dist_strategy_create(so, &t->s);
    if (st != DIST_OK) return st;
    int64_t shape[3] = {28, 28, 1};
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    st = dist_strategy_scope_enter(t->s);
    if (st == DIST_OK) {
        st = dist_model_create_mnist_cnn(&t->model);
        if (st == DIST_OK) st = dist_model_build(t->model, 3, shape, 1);
        if (st == DIST_OK) st = dist_optimizer_create_adam(&ao, &t->opt);
        dist_status exit_st = dist_strategy_scope_exit(t->s);
        if (st == DIST_OK) st = exit_st;
    }
    if (st == DIST_OK) st = dist_model_set_dtype_policy(t->model, policy);
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    if (st == DIST_OK && policy == DIST_POLICY_MIXED_FLOAT16)
        st = dist_loss_scale_optimizer_create(t->opt, &lo, &t->lso);

    dist_tensor images = *dist_mnist_train_images(mnist), labels = *dist_mnist_train_labels(mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *next = NULL;
    if (st == DIST_OK) st = dist_dataset_from_tensor_slices(parts, 2, 0, &t->ds);
    /* distrain's order: the shuffle buffer holds the uint8 examples (7.8 MB, not 31 MB of
     * floats that miss the cache on every draw) */
    if (st == DIST_OK)
        st = pipeline_then(dist_dataset_shuffle(t->ds, 10000, 1, 1, &next), &t->ds, &next);
    if (st == DIST_OK)
        st = pipeline_then(dist_dataset_map_image_normalize(t->ds, &next), &t->ds, &next);
    if (st == DIST_OK)
        st = pipeline_then(dist_dataset_batch(t->ds, batch, 1, &next), &t->ds, &next);
    if (st == DIST_OK) st = pipeline_then(dist_dataset_repeat(t->ds, -1, &next), &t->ds, &next);
    if (st == DIST_OK) st = pipeline_then(dist_dataset_prefetch(t->ds, 2, &next), &t->ds, &next);
    if (st == DIST_OK) st = dist_strategy_distribute_dataset(t->s, t->ds, &t->dds);
    if (st == DIST_OK) st = dist_distributed_dataset_iterator(t->dds, &t->it);
    if (st != DIST_OK) {
        trainer_destroy(t);
        return st;
    }
    t->cs = (dist_classifier_step){t->model, t->opt, batch, t->lso};
    return DIST_OK;
}

/* `n` training steps, each waited for (run() brings the step's outputs to the host). */
static dist_status trainer_steps(trainer *t, int n) {
    for (int i = 0; i < n; i++) {
        dist_per_replica_element e;
        int end = 0;
        double t0 = now_s();
        dist_status st = dist_distributed_iterator_next(t->it, &e, &end);
        t->input_wait_s += now_s() - t0;
        if (st != DIST_OK) return st;
        if (end) {
            dist_clear_error();
            return DIST_OUT_OF_RANGE; /* cannot happen: the pipeline repeats forever */
        }
        st = dist_strategy_run(t->s, dist_classifier_train_step, &t->cs, &e, &t->out);
        if (st != DIST_OK) return st;
    }
    return DIST_OK;
}

/* images/s of each repeat of `steps` training steps (after 20 warm-up steps). */
static double run_libdist_policy(dist_strategy_kind kind, const char *devices, int threads,
                                 int steps, int repeats, const dist_mnist *mnist,
                                 const char *cluster_spec, dist_dtype_policy policy, double *runs) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = kind;
    so.devices = devices;
    so.threads_per_replica = threads;
    so.cluster.spec = cluster_spec;
    trainer t;
    CHECK(trainer_create(&so, 64, policy, mnist, &t));
    for (int r = -1; r < repeats; r++) {
        int n = r < 0 ? 20 : steps;
        double t0 = now_s();
        CHECK(trainer_steps(&t, n));
        if (r >= 0) runs[r] = 64.0 * steps / (now_s() - t0);
    }
    trainer_destroy(&t);
    double copy[MAX_REPEATS];
    memcpy(copy, runs, (size_t)repeats * sizeof *copy);
    return median(copy, repeats);
}

static double run_libdist(dist_strategy_kind kind, const char *devices, int threads, int steps,
                          int repeats, const dist_mnist *mnist, const char *cluster_spec,
                          double *runs) {
    return run_libdist_policy(kind, devices, threads, steps, repeats, mnist, cluster_spec,
                              DIST_POLICY_FLOAT32, runs);
}

/* Runs a reference script (bench/torch_cnn.py, bench/tf_keras_fit.py) given as a shell command
 * whose stdout ends in a JSON line with "images_per_sec_median" and "runs"; returns the median
 * (0 when it did not run or printed none) and the runs' text in runs_text. */
static double run_python_ref(const char *cmd, char *runs_text, size_t size) {
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[4096] = "";
    double med = 0;
    while (fgets(line, sizeof line, p)) {
        const char *m = strstr(line, "\"images_per_sec_median\":");
        if (m) med = atof(m + strlen("\"images_per_sec_median\":"));
        const char *r = strstr(line, "\"runs\": [");
        if (r && runs_text) {
            r += strlen("\"runs\": [");
            const char *e = strchr(r, ']');
            size_t n = e ? (size_t)(e - r) : 0;
            if (n >= size) n = size - 1;
            memcpy(runs_text, r, n);
            runs_text[n] = '\0';
        }
    }
    return pclose(p) == 0 ? med : 0;
}

/* One repeat of bench/torch_cnn.py (a fresh process, 20 warm-up steps); 0 when it cannot run. */
static double run_torch_repeat(const char *python, int threads, int steps, int flush) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s %s/bench/torch_cnn.py --threads %d --steps %d --repeats 1%s 2>/dev/null", python,
             DIST_SOURCE_DIR, threads, steps, flush ? " --flush-denormal" : "");
    return run_python_ref(cmd, NULL, 0);
}

/* One repeat of bench/tf_keras_fit.py (a fresh process: TensorFlow's import, tracing and a
 * warm-up epoch of `steps` steps, then one timed epoch); its stderr is appended to `log`.
 * mirrored: MirroredStrategy over `threads` logical CPUs; bf16: the mixed_bfloat16 policy.
 * 0 when it cannot run. */
static double run_tf_repeat(const char *python, int threads, int mirrored, int bf16, int steps,
                            const char *log) {
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "'%s' %s/bench/tf_keras_fit.py --threads %d%s%s --steps %d --repeats 1 2>>'%s'",
             python, DIST_SOURCE_DIR, threads, mirrored ? " --mirrored" : "",
             bf16 ? " --mixed-precision bf16" : "", steps, log);
    return run_python_ref(cmd, NULL, 0);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* `workers` processes of this program on loopback, one replica and one thread each, global
 * batch 64; returns worker 0's median images/s (cluster-wide) and its repeats in runs. */
static double run_multi_worker(int workers, int steps, int repeats, const char *transport,
                               double *runs) {
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 0;
    self[n] = '\0';
    char cluster[1024];
    size_t len = (size_t)snprintf(cluster, sizeof cluster, "{\"worker\":[");
    for (int i = 0; i < workers; i++)
        len += (size_t)snprintf(cluster + len, sizeof cluster - len, "%s\"127.0.0.1:%d\"",
                                i ? "," : "", free_port());
    snprintf(cluster + len, sizeof cluster - len, "]}");
    FILE *p[16];
    int procs = workers;
    if (strcmp(transport, "mpi") == 0) {
#ifndef DIST_BENCH_MPIEXEC
        return 0; /* built without MPI */
#else
        /* one launcher for every worker: the cluster is its MPI world (Open MPI as root in a
         * container, more ranks than cores: tests/unit/test_mpi_comm.c says why) */
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 "
                 "OMPI_MCA_rmaps_base_oversubscribe=1 "
                 "OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_"
                 "mechanism:-none} DIST_COLLECTIVE_TRANSPORT=mpi '%s' -n %d '%s' --worker mpi "
                 "%d %d 2>/dev/null",
                 DIST_BENCH_MPIEXEC, workers, self, steps, repeats);
        p[0] = popen(cmd, "r");
        if (!p[0]) return 0;
        procs = 1;
#endif
    } else {
        for (int i = 0; i < workers; i++) {
            char cmd[8192];
            snprintf(cmd, sizeof cmd,
                     "DIST_COLLECTIVE_TRANSPORT=%s '%s' --worker '{\"cluster\":%s,\"task\":{"
                     "\"type\":\"worker\",\"index\":%d}}' %d %d",
                     transport, self, cluster, i, steps, repeats);
            p[i] = popen(cmd, "r");
            if (!p[i]) return 0;
        }
    }
    double med = 0;
    char line[4096];
    int got = 0;
    while (fgets(line, sizeof line, p[0])) {
        char *rest = line;
        if (strncmp(line, "runs", 4) != 0) continue;
        rest += 4;
        for (int r = 0; r < repeats; r++) runs[r] = strtod(rest, &rest);
        got = 1;
    }
    int ok = 1;
    for (int i = 0; i < procs; i++) ok &= pclose(p[i]) == 0;
    if (!got || !ok) return 0;
    double copy[MAX_REPEATS];
    memcpy(copy, runs, (size_t)repeats * sizeof *copy);
    med = median(copy, repeats);
    return med;
}

/* bench_train --worker SPEC STEPS REPEATS: one multi_worker worker; worker 0 prints its runs.
 * SPEC "mpi": the cluster is the MPI world (started by mpiexec). */
static int worker_main(char **argv, const dist_mnist *mnist) {
    int steps = atoi(argv[3]), repeats = atoi(argv[4]);
    double runs[MAX_REPEATS];
    int mpi = strcmp(argv[2], "mpi") == 0;
    run_libdist(DIST_STRATEGY_MULTI_WORKER, "cpu:0", 1, steps, repeats, mnist, mpi ? NULL : argv[2],
                runs);
    const char *rank = getenv("OMPI_COMM_WORLD_RANK");
    if (mpi ? rank && strcmp(rank, "0") == 0 : strstr(argv[2], "\"index\":0}") != NULL) {
        printf("runs");
        for (int r = 0; r < repeats; r++) printf(" %.1f", runs[r]);
        printf("\n");
    }
    return 0;
}

static void runs_str(const double *runs, int n, char *buf, size_t size) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%.0f", i ? ", " : "", runs[i]);
}

/* Makes the file TensorFlow's stderr goes to (path: a mkstemp template) and says so on stdout
 * with `what`; 0, or 1 with a message. */
static int tf_log_open(char *path, const char *tf_python, const char *what) {
    int fd = mkstemp(path);
    if (fd < 0) {
        perror("bench_train: mkstemp");
        return 1;
    }
    close(fd);
    printf("TensorFlow: %s bench/tf_keras_fit.py%s (its stderr: %s)\n", tf_python, what, path);
    return 0;
}

/* --mixed-precision: float32, mixed_bfloat16 (native bfloat16 kernels where the CPU has them,
 * and the rounding path with DIST_CPU_NATIVE_BF16=0), mixed_float16 and float32 on oneDNN's
 * Winograd forwards (DIST_CPU_WINOGRAD=1) on one_device (1 thread) and mirrored (every core);
 * each repeat runs every policy once, in turn. */
static int bench_policies(int steps, int repeats, int cores, const char *all_cpus,
                          const dist_mnist *mnist, const char *tf_python) {
    enum { NP = 5 };
    const dist_dtype_policy pol[NP] = {DIST_POLICY_FLOAT32, DIST_POLICY_MIXED_BFLOAT16,
                                       DIST_POLICY_MIXED_BFLOAT16, DIST_POLICY_MIXED_FLOAT16,
                                       DIST_POLICY_FLOAT32};
    const int rounding[NP] = {0, 0, 1, 0, 0}; /* the bfloat16 rounding path forced */
    const int wino[NP] = {0, 0, 0, 0, 1};     /* float32 with DIST_CPU_WINOGRAD=1 */
    const int native = cpu_dnnl_native_bf16_default();
    const char *env = getenv("DIST_CPU_NATIVE_BF16");
    char *saved = env ? strdup(env) : NULL;
    const char *wenv = getenv("DIST_CPU_WINOGRAD");
    char *wsaved = wenv ? strdup(wenv) : NULL;
    unsetenv("DIST_CPU_WINOGRAD"); /* the float32 row: the default, direct kernels */
    double runs[2][NP][MAX_REPEATS], tf_runs[2][MAX_REPEATS]; /* TF float32, mixed_bfloat16 */
    char tf_log[] = "/tmp/bench_train_tf.XXXXXX";
    if (tf_python) {
        if (tf_log_open(tf_log, tf_python, ", 1 thread, float32 and mixed_bfloat16")) return 1;
        printf("\n");
        fflush(stdout);
    }
    for (int r = 0; r < repeats; r++) {
        for (int b = 0; tf_python && b < 2; b++)
            tf_runs[b][r] = run_tf_repeat(tf_python, 1, 0, b, steps, tf_log);
        for (int cfg = 0; cfg < 2; cfg++)
            for (int p = 0; p < NP; p++) {
                if (rounding[p]) setenv("DIST_CPU_NATIVE_BF16", "0", 1);
                if (wino[p]) setenv("DIST_CPU_WINOGRAD", "1", 1);
                run_libdist_policy(cfg ? DIST_STRATEGY_MIRRORED : DIST_STRATEGY_ONE_DEVICE,
                                   cfg ? all_cpus : "cpu:0", 1, steps, 1, mnist, NULL, pol[p],
                                   &runs[cfg][p][r]);
                if (rounding[p] && saved) setenv("DIST_CPU_NATIVE_BF16", saved, 1);
                if (rounding[p] && !saved) unsetenv("DIST_CPU_NATIVE_BF16");
                if (wino[p]) unsetenv("DIST_CPU_WINOGRAD");
            }
    }
    free(saved);
    if (wsaved) setenv("DIST_CPU_WINOGRAD", wsaved, 1);
    free(wsaved);
    printf("| configuration | policy | images/s (median) | vs float32 | repeats |\n"
           "|---|---|---|---|---|\n");
    for (int cfg = 0; cfg < 2; cfg++) {
        double f32 = 0;
        for (int p = 0; p < NP; p++) {
            char buf[512], name[64];
            runs_str(runs[cfg][p], repeats, buf, sizeof buf);
            double copy[MAX_REPEATS];
            memcpy(copy, runs[cfg][p], (size_t)repeats * sizeof *copy);
            double med = median(copy, repeats);
            if (p == 0) f32 = med;
            snprintf(name, sizeof name, cfg ? "mirrored, %d CPU replicas" : "one_device, 1 thread",
                     cores);
            const char *how = wino[p] ? ", Winograd forwards (DIST_CPU_WINOGRAD=1)"
                              : pol[p] == DIST_POLICY_MIXED_FLOAT16  ? " + dynamic loss scale"
                              : pol[p] != DIST_POLICY_MIXED_BFLOAT16 ? ""
                              : rounding[p] ? ", rounding path (DIST_CPU_NATIVE_BF16=0)"
                              : native      ? ", native bfloat16 kernels"
                                            : ", rounding path (no AVX512_BF16)";
            printf("| libdist %s | %s%s | %.0f | %.2fx | %s |\n", name,
                   dist_dtype_policy_name(pol[p]), how, med, med / f32, buf);
        }
    }
    if (tf_python) {
        double tf_med[2];
        for (int b = 0; b < 2; b++) {
            char buf[512];
            runs_str(tf_runs[b], repeats, buf, sizeof buf);
            double copy[MAX_REPEATS];
            memcpy(copy, tf_runs[b], (size_t)repeats * sizeof *copy);
            tf_med[b] = median(copy, repeats);
            printf(
                "| TensorFlow Keras fit, 1 thread (tf_keras_fit.py) | %s | %.0f | %.2fx | %s |\n",
                b ? "mixed_bfloat16" : "float32", tf_med[b],
                tf_med[0] > 0 ? tf_med[b] / tf_med[0] : 0.0, buf);
        }
        double lib[2];
        for (int b = 0; b < 2; b++) {
            double copy[MAX_REPEATS];
            memcpy(copy, runs[0][b], (size_t)repeats * sizeof *copy);
            lib[b] = median(copy, repeats);
        }
        printf("\nlibdist / TF Keras fit, 1 thread: %.2fx float32, %.2fx mixed_bfloat16\n",
               tf_med[0] > 0 ? lib[0] / tf_med[0] : 0.0, tf_med[1] > 0 ? lib[1] / tf_med[1] : 0.0);
    }
    printf("\nmixed_bfloat16 %s.\nThe rounding path and mixed_float16 run float32 kernels with "
           "values stored at bfloat16 / float16\nprecision (dist/policy.h): their difference "
           "from float32 is the cost of the rounding passes.\n",
           native ? "ran oneDNN's bfloat16 convolutions and matmuls (this CPU has AVX512_BF16)"
                  : "fell back to the rounding path: oneDNN has no native bfloat16 kernels "
                    "on this CPU (no AVX512_BF16 or AMX)");
    return 0;
}

/* ---- the default mode: strategies against PyTorch and TensorFlow, interleaved ------------ */

/* One row of the table: its repeats in the order measured (0: that repeat failed). */
typedef struct cpu_row {
    char name[96];
    char threads[16];
    int peak_cores; /* the "% of FP32 peak" is against this many cores' peak */
    double runs[MAX_REPEATS];
    int count;
    const char *missing; /* why the row has no numbers, or NULL */
} cpu_row;

static void cpu_row_init(cpu_row *row, const char *name, const char *threads, int peak_cores) {
    memset(row, 0, sizeof *row);
    snprintf(row->name, sizeof row->name, "%s", name);
    snprintf(row->threads, sizeof row->threads, "%s", threads);
    row->peak_cores = peak_cores;
}

/* The median of the repeats that ran (0 when one failed: a median over survivors would hide
 * it). */
static double cpu_row_median(const cpu_row *row) {
    if (row->count == 0) return 0;
    double copy[MAX_REPEATS];
    for (int i = 0; i < row->count; i++) {
        if (row->runs[i] <= 0) return 0;
        copy[i] = row->runs[i];
    }
    return median(copy, row->count);
}

static void cpu_row_print(const cpu_row *row, double peak_per_core) {
    if (row->missing) {
        printf("| %s | %s | %s | | |\n", row->name, row->threads, row->missing);
        return;
    }
    double med = cpu_row_median(row);
    char buf[512], pct[32] = "n/a";
    runs_str(row->runs, row->count, buf, sizeof buf);
    if (med <= 0) {
        printf("| %s | %s | failed (a repeat did not run) | | %s |\n", row->name, row->threads,
               buf);
        return;
    }
    if (peak_per_core > 0)
        snprintf(pct, sizeof pct, "%.0f%%",
                 100 * med * FLOP_PER_IMAGE / (peak_per_core * row->peak_cores));
    printf("| %s | %s | %.0f | %s | %s |\n", row->name, row->threads, med, pct, buf);
}

/* "  label: 1.23x" when both ran, else why not. */
static void print_ratio(const char *label, const cpu_row *ours, const cpu_row *ref,
                        const char *target) {
    double a = cpu_row_median(ours), b = ref->missing ? 0 : cpu_row_median(ref);
    if (ref->missing)
        printf("  %s: n/a (%s)\n", label, ref->missing);
    else if (a > 0 && b > 0)
        printf("  %s: %.2fx%s\n", label, a / b, target);
    else
        printf("  %s: n/a (a repeat failed)\n", label);
}

/* The default mode. Every repeat is a round that runs each configuration once, in turn:
 * libdist's strategies (a fresh trainer, 20 warm-up steps, `steps` timed), the multi_worker
 * clusters, PyTorch (a fresh process per repeat, with and without flushing denormals: the
 * faster mode's repeats are reported) and TensorFlow's Keras fit (a fresh process per repeat).
 * Drift of a shared machine thus hits every row alike. */
static int bench_cpu(int steps, int repeats, int cores, const char *all_cpus,
                     const dist_mnist *mnist, const char *torch_python, const char *tf_python,
                     const char *tf_missing) {
    const char *isa = "none";
    double peak = dist_bench_fma_peak(7, 0.1, &isa);
    if (peak > 0)
        printf("FP32 peak, measured: %.1f GFLOP/s per core (%s FMA, 12 independent chains, one "
               "thread, best of 7), %.1f GFLOP/s on %d cores\n",
               peak / 1e9, isa, peak * cores / 1e9, cores);
    else
        printf("FP32 peak: not measured (no AVX2+FMA or AVX-512F here): %% of peak is n/a\n");
    char tf_log[] = "/tmp/bench_train_tf.XXXXXX";
    if (tf_python && tf_log_open(tf_log, tf_python, "")) return 1;
    printf("\n");
    fflush(stdout);

    enum { ONE, ALL, MIR, MW_SHM, MW_TCP, MW_MPI, T1, TALL, TF1, TFALL, TFMIR, ROWS };
    cpu_row rows[ROWS];
    char name[96], thr[16], thr_x1[16];
    snprintf(thr, sizeof thr, "%d", cores);
    snprintf(thr_x1, sizeof thr_x1, "%d x 1", cores);
    cpu_row_init(&rows[ONE], "libdist one_device cpu:0", "1", 1);
    cpu_row_init(&rows[ALL], "libdist one_device cpu:0", thr, cores);
    snprintf(name, sizeof name, "libdist mirrored, %d CPU replicas", cores);
    cpu_row_init(&rows[MIR], name, thr_x1, cores);
    snprintf(name, sizeof name, "libdist multi_worker, %d workers, shared memory", cores);
    cpu_row_init(&rows[MW_SHM], name, thr_x1, cores);
    snprintf(name, sizeof name, "libdist multi_worker, %d workers, TCP", cores);
    cpu_row_init(&rows[MW_TCP], name, thr_x1, cores);
    snprintf(name, sizeof name, "libdist multi_worker, %d workers, MPI (mpiexec)", cores);
    cpu_row_init(&rows[MW_MPI], name, thr_x1, cores);
    cpu_row_init(&rows[T1], "PyTorch eager (torch_cnn.py)", "1", 1);
    cpu_row_init(&rows[TALL], "PyTorch eager (torch_cnn.py)", thr, cores);
    cpu_row_init(&rows[TF1], "TensorFlow Keras fit (tf_keras_fit.py)", "1", 1);
    cpu_row_init(&rows[TFALL], "TensorFlow Keras fit (tf_keras_fit.py)", thr, cores);
    snprintf(name, sizeof name,
             "TensorFlow Keras fit, MirroredStrategy, %d logical CPUs (tf_keras_fit.py "
             "--mirrored)",
             cores);
    cpu_row_init(&rows[TFMIR], name, thr, cores);
    /* PyTorch's two modes per thread count: [row - T1][flush] */
    double torch_runs[2][2][MAX_REPEATS];
#ifndef DIST_BENCH_MPIEXEC
    rows[MW_MPI].missing = "n/a (libdist built without MPI)";
#endif
    if (!torch_python) rows[T1].missing = rows[TALL].missing = "not run (--no-torch)";
    if (!tf_python) rows[TF1].missing = rows[TFALL].missing = rows[TFMIR].missing = tf_missing;

    for (int r = 0; r < repeats; r++) {
        fprintf(stderr, "bench_train: round %d of %d\n", r + 1, repeats);
        run_libdist(DIST_STRATEGY_ONE_DEVICE, "cpu:0", 1, steps, 1, mnist, NULL,
                    &rows[ONE].runs[r]);
        run_libdist(DIST_STRATEGY_ONE_DEVICE, "cpu:0", cores, steps, 1, mnist, NULL,
                    &rows[ALL].runs[r]);
        run_libdist(DIST_STRATEGY_MIRRORED, all_cpus, 1, steps, 1, mnist, NULL, &rows[MIR].runs[r]);
        run_multi_worker(cores, steps, 1, "shm", &rows[MW_SHM].runs[r]);
        run_multi_worker(cores, steps, 1, "tcp", &rows[MW_TCP].runs[r]);
        if (!rows[MW_MPI].missing) run_multi_worker(cores, steps, 1, "mpi", &rows[MW_MPI].runs[r]);
        for (int i = ONE; i <= MW_MPI; i++) rows[i].count = r + 1;
        if (torch_python) {
            for (int t = 0; t < 2; t++)
                for (int flush = 0; flush < 2; flush++)
                    torch_runs[t][flush][r] =
                        run_torch_repeat(torch_python, t ? cores : 1, steps, flush);
        }
        if (tf_python) {
            rows[TF1].runs[r] = run_tf_repeat(tf_python, 1, 0, 0, steps, tf_log);
            rows[TFALL].runs[r] = run_tf_repeat(tf_python, cores, 0, 0, steps, tf_log);
            rows[TFMIR].runs[r] = run_tf_repeat(tf_python, cores, 1, 0, steps, tf_log);
            rows[TF1].count = rows[TFALL].count = rows[TFMIR].count = r + 1;
        }
    }
    if (rows[MW_MPI].count && cpu_row_median(&rows[MW_MPI]) <= 0)
        rows[MW_MPI].missing = "n/a (no mpiexec, or the MPI run failed)";
    if (torch_python) {
        /* whichever mode of PyTorch was faster at each thread count, as before */
        for (int t = 0; t < 2; t++) {
            cpu_row plain = rows[T1 + t], flushed = rows[T1 + t];
            memcpy(plain.runs, torch_runs[t][0], (size_t)repeats * sizeof(double));
            memcpy(flushed.runs, torch_runs[t][1], (size_t)repeats * sizeof(double));
            plain.count = flushed.count = repeats;
            int use_flush = cpu_row_median(&flushed) > cpu_row_median(&plain);
            rows[T1 + t] = use_flush ? flushed : plain;
            if (use_flush)
                snprintf(rows[T1 + t].name, sizeof rows[T1 + t].name, "%s",
                         "PyTorch eager (torch_cnn.py --flush-denormal)");
        }
        if (cpu_row_median(&rows[T1]) <= 0 && cpu_row_median(&rows[TALL]) <= 0)
            rows[T1].missing = rows[TALL].missing =
                "failed to run (bench/torch_cnn.py; install python3-torch: tools/setup-deps.sh "
                "--bench)";
    }
    if (tf_python && cpu_row_median(&rows[TF1]) <= 0 && cpu_row_median(&rows[TFALL]) <= 0)
        rows[TF1].missing = rows[TFALL].missing = rows[TFMIR].missing =
            "failed to run (see the TensorFlow log named above)";

    printf("| configuration | threads | images/s (median) | %% of FP32 peak | repeats "
           "|\n|---|---|---|---|---|\n");
    for (int i = 0; i < ROWS; i++) cpu_row_print(&rows[i], peak);

    double one = cpu_row_median(&rows[ONE]), mir = cpu_row_median(&rows[MIR]);
    printf("\nratios:\n");
    if (one > 0 && mir > 0) {
        /* and the ratio within each round (the two runs minutes apart at most), which a host
         * whose speed drifts between rounds moves less */
        double paired[MAX_REPEATS];
        int np = rows[ONE].count < rows[MIR].count ? rows[ONE].count : rows[MIR].count;
        for (int i = 0; i < np; i++)
            paired[i] = rows[ONE].runs[i] > 0 ? rows[MIR].runs[i] / rows[ONE].runs[i] : 0;
        printf("  mirrored %d replicas / one replica on one core: %.2fx (target >= 1.85x); "
               "median of the rounds' own ratios %.2fx\n",
               cores, mir / one, np > 0 ? median(paired, np) : 0.0);
    }
    if (mir > 0)
        printf("  multi_worker %d workers / mirrored %d replicas: %.2fx shared memory, %.2fx TCP, "
               "%.2fx MPI (target >= 0.9x)\n",
               cores, cores, cpu_row_median(&rows[MW_SHM]) / mir,
               cpu_row_median(&rows[MW_TCP]) / mir,
               rows[MW_MPI].missing ? 0.0 : cpu_row_median(&rows[MW_MPI]) / mir);
    char label[128];
    print_ratio("libdist 1 thread / PyTorch 1 thread", &rows[ONE], &rows[T1], " (target >= 2x)");
    snprintf(label, sizeof label, "libdist one_device %d threads / PyTorch %d threads", cores,
             cores);
    print_ratio(label, &rows[ALL], &rows[TALL], " (target >= 2x)");
    snprintf(label, sizeof label, "libdist mirrored / PyTorch %d threads", cores);
    print_ratio(label, &rows[MIR], &rows[TALL], " (target >= 2x)");
    print_ratio("libdist 1 thread / TF Keras fit 1 thread", &rows[ONE], &rows[TF1], "");
    snprintf(label, sizeof label, "libdist one_device %d threads / TF Keras fit %d threads", cores,
             cores);
    print_ratio(label, &rows[ALL], &rows[TFALL], "");
    snprintf(label, sizeof label, "libdist mirrored / TF Keras fit %d threads", cores);
    print_ratio(label, &rows[MIR], &rows[TFALL], "");
    snprintf(label, sizeof label,
             "libdist mirrored / TF Keras fit MirroredStrategy, %d logical CPUs", cores);
    print_ratio(label, &rows[MIR], &rows[TFMIR], "");
    return 0;
}

/* ---- --gpu: libdist on gpu:0 with CUDA graphs on and off, against PyTorch eager ---------- */

#define GPU_MAX_BATCHES 8
#define GPU_WARMUP_STEPS 20
#define GPU_TARGET 2.0 /* the issue's target: libdist >= 2x PyTorch eager at batch 64 and 1024 */

enum { GPU_GRAPHS, GPU_EAGER, TORCH_GPU_DATA, TORCH_HOST_DATA, GPU_CONFIGS };
static const char *const gpu_key[GPU_CONFIGS] = {"libdist_graphs", "libdist_eager",
                                                 "torch_gpu_data", "torch_host_data"};
static const char *const gpu_title[GPU_CONFIGS] = {"libdist graphs on", "libdist graphs off",
                                                   "PyTorch (data on GPU)", "PyTorch (host data)"};

/* The repeats measured for one batch size, per configuration, in the order measured. */
typedef struct gpu_results {
    double runs[GPU_CONFIGS][MAX_REPEATS];
    int count[GPU_CONFIGS];
} gpu_results;

static double gpu_median(const gpu_results *g, int c) {
    if (g->count[c] == 0) return 0;
    double copy[MAX_REPEATS];
    memcpy(copy, g->runs[c], (size_t)g->count[c] * sizeof *copy);
    return median(copy, g->count[c]);
}

/* Says why a libdist call of the GPU benchmark failed; returns whether it did. */
static int gpu_failed(dist_status st, int64_t batch, int config, const char *what) {
    if (st == DIST_OK) return 0;
    printf("FAIL: batch %lld, %s, %s: %s: %s\n", (long long)batch, gpu_title[config], what,
           dist_status_name(st), dist_last_error());
    return 1;
}

/* The checks after timing: the graphs-on strategy replayed graphs, the graphs-off one none,
 * and the last step's loss of both is finite. Returns whether one failed. */
static int gpu_check_trainers(trainer t[2], int64_t batch) {
    int failed = 0;
    dist_graph_stats gs[2];
    for (int c = 0; c < 2; c++) {
        dist_strategy_graph_stats(t[c].s, &gs[c]);
        printf("graph counters, batch %lld, %s: captured %lld, replayed %lld, eager_segments %lld, "
               "capture_failures %lld\n",
               (long long)batch, gpu_title[c], (long long)gs[c].captured, (long long)gs[c].replayed,
               (long long)gs[c].eager_segments, (long long)gs[c].capture_failures);
    }
    if (gs[0].replayed == 0) {
        printf("FAIL: batch %lld: CUDA graphs were on, yet no graph was replayed\n",
               (long long)batch);
        failed = 1;
    }
    if (gs[1].captured != 0 || gs[1].replayed != 0) {
        printf("FAIL: batch %lld: CUDA graphs were off, yet graphs were captured or replayed: "
               "the two configurations do not differ as they should\n",
               (long long)batch);
        failed = 1;
    }
    double loss[2];
    for (int c = 0; c < 2; c++) {
        if (t[c].out.count < 1) {
            printf("FAIL: batch %lld, %s: the step returned no outputs\n", (long long)batch,
                   gpu_title[c]);
            return 1;
        }
        dist_tensor *l;
        if (gpu_failed(dist_strategy_reduce(t[c].s, DIST_REDUCE_SUM, &t[c].out, 0, -1, &l), batch,
                       c, "reducing the loss"))
            return 1;
        loss[c] = *(const float *)l->data;
        dist_tensor_destroy(l);
        if (!isfinite(loss[c])) {
            printf("FAIL: batch %lld, %s: the last step's loss is %g, not finite\n",
                   (long long)batch, gpu_title[c], loss[c]);
            failed = 1;
        }
    }
    printf("last loss, batch %lld: graphs on %.6f, graphs off %.6f (same seeds and data order)\n",
           (long long)batch, loss[0], loss[1]);
    return failed;
}

/* libdist one_device on gpu:0 at global batch `batch`, CUDA graphs on and off: both strategies
 * alive at once, their repeats interleaved (on, off, on, off, ...) so that drift hits both.
 * Returns whether it failed (after saying why). */
static int gpu_libdist(int64_t batch, int steps, int repeats, const dist_mnist *mnist,
                       gpu_results *g) {
    const int graphs[2] = {1, -1}; /* cuda_graphs of GPU_GRAPHS, GPU_EAGER */
    trainer t[2];
    memset(t, 0, sizeof t);
    int failed = 0;
    for (int c = 0; c < 2 && !failed; c++) {
        dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
        so.kind = DIST_STRATEGY_ONE_DEVICE;
        so.devices = "gpu:0";
        so.cuda_graphs = graphs[c];
        failed = gpu_failed(trainer_create(&so, batch, DIST_POLICY_FLOAT32, mnist, &t[c]), batch, c,
                            "creating the strategy, model and pipeline");
        if (!failed)
            failed = gpu_failed(trainer_steps(&t[c], GPU_WARMUP_STEPS), batch, c, "warm-up steps");
    }
    double timed[2] = {0, 0}, waited[2] = {0, 0}; /* seconds, over the timed repeats */
    for (int r = 0; r < repeats && !failed; r++)
        for (int c = 0; c < 2 && !failed; c++) {
            double t0 = now_s(), w0 = t[c].input_wait_s;
            failed = gpu_failed(trainer_steps(&t[c], steps), batch, c, "timed steps");
            double dt = now_s() - t0;
            timed[c] += dt;
            waited[c] += t[c].input_wait_s - w0;
            if (!failed) g->runs[c][g->count[c]++] = (double)batch * steps / dt;
        }
    if (!failed) {
        for (int c = 0; c < 2; c++)
            printf("libdist batch %lld, %s: %.0f images/s (median), %.3f ms a step, %.0f%% of it "
                   "waiting for the input pipeline\n",
                   (long long)batch, gpu_title[c], gpu_median(g, c),
                   1e3 * timed[c] / ((double)repeats * steps), 100 * waited[c] / timed[c]);
        failed = gpu_check_trainers(t, batch);
    }
    trainer_destroy(&t[0]);
    trainer_destroy(&t[1]);
    return failed;
}

/* PyTorch eager (bench/torch_cnn_gpu.py) on the same GPU, one way of feeding it, the same batch
 * sizes, step counts and repeats; its output is echoed. Returns whether it failed or measured
 * less than asked. */
static int gpu_torch(const char *python, int host_data, const int64_t *batches, const int *steps,
                     int nb, int repeats, gpu_results *g) {
    char bl[256] = "", sl[256] = "", cmd[2048];
    for (int i = 0, lb = 0, ls = 0; i < nb; i++) {
        lb += snprintf(bl + lb, sizeof bl - (size_t)lb, "%s%lld", i ? "," : "",
                       (long long)batches[i]);
        ls += snprintf(sl + ls, sizeof sl - (size_t)ls, "%s%d", i ? "," : "", steps[i]);
    }
    snprintf(cmd, sizeof cmd,
             "'%s' '%s/bench/torch_cnn_gpu.py' --batch-sizes %s --steps %s --repeats %d%s", python,
             DIST_SOURCE_DIR, bl, sl, repeats, host_data ? " --host-data" : "");
    const int c = host_data ? TORCH_HOST_DATA : TORCH_GPU_DATA;
    const char *mode = host_data ? "host_data" : "gpu_data";
    printf("running: %s\n", cmd);
    fflush(stdout);
    FILE *p = popen(cmd, "r");
    if (!p) {
        printf("FAIL: cannot start %s\n", cmd);
        return 1;
    }
    char line[1024];
    while (fgets(line, sizeof line, p)) {
        printf("  %s%s", line, strchr(line, '\n') ? "" : "\n");
        int b, st;
        char m[32];
        double ips;
        if (sscanf(line, "torch batch=%d mode=%31s steps=%d images_per_sec=%lf", &b, m, &st,
                   &ips) != 4 ||
            strcmp(m, mode) != 0)
            continue;
        for (int i = 0; i < nb; i++)
            if (batches[i] == b && steps[i] == st && g[i].count[c] < MAX_REPEATS)
                g[i].runs[c][g[i].count[c]++] = ips;
    }
    int status = pclose(p);
    int failed = 0;
    if (status != 0) {
        printf("FAIL: PyTorch (%s) exited with %s %d\n", mode,
               WIFEXITED(status) ? "status" : "wait status",
               WIFEXITED(status) ? WEXITSTATUS(status) : status);
        failed = 1;
    }
    for (int i = 0; i < nb; i++)
        if (g[i].count[c] != repeats) {
            printf("FAIL: PyTorch (%s), batch %lld: %d of %d repeats measured\n", mode,
                   (long long)batches[i], g[i].count[c], repeats);
            failed = 1;
        }
    return failed;
}

static void gpu_log(dist_log_level level, const char *message, void *user) {
    (void)user;
    printf("libdist %s: %s\n", level == DIST_LOG_ERROR ? "error" : "warning", message);
}

/* "1234" or "n/a" */
static const char *gpu_cell(double v, const char *fmt, char *buf, size_t size) {
    if (v > 0)
        snprintf(buf, size, fmt, v);
    else
        snprintf(buf, size, "n/a");
    return buf;
}

static void gpu_report(const int64_t *batches, int nb, const gpu_results *g) {
    printf("\n| batch | %s | %s | %s | %s | libdist graphs / PyTorch host data | libdist graphs / "
           "PyTorch on GPU |\n|---:|---:|---:|---:|---:|---:|---:|\n",
           gpu_title[0], gpu_title[1], gpu_title[2], gpu_title[3]);
    for (int i = 0; i < nb; i++) {
        double m[GPU_CONFIGS];
        char cell[GPU_CONFIGS][32], rh[32], rg[32];
        for (int c = 0; c < GPU_CONFIGS; c++) {
            m[c] = gpu_median(&g[i], c);
            gpu_cell(m[c], "%.0f", cell[c], sizeof cell[c]);
        }
        gpu_cell(m[TORCH_HOST_DATA] > 0 ? m[GPU_GRAPHS] / m[TORCH_HOST_DATA] : 0, "%.2fx", rh,
                 sizeof rh);
        gpu_cell(m[TORCH_GPU_DATA] > 0 ? m[GPU_GRAPHS] / m[TORCH_GPU_DATA] : 0, "%.2fx", rg,
                 sizeof rg);
        printf("| %lld | %s | %s | %s | %s | %s | %s |\n", (long long)batches[i], cell[0], cell[1],
               cell[2], cell[3], rh, rg);
    }
    printf("\nmedians of the repeats; every repeat (images/s, in the order measured):\n");
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < GPU_CONFIGS; c++) {
            char buf[512];
            runs_str(g[i].runs[c], g[i].count[c], buf, sizeof buf);
            printf("  batch %lld, %s: %s\n", (long long)batches[i], gpu_title[c],
                   g[i].count[c] ? buf : "n/a");
        }
    printf("\ntarget (the issue): libdist >= %.0fx PyTorch eager at batch 64 and 1024\n",
           GPU_TARGET);
    for (int i = 0; i < nb; i++) {
        double ours = gpu_median(&g[i], GPU_GRAPHS);
        for (int c = TORCH_GPU_DATA; c <= TORCH_HOST_DATA; c++) {
            double ref = gpu_median(&g[i], c);
            if (ours > 0 && ref > 0)
                printf("  batch %lld: libdist graphs on / %s = %.2fx: %s\n", (long long)batches[i],
                       gpu_title[c], ours / ref, ours >= GPU_TARGET * ref ? "met" : "NOT met");
        }
    }
    printf("\n");
    for (int i = 0; i < nb; i++)
        for (int c = 0; c < GPU_CONFIGS; c++)
            if (g[i].count[c])
                printf("RESULT batch=%lld config=%s images_per_sec=%.0f\n", (long long)batches[i],
                       gpu_key[c], gpu_median(&g[i], c));
}

/* bench_train --gpu: exits 77 without a GPU, 1 when a measurement or check failed. */
static int gpu_main(const int64_t *batches, int nb, int images, int repeats, int torch,
                    const char *python) {
    /* This program links libdist statically, so the loader would look for the CUDA module
     * next to this program: name the build tree's copy unless $DIST_CUDA_MODULE is set. */
#ifdef DIST_BENCH_CUDA_MODULE
    if (access(DIST_BENCH_CUDA_MODULE, F_OK) == 0)
        setenv("DIST_CUDA_MODULE", DIST_BENCH_CUDA_MODULE, 0);
#endif
    if (dist_device_count(DIST_DEVICE_CUDA) == 0) {
        dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
        bo.device = (dist_device){DIST_DEVICE_CUDA, 0};
        dist_backend *be = NULL;
        dist_status st = dist_backend_create(&bo, &be);
        dist_backend_destroy(be);
        printf("bench_train --gpu: no GPU visible, skipped (%s)\n",
               st != DIST_OK ? dist_last_error() : "dist_device_count(DIST_DEVICE_CUDA) is 0");
        return 77;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress reaches a log even if the run is cut short */
    dist_set_log_callback(gpu_log, DIST_LOG_WARN, NULL);
    dist_mnist *mnist;
    dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
    mo.allow_download = 0;
    CHECK(dist_mnist_load(&mo, &mnist));
    int64_t examples = dist_mnist_train_images(mnist)->shape[0];
    int steps[GPU_MAX_BATCHES];
    for (int i = 0; i < nb; i++) {
        if (batches[i] > examples) {
            printf("bench_train --gpu: batch %lld is larger than the %lld training images of %s\n",
                   (long long)batches[i], (long long)examples, dist_mnist_source(mnist));
            dist_mnist_destroy(mnist);
            return 2;
        }
        steps[i] = (int)(images / batches[i] > 20 ? images / batches[i] : 20);
    }
    printf("bench_train --gpu: seed CNN, Adam, global batch B on one GPU, float32 without TF32 "
           "on both sides\n"
           "PyTorch eager (bench/torch_cnn_gpu.py): random MNIST-shaped data on the GPU, and "
           "copied from pinned host memory each step\n"
           "libdist one_device gpu:0: %s through normalize -> shuffle -> batch -> repeat -> "
           "prefetch, CUDA graphs on and off, repeats interleaved\n"
           "each: %d warm-up steps, then %d repeats of max(20, %d / B) steps\n",
           dist_mnist_source(mnist), GPU_WARMUP_STEPS, repeats, images);
    printf("target: libdist >= %.0fx PyTorch eager at batch 64 and 1024\n\n", GPU_TARGET);
    gpu_results g[GPU_MAX_BATCHES];
    memset(g, 0, sizeof g);
    int failed = 0;
    /* PyTorch first, while this process has no CUDA context yet (counting GPUs makes none), so
     * that the two never hold the GPU at once (a GPU in exclusive-process mode allows one). */
    if (torch) {
        failed |= gpu_torch(python, 0, batches, steps, nb, repeats, g);
        failed |= gpu_torch(python, 1, batches, steps, nb, repeats, g);
    }
    for (int i = 0; i < nb; i++) {
        printf("libdist batch %lld: %d steps per repeat\n", (long long)batches[i], steps[i]);
        failed |= gpu_libdist(batches[i], steps[i], repeats, mnist, &g[i]);
    }
    dist_mnist_destroy(mnist);
    gpu_report(batches, nb, g);
    if (failed) printf("\nbench_train --gpu: FAILED (see the FAIL lines above)\n");
    return failed ? 1 : 0;
}

/* "64,1024" -> batches; returns their count, or 0 when the list is malformed. */
static int parse_batches(const char *text, int64_t *out, int max) {
    int n = 0;
    const char *p = text;
    for (;;) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1 || v > 1000000 || n == max) return 0;
        out[n++] = v;
        if (*end == '\0') return n;
        if (*end != ',') return 0;
        p = end + 1;
    }
}

int main(int argc, char **argv) {
    /* the multi_worker rows' workers are this program: they share the token by inheritance */
    setenv("DIST_CLUSTER_TOKEN", "bench_train local cluster token", 0);
    int steps = 300, repeats = 5, torch = 1, policies = 0;
    int gpu = 0, images = 65536, nb = 2, steps_set = 0, repeats_set = 0, gpu_args = 0;
    int64_t batches[GPU_MAX_BATCHES] = {64, 1024};
    const char *python = NULL, *tf_python = NULL;
    int tf = 1;
#ifdef DIST_BENCH_MPI_MODULE
    /* linked statically: the MPI workers find the build tree's module, unless told another */
    if (access(DIST_BENCH_MPI_MODULE, F_OK) == 0)
        setenv("DIST_MPI_MODULE", DIST_BENCH_MPI_MODULE, 0);
#endif
    if (argc == 5 && strcmp(argv[1], "--worker") == 0) {
        dist_mnist *m;
        dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
        mo.allow_download = 0;
        CHECK(dist_mnist_load(&mo, &m));
        int rc = worker_main(argv, m);
        dist_mnist_destroy(m);
        return rc;
    }
    int bad = 0;
    for (int i = 1; i < argc && !bad; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]), steps_set = 1;
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]), repeats_set = 1;
        else if (!strcmp(argv[i], "--no-torch"))
            torch = 0;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--tf") && i + 1 < argc)
            tf_python = argv[++i];
        else if (!strcmp(argv[i], "--no-tf"))
            tf = 0;
        else if (!strcmp(argv[i], "--mixed-precision"))
            policies = 1;
        else if (!strcmp(argv[i], "--gpu"))
            gpu = 1;
        else if (!strcmp(argv[i], "--batch-sizes") && i + 1 < argc)
            bad = (nb = parse_batches(argv[++i], batches, GPU_MAX_BATCHES)) == 0, gpu_args = 1;
        else if (!strcmp(argv[i], "--images") && i + 1 < argc)
            images = atoi(argv[++i]), gpu_args = 1;
        else
            bad = 1;
    }
    /* --steps and --mixed-precision are the CPU modes'; --batch-sizes and --images the GPU's */
    if (bad || (gpu && (steps_set || policies)) || (!gpu && gpu_args)) {
        fprintf(stderr,
                "usage: %s [--steps N] [--repeats R] [--no-torch] [--python PATH] [--no-tf] "
                "[--tf PYTHON] [--mixed-precision]\n"
                "       %s --gpu [--batch-sizes 64,1024] [--images N] [--repeats R] [--no-torch] "
                "[--python PATH]\n",
                argv[0], argv[0]);
        return 2;
    }
    if (gpu && !repeats_set) repeats = 3;
    if (steps < 1 || repeats < 1 || repeats > MAX_REPEATS || images < 1) {
        fprintf(stderr, "bench_train: steps and images must be >= 1 and repeats 1..%d\n",
                MAX_REPEATS);
        return 2;
    }
    if (gpu) return gpu_main(batches, nb, images, repeats, torch, python ? python : "python3");
    if (!python) python = "/usr/bin/python3";
    /* TensorFlow: --tf, else the project's venv (tools/setup-deps.sh makes it) when present */
    char venv_python[4096] = "";
    const char *tf_missing = "not run (--no-tf)";
    if (tf && !tf_python) {
        const char *home = getenv("HOME");
        snprintf(venv_python, sizeof venv_python, "%s/.cache/libdist/venv-tf/bin/python",
                 home ? home : "");
        if (home && access(venv_python, X_OK) == 0)
            tf_python = venv_python;
        else
            tf_missing = "not run: no TensorFlow found (no ~/.cache/libdist/venv-tf/bin/python; "
                         "--tf PYTHON names one)";
    }
    int cores = dist_device_count(DIST_DEVICE_CPU);
    char all_cpus[256] = "";
    for (int c = 0, len = 0; c < cores && len < 240; c++)
        len += snprintf(all_cpus + len, sizeof all_cpus - (size_t)len, "%scpu:%d", c ? "," : "", c);
    dist_mnist *mnist;
    dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
    mo.allow_download = 0;
    CHECK(dist_mnist_load(&mo, &mnist));

    printf("seed CNN, batch 64, Adam; %d steps x %d repeats after 20 warm-up steps; %d cores\n\n",
           steps, repeats, cores);
    if (policies) {
        int rc = bench_policies(steps, repeats, cores, all_cpus, mnist, tf ? tf_python : NULL);
        dist_mnist_destroy(mnist);
        return rc;
    }
    int rc = bench_cpu(steps, repeats, cores, all_cpus, mnist, torch ? python : NULL,
                       tf ? tf_python : NULL, tf_missing);
    dist_mnist_destroy(mnist);
    return rc;
}
