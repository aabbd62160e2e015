/* multi_worker (MultiWorkerMirroredStrategy): mirrored across processes. The cluster comes
 * from TF_CONFIG (or Slurm, or options.cluster_spec); every chief/worker task is one worker,
 * numbered by TF's id_in_cluster, with the same number of local replicas. Collectives are
 * hierarchical: the replicas of a process meet in-process first, then replica 0 of every
 * worker meets the others through the cross-process communicator (TCP ring or shared
 * memory), then the result goes back to the local replicas. Initial variables are broadcast
 * from the chief, so every worker starts from the chief's values. */
#include "backend/backend.h"
#include "backend/nccl.h"
#include "collective/net_comm.h"
#include "core/error.h"
#include "core/sha256.h"
#include "dist/cluster.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define MW_DEFAULT_COLLECTIVE_TIMEOUT_S 60.0

typedef struct mw_ctx {
    dist_local_comm *local;
    dist_net_comm *net;
    dist_comm *nccl;   /* every replica of every worker on a GPU: NCCL does it all */
    int nccl_comms;    /* communicators made so far (each gets a fresh unique id) */
    size_t pack_elems; /* 0: one call for the whole tensor */
    float *stage;      /* host staging of device tensors (GPU replicas) */
    size_t stage_cap;
    char cross_name[48];
} mw_ctx;

/* Host memory holding t's data: t itself on the CPU, else a staging copy. */
static dist_status host_view(mw_ctx *c, dist_backend *be, dist_tensor *t, float **out) {
    size_t bytes = dist_tensor_bytes(t);
    if (be->device.kind == DIST_DEVICE_CPU) {
        *out = t->data;
        return DIST_OK;
    }
    if (c->stage_cap < bytes) {
        float *p = realloc(c->stage, bytes);
        if (!p)
            return dist_error(DIST_OUT_OF_MEMORY, "multi_worker: cannot stage %zu bytes", bytes);
        c->stage = p;
        c->stage_cap = bytes;
    }
    DIST_TRY(dist_backend_to_host(be, t, c->stage, bytes));
    *out = c->stage;
    return DIST_OK;
}

static dist_status host_writeback(mw_ctx *c, dist_backend *be, dist_tensor *t, const float *h) {
    if (be->device.kind == DIST_DEVICE_CPU) return DIST_OK;
    (void)c;
    DIST_TRY(be->iface->copy(be->ctx, t->data, h, dist_tensor_bytes(t), DIST_COPY_H2D));
    return be->iface->synchronize(be->ctx);
}

/* Replica 0 failed between the workers: the other local replicas wait for it in the local
 * broadcast that follows, so release them, keeping replica 0's message. */
static dist_status release_local_replicas(mw_ctx *c, int L, dist_status st) {
    if (L <= 1) return st;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", dist_last_error());
    dist_local_comm_cancel(c->local, 0);
    return dist_error(st, "%s", msg);
}

/* Local sum (in-process), then the workers' sum by replica 0, then back to every replica. */
static dist_status reduce_one(dist_strategy *s, int r, dist_reduce_op op, dist_tensor *t) {
    mw_ctx *c = s->ctx;
    int L = s->num_replicas;
    if (L > 1) DIST_TRY(dist_local_comm_all_reduce(c->local, r, DIST_REDUCE_SUM, t));
    dist_status st = DIST_OK;
    if (r == 0) {
        float *h = NULL;
        st = host_view(c, s->backends[0], t, &h);
        size_t n = (size_t)dist_tensor_numel(t);
        if (st == DIST_OK) st = dist_net_comm_all_reduce(c->net, h, n, DIST_REDUCE_SUM);
        if (st == DIST_OK && op == DIST_REDUCE_MEAN) {
            float inv = 1.0f / (float)s->num_replicas_in_sync;
            for (size_t i = 0; i < n; i++) h[i] *= inv;
        }
        if (st == DIST_OK) st = host_writeback(c, s->backends[0], t, h);
        if (st != DIST_OK) return release_local_replicas(c, L, st);
    }
    if (L > 1) DIST_TRY(dist_local_comm_broadcast(c->local, r, 0, t));
    return st;
}

