/* libdist_mpi.so: the MPI communicator (collective/mpi_comm.h says what it does, mpi_module.h
 * how libdist loads it). The only file that includes mpi.h. It does not link libdist: errors,
 * the communicator allocator and the typed arithmetic come through the host table. */
#include "collective/mpi_module.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Polling a request: MPI (Open MPI's libnbc, its TCP and shared-memory transports) moves data
 * only while some thread is inside an MPI call, so a wait yields between tests while a
 * collective is likely to finish soon, then sleeps to leave the core to others. */
#define DIST_MPI_POLL_YIELD_S 0.05
#define DIST_MPI_POLL_SLEEP_NS 100000L

/* MPI is one per process, so its state is too. g_lock serializes every MPI call of the module
 * (MPI_THREAD_SERIALIZED) and guards the counters. */
static const struct dist_mpi_host *g_host;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_owned;     /* this module called MPI_Init_thread and has not finalized yet */
static int g_live;      /* communicators created and not yet destroyed */
static int g_pending;   /* requests of failed calls not known to have completed */
static int g_ops_ready; /* g_user_ops created (they live until MPI_Finalize) */
/* User ops for what MPI's own do not do as libdist does: F16 and BF16 arithmetic, MAX/MIN that
 * propagate NaN, and a U8 SUM that wraps modulo 256 (Open MPI 4.1's AVX op component saturates
 * 8-bit sums of 32 elements or more, open-mpi/ompi#8045, "wontfix"). [dtype][op]; MPI_OP_NULL
 * where MPI's own op is used. */
static MPI_Op g_user_ops[DIST_DTYPE_COUNT][DIST_REDUCE_MIN + 1];

struct mpi_ctx {
    MPI_Comm comm;
    MPI_Request pending; /* the request a failed call left behind, or MPI_REQUEST_NULL */
    atomic_int cancelled;
    dist_status failed; /* DIST_OK, or the error every later call repeats */
    char why[512];
};

/* ---- user reduction ops ------------------------------------------------------------------- */

/* MPI's contract: inout[i] = in[i] (op) inout[i]. Every op here is commutative. */
#define DIST_MPI_USER_OP(name, dtype, op)                                                          \
    static void name(void *in, void *inout, int *len, MPI_Datatype *type) {                        \
        (void)type;                                                                                \
        g_host->comm_accumulate(dtype, op, inout, in, (size_t)*len);                               \
    }
DIST_MPI_USER_OP(mpi_op_f32_max, DIST_F32, DIST_REDUCE_MAX)
DIST_MPI_USER_OP(mpi_op_f32_min, DIST_F32, DIST_REDUCE_MIN)
DIST_MPI_USER_OP(mpi_op_u8_sum, DIST_U8, DIST_REDUCE_SUM)
DIST_MPI_USER_OP(mpi_op_f16_sum, DIST_F16, DIST_REDUCE_SUM)
DIST_MPI_USER_OP(mpi_op_f16_max, DIST_F16, DIST_REDUCE_MAX)
DIST_MPI_USER_OP(mpi_op_f16_min, DIST_F16, DIST_REDUCE_MIN)
DIST_MPI_USER_OP(mpi_op_bf16_sum, DIST_BF16, DIST_REDUCE_SUM)
DIST_MPI_USER_OP(mpi_op_bf16_max, DIST_BF16, DIST_REDUCE_MAX)
DIST_MPI_USER_OP(mpi_op_bf16_min, DIST_BF16, DIST_REDUCE_MIN)

static int mpi_create_user_ops(void) {
    static const struct {
        dist_dtype dtype;
        dist_reduce_op op;
        MPI_User_function *fn;
    } k_ops[] = {
        {DIST_F32, DIST_REDUCE_MAX, mpi_op_f32_max},
        {DIST_F32, DIST_REDUCE_MIN, mpi_op_f32_min},
        {DIST_F16, DIST_REDUCE_SUM, mpi_op_f16_sum},
        {DIST_F16, DIST_REDUCE_MAX, mpi_op_f16_max},
        {DIST_F16, DIST_REDUCE_MIN, mpi_op_f16_min},
        {DIST_BF16, DIST_REDUCE_SUM, mpi_op_bf16_sum},
        {DIST_BF16, DIST_REDUCE_MAX, mpi_op_bf16_max},
        {DIST_BF16, DIST_REDUCE_MIN, mpi_op_bf16_min},
        {DIST_U8, DIST_REDUCE_SUM, mpi_op_u8_sum},
    };
    for (int t = 0; t < DIST_DTYPE_COUNT; t++)
        for (int o = 0; o <= DIST_REDUCE_MIN; o++) g_user_ops[t][o] = MPI_OP_NULL;
    for (size_t i = 0; i < sizeof k_ops / sizeof k_ops[0]; i++) {
        int rc = MPI_Op_create(k_ops[i].fn, 1, &g_user_ops[k_ops[i].dtype][k_ops[i].op]);
        if (rc != MPI_SUCCESS) return rc;
    }
    return MPI_SUCCESS;
}

