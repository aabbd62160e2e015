/* multi_worker (MultiWorkerMirroredStrategy): mirrored across processes. The cluster comes
 * from TF_CONFIG (or Slurm, or options.cluster.spec), or from the MPI world under an MPI
 * launcher without TF_CONFIG; every chief/worker task is one worker, numbered by TF's
 * id_in_cluster, with the same number of local replicas. The replicas meet through one
 * communicator: NCCL over every GPU of every worker, or a hierarchical one (in-process inside
 * a worker, then TCP / shared memory / MPI between workers). Initial variables are broadcast
 * from the chief, so every worker starts from the chief's values. Every other entry is the
 * shared default, over those communicators. */
#include "backend/backend.h"
#include "backend/nccl.h"
#include "collective/hier_comm.h"
#include "collective/local_comm.h"
#include "collective/mpi_comm.h"
#include "collective/net_comm.h"
#include "core/env.h"
#include "core/error.h"
#include "core/sha256.h"
#include "dist/cluster.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The chief's replica 0 values to every replica of every worker (variables at creation). */
static dist_status mw_create_variable(dist_strategy *s, dist_tensor *const *copies,
                                      const dist_variable_desc *vars, int count) {
    (void)vars;
    (void)count;
    if (s->num_workers == 1) return DIST_OK;
    dist_tensor *t0 = copies[0];
    size_t bytes = dist_tensor_bytes(t0);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return dist_error(DIST_OUT_OF_MEMORY, "multi_worker: out of memory");
    dist_status st = dist_backend_to_host(s->replicas.backends[0], t0, h, bytes);
    if (st == DIST_OK) st = dist_comm_broadcast(s->workers_comm, 0, h, bytes, DIST_U8, 0, 0);
    for (int r = 0; r < s->num_replicas && st == DIST_OK; r++) {
        dist_backend *be = s->replicas.backends[r];
        st = dist_backend_from_host(be, h, bytes, copies[r]);
        if (st == DIST_OK) st = dist_backend_synchronize(be);
    }
    free(h);
    if (st != DIST_OK)
        return dist_error_context(st, "broadcasting the initial variables from the chief");
    return DIST_OK;
}

static const struct dist_strategy_i multi_worker_iface = {
    .create_variable = mw_create_variable,
};

/* ---- the cluster ------------------------------------------------------------------------- */

#define MW_MAX_WORKERS (DIST_MAX_REPLICAS * 4)

typedef struct mw_workers {
    int count;
    int rank;
    int is_chief;
    char addresses[MW_MAX_WORKERS][256]; /* copied: the cluster is gone when they are used */
    char names[MW_MAX_WORKERS][32];
    char fingerprint[DIST_SHA256_HEX_CHARS + 1];
} mw_workers;

/* Workers in id_in_cluster order (chief first), and a fingerprint of the whole cluster: a
 * SHA-256 of every job's addresses, so processes of two different clusters never pair up. */
static dist_status list_workers(const dist_cluster *cl, mw_workers *w) {
    static const char *const jobs[] = {"chief", "worker"};
    dist_sha256_ctx h;
    dist_sha256_init(&h);
    dist_sha256_update(&h, "libdist-cluster-v1", 18);
    for (size_t j = 0; j < dist_cluster_num_jobs(cl); j++) {
        const char *job = dist_cluster_job_name(cl, j);
        dist_sha256_update(&h, job, strlen(job) + 1);
        for (size_t i = 0; i < dist_cluster_num_tasks(cl, job); i++) {
            const char *a = dist_cluster_task_address(cl, job, i, NULL);
            dist_sha256_update(&h, a, strlen(a) + 1);
        }
    }
    unsigned char digest[DIST_SHA256_BYTES];
    dist_sha256_final(&h, digest);
    dist_sha256_hex(digest, w->fingerprint);
    w->count = 0;
    for (int j = 0; j < 2; j++) {
        size_t n = dist_cluster_num_tasks(cl, jobs[j]);
        for (size_t i = 0; i < n; i++) {
            if (w->count == MW_MAX_WORKERS)
                return dist_error(DIST_INVALID_ARGUMENT, "multi_worker: more than %d workers",
                                  MW_MAX_WORKERS);
            int index = 0;
            const char *a = dist_cluster_task_address(cl, jobs[j], i, &index);
            if (strlen(a) >= sizeof w->addresses[0])
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "multi_worker: address '%.64s...' of "
                                  "%s/%d is too long",
                                  a, jobs[j], index);
            snprintf(w->addresses[w->count], sizeof w->addresses[0], "%s", a);
            snprintf(w->names[w->count], sizeof w->names[0], "%s/%d", jobs[j], index);
            w->count++;
        }
    }
    return DIST_OK;
}

