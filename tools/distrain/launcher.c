/* distrain --strategy multi_worker --workers N: a local cluster. Picks N free loopback ports,
 * starts N copies of this program, each with the TF_CONFIG of its worker and without
 * --workers, forwards their output line by line behind "[worker i] ", and exits with the
 * first failure's code (the others notice the lost peer and stop; the launcher ends any that
 * are still running a grace period later).
 *
 * distrain --strategy parameter_server --workers N --ps M: a chief, N workers and M ps tasks,
 * forwarded behind "[chief 0] ", "[worker i] ", "[ps j] ". The chief's exit code is the job's
 * (a worker may die and come back: the coordinator runs its work elsewhere); when the chief has
 * exited the others get a few seconds to leave, then are stopped.
 *
 * Unless a token is given ($DIST_CLUSTER_TOKEN, $DIST_CLUSTER_TOKEN_FILE, --cluster-token-file),
 * the launcher makes a random cluster token and hands it to its workers in their environment
 * (never on a command line, which every local user can read in /proc): only they can join.
 *
 * Every task dies with the launcher, even a launcher killed by SIGKILL (PR_SET_PDEATHSIG). */
#include "launcher.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_WORKERS 130 /* a chief, 64 workers, 64 ps */
#define LINE_MAX_BYTES 4096

typedef struct stream {
    int fd;     /* -1 once closed */
    FILE *sink; /* stdout or stderr */
    char buf[LINE_MAX_BYTES];
    size_t len;
} stream;

typedef struct worker {
    char label[24]; /* "worker 1", "ps 0" */
    pid_t pid;
    int done, status;
    stream out, err;
} worker;

static volatile sig_atomic_t g_signal;

static void on_signal(int sig) { g_signal = sig; }

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* N distinct free ports, each held by a socket bound to it (SO_REUSEADDR, not listening, closed
 * on exec) until the launcher exits: a task's listener binds beside the holder (the library's
 * listeners set SO_REUSEADDR too), and meanwhile the kernel gives the port to no other bind(0)
 * or outgoing connection. Picking a port and closing it left a window in which another
 * program's socket could take it before the task bound it (a job beside another on a busy
 * machine failed at once). */