static dist_status mw_all_reduce(dist_strategy *s, int r, dist_reduce_op op, dist_tensor *t) {
    mw_ctx *c = s->ctx;
    if (c->nccl)
        return dist_comm_all_reduce(c->nccl, r, t->data, (size_t)dist_tensor_numel(t), t->dtype, op,
                                    0);
    size_t n = (size_t)dist_tensor_numel(t);
    if (c->pack_elems == 0 || n <= c->pack_elems) return reduce_one(s, r, op, t);
    for (size_t lo = 0; lo < n; lo += c->pack_elems) {
        int64_t len = (int64_t)(n - lo < c->pack_elems ? n - lo : c->pack_elems);
        dist_tensor pack = dist_tensor_view((float *)t->data + lo, DIST_F32, 1, &len);
        pack.device = t->device;
        DIST_TRY(reduce_one(s, r, op, &pack));
    }
    return DIST_OK;
}

/* out = every global replica's `in` in replica order: the local gather goes into this
 * worker's segment of out, replica 0 gathers the segments of every worker, and broadcasts. */
static dist_status mw_all_gather(dist_strategy *s, int r, const dist_tensor *in, dist_tensor *out) {
    mw_ctx *c = s->ctx;
    if (c->nccl)
        return dist_comm_all_gather(c->nccl, r, in->data, out->data, (size_t)dist_tensor_numel(in),
                                    in->dtype, 0);
    int L = s->num_replicas;
    size_t seg = dist_tensor_bytes(in) * (size_t)L;
    dist_backend *be = s->backends[r];
    /* the local gather, into a host buffer of L pieces (replica 0 owns it) */
    void *local = NULL;
    dist_status st = DIST_OK;
    if (r == 0) {
        local = malloc(seg ? seg : 1);
        void *all = malloc(seg * (size_t)s->num_workers + 1);
        if (!local || !all) {
            free(local);
            free(all);
            return dist_error(DIST_OUT_OF_MEMORY, "all_gather: out of memory");
        }
        int64_t rows = in->shape[0] * L;
        if (L > 1) {
            /* gather on the device into out's first rows, then download */
            dist_tensor dv = *out;
            dv.shape[0] = rows;
            st = dist_local_comm_all_gather(c->local, r, in, &dv);
            if (st == DIST_OK) st = dist_backend_to_host(be, &dv, local, seg);
        } else {
            st = dist_backend_to_host(be, in, local, seg);
        }
        if (st == DIST_OK) st = dist_net_comm_all_gather(c->net, local, seg, all);
        if (st == DIST_OK)
            st = be->iface->copy(be->ctx, out->data, all, seg * (size_t)s->num_workers,
                                 DIST_COPY_H2D);
        if (st == DIST_OK) st = be->iface->synchronize(be->ctx);
        free(local);
        free(all);
        if (st != DIST_OK) return release_local_replicas(c, L, st);
    } else {
        dist_tensor dv = *out;
        dv.shape[0] = in->shape[0] * L;
        DIST_TRY(dist_local_comm_all_gather(c->local, r, in, &dv));
    }
    if (L > 1) DIST_TRY(dist_local_comm_broadcast(c->local, r, 0, out));
    return st;
}

