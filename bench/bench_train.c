/* Training throughput of the seed CNN (batch 64): libdist one_device on 1 thread, one_device
 * on every core, mirrored with one CPU replica per core, multi_worker with one worker process
 * per core on loopback (this program run again as the workers), against the same model in PyTorch
 * (bench/torch_cnn.py, run in this benchmark) at the same thread counts. Prints a table with
 * the median of several repeats, the ratios the targets are stated in, and the fraction of
 * the FP32 peak.
 *
 * With --mixed-precision: the dtype policies instead, float32 against mixed_bfloat16 and
 * mixed_float16 (dynamic loss scale), one_device on 1 thread and mirrored over every core, the
 * policies' repeats interleaved so that drift of the machine hits all alike.
 *
 * usage: bench_train [--steps N] [--repeats R] [--no-torch] [--python PATH] [--mixed-precision]
 *        (run from anywhere; the PyTorch script is found through the source tree) */
#include <arpa/inet.h>
#include <dist/dist.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#ifndef DIST_SOURCE_DIR
#define DIST_SOURCE_DIR "."
#endif

#define FLOP_PER_IMAGE 14.8e6 /* training: forward + backward of the seed CNN */
/* FP32 FMA peak of one core: measured on the AVX-512 Zen 5 (PERFORMANCE.md); half of it where
 * the widest vectors are AVX2's (same FMA ports, half the lanes). */
#define PEAK_PER_CORE_AVX512 222e9
static double peak_per_core(void) {
    return __builtin_cpu_supports("avx512f") ? PEAK_PER_CORE_AVX512 : PEAK_PER_CORE_AVX512 / 2;
}
#define PEAK_PER_CORE peak_per_core()
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

