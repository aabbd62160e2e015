/* All-reduce latency and bus bandwidth of the cross-process communicator (net_comm.h), with
 * P processes on loopback, over TCP, over TCP in TLS 1.3 (the PSK from the cluster token,
 * AES-128-GCM), and over shared memory, and of the MPI communicator (collective/mpi_comm.h)
 * through the MPI the build found.
 *
 *   bench_allreduce [--quick] [--procs P] [--transport tcp|tls|shm|mpi]
 *   bench_allreduce --algorithms [--small] [--quick] [--procs P] [--transport tcp|tls]
 *
 * The MPI rows start this program again as `mpiexec -n P bench_allreduce --mpi-rank`, with
 * OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM)=1 and OMPI_MCA_rmaps_base_oversubscribe=1 in the environment
 * (as root in a container, more ranks than cores); rank 0 writes the timings to mpiexec's stdout.
 * They use Open MPI's default transports (shared memory between processes of one host).
 *
 * For P = 2 and 4 and each transport, sizes 4 KB, 64 KB, 1 MB, 16 MB, 64 MB: warm-up, then
 * the median time of several all-reduces (each one preceded by a barrier). Bus bandwidth as
 * NCCL defines it: size / time x 2 (P - 1) / P. As in-run references (the machine is shared and
 * noisy): one process sending 64 MB to another over one loopback TCP socket, memcpy of 64 MB,
 * and memcpy of 64 MB in two processes at once (the ceiling of a 2-process shared-memory
 * all-reduce, which has to read each rank's input and write its output at least once: the
 * two cores share the memory bandwidth). Targets (P = 2): TCP >= 1.2 GB/s bus bandwidth at 64 MB, 4
 * KB in <= 100 us; shm >= 5 GB/s at 64 MB.
 *
 * --algorithms: the TCP (or TLS) all-reduce's algorithms (net_allreduce.c) side by side at
 * small and middle sizes (8 B to 4 MB; --small: to 64 KB), P = 2, 4 and 8 (or --procs P, 2 to
 * 16): each one forced (ring, direct, doubling, scatter), then auto's choice; the rows that set
 * auto's thresholds. */
#include "collective/mpi_comm.h"
#include "collective/net_comm.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_P 16
#define REF_BYTES (64u << 20)

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
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) < 0) return -1;
    socklen_t l = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

static double memcpy_gbs(int reps) {
    char *a = malloc(REF_BYTES), *b = malloc(REF_BYTES);
    memset(a, 1, REF_BYTES);
    memset(b, 2, REF_BYTES);
    double t[16];
    for (int i = 0; i < reps; i++) {
        double t0 = now_s();
        memcpy(b, a, REF_BYTES);
        t[i] = now_s() - t0;
    }
    double m = median(t, reps);
    free(a);
    free(b);
    return REF_BYTES / m / 1e9;
}

/* memcpy_gbs in two processes started together; the slower one's rate. */
static double memcpy_pair_gbs(int reps) {
    int fds[2][2];
    pid_t pid[2];
    for (int k = 0; k < 2; k++) {
        if (pipe(fds[k]) != 0) return 0;
        pid[k] = fork();
        if (pid[k] == 0) {
            double g = memcpy_gbs(reps);
            ssize_t w = write(fds[k][1], &g, sizeof g);
            _exit(w == (ssize_t)sizeof g ? 0 : 1);
        }
        close(fds[k][1]);
    }
    double slow = 0;
    for (int k = 0; k < 2; k++) {
        double g = 0;
        if (read(fds[k][0], &g, sizeof g) != (ssize_t)sizeof g) g = 0;
        close(fds[k][0]);
        waitpid(pid[k], NULL, 0);
        slow = k == 0 || g < slow ? g : slow;
    }
    return slow;
}

/* One process sends 64 MB to another over one socket; the receiver answers one byte. */
static double tcp_stream_gbs(int reps) {
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int one = 1, buf = 4 << 20;
    setsockopt(lfd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    bind(lfd, (struct sockaddr *)&a, sizeof a);
    socklen_t l = sizeof a;
    getsockname(lfd, (struct sockaddr *)&a, &l);
    listen(lfd, 1);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = accept(lfd, NULL, NULL);
        char *b = malloc(1 << 20);
        for (int r = 0; r < reps; r++) {
            size_t got = 0;
            while (got < REF_BYTES) {
                ssize_t n = recv(fd, b, 1 << 20, 0);
                if (n <= 0) _exit(1);
                got += (size_t)n;
            }
            if (send(fd, "k", 1, 0) != 1) _exit(1);
        }
        _exit(0);
    }
    close(lfd);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) return 0;
    char *b = malloc(REF_BYTES);
    memset(b, 3, REF_BYTES);
    double t[16];
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        size_t sent = 0;
        while (sent < REF_BYTES) {
            ssize_t n = send(fd, b + sent, REF_BYTES - sent, 0);
            if (n <= 0) return 0;
            sent += (size_t)n;
        }
        char k;
        if (recv(fd, &k, 1, 0) != 1) return 0;
        t[r] = now_s() - t0;
    }
    close(fd);
    waitpid(pid, NULL, 0);
    free(b);
    return REF_BYTES / median(t, reps) / 1e9;
}

