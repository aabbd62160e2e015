/* The parameter-server strategy's speed: steps/s of the MNIST CNN (batch 64 per step, Adam)
 * with W workers and P ps tasks on loopback, beside TensorFlow's own ParameterServerStrategy on
 * the same configuration in the same run (bench/tf_parameter_server.py, interleaved), and the
 * ps update throughput: full-model Adam updates (121,930 parameters) per second that one ps
 * applies for one client pushing as fast as it can.
 *
 *   bench_ps [--configs 1x1,2x1,1x2,2x2] [--steps 400] [--warmup 50] [--repeats 3] [--no-tf]
 *            [--updates 2000]
 *
 * Each configuration is a fresh cluster of this program (a chief, W workers, P ps tasks, one
 * cluster token, free loopback ports; each worker computes with cores / W threads); the chief
 * schedules --warmup closures, joins, then times --steps closures to the last join. The TF
 * reference needs the conformance venv (tests/conformance/venv.sh), else its column is empty. */
#include "ps/ps_cluster.h"
#include "ps/ps_server.h"
#include "ps/ps_wire.h"

#include <arpa/inet.h>
#include <dist/dist.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONFIGS 8
#define MAX_REPEATS 16
#define BATCH 64

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int die(const char *what) {
    fprintf(stderr, "bench_ps: %s: %s\n", what, dist_last_error());
    return 1;
}

/* ---- one task of a cluster (TF_CONFIG in the environment) ---- */

typedef struct task {
    dist_mnist *mnist;
    dist_model *model;
    dist_optimizer *opt;
    dist_classifier_step step;
} task;

static dist_status dataset_fn(const dist_input_context *ctx, void *user, dist_dataset **out) {
    task *t = user;
    dist_tensor images = *dist_mnist_train_images(t->mnist);
    dist_tensor labels = *dist_mnist_train_labels(t->mnist);
    dist_tensor *parts[2] = {&images, &labels};
    dist_dataset *ds, *next;
    DIST_RETURN_IF_ERROR(dist_dataset_from_tensor_slices(parts, 2, 0, &ds));
    dist_status st =
        dist_dataset_shuffle(ds, 10000, 11 + (uint64_t)ctx->input_pipeline_id, 1, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st == DIST_OK) st = dist_dataset_map_image_normalize(ds, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st == DIST_OK) st = dist_dataset_batch(ds, BATCH / ctx->num_replicas_in_sync, 1, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st == DIST_OK) st = dist_dataset_prefetch(ds, 2, &next);
    if (st == DIST_OK) dist_dataset_destroy(ds), ds = next;
    if (st != DIST_OK) {
        dist_dataset_destroy(ds);
        return st;
    }
    *out = ds;
    return DIST_OK;
}

static int run_chief(dist_strategy *s, long warmup, long steps) {
    dist_coordinator *c;
    int ds;
    if (dist_coordinator_create(s, NULL, &c)) return die("coordinator");
    if (dist_coordinator_create_per_worker_dataset(c, "data", &ds)) return die("dataset");
    int rc = 0;
    for (long i = 0; i < warmup && !rc; i++)
        rc = dist_coordinator_schedule(c, "train", ds, NULL, 0, NULL) ? die("schedule") : 0;
    if (!rc && dist_coordinator_join(c)) rc = die("join");
    double t0 = now_s();
    for (long i = 0; i < steps && !rc; i++)
        rc = dist_coordinator_schedule(c, "train", ds, NULL, 0, NULL) ? die("schedule") : 0;
    if (!rc && dist_coordinator_join(c)) rc = die("join");
    double dt = now_s() - t0;
    if (!rc) printf("RESULT %.3f\n", (double)steps / dt);
    fflush(stdout);
    dist_coordinator_shutdown_cluster(c);
    dist_coordinator_destroy(c);
    return rc;
}