/* images/s of each repeat of `steps` training steps (after 20 warm-up steps). */
static double run_libdist_policy(dist_strategy_kind kind, const char *devices, int threads,
                                 int steps, int repeats, const dist_mnist *mnist,
                                 const char *cluster_spec, dist_dtype_policy policy,
                                 double *runs) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = kind;
    so.devices = devices;
    so.threads_per_replica = threads;
    so.cluster_spec = cluster_spec;
    dist_strategy *s;
    CHECK(dist_strategy_create(&so, &s));
    dist_model *model;
    dist_optimizer *opt;
    int64_t shape[3] = {28, 28, 1};
    dist_adam_options ao = DIST_ADAM_OPTIONS_INIT;
    CHECK(dist_strategy_scope_enter(s));
    CHECK(dist_model_create_mnist_cnn(&model));
    CHECK(dist_model_build(model, 3, shape, 1));
    CHECK(dist_optimizer_create_adam(&ao, &opt));
    CHECK(dist_strategy_scope_exit(s));
    CHECK(dist_model_set_dtype_policy(model, policy));
    dist_loss_scale_optimizer *lso = NULL;
    dist_loss_scale_options lo = DIST_LOSS_SCALE_OPTIONS_INIT;
    if (policy == DIST_POLICY_MIXED_FLOAT16) CHECK(dist_loss_scale_optimizer_create(opt, &lo, &lso));

    dist_tensor images = *dist_mnist_train_images(mnist), labels = *dist_mnist_train_labels(mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    CHECK(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    CHECK(dist_dataset_map_image_normalize(ds, &next));
    dist_dataset_destroy(ds), ds = next;
    CHECK(dist_dataset_shuffle(ds, 10000, 1, 1, &next));
    dist_dataset_destroy(ds), ds = next;
    CHECK(dist_dataset_batch(ds, 64, 1, &next));
    dist_dataset_destroy(ds), ds = next;
    CHECK(dist_dataset_repeat(ds, -1, &next));
    dist_dataset_destroy(ds), ds = next;
    CHECK(dist_dataset_prefetch(ds, 2, &next));
    dist_dataset_destroy(ds), ds = next;
    dist_distributed_dataset *dds;
    dist_distributed_iterator *it;
    CHECK(dist_strategy_distribute_dataset(s, ds, &dds));
    CHECK(dist_distributed_dataset_iterator(dds, &it));

    dist_classifier_step cs = {model, opt, 64, lso};
    for (int r = -1; r < repeats; r++) {
        int n = r < 0 ? 20 : steps;
        double t0 = now_s();
        for (int i = 0; i < n; i++) {
            dist_per_replica_element e;
            dist_per_replica out;
            int end;
            CHECK(dist_distributed_iterator_next(it, &e, &end));
            CHECK(dist_strategy_run(s, dist_classifier_train_step, &cs, &e, &out));
        }
        if (r >= 0) runs[r] = 64.0 * steps / (now_s() - t0);
    }
    dist_distributed_iterator_destroy(it);
    dist_distributed_dataset_destroy(dds);
    dist_dataset_destroy(ds);
    dist_loss_scale_optimizer_destroy(lso);
    dist_optimizer_destroy(opt);
    dist_model_destroy(model);
    dist_strategy_destroy(s);
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

/* Runs bench/torch_cnn.py once; returns its median images/s (0 when it cannot run). */
static double run_torch_once(const char *python, int threads, int steps, int repeats, int flush,
                             char *runs_text, size_t size) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "%s %s/bench/torch_cnn.py --threads %d --steps %d --repeats %d%s 2>/dev/null", python,
             DIST_SOURCE_DIR, threads, steps, repeats, flush ? " --flush-denormal" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[4096] = "";
    double med = 0;
    while (fgets(line, sizeof line, p)) {
        const char *m = strstr(line, "\"images_per_sec_median\":");
        if (m) med = atof(m + strlen("\"images_per_sec_median\":"));
        const char *r = strstr(line, "\"runs\": [");
        if (r) {
            r += strlen("\"runs\": [");
            const char *e = strchr(r, ']');
            size_t n = e ? (size_t)(e - r) : 0;
            if (n >= size) n = size - 1;
            memcpy(runs_text, r, n);
            runs_text[n] = '\0';
        }
    }
    pclose(p);
    return med;
}

/* PyTorch at its best: with and without flushing denormals, whichever is faster. */
static double run_torch(const char *python, int threads, int steps, int repeats, char *runs_text,
                        size_t size) {
    char other[512] = "";
    double a = run_torch_once(python, threads, steps, repeats, 0, runs_text, size);
    double b = run_torch_once(python, threads, steps, repeats, 1, other, sizeof other);
    if (b > a) {
        snprintf(runs_text, size, "%s (flush-denormal)", other);
        return b;
    }
    return a;
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
    for (int i = 0; i < workers; i++) {
        char cmd[8192];
        snprintf(cmd, sizeof cmd,
                 "DIST_COLLECTIVE_TRANSPORT=%s '%s' --worker '{\"cluster\":%s,\"task\":{\"type\":"
                 "\"worker\",\"index\":%d}}' %d %d",
                 transport, self, cluster, i, steps, repeats);
        p[i] = popen(cmd, "r");
        if (!p[i]) return 0;
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
    for (int i = 0; i < workers; i++) ok &= pclose(p[i]) == 0;
    if (!got || !ok) return 0;
    double copy[MAX_REPEATS];
    memcpy(copy, runs, (size_t)repeats * sizeof *copy);
    med = median(copy, repeats);
    return med;
}

/* bench_train --worker SPEC STEPS REPEATS: one multi_worker worker; worker 0 prints its runs. */
static int worker_main(char **argv, const dist_mnist *mnist) {
    int steps = atoi(argv[3]), repeats = atoi(argv[4]);
    double runs[MAX_REPEATS];
    run_libdist(DIST_STRATEGY_MULTI_WORKER, "cpu:0", 1, steps, repeats, mnist, argv[2], runs);
    if (strstr(argv[2], "\"index\":0}")) {
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

/* --mixed-precision: float32, mixed_bfloat16 and mixed_float16 on one_device (1 thread) and
 * mirrored (every core); each repeat runs every policy once, in turn. */
static int bench_policies(int steps, int repeats, int cores, const char *all_cpus,
                          const dist_mnist *mnist) {
    const dist_dtype_policy pol[3] = {DIST_POLICY_FLOAT32, DIST_POLICY_MIXED_BFLOAT16,
                                      DIST_POLICY_MIXED_FLOAT16};
    double runs[2][3][MAX_REPEATS];
    for (int r = 0; r < repeats; r++)
        for (int cfg = 0; cfg < 2; cfg++)
            for (int p = 0; p < 3; p++)
                run_libdist_policy(cfg ? DIST_STRATEGY_MIRRORED : DIST_STRATEGY_ONE_DEVICE,
                                   cfg ? all_cpus : "cpu:0", 1, steps, 1, mnist, NULL, pol[p],
                                   &runs[cfg][p][r]);
    printf("| configuration | policy | images/s (median) | vs float32 | repeats |\n"
           "|---|---|---|---|---|\n");
    for (int cfg = 0; cfg < 2; cfg++) {
        double f32 = 0;
        for (int p = 0; p < 3; p++) {
            char buf[512], name[64];
            runs_str(runs[cfg][p], repeats, buf, sizeof buf);
            double copy[MAX_REPEATS];
            memcpy(copy, runs[cfg][p], (size_t)repeats * sizeof *copy);
            double med = median(copy, repeats);
            if (p == 0) f32 = med;
            snprintf(name, sizeof name, cfg ? "mirrored, %d CPU replicas" : "one_device, 1 thread",
                     cores);
            printf("| libdist %s | %s%s | %.0f | %.2fx | %s |\n", name,
                   dist_dtype_policy_name(pol[p]),
                   pol[p] == DIST_POLICY_MIXED_FLOAT16 ? " + dynamic loss scale" : "", med,
                   med / f32, buf);
        }
    }
    printf("\nThe mixed policies run float32 kernels with values stored at float16 / bfloat16 "
           "precision\n(dist/policy.h): the difference is the cost of the rounding passes.\n");
    return 0;
}

int main(int argc, char **argv) {
    int steps = 300, repeats = 5, torch = 1, policies = 0;
    const char *python = "/usr/bin/python3";
    if (argc == 5 && strcmp(argv[1], "--worker") == 0) {
        dist_mnist *m;
        dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
        mo.allow_download = 0;
        CHECK(dist_mnist_load(&mo, &m));
        int rc = worker_main(argv, m);
        dist_mnist_destroy(m);
        return rc;
    }
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc)
            steps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--repeats") && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--no-torch"))
            torch = 0;
        else if (!strcmp(argv[i], "--python") && i + 1 < argc)
            python = argv[++i];
        else if (!strcmp(argv[i], "--mixed-precision"))
            policies = 1;
        else {
            fprintf(stderr,
                    "usage: %s [--steps N] [--repeats R] [--no-torch] [--python PATH] "
                    "[--mixed-precision]\n",
                    argv[0]);
            return 2;
        }
    }
    if (steps < 1 || repeats < 1 || repeats > MAX_REPEATS) {
        fprintf(stderr, "bench_train: steps must be >= 1 and repeats 1..%d\n", MAX_REPEATS);
        return 2;
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
        int rc = bench_policies(steps, repeats, cores, all_cpus, mnist);
        dist_mnist_destroy(mnist);
        return rc;
    }
    double r1[MAX_REPEATS], rall[MAX_REPEATS], rmir[MAX_REPEATS], rmw[MAX_REPEATS],
        rmwt[MAX_REPEATS];
    double one = run_libdist(DIST_STRATEGY_ONE_DEVICE, "cpu:0", 1, steps, repeats, mnist, NULL, r1);
    double all =
        run_libdist(DIST_STRATEGY_ONE_DEVICE, "cpu:0", cores, steps, repeats, mnist, NULL, rall);
    double mir =
        run_libdist(DIST_STRATEGY_MIRRORED, all_cpus, 1, steps, repeats, mnist, NULL, rmir);
    double mw = run_multi_worker(cores, steps, repeats, "shm", rmw);
    double mwt = run_multi_worker(cores, steps, repeats, "tcp", rmwt);
    char t1_runs[512] = "n/a", tall_runs[512] = "n/a";
    double t1 = torch ? run_torch(python, 1, steps, repeats, t1_runs, sizeof t1_runs) : 0;
    double tall = torch ? run_torch(python, cores, steps, repeats, tall_runs, sizeof tall_runs) : 0;

    char buf[512];
    printf("| configuration | threads | images/s (median) | %% of FP32 peak | repeats "
           "|\n|---|---|---|---|---|\n");
    runs_str(r1, repeats, buf, sizeof buf);
    printf("| libdist one_device cpu:0 | 1 | %.0f | %.0f%% | %s |\n", one,
           100 * one * FLOP_PER_IMAGE / PEAK_PER_CORE, buf);
    runs_str(rall, repeats, buf, sizeof buf);
    printf("| libdist one_device cpu:0 | %d | %.0f | %.0f%% | %s |\n", cores, all,
           100 * all * FLOP_PER_IMAGE / (PEAK_PER_CORE * cores), buf);
    runs_str(rmir, repeats, buf, sizeof buf);
    printf("| libdist mirrored, %d CPU replicas | %d x 1 | %.0f | %.0f%% | %s |\n", cores, cores,
           mir, 100 * mir * FLOP_PER_IMAGE / (PEAK_PER_CORE * cores), buf);
    runs_str(rmw, repeats, buf, sizeof buf);
    printf("| libdist multi_worker, %d workers, shared memory | %d x 1 | %.0f | %.0f%% | %s |\n",
           cores, cores, mw, 100 * mw * FLOP_PER_IMAGE / (PEAK_PER_CORE * cores), buf);
    runs_str(rmwt, repeats, buf, sizeof buf);
    printf("| libdist multi_worker, %d workers, TCP | %d x 1 | %.0f | %.0f%% | %s |\n", cores,
           cores, mwt, 100 * mwt * FLOP_PER_IMAGE / (PEAK_PER_CORE * cores), buf);
    if (torch) {
        printf("| PyTorch eager (torch_cnn.py) | 1 | %.0f | %.0f%% | %s |\n", t1,
               100 * t1 * FLOP_PER_IMAGE / PEAK_PER_CORE, t1_runs);
        printf("| PyTorch eager (torch_cnn.py) | %d | %.0f | %.0f%% | %s |\n", cores, tall,
               100 * tall * FLOP_PER_IMAGE / (PEAK_PER_CORE * cores), tall_runs);
    }
    printf("\nratios:\n");
    printf("  mirrored %d replicas / one replica on one core: %.2fx (target >= 1.7x)\n", cores,
           mir / one);
    if (mir > 0)
        printf("  multi_worker %d workers / mirrored %d replicas: %.2fx shared memory, %.2fx TCP "
               "(target >= 0.9x)\n",
               cores, cores, mw / mir, mwt / mir);
    if (torch && t1 > 0 && tall > 0) {
        printf("  libdist 1 thread / PyTorch 1 thread: %.2fx (target >= 2x)\n", one / t1);
        printf("  libdist one_device %d threads / PyTorch %d threads: %.2fx (target >= 2x)\n",
               cores, cores, all / tall);
        printf("  libdist mirrored / PyTorch %d threads: %.2fx (target >= 2x)\n", cores,
               mir / tall);
    } else if (torch) {
        printf("  PyTorch did not run (%s bench/torch_cnn.py; install python3-torch: "
               "tools/setup-deps.sh --bench)\n",
               python);
    }
    dist_mnist_destroy(mnist);
    return 0;
}