static MPI_Datatype mpi_type(dist_dtype dtype, size_t *elem_size) {
    switch (dtype) {
    case DIST_F16:
    case DIST_BF16: *elem_size = 2; return MPI_UINT16_T;
    case DIST_I32: *elem_size = 4; return MPI_INT32_T;
    case DIST_U8: *elem_size = 1; return MPI_UINT8_T;
    case DIST_I64: *elem_size = 8; return MPI_INT64_T;
    default: *elem_size = 4; return MPI_FLOAT;
    }
}

/* MEAN reduces as SUM; the division follows. */
static MPI_Op mpi_op(dist_dtype dtype, dist_reduce_op op) {
    if (op == DIST_REDUCE_MEAN) op = DIST_REDUCE_SUM;
    if (g_user_ops[dtype][op] != MPI_OP_NULL) return g_user_ops[dtype][op];
    return op == DIST_REDUCE_MAX ? MPI_MAX : op == DIST_REDUCE_MIN ? MPI_MIN : MPI_SUM;
}

/* ---- process state: init and finalize ----------------------------------------------------- */

static const char *mpi_error_string(int rc, char buf[MPI_MAX_ERROR_STRING]) {
    int len = 0;
    if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) snprintf(buf, 32, "MPI error %d", rc);
    return buf;
}

/* With g_lock held, when libdist owns MPI and no communicator is left. */
static void mpi_finalize_locked(void) {
    if (g_pending > 0) {
        g_host->log(DIST_LOG_WARN,
                    "mpi: MPI_Finalize skipped: %d collective(s) that failed are still pending, "
                    "and finalizing could wait for them forever",
                    g_pending);
    } else {
        MPI_Finalize();
    }
    g_owned = 0;
}

/* A program that asked for its rank (dist_mpi_world) but never made a communicator, or did
 * not destroy one, still finalizes: launchers report processes that exit without it. */
static void mpi_finalize_at_exit(void) {
    pthread_mutex_lock(&g_lock);
    if (g_owned) mpi_finalize_locked();
    pthread_mutex_unlock(&g_lock);
}

/* With g_lock held: MPI initialized (by the application, or now by libdist) and the user ops
 * made. */
static dist_status mpi_init_locked(void) {
    int finalized = 0, initialized = 0;
    MPI_Finalized(&finalized);
    if (finalized)
        return g_host->error(DIST_UNSUPPORTED, "mpi: MPI was finalized; one MPI job per process");
    MPI_Initialized(&initialized);
    if (!initialized) {
        /* Open MPI's non-blocking all-reduce (libnbc) uses a binomial tree (reduce to one rank,
         * then broadcast) for fewer than 4 ranks at every size: on 2 ranks its ring is 2-4x
         * faster from 1 MB up (1.2 vs 0.3 GB/s at 64 MB, here over shared memory), and as fast
         * at 4 KB; a ring also gives every rank the same bits. A default only: a value in the
         * environment wins, and an application that initializes MPI itself chooses its own. */
        setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
        int provided = 0;
        int rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
        if (rc != MPI_SUCCESS) {
            char buf[MPI_MAX_ERROR_STRING];
            return g_host->error(DIST_UNAVAILABLE, "mpi: MPI_Init_thread failed: %s",
                                 mpi_error_string(rc, buf));
        }
        g_owned = 1;
        atexit(mpi_finalize_at_exit);
        if (provided < MPI_THREAD_SERIALIZED)
            g_host->log(DIST_LOG_WARN,
                        "mpi: MPI provides thread level %d only (MPI_THREAD_SERIALIZED wanted); "
                        "make every MPI call from the thread that made the first",
                        provided);
    }
    if (!g_ops_ready) {
        int rc = mpi_create_user_ops();
        if (rc != MPI_SUCCESS) {
            char buf[MPI_MAX_ERROR_STRING];
            return g_host->error(DIST_INTERNAL, "mpi: MPI_Op_create failed: %s",
                                 mpi_error_string(rc, buf));
        }
        g_ops_ready = 1;
    }
    return DIST_OK;
}