static dist_status transport_from_env(dist_transport *t) {
    static const struct {
        const char *name;
        dist_transport value;
    } names[] = {{"auto", DIST_TRANSPORT_AUTO},
                 {"tcp", DIST_TRANSPORT_TCP},
                 {"shm", DIST_TRANSPORT_SHM},
                 {"mpi", DIST_TRANSPORT_MPI},
                 {"tls", DIST_TRANSPORT_TLS}};
    const char *e = dist_env_raw(DIST_ENV_COLLECTIVE_TRANSPORT);
    if (!e || !*e) return DIST_OK;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcasecmp(e, names[i].name) == 0) {
            *t = names[i].value;
            return DIST_OK;
        }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "DIST_COLLECTIVE_TRANSPORT='%s': expected auto, tcp, shm, mpi or tls", e);
}

/* The workers of the cluster (TF_CONFIG / Slurm / the spec in the options). `local` is set
 * when there is no cluster (or this task is an evaluator, which TF runs on its own): one
 * worker, this process. */
static dist_status resolve_workers(const dist_cluster_settings *c, mw_workers *w, int *local) {
    dist_cluster_options co = DIST_CLUSTER_OPTIONS_INIT;
    co.tf_config = c->spec;
    dist_cluster *cl = NULL;
    dist_status st = dist_cluster_resolve(&co, &cl);
    if (st != DIST_OK) return dist_error_context(st, "multi_worker: TF_CONFIG");
    const char *type = dist_cluster_task_type(cl);
    if (type && strcmp(type, "ps") == 0) {
        int id = dist_cluster_task_id(cl);
        dist_cluster_destroy(cl);
        return dist_error(DIST_INVALID_ARGUMENT,
                          "multi_worker: this task is ps/%d; ps tasks belong to the "
                          "parameter_server strategy",
                          id);
    }
    *local = dist_cluster_is_empty(cl) || (type && strcmp(type, "evaluator") == 0);
    if (!*local) {
        st = list_workers(cl, w);
        bool has = false;
        w->rank = dist_cluster_id_in_cluster(cl, &has);
        if (st == DIST_OK && (!has || w->rank < 0 || w->rank >= w->count))
            st = dist_error(DIST_INVALID_ARGUMENT, "multi_worker: this task has no worker id");
    }
    /* TF's chief rule: chief/0, else worker/0; an evaluator is its own chief. */
    w->is_chief = dist_cluster_is_chief(cl) ? 1 : 0;
    dist_cluster_destroy(cl);
    return st;
}

/* The MPI world as the cluster: rank r is worker/r, rank 0 the chief. With a TF_CONFIG
 * cluster too, the two must agree. */
static dist_status workers_from_mpi(mw_workers *w, int have_cluster) {
    int rank = 0, size = 0;
    DIST_TRY(dist_mpi_world(&rank, &size));
    if (have_cluster) {
        if (rank != w->rank || size != w->count)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "multi_worker: the MPI world (rank %d of %d) does not match "
                              "TF_CONFIG (%s, %d workers); launch one process per worker in "
                              "id_in_cluster order, or drop TF_CONFIG",
                              rank, size, w->names[w->rank], w->count);
        return DIST_OK;
    }
    if (size > MW_MAX_WORKERS)
        return dist_error(DIST_INVALID_ARGUMENT, "multi_worker: an MPI world of %d (at most %d)",
                          size, MW_MAX_WORKERS);
    w->count = size;
    w->rank = rank;
    w->is_chief = rank == 0;
    for (int i = 0; i < size; i++) snprintf(w->names[i], sizeof w->names[0], "worker/%d", i);
    return DIST_OK;
}