static int run_task(long warmup, long steps, int threads) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    so.kind = DIST_STRATEGY_PARAMETER_SERVER;
    so.threads_per_replica = threads;
    dist_strategy *s;
    if (dist_strategy_create(&so, &s)) return die("strategy");
    const char *role = dist_strategy_task_type(s);
    task t = {0};
    int rc = 0;
    if (strcmp(role, "ps") == 0) {
        rc = dist_strategy_serve(s) ? die("serve") : 0;
        dist_strategy_destroy(s);
        return rc;
    }
    dist_mnist_options mo = DIST_MNIST_OPTIONS_INIT;
    mo.data_dir = DIST_SOURCE_DIR "/src/data/mnist_subset";
    int64_t shape[3] = {28, 28, 1};
    dist_adam_options adam = DIST_ADAM_OPTIONS_INIT;
    if (dist_mnist_load(&mo, &t.mnist) || dist_strategy_scope_enter(s) ||
        dist_model_create_mnist_cnn(&t.model) || dist_model_build(t.model, 3, shape, 42) ||
        dist_optimizer_create_adam(&adam, &t.opt) || dist_strategy_scope_exit(s))
        rc = die("model");
    t.step = (dist_classifier_step){t.model, t.opt, 0, NULL};
    if (!rc &&
        (dist_strategy_register_function(s, "train", dist_classifier_train_closure, &t.step) ||
         dist_strategy_register_dataset_function(s, "data", dataset_fn, &t)))
        rc = die("register");
    if (!rc)
        rc = strcmp(role, "worker") == 0 ? (dist_strategy_serve(s) ? die("serve") : 0)
                                         : run_chief(s, warmup, steps);
    dist_optimizer_destroy(t.opt);
    dist_model_destroy(t.model);
    dist_mnist_destroy(t.mnist);
    dist_strategy_destroy(s);
    return rc;
}

/* ---- the ps update throughput: a chief pushing whole-model gradients to one ps ---- */

static int run_updates(long updates) {
    dist_strategy_options so = DIST_STRATEGY_OPTIONS_INIT;
    ps_cluster *cl;
    if (ps_cluster_resolve(&so.cluster, &cl)) return die("cluster");
    if (cl->role == PS_ROLE_WORKER) { /* the chief is the only client here */
        ps_cluster_destroy(cl);
        return 0;
    }
    if (cl->role == PS_ROLE_PS) {
        ps_server *srv;
        if (ps_server_start(cl, &srv)) return die("ps");
        ps_server_wait(srv);
        ps_server_destroy(srv);
        ps_cluster_destroy(cl);
        return 0;
    }
    /* the model's variables as one ps holds them: 8 tensors, 121,930 floats */
    static const uint64_t sizes[8] = {288, 32, 18432, 64, 102400, 64, 640, 10};
    uint64_t total = 0;
    for (int i = 0; i < 8; i++) total += sizes[i];
    float *values = calloc(total, sizeof *values), *grads = malloc(total * sizeof *grads);
    for (uint64_t i = 0; i < total; i++) grads[i] = 1e-3f * (float)(i % 7);
    int fd;
    char who[] = "ps/0";
    if (ps_connect(cl, ps_ps_rank(cl, 0), now_s() + 60, &fd)) return die("connect");
    ps_buf b = {0};
    ps_put_u32(&b, 8);
    for (uint32_t i = 0, off = 0; i < 8; off += (uint32_t)sizes[i], i++) {
        char name[16];
        snprintf(name, sizeof name, "v%u", i);
        ps_put_u32(&b, i);
        ps_put_str(&b, name);
        ps_put_u64(&b, sizes[i]);
        ps_put_bytes(&b, values + off, sizes[i] * 4);
    }
    ps_piece piece = {b.p, b.len};
    ps_header h;
    if (ps_send_frame(fd, PS_MSG_CREATE, 1, 0, &piece, 1, now_s() + 30, who) ||
        ps_recv_reply(fd, PS_MSG_CREATE, 1, &h, 4096, now_s() + 30, who))
        return die("create");
    ps_buf_reset(&b);
    ps_rule rule = {.kind = PS_RULE_ADAM,
                    .lr = 1e-3f,
                    .beta1 = 0.9f,
                    .beta2 = 0.999f,
                    .epsilon = 1e-7f,
                    .grad_scale = 1.0f};
    unsigned char rb[PS_RULE_BYTES];
    ps_rule_encode(&rule, rb);
    ps_put_bytes(&b, rb, sizeof rb);
    ps_put_u32(&b, 8);
    for (uint32_t i = 0; i < 8; i++) {
        ps_put_u32(&b, i);
        ps_put_u64(&b, sizes[i]);
    }
    ps_piece push[2] = {{b.p, b.len}, {grads, total * 4}};
    /* a window of pushes in flight, as a worker's lazily read replies allow */
    const int window = 4;
    double t0 = 0;
    long warm = updates / 10, sent = 0, done = 0;
    while (done < warm + updates) {
        if (done == warm && t0 == 0) t0 = now_s();
        if (sent < warm + updates && sent - done < window) {
            if (ps_send_frame(fd, PS_MSG_PUSH, 100 + (uint64_t)sent, 0, push, 2, now_s() + 30, who))
                return die("push");
            sent++;
            continue;
        }
        if (ps_recv_reply(fd, PS_MSG_PUSH, 100 + (uint64_t)done, &h, 4096, now_s() + 30, who))
            return die("push reply");
        done++;
    }
    double dt = now_s() - t0;
    printf("RESULT %.3f\n", (double)updates / dt);
    fflush(stdout);
    ps_send_frame(fd, PS_MSG_SHUTDOWN, 2, 0, NULL, 0, now_s() + 5, who);
    ps_recv_reply(fd, PS_MSG_SHUTDOWN, 2, &h, 4096, now_s() + 5, who);
    net_close(&fd);
    ps_buf_free(&b);
    free(values);
    free(grads);
    ps_cluster_destroy(cl);
    return 0;
}