static dist_status mpi_world(int *rank, int *size) {
    pthread_mutex_lock(&g_lock);
    dist_status st = mpi_init_locked();
    if (st == DIST_OK) {
        MPI_Comm_rank(MPI_COMM_WORLD, rank);
        MPI_Comm_size(MPI_COMM_WORLD, size);
    }
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* ---- waiting with a deadline ---------------------------------------------------------------- */

static double mpi_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Records the communicator's failure (every later call repeats it) and reports it. */
static dist_status mpi_fail(struct mpi_ctx *x, dist_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static dist_status mpi_fail(struct mpi_ctx *x, dist_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->why, sizeof x->why, fmt, ap);
    va_end(ap);
    x->failed = st;
    return g_host->error(st, "%s", x->why);
}

static dist_status mpi_check_usable(const dist_comm *c, const char *what) {
    struct mpi_ctx *x = c->ctx;
    if (x->failed != DIST_OK)
        return g_host->error(
            x->failed, "communicator 'mpi' %s: the communicator failed earlier: %s", what, x->why);
    if (atomic_load(&x->cancelled))
        return mpi_fail(x, DIST_PEER_LOST, "communicator 'mpi' %s: rank %d was cancelled", what,
                        c->first_rank);
    return DIST_OK;
}

static dist_status mpi_started(dist_comm *c, int rc, const char *what) {
    if (rc == MPI_SUCCESS) return DIST_OK;
    char buf[MPI_MAX_ERROR_STRING];
    return mpi_fail(c->ctx, DIST_PEER_LOST, "communicator 'mpi' %s: %s", what,
                    mpi_error_string(rc, buf));
}

/* Tests *req until it completes, the deadline passes or the communicator is cancelled. A
 * request that does not complete cannot be cancelled (MPI_Cancel does not apply to
 * collectives): it is kept, and the communicator fails. */
static dist_status mpi_wait(dist_comm *c, MPI_Request *req, double deadline, double timeout_s,
                            const char *what) {
    struct mpi_ctx *x = c->ctx;
    double start = mpi_now();
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&g_lock);
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        pthread_mutex_unlock(&g_lock);
        if (rc != MPI_SUCCESS) return mpi_started(c, rc, what);
        if (done) return DIST_OK;
        int cancelled = atomic_load(&x->cancelled);
        double now = mpi_now();
        if (cancelled || now >= deadline) {
            pthread_mutex_lock(&g_lock);
            x->pending = *req;
            g_pending++;
            pthread_mutex_unlock(&g_lock);
            if (cancelled)
                return mpi_fail(x, DIST_PEER_LOST, "communicator 'mpi' %s: rank %d was cancelled",
                                what, c->first_rank);
            return mpi_fail(x, DIST_TIMEOUT,
                            "communicator 'mpi' %s: not complete after %.3g s (the timeout) on "
                            "rank %d of %d: some other rank has not made the same call",
                            what, timeout_s, c->first_rank, c->size);
        }
        if (now - start < DIST_MPI_POLL_YIELD_S) {
            sched_yield();
        } else {
            struct timespec ts = {0, DIST_MPI_POLL_SLEEP_NS};
            nanosleep(&ts, NULL);
        }
    }
}

/* ---- the collectives ------------------------------------------------------------------------ */

/* One non-blocking collective: what mpi_start passes to MPI. */
struct mpi_call {
    enum {
        DIST_MPI_CALL_ALL_REDUCE,
        DIST_MPI_CALL_ALL_GATHER,
        DIST_MPI_CALL_BROADCAST,
        DIST_MPI_CALL_BARRIER
    } kind;
    const char *what; /* for messages: "all_reduce", ... */
    const void *send; /* all_gather's input, or MPI_IN_PLACE */
    void *buf;        /* all_reduce's and broadcast's data, all_gather's output */
    int count;
    MPI_Datatype type;
    MPI_Op op;
    int root;
};