/* The communicator between workers (one rank each, host memory). */
static dist_status join_workers(const dist_cluster_settings *c, double timeout, mw_workers *w,
                                dist_transport transport, dist_comm **out) {
    if (transport == DIST_TRANSPORT_MPI) return dist_comm_create_mpi(timeout, out);
    const char *names[MW_MAX_WORKERS], *addresses[MW_MAX_WORKERS];
    for (int i = 0; i < w->count; i++) {
        names[i] = w->names[i];
        addresses[i] = w->addresses[i];
    }
    dist_net_comm_options no = DIST_NET_COMM_OPTIONS_INIT;
    no.rank = w->rank;
    no.world = w->count;
    no.addresses = addresses;
    no.task_names = names;
    no.fingerprint = w->fingerprint;
    no.allow_insecure = c->allow_insecure; /* the token: $DIST_CLUSTER_TOKEN(_FILE) */
    no.connect_timeout_s = c->connect_timeout_s;
    no.timeout_s = timeout;
    no.transport = transport == DIST_TRANSPORT_TCP || transport == DIST_TRANSPORT_TLS ? DIST_NET_TCP
                   : transport == DIST_TRANSPORT_SHM                                  ? DIST_NET_SHM
                                                     : DIST_NET_AUTO;
    no.tls = transport == DIST_TRANSPORT_TLS;
    no.tls_cert = c->tls_cert;
    no.tls_key = c->tls_key;
    no.tls_ca = c->tls_ca;
    return dist_comm_create_net(&no, out);
}

/* Every worker must have the same number of replicas: the counts meet as int32. */
static dist_status check_replica_counts(dist_strategy *s, const mw_workers *w) {
    int32_t mine = s->num_replicas, all[MW_MAX_WORKERS];
    DIST_TRY(dist_comm_all_gather(s->workers_comm, 0, &mine, all, 1, DIST_I32, 0));
    for (int i = 0; i < w->count; i++)
        if (all[i] != mine)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "multi_worker: %s has %d replica(s), %s has %d; every worker needs "
                              "the same number",
                              w->names[i], (int)all[i], w->names[w->rank], s->num_replicas);
    return DIST_OK;
}

/* One NCCL communicator over every GPU of every worker: the chief makes the unique id and
 * broadcasts it over the workers' communicator. */
static dist_status nccl_over_workers(dist_strategy *s) {
    unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES] = {0};
    if (s->worker_id == 0) DIST_TRY(dist_backend_nccl_unique_id(id));
    DIST_TRY(dist_comm_broadcast(s->workers_comm, 0, id, sizeof id, DIST_U8, 0, 0));
    return dist_backend_nccl_comm_create_ranks(s->num_replicas_in_sync, s->replica_offset,
                                               s->num_replicas, s->replicas.backends, id,
                                               s->collective_timeout_s, &s->replicas_comm);
}

/* The replicas' communicator: NCCL when every replica is on a GPU (unless in-process is
 * forced), else in-process inside the worker composed with the workers' communicator. */