static int free_ports(int n, int *ports) {
    static int held[MAX_WORKERS];
    for (int i = 0; i < n; i++) {
        held[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        const int one = 1;
        if (held[i] < 0 || setsockopt(held[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
            bind(held[i], (struct sockaddr *)&a, sizeof a) != 0 ||
            getsockname(held[i], (struct sockaddr *)&a, &len) != 0) {
            fprintf(stderr, "distrain: --workers: cannot find a free loopback port: %s\n",
                    strerror(errno));
            for (int j = 0; j <= i; j++)
                if (held[j] >= 0) close(held[j]);
            return 0;
        }
        ports[i] = ntohs(a.sin_port);
    }
    return 1;
}

static void emit(stream *s, const char *label, const char *line, size_t len) {
    fprintf(s->sink, "[%s] %.*s\n", label, (int)len, line);
    fflush(s->sink);
}

/* Reads what is there; forwards complete lines (a very long line is cut into pieces). */
static void pump(stream *s, const char *id) {
    ssize_t got = read(s->fd, s->buf + s->len, sizeof s->buf - s->len);
    if (got <= 0) {
        if (got < 0 && errno == EINTR) return;
        if (s->len) emit(s, id, s->buf, s->len);
        s->len = 0;
        close(s->fd);
        s->fd = -1;
        return;
    }
    s->len += (size_t)got;
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n' || s->buf[i] == '\r') {
            if (i > start) emit(s, id, s->buf + start, i - start);
            start = i + 1;
        }
    if (start == 0 && s->len == sizeof s->buf) {
        emit(s, id, s->buf, s->len);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

static int exit_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    return 1;
}

static void describe_exit(const char *label, int status) {
    if (WIFSIGNALED(status))
        fprintf(stderr, "distrain: %s was killed by signal %d\n", label, WTERMSIG(status));
    else if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
        fprintf(stderr, "distrain: %s exited with code %d\n", label, WEXITSTATUS(status));
}

/* 32 random bytes in hex into out (65 bytes); 0 when the kernel has none to give. */
static int make_token(char out[65]) {
    unsigned char b[32];
    size_t got = 0;
    while (got < sizeof b) {
        ssize_t n = getrandom(b + got, sizeof b - got, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        got += (size_t)n;
    }
    for (size_t i = 0; i < sizeof b; i++) snprintf(out + 2 * i, 3, "%02x", b[i]);
    return 1;
}

static int has_token(const distrain_options *o) {
    const char *t = getenv("DIST_CLUSTER_TOKEN"), *f = getenv("DIST_CLUSTER_TOKEN_FILE");
    return o->token_file || (t && t[0]) || (f && f[0]);
}

/* argv without --workers N / --workers=N, plus --threads when the user gave none. */
static char **child_argv(int argc, char **argv, int threads, char *threads_buf) {
    char **out = calloc((size_t)argc + 4, sizeof *out);
    if (!out) return NULL;
    int n = 0, has_threads = 0;
    out[n++] = argv[0];
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--workers") == 0 || strcmp(argv[i], "--ps") == 0) {
            i++;
            continue;
        }
        if (strncmp(argv[i], "--workers=", 10) == 0 || strncmp(argv[i], "--ps=", 5) == 0) continue;
        if (strcmp(argv[i], "--threads") == 0 || strncmp(argv[i], "--threads=", 10) == 0)
            has_threads = 1;
        out[n++] = argv[i];
    }
    if (!has_threads) {
        out[n++] = "--threads";
        snprintf(threads_buf, 16, "%d", threads);
        out[n++] = threads_buf;
    }
    out[n] = NULL;
    return out;
}

int distrain_launch(int argc, char **argv, const distrain_options *o) {
    int ps_mode = o->ps > 0;
    /* tasks: multi_worker's workers, or the chief, the workers and the ps tasks */
    int n = ps_mode ? 1 + o->workers + o->ps : o->workers;
    int ports[MAX_WORKERS];
    if (n > MAX_WORKERS) {
        fprintf(stderr, "distrain: --workers: at most %d tasks\n", MAX_WORKERS);
        return 2;
    }
    if (!free_ports(n, ports)) return 1;
    char token[65] = "";
    if (!has_token(o) && !make_token(token)) {
        fprintf(stderr, "distrain: --workers: no random bytes for the cluster token: %s\n",
                strerror(errno));
        return 1;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int threads = cores / o->workers > 0 ? (int)(cores / o->workers) : 1;
    char threads_buf[16];
    char **args = child_argv(argc, argv, threads, threads_buf);
    if (!args) return 1;
    /* every worker's cluster: "127.0.0.1:p0", ... */
    size_t cap = 96 + (size_t)n * 32;
    char *cluster = malloc(cap), *tf_config = malloc(cap + 64);
    if (!cluster || !tf_config) return 1;
    static const char *const jobs[] = {"chief", "worker", "ps"};
    const int counts[] = {ps_mode ? 1 : 0, o->workers, ps_mode ? o->ps : 0};
    const char *task_job[MAX_WORKERS];
    int task_index[MAX_WORKERS];
    size_t len = (size_t)snprintf(cluster, cap, "{");
    for (int j = 0, t = 0; j < 3; j++) {
        if (!counts[j]) continue;
        len += (size_t)snprintf(cluster + len, cap - len, "%s\"%s\":[", t ? "," : "", jobs[j]);
        for (int i = 0; i < counts[j]; i++, t++) {
            task_job[t] = jobs[j];
            task_index[t] = i;
            len += (size_t)snprintf(cluster + len, cap - len, "%s\"127.0.0.1:%d\"", i ? "," : "",
                                    ports[t]);
        }
        len += (size_t)snprintf(cluster + len, cap - len, "]");
    }
    snprintf(cluster + len, cap - len, "}");

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    worker w[MAX_WORKERS];
    memset(w, 0, sizeof w);
    int started = 0, rc = 0;
    pid_t launcher = getpid();
    for (int i = 0; i < n; i++) {
        int po[2], pe[2];
        if (pipe(po) != 0 || pipe(pe) != 0) {
            perror("distrain: pipe");
            rc = 1;
            break;
        }
        snprintf(tf_config, cap + 64, "{\"cluster\":%s,\"task\":{\"type\":\"%s\",\"index\":%d}}",
                 cluster, task_job[i], task_index[i]);
        snprintf(w[i].label, sizeof w[i].label, "%s %d", task_job[i], task_index[i]);
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            perror("distrain: fork");
            rc = 1;
            break;
        }
        if (pid == 0) {
            /* Its own process group: a Ctrl-C in the terminal reaches the launcher only, which
             * passes it on once (a second copy would end a worker without saving). */
            setpgid(0, 0);
            /* A launcher killed outright (SIGKILL, the OOM killer) passes nothing on: its tasks
             * would train on alone, and one that finished would delete the backup a restarted
             * job resumes from. The kernel kills each task when the launcher dies (the flag
             * survives exec); a launcher that died before prctl is seen as a changed parent. */
            if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != launcher) _exit(1);
            dup2(po[1], STDOUT_FILENO);
            dup2(pe[1], STDERR_FILENO);
            close(po[0]);
            close(po[1]);
            close(pe[0]);
            close(pe[1]);
            setenv("TF_CONFIG", tf_config, 1);
            if (token[0]) setenv("DIST_CLUSTER_TOKEN", token, 1);
            execv("/proc/self/exe", args);
            execvp(argv[0], args);
            fprintf(stderr, "distrain: cannot start %s %d: %s\n", task_job[i], task_index[i],
                    strerror(errno));
            _exit(1);
        }
        close(po[1]);
        close(pe[1]);
        w[i].pid = pid;
        w[i].out = (stream){.fd = po[0], .sink = stdout};
        w[i].err = (stream){.fd = pe[0], .sink = stderr};
        started++;
    }
    free(args);
    free(cluster);
    free(tf_config);

    /* forward output until every worker has exited and its pipes are drained */
    int first_failure = -1, running = started;
    double failed_at = 0, grace_s = o->collective_timeout_s > 0 ? o->collective_timeout_s + 30 : 90;
    int killed = 0, interrupted_by = 0;
    if (rc) { /* a worker could not be started: stop the others */
        for (int i = 0; i < started; i++) kill(w[i].pid, SIGTERM);
    }
    for (;;) {
        struct pollfd fds[2 * MAX_WORKERS];
        stream *which[2 * MAX_WORKERS];
        const char *ids[2 * MAX_WORKERS];
        int nf = 0;
        for (int i = 0; i < started; i++) {
            stream *ss[2] = {&w[i].out, &w[i].err};
            for (int k = 0; k < 2; k++)
                if (ss[k]->fd >= 0) {
                    fds[nf] = (struct pollfd){.fd = ss[k]->fd, .events = POLLIN};
                    which[nf] = ss[k];
                    ids[nf++] = w[i].label;
                }
        }
        if (nf == 0 && running == 0) break;
        int ready = poll(fds, (nfds_t)nf, 200);
        for (int k = 0; ready > 0 && k < nf; k++)
            if (fds[k].revents) pump(which[k], ids[k]);
        for (int i = 0; i < started; i++) {
            if (w[i].done) continue;
            int status;
            pid_t p = waitpid(w[i].pid, &status, WNOHANG);
            if (p != w[i].pid) continue;
            w[i].done = 1;
            w[i].status = status;
            running--;
            if (ps_mode && i == 0) { /* the chief is done: the job is */
                if (first_failure < 0) {
                    first_failure = 0;
                    failed_at = now_s();
                    grace_s = 10;
                }
                if (exit_code(status) != 0) describe_exit(w[i].label, status);
            } else if (ps_mode) {
                if (exit_code(status) != 0) describe_exit(w[i].label, status);
            } else if (exit_code(status) != 0 && first_failure < 0) {
                first_failure = i;
                failed_at = now_s();
                describe_exit(w[i].label, status);
            }
        }
        if (g_signal) {
            for (int i = 0; i < started; i++)
                if (!w[i].done) kill(w[i].pid, (int)g_signal);
            interrupted_by = (int)g_signal;
            g_signal = 0;
            if (first_failure < 0) {
                first_failure = n; /* interrupted: no worker to blame */
                failed_at = now_s();
            }
        }
        if (first_failure >= 0 && running > 0 && !killed && now_s() - failed_at > grace_s) {
            fprintf(stderr,
                    ps_mode ? "distrain: stopping the tasks still running %.0f s after the "
                              "chief ended\n"
                            : "distrain: stopping the workers still running %.0f s after the "
                              "first failure\n",
                    grace_s);
            for (int i = 0; i < started; i++)
                if (!w[i].done) kill(w[i].pid, SIGKILL);
            killed = 1;
        }
    }
    if (rc) return rc;
    if (first_failure < 0) return 0;
    if (first_failure == n) return 128 + interrupted_by; /* interrupted: as a shell reports it */
    return exit_code(w[first_failure].status);
}