static int mpi_start(const struct mpi_call *k, MPI_Comm comm, MPI_Request *req) {
    switch (k->kind) {
    case DIST_MPI_CALL_ALL_REDUCE:
        return MPI_Iallreduce(MPI_IN_PLACE, k->buf, k->count, k->type, k->op, comm, req);
    case DIST_MPI_CALL_ALL_GATHER:
        return MPI_Iallgather(k->send, k->count, k->type, k->buf, k->count, k->type, comm, req);
    case DIST_MPI_CALL_BROADCAST: return MPI_Ibcast(k->buf, k->count, k->type, k->root, comm, req);
    default: return MPI_Ibarrier(comm, req);
    }
}

/* Starts the collective and waits for it until the deadline. */
static dist_status mpi_call(dist_comm *c, const struct mpi_call *k, double deadline,
                            double timeout_s) {
    struct mpi_ctx *x = c->ctx;
    MPI_Request req;
    pthread_mutex_lock(&g_lock);
    int rc = mpi_start(k, x->comm, &req);
    pthread_mutex_unlock(&g_lock);
    dist_status st = mpi_started(c, rc, k->what);
    if (st != DIST_OK) return st;
    return mpi_wait(c, &req, deadline, timeout_s > 0 ? timeout_s : c->timeout_s, k->what);
}

/* An in-place collective over `count` elements of `data`: MPI counts are int, so larger
 * buffers go in INT_MAX-element pieces, one collective each, all within the one deadline. */
static dist_status mpi_call_pieces(dist_comm *c, struct mpi_call *k, void *data, size_t count,
                                   dist_dtype dtype, double timeout_s) {
    dist_status st = mpi_check_usable(c, k->what);
    if (st != DIST_OK) return st;
    double deadline = g_host->comm_deadline(c, timeout_s);
    size_t esize;
    k->type = mpi_type(dtype, &esize);
    char *p = data;
    for (size_t left = count; left > 0; left -= (size_t)k->count) {
        k->buf = p;
        k->count = left > (size_t)INT_MAX ? INT_MAX : (int)left;
        if ((st = mpi_call(c, k, deadline, timeout_s)) != DIST_OK) return st;
        p += (size_t)k->count * esize;
    }
    return DIST_OK;
}

static dist_status mpi_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                  dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    struct mpi_call k = {.kind = DIST_MPI_CALL_ALL_REDUCE, .what = "all_reduce"};
    k.op = mpi_op(dtype, op);
    dist_status st = mpi_call_pieces(c, &k, data, count, dtype, timeout_s);
    if (st == DIST_OK && op == DIST_REDUCE_MEAN) g_host->comm_divide(dtype, data, count, c->size);
    return st;
}

static dist_status mpi_broadcast(dist_comm *c, int local, void *data, size_t count,
                                 dist_dtype dtype, int root, double timeout_s) {
    struct mpi_call k = {.kind = DIST_MPI_CALL_BROADCAST, .what = "broadcast", .root = root};
    return mpi_call_pieces(c, &k, data, count, dtype, timeout_s);
}

static dist_status mpi_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                  dist_dtype dtype, double timeout_s) {
    struct mpi_call k = {.kind = DIST_MPI_CALL_ALL_GATHER, .what = "all_gather", .buf = out};
    dist_status st = mpi_check_usable(c, k.what);
    if (st != DIST_OK) return st;
    if (count > (size_t)INT_MAX / (size_t)c->size)
        return g_host->error(DIST_INVALID_ARGUMENT,
                             "communicator 'mpi' all_gather: %zu elements per rank (at most %d "
                             "with %d ranks: MPI counts are int)",
                             count, INT_MAX / c->size, c->size);
    if (count == 0) return DIST_OK;
    size_t esize;
    k.type = mpi_type(dtype, &esize);
    k.count = (int)count;
    /* MPI forbids `in` overlapping `out` except as MPI_IN_PLACE at this rank's own slot. */
    k.send = (const char *)out + (size_t)c->first_rank * count * esize == in ? MPI_IN_PLACE : in;
    return mpi_call(c, &k, g_host->comm_deadline(c, timeout_s), timeout_s);
}