static const size_t k_sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20, 64u << 20};
static const size_t k_algo_sizes[] = {8,         256,        4u << 10, 16u << 10, 32u << 10,
                                      64u << 10, 256u << 10, 1u << 20, 4u << 20};

/* What one run times: its sizes, and the algorithm (FROM_ENV: the communicator's default). */
typedef struct bench_plan {
    const size_t *sizes;
    int nsizes;
    dist_net_allreduce_algorithm algo;
} bench_plan;
static const bench_plan k_default_plan = {k_sizes, (int)(sizeof k_sizes / sizeof k_sizes[0]),
                                          DIST_NET_ALLREDUCE_FROM_ENV};

static int iters_for(size_t bytes, int quick) {
    int n = bytes <= (64u << 10) ? 300 : bytes <= (1u << 20) ? 40 : bytes <= (16u << 20) ? 10 : 7;
    return quick ? (n / 4 > 3 ? n / 4 : 3) : n;
}

/* The timed loop over every size, for any communicator: `barrier`, then `all_reduce` (MEAN of
 * floats) on `c`; rank 0 writes "size median_s" lines to `out`. */
typedef dist_status (*bench_barrier_fn)(void *c);
typedef dist_status (*bench_all_reduce_fn)(void *c, float *data, size_t count);

static int time_sizes(void *c, bench_barrier_fn barrier, bench_all_reduce_fn all_reduce, int rank,
                      const bench_plan *plan, int quick, int out) {
    float *data = malloc(64u << 20);
    for (size_t i = 0; i < (64u << 20) / sizeof(float); i++) data[i] = (float)(i % 13);
    for (int s = 0; s < plan->nsizes; s++) {
        size_t size = plan->sizes[s], count = size / sizeof(float);
        int iters = iters_for(size, quick), warm = iters / 5 > 2 ? iters / 5 : 2;
        double *times = malloc((size_t)iters * sizeof *times);
        for (int i = 0; i < warm + iters; i++) {
            if (barrier(c) != DIST_OK) return 1;
            double t0 = now_s();
            if (all_reduce(c, data, count) != DIST_OK) return 1;
            if (i >= warm) times[i - warm] = now_s() - t0;
        }
        double m = median(times, iters);
        free(times);
        if (rank == 0) {
            char line[64];
            int n = snprintf(line, sizeof line, "%zu %.9f\n", size, m);
            if (write(out, line, (size_t)n) != n) return 1;
        }
    }
    free(data);
    return 0;
}

static dist_status net_barrier(void *c) { return dist_net_comm_barrier(c); }
static dist_status net_all_reduce(void *c, float *data, size_t count) {
    return dist_net_comm_all_reduce(c, data, count, DIST_REDUCE_MEAN);
}

/* Rank's part over TCP or shm. */
static int run_rank(int rank, int p, const char *const *addrs, dist_net_transport t, int tls,
                    const bench_plan *plan, int quick, int out) {
    dist_net_comm_options o = DIST_NET_COMM_OPTIONS_INIT;
    o.rank = rank;
    o.world = p;
    o.addresses = addrs;
    o.fingerprint = "bench_allreduce";
    o.token = "bench_allreduce cluster token"; /* every rank is this program */
    o.connect_timeout_s = 30;
    o.timeout_s = 60;
    o.transport = t;
    o.tls = tls;
    o.allreduce_algorithm = plan->algo;
    dist_net_comm *c = NULL;
    double t0 = now_s();
    dist_status st = dist_net_comm_create(&o, &c);
    if (st == DIST_OK && rank == 0) { /* "0 seconds": the join, printed before the sizes */
        char line[64];
        int n = snprintf(line, sizeof line, "0 %.9f\n", now_s() - t0);
        if (write(out, line, (size_t)n) != n) st = DIST_SYSTEM;
    }
    if (st != DIST_OK || time_sizes(c, net_barrier, net_all_reduce, rank, plan, quick, out) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, dist_last_error());
        return 1;
    }
    dist_net_comm_destroy(c);
    return 0;
}