/* Global replica `root`'s t to every replica of every worker. */
static dist_status mw_broadcast(dist_strategy *s, int r, int root, dist_tensor *t) {
    mw_ctx *c = s->ctx;
    if (c->nccl)
        return dist_comm_broadcast(c->nccl, r, t->data, (size_t)dist_tensor_numel(t), t->dtype,
                                   root, 0);
    int L = s->num_replicas;
    int root_worker = root / L, root_local = root % L;
    if (L > 1) DIST_TRY(dist_local_comm_broadcast(c->local, r, root_local, t));
    dist_status st = DIST_OK;
    if (r == 0) {
        float *h = NULL;
        st = host_view(c, s->backends[0], t, &h);
        if (st == DIST_OK)
            st = dist_net_comm_broadcast(c->net, h, dist_tensor_bytes(t), root_worker);
        if (st == DIST_OK) st = host_writeback(c, s->backends[0], t, h);
        if (st != DIST_OK) return release_local_replicas(c, L, st);
    }
    if (L > 1) DIST_TRY(dist_local_comm_broadcast(c->local, r, 0, t));
    return st;
}

static dist_status mw_cross_sum(dist_strategy *s, float *data, size_t count) {
    mw_ctx *c = s->ctx;
    return dist_net_comm_all_reduce(c->net, data, count, DIST_REDUCE_SUM);
}

static dist_status mw_cross_gather(dist_strategy *s, const void *in, size_t bytes, void *out) {
    mw_ctx *c = s->ctx;
    return dist_net_comm_all_gather(c->net, in, bytes, out);
}

static dist_status mw_cross_broadcast(dist_strategy *s, void *data, size_t bytes) {
    mw_ctx *c = s->ctx;
    return dist_net_comm_broadcast(c->net, data, bytes, 0);
}

/* The chief's replica 0 values to every replica of every worker (variables at creation). */
static dist_status mw_sync_initial(void *owner, dist_tensor *const *copies) {
    dist_strategy *s = owner;
    mw_ctx *c = s->ctx;
    dist_tensor *t0 = copies[0];
    size_t bytes = dist_tensor_bytes(t0);
    void *h = malloc(bytes ? bytes : 1);
    if (!h) return dist_error(DIST_OUT_OF_MEMORY, "multi_worker: out of memory");
    dist_status st = dist_backend_to_host(s->backends[0], t0, h, bytes);
    if (st == DIST_OK) st = dist_net_comm_broadcast(c->net, h, bytes, 0);
    for (int r = 0; r < s->num_replicas && st == DIST_OK; r++) {
        dist_backend *be = s->backends[r];
        st = be->iface->copy(be->ctx, copies[r]->data, h, bytes, DIST_COPY_H2D);
        if (st == DIST_OK) st = be->iface->synchronize(be->ctx);
    }
    free(h);
    if (st != DIST_OK)
        return dist_error_context(st, "broadcasting the initial variables from the chief");
    return DIST_OK;
}

static void mw_cancel(dist_strategy *s, int r) {
    mw_ctx *c = s->ctx;
    dist_local_comm_cancel(c->local, r);
}

static void mw_reset(dist_strategy *s) {
    mw_ctx *c = s->ctx;
    dist_local_comm_reset(c->local);
}

static void mw_destroy(dist_strategy *s) {
    mw_ctx *c = s->ctx;
    if (!c) return;
    dist_comm_destroy(c->nccl);
    dist_net_comm_destroy(c->net);
    dist_local_comm_destroy(c->local);
    free(c->stage);
    free(c);
    s->ctx = NULL;
}

static const struct dist_strategy_i multi_worker_iface = {
    .name = "multi_worker",
    .all_reduce = mw_all_reduce,
    .all_gather = mw_all_gather,
    .broadcast = mw_broadcast,
    .cancel = mw_cancel,
    .reset = mw_reset,
    .cross_worker_sum = mw_cross_sum,
    .cross_worker_gather = mw_cross_gather,
    .cross_worker_broadcast = mw_cross_broadcast,
    .destroy = mw_destroy,
};

/* ---- the cluster ------------------------------------------------------------------------- */

typedef struct mw_workers {
    int count;
    int rank;
    char *addresses[DIST_MAX_REPLICAS * 4];
    char names[DIST_MAX_REPLICAS * 4][32];
    char fingerprint[DIST_SHA256_HEX_CHARS + 1];
} mw_workers;