static dist_status mpi_barrier(dist_comm *c, int local, double timeout_s) {
    struct mpi_call k = {.kind = DIST_MPI_CALL_BARRIER, .what = "barrier"};
    dist_status st = mpi_check_usable(c, k.what);
    if (st != DIST_OK) return st;
    return mpi_call(c, &k, g_host->comm_deadline(c, timeout_s), timeout_s);
}

static void mpi_cancel(dist_comm *c, int local) {
    struct mpi_ctx *x = c->ctx;
    atomic_store(&x->cancelled, 1);
}

/* A communicator whose failed call is still pending is left to MPI (freeing it could wait);
 * the last destroy finalizes MPI when libdist initialized it. */
static void mpi_destroy(dist_comm *c) {
    struct mpi_ctx *x = c->ctx;
    if (!x) return;
    pthread_mutex_lock(&g_lock);
    int done = 1;
    if (x->pending != MPI_REQUEST_NULL) {
        MPI_Test(&x->pending, &done, MPI_STATUS_IGNORE);
        if (done) g_pending--;
    }
    if (done && x->comm != MPI_COMM_NULL) MPI_Comm_free(&x->comm);
    if (--g_live == 0 && g_owned) mpi_finalize_locked();
    pthread_mutex_unlock(&g_lock);
    free(x);
}

static const struct dist_comm_i k_mpi_iface = {
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .broadcast = mpi_broadcast,
    .barrier = mpi_barrier,
    .cancel = mpi_cancel,
    .reset = NULL,
    .destroy = mpi_destroy,
};

static dist_status mpi_comm_create(double timeout_s, dist_comm **out) {
    *out = NULL;
    struct mpi_ctx *x = calloc(1, sizeof *x);
    dist_comm *c = x ? g_host->comm_alloc(&k_mpi_iface, x, "mpi") : NULL;
    if (!c) {
        free(x);
        return g_host->error(DIST_OUT_OF_MEMORY, "creating the MPI communicator");
    }
    x->comm = MPI_COMM_NULL;
    x->pending = MPI_REQUEST_NULL;
    if (timeout_s > 0) c->timeout_s = timeout_s;
    double deadline = g_host->comm_deadline(c, 0);

    pthread_mutex_lock(&g_lock);
    dist_status st = mpi_init_locked();
    MPI_Request req = MPI_REQUEST_NULL;
    int rc = MPI_SUCCESS;
    if (st == DIST_OK) {
        g_live++; /* from here on, the destroy below balances it */
        MPI_Comm_rank(MPI_COMM_WORLD, &c->first_rank);
        MPI_Comm_size(MPI_COMM_WORLD, &c->size);
        rc = MPI_Comm_idup(MPI_COMM_WORLD, &x->comm, &req);
    }
    pthread_mutex_unlock(&g_lock);
    if (st != DIST_OK) {
        free(x);
        c->ctx = NULL;
        free(c);
        return g_host->error_context(st, "creating the MPI communicator");
    }
    if (rc != MPI_SUCCESS) x->comm = MPI_COMM_NULL;
    st = mpi_started(c, rc, "create (MPI_Comm_idup)");
    if (st == DIST_OK) st = mpi_wait(c, &req, deadline, c->timeout_s, "create (MPI_Comm_idup)");
    if (st == DIST_OK) {
        pthread_mutex_lock(&g_lock);
        /* Report errors instead of MPI's default of aborting the job. */
        MPI_Comm_set_errhandler(x->comm, MPI_ERRORS_RETURN);
        pthread_mutex_unlock(&g_lock);
        *out = c;
        return DIST_OK;
    }
    mpi_destroy(c);
    free(c);
    return st;
}

/* Exported by name (mpi_module.map lists it); the loader finds it with dlsym(). A mismatch
 * returns NULL before anything else runs: the module then never touches libdist's structs. */
__attribute__((visibility("default"))) const struct dist_mpi_module *
dist_mpi_module_get(int abi_version, const struct dist_mpi_host *host) {
    static const struct dist_mpi_module k_module = {
        .abi_version = DIST_MPI_MODULE_ABI,
        .world = mpi_world,
        .comm_create = mpi_comm_create,
    };
    if (abi_version != DIST_MPI_MODULE_ABI || !host || host->abi_version != DIST_MPI_MODULE_ABI ||
        host->comm_size != sizeof(struct dist_comm) ||
        host->comm_iface_size != sizeof(struct dist_comm_i))
        return NULL;
    g_host = host;
    return &k_module;
}