static dist_status mpi_barrier(void *c) { return dist_comm_barrier(c, 0, 0); }
static dist_status mpi_all_reduce(void *c, float *data, size_t count) {
    return dist_comm_all_reduce(c, 0, data, count, DIST_F32, DIST_REDUCE_MEAN, 0);
}

/* Rank's part under mpiexec (--mpi-rank): rank 0 writes to stdout, which mpiexec forwards. */
static int run_mpi_rank(int quick) {
    dist_comm *c = NULL;
    if (dist_comm_create_mpi(60, &c) != DIST_OK) {
        fprintf(stderr, "mpi: %s\n", dist_last_error());
        return 1;
    }
    int rc = time_sizes(c, mpi_barrier, mpi_all_reduce, c->first_rank, &k_default_plan, quick,
                        STDOUT_FILENO);
    if (rc != 0) fprintf(stderr, "mpi rank %d: %s\n", c->first_rank, dist_last_error());
    dist_comm_destroy(c);
    return rc;
}

/* Reads rank 0's "size median_s" lines and prints a table row for each. */
static void print_rows(FILE *f, int p, const char *tname) {
    size_t bytes;
    double m;
    while (f && fscanf(f, "%zu %lf", &bytes, &m) == 2) {
        if (bytes == 0) { /* the join: rendezvous and every connection's handshakes */
            printf("| %d | %s | join | %.1f (connect and handshakes) | | |\n", p, tname, m * 1e6);
            continue;
        }
        double alg = (double)bytes / m / 1e9, bus = alg * 2.0 * (p - 1) / p;
        char size[32];
        if (bytes >= (1u << 20))
            snprintf(size, sizeof size, "%zu MB", bytes >> 20);
        else if (bytes >= (1u << 10))
            snprintf(size, sizeof size, "%zu KB", bytes >> 10);
        else
            snprintf(size, sizeof size, "%zu B", bytes);
        printf("| %d | %s | %s | %.1f | %.2f | %.2f |\n", p, tname, size, m * 1e6, alg, bus);
        fflush(stdout);
    }
}

static void run_config(int p, dist_net_transport t, int tls, const char *tname,
                       const bench_plan *plan, int quick) {
    char abuf[MAX_P][32];
    const char *addrs[MAX_P];
    for (int r = 0; r < p; r++) {
        snprintf(abuf[r], sizeof abuf[r], "127.0.0.1:%d", free_port());
        addrs[r] = abuf[r];
    }
    int pfd[2];
    if (pipe(pfd) < 0) return;
    pid_t pids[MAX_P];
    fflush(NULL);
    for (int r = 0; r < p; r++) {
        pids[r] = fork();
        if (pids[r] == 0) {
            close(pfd[0]);
            _exit(run_rank(r, p, addrs, t, tls, plan, quick, pfd[1]));
        }
    }
    close(pfd[1]);
    FILE *f = fdopen(pfd[0], "r");
    print_rows(f, p, tname);
    if (f) fclose(f);
    int bad = 0;
    for (int r = 0; r < p; r++) {
        int st;
        waitpid(pids[r], &st, 0);
        bad |= !WIFEXITED(st) || WEXITSTATUS(st);
    }
    if (bad) printf("| %d | %s | (a rank failed) | | | |\n", p, tname);
}

/* P ranks under mpiexec: this program again, in --mpi-rank mode. */
static void run_mpi_config(int p, int quick) {
#ifdef DIST_BENCH_MPIEXEC
    char self[4096], np[16];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    int pfd[2];
    if (len <= 0 || pipe(pfd) < 0) return;
    self[len] = 0;
    snprintf(np, sizeof np, "%d", p);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        dup2(pfd[1], STDOUT_FILENO);
        setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
        setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
        setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
        execl(DIST_BENCH_MPIEXEC, DIST_BENCH_MPIEXEC, "-n", np, self, "--mpi-rank",
              quick ? "--quick" : (char *)NULL, (char *)NULL);
        _exit(127);
    }
    close(pfd[1]);
    FILE *f = fdopen(pfd[0], "r");
    print_rows(f, p, "mpi");
    if (f) fclose(f);
    int st;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) printf("| %d | mpi | (a rank failed) | | | |\n", p);
#else
    printf("| %d | mpi | (built without MPI) | | | |\n", p);
#endif
}