#define MW_MAX_WORKERS (DIST_MAX_REPLICAS * 4)

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
            w->addresses[w->count] = (char *)dist_cluster_task_address(cl, jobs[j], i, &index);
            snprintf(w->names[w->count], sizeof w->names[0], "%s/%d", jobs[j], index);
            w->count++;
        }
    }
    return DIST_OK;
}

static dist_status transport_from_env(dist_transport *t) {
    const char *e = getenv("DIST_COLLECTIVE_TRANSPORT");
    if (!e || !*e || strcasecmp(e, "auto") == 0) return DIST_OK;
    if (strcasecmp(e, "tcp") == 0) {
        *t = DIST_TRANSPORT_TCP;
        return DIST_OK;
    }
    if (strcasecmp(e, "shm") == 0) {
        *t = DIST_TRANSPORT_SHM;
        return DIST_OK;
    }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "DIST_COLLECTIVE_TRANSPORT='%s': expected auto, tcp or shm", e);
}

/* One NCCL communicator over every GPU of every worker: the leader makes the unique id and
 * puts it in the rendezvous store under a key of its own; the others wait for it there. */
static dist_status nccl_over_workers(dist_strategy *s, mw_ctx *c) {
    unsigned char id[DIST_NCCL_UNIQUE_ID_BYTES];
    char key[32];
    snprintf(key, sizeof key, "nccl/unique_id/%d", c->nccl_comms++);
    if (s->worker_id == 0) {
        DIST_TRY(dist_backend_nccl_unique_id(id));
        DIST_TRY(dist_net_comm_store_set(c->net, key, id, sizeof id));
    }
    size_t len = 0;
    DIST_TRY(dist_net_comm_store_get(c->net, key, id, sizeof id, &len));
    if (len != sizeof id)
        return dist_error(DIST_INTERNAL, "NCCL: the unique id in the store has %zu bytes", len);
    return dist_backend_nccl_comm_create_ranks(s->num_replicas_in_sync, s->replica_offset,
                                               s->num_replicas, s->backends, id, 0, &c->nccl);
}