static dist_status replicas_communicator(dist_strategy *s, const dist_strategy_options *o) {
    int nccl = 0;
    DIST_TRY(dist_strategy_cross_device_rule(o, s->replicas.devices, s->num_replicas, &nccl));
    if (nccl && s->num_replicas_in_sync > 1) {
        if (s->workers_comm)
            DIST_TRY(nccl_over_workers(s));
        else
            DIST_TRY(dist_backend_nccl_comm_create(s->num_replicas, s->replicas.backends,
                                                   s->collective_timeout_s, &s->replicas_comm));
        snprintf(s->cross_device, sizeof s->cross_device, "nccl");
        return DIST_OK;
    }
    if (s->workers_comm) {
        dist_comm *inner = NULL;
        DIST_TRY(dist_comm_create_in_process(s->num_replicas, s->replicas.backends,
                                             s->collective_timeout_s, &inner));
        /* the hierarchical communicator owns the workers' one from here on */
        s->owns_workers_comm = 0;
        dist_status st = dist_comm_create_hierarchical(inner, s->workers_comm, s->replicas.backends,
                                                       &s->replicas_comm);
        if (st != DIST_OK) {
            s->workers_comm = NULL; /* freed with the failed hierarchical communicator */
            return st;
        }
        snprintf(s->cross_device, sizeof s->cross_device, "%s", s->replicas_comm->name);
        return DIST_OK;
    }
    snprintf(s->cross_device, sizeof s->cross_device, "in-process");
    if (s->num_replicas == 1) return DIST_OK;
    return dist_comm_create_in_process(s->num_replicas, s->replicas.backends,
                                       s->collective_timeout_s, &s->replicas_comm);
}

static dist_status init_multi_worker(dist_strategy *s, const dist_strategy_options *o) {
    s->iface = &multi_worker_iface;
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    DIST_TRY(dist_strategy_devices(s->desc->devices, o->devices, devs, &n));
    for (int r = 0; r < n; r++)
        if (devs[r].kind != devs[0].kind)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "multi_worker: a worker's replicas must all be CPUs or all GPUs");
    DIST_TRY(dist_local_replicas_init(s, devs, n, o));

    dist_transport transport = o->cluster.transport;
    if (transport == DIST_TRANSPORT_AUTO) DIST_TRY(transport_from_env(&transport));
    mw_workers *w = calloc(1, sizeof *w);
    if (!w) return dist_error(DIST_OUT_OF_MEMORY, "multi_worker: out of memory");
    int local = 0;
    dist_status st = resolve_workers(&o->cluster, w, &local);
    /* Under an MPI launcher without a cluster, the MPI world is the cluster. */
    if (st == DIST_OK && local && transport == DIST_TRANSPORT_AUTO && dist_mpi_launched())
        transport = DIST_TRANSPORT_MPI;
    if (st == DIST_OK && transport == DIST_TRANSPORT_MPI) {
        st = workers_from_mpi(w, !local);
        local = 0;
    }
    if (st == DIST_OK && local) {
        w->count = 1;
        w->rank = 0;
    }
    if (st == DIST_OK && w->count > 1) {
        st = join_workers(&o->cluster, s->collective_timeout_s, w, transport, &s->workers_comm);
        s->owns_workers_comm = s->workers_comm != NULL;
        if (st != DIST_OK)
            st = dist_error_context(st, "multi_worker: joining the cluster as %s",
                                    w->names[w->rank]);
    }
    if (st == DIST_OK && s->workers_comm) st = check_replica_counts(s, w);
    if (st == DIST_OK) {
        s->is_chief = w->is_chief;
        s->num_workers = w->count;
        s->worker_id = w->rank;
        s->num_replicas_in_sync = s->num_replicas * w->count;
        s->replica_offset = s->num_replicas * w->rank;
        for (int r = 0; r < s->num_replicas; r++) {
            s->replicas.rctx[r].replica_id = s->replica_offset + r;
            s->replicas.rctx[r].num_replicas = s->num_replicas_in_sync;
        }
        st = replicas_communicator(s, o);
    }
    free(w);
    return st;
}

const dist_strategy_kind_desc dist_strategy_kind_multi_worker = {
    .kind = DIST_STRATEGY_MULTI_WORKER,
    .name = "multi_worker",
    .init = init_multi_worker,
    .collective_timeout_s = DIST_NET_COLLECTIVE_TIMEOUT_S,
    .devices = DIST_DEFAULT_DEVICES_WORKER,
};