/* --algorithms: every algorithm forced, then auto, over TCP (or TLS), P = 2, 4, 8. */
static int run_algorithms(int only_p, const char *only_t, int small, int quick) {
    int tls = only_t && strcmp(only_t, "tls") == 0;
    if (only_t && !tls && strcmp(only_t, "tcp") != 0) {
        fprintf(stderr, "--algorithms runs over tcp or tls, not %s\n", only_t);
        return 2;
    }
    static const struct {
        dist_net_allreduce_algorithm algo;
        const char *name;
    } algos[] = {{DIST_NET_ALLREDUCE_RING, "ring"},
                 {DIST_NET_ALLREDUCE_DIRECT, "direct"},
                 {DIST_NET_ALLREDUCE_DOUBLING, "doubling"},
                 {DIST_NET_ALLREDUCE_SCATTER, "scatter"},
                 {DIST_NET_ALLREDUCE_AUTO, "auto"}};
    printf("| P | transport/algorithm | size | median latency (us) | algbw (GB/s) | busbw (GB/s) "
           "|\n");
    printf("|---|---|---|---|---|---|\n");
    /* --procs picks any world up to MAX_P here (the crossovers between 4 and 8) */
    int ps[] = {2, 4, 8}, nps = 3;
    if (only_p) {
        if (only_p < 2 || only_p > MAX_P) {
            fprintf(stderr, "--procs %d: 2 to %d\n", only_p, MAX_P);
            return 2;
        }
        ps[0] = only_p;
        nps = 1;
    }
    for (int i = 0; i < nps; i++) {
        for (size_t a = 0; a < sizeof algos / sizeof algos[0]; a++) {
            int nsizes = (int)(sizeof k_algo_sizes / sizeof k_algo_sizes[0]);
            while (small && k_algo_sizes[nsizes - 1] > (64u << 10)) nsizes--;
            bench_plan plan = {k_algo_sizes, nsizes, algos[a].algo};
            char tname[32];
            snprintf(tname, sizeof tname, "%s/%s", tls ? "tls" : "tcp", algos[a].name);
            run_config(ps[i], DIST_NET_TCP, tls, tname, &plan, quick);
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    int quick = 0, only_p = 0, mpi_rank = 0, algorithms = 0, small = 0;
    const char *only_t = NULL;
#ifdef DIST_BENCH_MPI_MODULE
    if (access(DIST_BENCH_MPI_MODULE, F_OK) == 0)
        setenv("DIST_MPI_MODULE", DIST_BENCH_MPI_MODULE, 0);
#endif
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--mpi-rank") == 0) {
            mpi_rank = 1;
        } else if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
        } else if (strcmp(argv[i], "--algorithms") == 0) {
            algorithms = 1;
        } else if (strcmp(argv[i], "--small") == 0) {
            small = 1;
        } else if (strcmp(argv[i], "--procs") == 0 && i + 1 < argc) {
            only_p = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--transport") == 0 && i + 1 < argc) {
            only_t = argv[++i];
        } else {
            fprintf(stderr,
                    "usage: %s [--algorithms [--small]] [--quick] [--procs P] "
                    "[--transport tcp|tls|shm|mpi]\n",
                    argv[0]);
            return 2;
        }
    }
    if (mpi_rank) return run_mpi_rank(quick);
    if (algorithms) return run_algorithms(only_p, only_t, small, quick);
    int reps = quick ? 3 : 7;
    double tcp = tcp_stream_gbs(reps), mem = memcpy_gbs(reps), pair = memcpy_pair_gbs(reps);
    printf("reference: loopback TCP, one stream, 64 MB: %.2f GB/s; memcpy 64 MB: %.2f GB/s; "
           "memcpy 64 MB in 2 processes at once: %.2f GB/s each\n\n",
           tcp, mem, pair);
    printf("| P | transport | size | median latency (us) | algbw (GB/s) | busbw (GB/s) |\n");
    printf("|---|---|---|---|---|---|\n");
    const int ps[] = {2, 4};
    for (int i = 0; i < 2; i++) {
        if (only_p && only_p != ps[i]) continue;
        const bench_plan *d = &k_default_plan;
        if (!only_t || strcmp(only_t, "tcp") == 0)
            run_config(ps[i], DIST_NET_TCP, 0, "tcp", d, quick);
        if (!only_t || strcmp(only_t, "tls") == 0)
            run_config(ps[i], DIST_NET_TCP, 1, "tls", d, quick);
        if (!only_t || strcmp(only_t, "shm") == 0)
            run_config(ps[i], DIST_NET_SHM, 0, "shm", d, quick);
        if (!only_t || strcmp(only_t, "mpi") == 0) run_mpi_config(ps[i], quick);
    }
    printf("\nbusbw = size / time x 2 (P - 1) / P; targets at P = 2: tcp >= 1.2 GB/s at 64 MB "
           "and <= 100 us at 4 KB, shm >= 5 GB/s at 64 MB (TCP reference above: %.2f GB/s)\n",
           tcp);
    return 0;
}