/* ---- the launcher ---- */

static int free_ports(int n, int *ports) {
    int fds[64];
    for (int i = 0; i < n; i++) {
        fds[i] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t l = sizeof a;
        if (bind(fds[i], (struct sockaddr *)&a, sizeof a) < 0 ||
            getsockname(fds[i], (struct sockaddr *)&a, &l) < 0)
            return 0;
        ports[i] = ntohs(a.sin_port);
    }
    for (int i = 0; i < n; i++) close(fds[i]);
    return 1;
}

/* Starts the cluster (this program with --task), returns the chief's RESULT (0 on failure). */
static double run_cluster(const char *self, int workers, int ps, const char *mode, long warmup,
                          long steps, int threads) {
    int n = 1 + workers + ps, ports[64];
    if (n > 64 || !free_ports(n, ports)) return 0;
    char cluster[4096];
    size_t len = (size_t)snprintf(cluster, sizeof cluster,
                                  "{\"chief\":[\"127.0.0.1:%d\"],\"worker\":[", ports[0]);
    for (int i = 0; i < workers; i++)
        len += (size_t)snprintf(cluster + len, sizeof cluster - len, "%s\"127.0.0.1:%d\"",
                                i ? "," : "", ports[1 + i]);
    len += (size_t)snprintf(cluster + len, sizeof cluster - len, "],\"ps\":[");
    for (int j = 0; j < ps; j++)
        len += (size_t)snprintf(cluster + len, sizeof cluster - len, "%s\"127.0.0.1:%d\"",
                                j ? "," : "", ports[1 + workers + j]);
    snprintf(cluster + len, sizeof cluster - len, "]}");
    int pipefd[2];
    if (pipe(pipefd) != 0) return 0;
    pid_t pids[64];
    char args[4][32];
    snprintf(args[0], sizeof args[0], "%ld", warmup);
    snprintf(args[1], sizeof args[1], "%ld", steps);
    snprintf(args[2], sizeof args[2], "%d", threads);
    for (int t = 0; t < n; t++) {
        const char *job = t == 0 ? "chief" : t <= workers ? "worker" : "ps";
        int index = t == 0 ? 0 : t <= workers ? t - 1 : t - 1 - workers;
        char tf_config[4200];
        snprintf(tf_config, sizeof tf_config,
                 "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}", cluster, job, index);
        fflush(NULL);
        pids[t] = fork();
        if (pids[t] == 0) {
            if (t == 0) dup2(pipefd[1], STDOUT_FILENO);
            close(pipefd[0]);
            close(pipefd[1]);
            setenv("TF_CONFIG", tf_config, 1);
            setenv("DIST_CLUSTER_TOKEN", "bench_ps-cluster-token-0123456789abcdef", 1);
            execl(self, self, "--task", mode, args[0], args[1], args[2], (char *)NULL);
            _exit(127);
        }
    }
    close(pipefd[1]);
    char out[256] = "";
    FILE *f = fdopen(pipefd[0], "r");
    double result = 0;
    while (f && fgets(out, sizeof out, f))
        if (strncmp(out, "RESULT ", 7) == 0) result = atof(out + 7);
    if (f) fclose(f);
    for (int t = 0; t < n; t++) {
        int status;
        waitpid(pids[t], &status, 0);
    }
    return result;
}

/* TF's ParameterServerStrategy on the same configuration (steps/s, or with `updates` the ps's
 * apply_gradients of pushed full-model gradients per second; 0 when unavailable). */