dist_status dist_strategy_init_multi_worker(dist_strategy *s, const dist_strategy_options *o) {
    mw_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "strategy: out of memory");
    s->ctx = c;
    s->iface = &multi_worker_iface;
    c->pack_elems = o->bytes_per_pack / sizeof(float);
    if (o->bytes_per_pack > 0 && c->pack_elems == 0) c->pack_elems = 1;
    for (int r = 0; r < s->num_replicas; r++)
        if (s->devices[r].kind != s->devices[0].kind)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "multi_worker: a worker's replicas must all be CPUs or all GPUs");
    double timeout =
        o->collective_timeout_s > 0 ? o->collective_timeout_s : MW_DEFAULT_COLLECTIVE_TIMEOUT_S;
    DIST_TRY(dist_local_comm_create(s->num_replicas, s->backends, timeout, &c->local));

    dist_cluster_options co = DIST_CLUSTER_OPTIONS_INIT;
    co.tf_config = o->cluster_spec;
    dist_cluster *cl = NULL;
    dist_status st = dist_cluster_resolve(&co, &cl);
    if (st != DIST_OK) return dist_error_context(st, "multi_worker: TF_CONFIG");
    mw_workers w;
    memset(&w, 0, sizeof w);
    const char *type = dist_cluster_task_type(cl);
    if (type && (strcmp(type, "ps") == 0)) {
        int id = dist_cluster_task_id(cl);
        dist_cluster_destroy(cl);
        return dist_error(DIST_INVALID_ARGUMENT,
                          "multi_worker: this task is ps/%d; ps tasks belong to the "
                          "parameter_server strategy",
                          id);
    }
    int local_mode = dist_cluster_is_empty(cl) || (type && strcmp(type, "evaluator") == 0);
    if (!local_mode) {
        st = list_workers(cl, &w);
        bool has = false;
        w.rank = dist_cluster_id_in_cluster(cl, &has);
        if (st == DIST_OK && (!has || w.rank < 0 || w.rank >= w.count))
            st = dist_error(DIST_INVALID_ARGUMENT, "multi_worker: this task has no worker id");
    } else {
        /* No cluster (or an evaluator, which TF runs on its own): one worker, this process. */
        w.count = 1;
        w.rank = 0;
        static char local_addr[] = "localhost:0";
        w.addresses[0] = local_addr;
        snprintf(w.names[0], sizeof w.names[0], "worker/0");
        snprintf(w.fingerprint, sizeof w.fingerprint, "local");
    }
    dist_transport transport = o->transport;
    if (st == DIST_OK && transport == DIST_TRANSPORT_AUTO) st = transport_from_env(&transport);
    if (st == DIST_OK) {
        const char *names[MW_MAX_WORKERS];
        for (int i = 0; i < w.count; i++) names[i] = w.names[i];
        dist_net_comm_options no = DIST_NET_COMM_OPTIONS_INIT;
        no.rank = w.rank;
        no.world = w.count;
        no.addresses = (const char *const *)w.addresses;
        no.task_names = names;
        no.fingerprint = w.fingerprint;
        no.connect_timeout_s = o->connect_timeout_s;
        no.timeout_s = timeout;
        no.transport = transport == DIST_TRANSPORT_TCP   ? DIST_NET_TCP
                       : transport == DIST_TRANSPORT_SHM ? DIST_NET_SHM
                                                         : DIST_NET_AUTO;
        st = dist_net_comm_create(&no, &c->net);
        if (st != DIST_OK)
            st = dist_error_context(st, "multi_worker: joining the cluster as %s", w.names[w.rank]);
    }
    /* TF's chief rule: chief/0, else worker/0; an evaluator is its own chief. */
    s->is_chief = dist_cluster_is_chief(cl) ? 1 : 0;
    dist_cluster_destroy(cl);
    if (st != DIST_OK) return st;

    /* Every worker must have the same number of replicas. */
    float mine = (float)s->num_replicas, all[MW_MAX_WORKERS];
    DIST_TRY(dist_net_comm_all_gather(c->net, &mine, sizeof mine, all));
    for (int i = 0; i < w.count; i++)
        if (all[i] != mine)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "multi_worker: %s has %d replica(s), %s has %d; every worker needs "
                              "the same number",
                              w.names[i], (int)all[i], w.names[w.rank], s->num_replicas);
    s->num_workers = w.count;
    s->worker_id = w.rank;
    s->num_replicas_in_sync = s->num_replicas * w.count;
    s->replica_offset = s->num_replicas * w.rank;
    for (int r = 0; r < s->num_replicas; r++) {
        s->rctx[r].replica_id = s->replica_offset + r;
        s->rctx[r].num_replicas = s->num_replicas_in_sync;
    }
    if (w.count > 1) s->placement.sync_initial = mw_sync_initial;
    int all_gpu = s->devices[0].kind == DIST_DEVICE_CUDA;
    if (o->cross_device_ops == DIST_CROSS_DEVICE_NCCL && !all_gpu)
        return dist_error(DIST_UNSUPPORTED, "cross-device ops: NCCL needs every replica on a GPU");
    if (all_gpu && o->cross_device_ops != DIST_CROSS_DEVICE_IN_PROCESS) {
        DIST_TRY(nccl_over_workers(s, c));
        snprintf(c->cross_name, sizeof c->cross_name, "nccl");
        s->cross_device = c->cross_name;
        return DIST_OK;
    }
    snprintf(c->cross_name, sizeof c->cross_name, "in-process+%s",
             dist_net_comm_transport_name(c->net));
    s->cross_device = c->cross_name;
    return DIST_OK;
}