static double run_tf(int workers, int ps, long warmup, long steps, int updates) {
    const char *home = getenv("HOME");
    char py[1024], cmd[4096];
    snprintf(py, sizeof py, "%s/.cache/libdist/venv-tf/bin/python", home ? home : "/root");
    if (access(py, X_OK) != 0) return 0;
    snprintf(cmd, sizeof cmd,
             "TF_CPP_MIN_LOG_LEVEL=2 %s %s/bench/tf_parameter_server.py --configs %dx%d "
             "--repeats 1 --steps %ld --warmup %ld --json%s 2>/dev/null",
             py, DIST_SOURCE_DIR, workers, ps, steps, warmup, updates ? " --ps-update-only" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return 0;
    char line[8192];
    double v = 0;
    while (fgets(line, sizeof line, p)) {
        const char *k = strstr(line, "\"steps_per_sec_median\"");
        if (k && (k = strchr(k, ':'))) v = atof(k + 1);
    }
    pclose(p);
    return v;
}

int main(int argc, char **argv) {
    if (argc >= 6 && strcmp(argv[1], "--task") == 0) {
        long warmup = atol(argv[3]), steps = atol(argv[4]);
        int threads = atoi(argv[5]);
        return strcmp(argv[2], "updates") == 0 ? run_updates(steps)
                                               : run_task(warmup, steps, threads);
    }
    const char *configs = "1x1,2x1,1x2,2x2";
    long steps = 400, warmup = 50, updates = 2000;
    int repeats = 3, tf = 1;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--configs") == 0 && i + 1 < argc)
            configs = argv[++i];
        else if (strcmp(argv[i], "--steps") == 0 && i + 1 < argc)
            steps = atol(argv[++i]);
        else if (strcmp(argv[i], "--warmup") == 0 && i + 1 < argc)
            warmup = atol(argv[++i]);
        else if (strcmp(argv[i], "--repeats") == 0 && i + 1 < argc)
            repeats = atoi(argv[++i]);
        else if (strcmp(argv[i], "--updates") == 0 && i + 1 < argc)
            updates = atol(argv[++i]);
        else if (strcmp(argv[i], "--no-tf") == 0)
            tf = 0;
        else {
            fprintf(stderr, "usage: bench_ps [--configs 1x1,2x1,1x2,2x2] [--steps N] [--warmup N] "
                            "[--repeats N] [--updates N] [--no-tf]\n");
            return 2;
        }
    }
    if (repeats < 1 || repeats > MAX_REPEATS) repeats = 3;
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = 0;
    int W[MAX_CONFIGS], P[MAX_CONFIGS], nc = 0;
    for (const char *p = configs; *p && nc < MAX_CONFIGS;) {
        if (sscanf(p, "%dx%d", &W[nc], &P[nc]) == 2 && W[nc] > 0 && P[nc] > 0) nc++;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    char cpu[256] = "unknown CPU";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (ci && fgets(line, sizeof line, ci))
        if (strncmp(line, "model name", 10) == 0) {
            snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
            cpu[strcspn(cpu, "\n")] = 0;
            break;
        }
    if (ci) fclose(ci);
    printf("bench_ps: %s, %ld cores; batch %d per step, Adam; %ld warm-up + %ld timed steps; "
           "median of %d\n",
           cpu, cores, BATCH, warmup, steps, repeats);
    double ours[MAX_CONFIGS][MAX_REPEATS], theirs[MAX_CONFIGS][MAX_REPEATS], upd[MAX_REPEATS],
        tf_upd[MAX_REPEATS];
    int nt[MAX_CONFIGS] = {0}, ntu = 0;
    for (int r = 0; r < repeats; r++) {
        for (int c = 0; c < nc; c++) {
            int threads = cores / W[c] > 0 ? (int)(cores / W[c]) : 1;
            ours[c][r] = run_cluster(self, W[c], P[c], "steps", warmup, steps, threads);
            double v = tf ? run_tf(W[c], P[c], warmup, steps, 0) : 0;
            if (v > 0) theirs[c][nt[c]++] = v;
            fprintf(stderr, "  round %d, %d worker(s) x %d ps: libdist %.1f steps/s, TF %.1f\n",
                    r + 1, W[c], P[c], ours[c][r], v);
        }
        upd[r] = run_cluster(self, 1, 1, "updates", 0, updates, 1);
        double v = tf ? run_tf(1, 1, 20, 200, 1) : 0;
        if (v > 0) tf_upd[ntu++] = v;
        fprintf(stderr, "  round %d, ps updates/s: libdist %.0f, TF %.0f\n", r + 1, upd[r], v);
    }
    printf("\n| workers x ps | libdist steps/s | images/s | TF PS steps/s | libdist / TF |\n");
    printf("|---|---|---|---|---|\n");
    for (int c = 0; c < nc; c++) {
        double m = median(ours[c], repeats), t = median(theirs[c], nt[c]);
        printf("| %d x %d | %.1f | %.0f | ", W[c], P[c], m, m * BATCH);
        if (t > 0)
            printf("%.1f | %.2fx |\n", t, m / t);
        else
            printf("- | - |\n");
    }
    printf("\nps update throughput (one ps, one client, full-model Adam updates of 121,930 "
           "parameters): libdist %.0f updates/s (%.2f GB/s of gradients)",
           median(upd, repeats), median(upd, repeats) * 121930 * 4 / 1e9);
    if (ntu)
        printf("; TF (a worker pushing constant gradients, apply_gradients on the ps) %.0f "
               "updates/s: %.1fx",
               median(tf_upd, ntu), median(upd, repeats) / median(tf_upd, ntu));
    printf("; median of %d\n", repeats);
    return 0;
}
