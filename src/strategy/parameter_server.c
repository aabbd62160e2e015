/* parameter_server (ParameterServerStrategy, TF 2's form): variables live on ps tasks, placed
 * round-robin in creation order (each shard of a partitioned variable counts, as in TF), and
 * workers compute. Every task runs this kind; its role comes from TF_CONFIG:
 *   - ps: dist_strategy_serve runs the parameter service (src/ps/ps_server.c);
 *   - worker: dist_strategy_serve runs the closures the chief schedules; before each run the
 *     worker pulls every variable from the ps tasks into its local replicas' copies, and an
 *     optimizer's apply_gradients sums the gradients over the local replicas and pushes them
 *     with the optimizer's rule to the ps tasks, which apply it (asynchronously across workers);
 *   - chief: creates the variables on the ps tasks (their initial values are the chief's),
 *     runs the coordinator (dist/ps.h), evaluates with pulled values, and reads and writes the
 *     variables for checkpoints.
 * A lost ps is DIST_UNAVAILABLE naming the ps and its address. */
#include "backend/backend.h"
#include "collective/local_comm.h"
#include "core/error.h"
#include "core/update_rule.h"
#include "dist/nn.h"
#include "dist/partitioner.h"
#include "dist/ps.h"
#include "ps/ps_server.h"
#include "ps/ps_service.h"
#include "ps/ps_wire.h"
#include "strategy/strategy_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ps_shard {
    uint32_t id; /* creation order over every variable and shard: the round-robin counter */
    int ps;
    int64_t offset, numel; /* elements into the group's block */
    char name[128];
    int shard, num_shards;
    int64_t first_row, rows;
    bool assign; /* non-trainable: the worker assigns its value instead of pushing gradients */
} ps_shard;

/* The variables made by one create_variable call (a model's parameters): one block per
 * replica, and the shards that make it up. */
typedef struct ps_group {
    dist_tensor *copies[DIST_MAX_REPLICAS];
    int64_t numel;
    int num_shards;
    ps_shard *shards;
} ps_group;

typedef struct ps_link {
    int fd;
    int rank;
    int pending_acks; /* pushes whose replies have not been read */
    uint64_t next_id;
    /* A pull sent right after a push (its reply follows the push's), read by the next run while
     * it is fresh: the transfer and the ps's work overlap the worker's return to the coordinator
     * and the next closure's arrival. 0: none. */
    uint64_t prefetch_id;
    uint32_t prefetch_count;
    double prefetch_at;
    char lost[1024]; /* why the link broke; "" while it is healthy */
    char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
} ps_link;

#define PS_MAX_SERVED 64

typedef struct ps_ctx {
    ps_cluster *cl;
    ps_registry reg;
    dist_partitioner partitioner;
    pthread_mutex_t mu; /* the links and groups */
    ps_link *links;
    ps_group *groups;
    int num_groups;
    uint32_t next_id;
    double timeout_s; /* each request's deadline */
    struct {
        dist_distributed_iterator *it;
        dist_distributed_dataset *dds;
    } served[PS_MAX_SERVED]; /* a worker's per-worker datasets */
    void *staging;           /* host copies of device blocks */
    size_t staging_cap;
    ps_buf req;
} ps_ctx;

static ps_ctx *ctx_of(const dist_strategy *s) { return s->ctx; }

/* ---- the links to the ps tasks ---- */

/* A ps whose connection broke has lost its variables (or is gone): every later request on
 * the link fails at once with the same error rather than waiting to reconnect (TF's
 * semantics: a lost ps fails the job). */
static dist_status link_lost(ps_link *l, dist_status st) {
    char why[512];
    snprintf(why, sizeof why, "%s", dist_last_error());
    net_close(&l->fd);
    l->pending_acks = 0;
    l->prefetch_id = 0;
    if (st == DIST_UNAVAILABLE && strstr(why, "lost ")) {
        snprintf(l->lost, sizeof l->lost, "%s", why);
        return st;
    }
    snprintf(l->lost, sizeof l->lost, "parameter_server: lost %s: %s", l->who, why);
    return dist_error(DIST_UNAVAILABLE, "%s", l->lost);
}

/* The replies of earlier pushes, which come first on the link. */
static dist_status link_drain_acks(ps_ctx *c, ps_link *l) {
    while (l->pending_acks > 0) {
        ps_header h;
        uint64_t id = l->next_id - (uint64_t)l->pending_acks - (l->prefetch_id ? 1u : 0u);
        dist_status st =
            ps_recv_reply(l->fd, PS_MSG_PUSH, id, &h, 4096, net_now() + c->timeout_s, l->who);
        if (st == DIST_OK && h.length)
            st = dist_error(DIST_FORMAT, "%s: a push reply with data", l->who);
        if (st == DIST_PEER_LOST || st == DIST_TIMEOUT || st == DIST_FORMAT)
            return link_lost(l, st);
        l->pending_acks--;
        DIST_TRY(st);
    }
    return DIST_OK;
}

static dist_status link_reply(ps_ctx *c, ps_link *l, uint32_t type, uint64_t id, ps_header *h,
                              uint64_t cap);

/* Connected, with every earlier reply read (a prefetched pull nobody uses is dropped). */
static dist_status link_ready(ps_ctx *c, ps_link *l) {
    if (l->lost[0]) return dist_error(DIST_UNAVAILABLE, "%s", l->lost);
    if (l->fd < 0) {
        dist_status st = ps_connect(c->cl, l->rank, net_now() + c->cl->connect_timeout_s, &l->fd);
        if (st != DIST_OK)
            return dist_error(DIST_UNAVAILABLE, "parameter_server: cannot reach %s: %s", l->who,
                              dist_last_error());
        l->pending_acks = 0;
        l->prefetch_id = 0;
    }
    DIST_TRY(link_drain_acks(c, l));
    if (l->prefetch_id) {
        uint64_t id = l->prefetch_id;
        l->prefetch_id = 0;
        ps_header h;
        DIST_TRY(link_reply(c, l, PS_MSG_PULL, id, &h, PS_DEFAULT_FRAME_CAP));
        ps_rx rx;
        ps_rx_begin(&rx, l->fd, &h, l->who);
        dist_status st = ps_rx_skip(&rx, (size_t)h.length);
        if (st == DIST_OK) st = ps_rx_end(&rx);
        if (st != DIST_OK) return link_lost(l, st);
    }
    return DIST_OK;
}

/* Sends without reading earlier replies first (a prefetch behind a push). */
static dist_status link_send_now(ps_ctx *c, ps_link *l, uint32_t type, const ps_piece *pieces,
                                 int n, uint64_t *id) {
    *id = l->next_id++;
    dist_status st =
        ps_send_frame(l->fd, type, *id, 0, pieces, n, net_now() + c->timeout_s, l->who);
    if (st != DIST_OK) return link_lost(l, st);
    return DIST_OK;
}

static dist_status link_send(ps_ctx *c, ps_link *l, uint32_t type, const ps_piece *pieces, int n,
                             uint64_t *id) {
    DIST_TRY(link_ready(c, l));
    *id = l->next_id++;
    dist_status st =
        ps_send_frame(l->fd, type, *id, 0, pieces, n, net_now() + c->timeout_s, l->who);
    if (st != DIST_OK) return link_lost(l, st);
    return DIST_OK;
}

static dist_status link_reply(ps_ctx *c, ps_link *l, uint32_t type, uint64_t id, ps_header *h,
                              uint64_t cap) {
    dist_status st = ps_recv_reply(l->fd, type, id, h, cap, net_now() + c->timeout_s, l->who);
    if (st == DIST_PEER_LOST || st == DIST_TIMEOUT || st == DIST_FORMAT) return link_lost(l, st);
    return st;
}

/* ---- placement ---- */

static dist_status staging(ps_ctx *c, size_t bytes, void **out) {
    if (bytes > c->staging_cap) {
        void *p = realloc(c->staging, bytes);
        if (!p) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        c->staging = p;
        c->staging_cap = bytes;
    }
    *out = c->staging;
    return DIST_OK;
}

/* Shards of one variable: TF's partitioner decides how many, rows split with the earlier
 * shards one row larger, each shard takes the next id and ps in round-robin order. */
static dist_status place(ps_ctx *c, const dist_variable_desc *v, ps_shard *out, int cap, int *n) {
    int shards = 1;
    if (c->partitioner.kind != DIST_PARTITIONER_NONE && v->ndim >= 1)
        DIST_TRY(
            dist_partitioner_num_shards(&c->partitioner, v->ndim, v->shape, DIST_F32, &shards));
    if (shards > cap)
        return dist_error(DIST_INVALID_ARGUMENT, "parameter_server: '%s' in %d shards (at most %d)",
                          v->name, shards, cap);
    int64_t rows = v->ndim >= 1 ? v->shape[0] : 1;
    int64_t row = rows > 0 ? v->numel / rows : 0;
    for (int i = 0; i < shards; i++) {
        int64_t first = 0, count = rows;
        if (shards > 1) DIST_TRY(dist_partitioner_shard_rows(rows, shards, i, &first, &count));
        ps_shard *sh = &out[i];
        sh->id = c->next_id++;
        sh->ps = (int)(sh->id % (uint32_t)c->cl->num_ps);
        sh->offset = v->offset + first * row;
        sh->numel = count * row;
        sh->shard = i;
        sh->num_shards = shards;
        sh->first_row = first;
        sh->rows = count;
        sh->assign = v->non_trainable != 0;
        if (shards > 1)
            snprintf(sh->name, sizeof sh->name, "%s/part_%d", v->name, i);
        else
            snprintf(sh->name, sizeof sh->name, "%s", v->name);
    }
    *n = shards;
    return DIST_OK;
}

#define PS_MAX_SHARDS_PER_VARIABLE 4096

/* The chief sends each ps its shards with their initial values. */
static dist_status create_on_ps(ps_ctx *c, const ps_group *g, const float *values) {
    for (int j = 0; j < c->cl->num_ps; j++) {
        ps_buf b = {0};
        uint32_t count = 0;
        for (int i = 0; i < g->num_shards; i++) count += g->shards[i].ps == j;
        if (!count) continue;
        ps_put_u32(&b, count);
        for (int i = 0; i < g->num_shards; i++) {
            const ps_shard *sh = &g->shards[i];
            if (sh->ps != j) continue;
            ps_put_u32(&b, sh->id);
            ps_put_str(&b, sh->name);
            ps_put_u64(&b, (uint64_t)sh->numel);
            ps_put_bytes(&b, values + sh->offset, (size_t)sh->numel * 4);
        }
        dist_status st = b.failed ? dist_error(DIST_OUT_OF_MEMORY, "out of memory") : DIST_OK;
        ps_piece piece = {b.p, b.len};
        uint64_t id = 0;
        ps_header h;
        if (st == DIST_OK) st = link_send(c, &c->links[j], PS_MSG_CREATE, &piece, 1, &id);
        if (st == DIST_OK) st = link_reply(c, &c->links[j], PS_MSG_CREATE, id, &h, 4096);
        ps_buf_free(&b);
        DIST_TRY(st);
    }
    return DIST_OK;
}

static dist_status ps_create_variable(dist_strategy *s, dist_tensor *const *copies,
                                      const dist_variable_desc *vars, int count) {
    ps_ctx *c = ctx_of(s);
    if (c->cl->role == PS_ROLE_PS)
        return dist_error(DIST_INVALID_USAGE,
                          "parameter_server: %s holds variables for the others; it builds no "
                          "model (call dist_strategy_serve)",
                          ps_task_name(c->cl, c->cl->rank));
    pthread_mutex_lock(&c->mu);
    ps_group g = {0};
    for (int r = 0; r < s->num_replicas; r++) g.copies[r] = copies[r];
    g.numel = dist_tensor_numel(copies[0]);
    dist_status st = DIST_OK;
    ps_shard tmp[64];
    for (int v = 0; v < count && st == DIST_OK; v++) {
        int n = 0;
        ps_shard *many = malloc(PS_MAX_SHARDS_PER_VARIABLE * sizeof *many);
        if (!many) {
            st = dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
            break;
        }
        st = place(c, &vars[v], many, PS_MAX_SHARDS_PER_VARIABLE, &n);
        ps_shard *grown =
            st == DIST_OK ? realloc(g.shards, (size_t)(g.num_shards + n) * sizeof *grown) : NULL;
        if (st == DIST_OK && !grown) st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
        if (st == DIST_OK) {
            g.shards = grown;
            memcpy(g.shards + g.num_shards, many, (size_t)n * sizeof *many);
            g.num_shards += n;
        }
        free(many);
    }
    (void)tmp;
    if (st == DIST_OK && c->cl->role == PS_ROLE_CHIEF) {
        size_t bytes = (size_t)g.numel * sizeof(float);
        float *host = malloc(bytes ? bytes : 4);
        st = host ? dist_backend_to_host(s->replicas.backends[0], copies[0], host, bytes)
                  : dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        if (st == DIST_OK) st = create_on_ps(c, &g, host);
        free(host);
    }
    ps_group *grown =
        st == DIST_OK ? realloc(c->groups, (size_t)(c->num_groups + 1) * sizeof *grown) : NULL;
    if (st == DIST_OK && !grown) st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    if (st == DIST_OK) {
        c->groups = grown;
        c->groups[c->num_groups++] = g;
    } else {
        free(g.shards);
    }
    pthread_mutex_unlock(&c->mu);
    if (st != DIST_OK)
        return dist_error_context(st, "parameter_server: placing variables on the ps tasks");
    return DIST_OK;
}

/* ---- pull: every shard of `groups` (all when g < 0) into dst blocks ---- */

/* dst[k]: where group k's values go (host), or NULL to skip the group. */
/* A pull request for ps j's shards of the groups with want[k] into c->req; *count shards. */
static dist_status pull_request(ps_ctx *c, int j, const void *const *want, uint32_t *count) {
    *count = 0;
    ps_buf_reset(&c->req);
    ps_put_u32(&c->req, 0);
    for (int k = 0; k < c->num_groups; k++)
        for (int i = 0; want[k] && i < c->groups[k].num_shards; i++)
            if (c->groups[k].shards[i].ps == j) {
                ps_put_u32(&c->req, c->groups[k].shards[i].id);
                (*count)++;
            }
    if (c->req.failed) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    put32(c->req.p, *count);
    return DIST_OK;
}

/* How old a prefetched pull may be when a run uses it. */
#define PS_PREFETCH_MAX_AGE_S 0.05

static dist_status pull(ps_ctx *c, float *const *dst, bool use_prefetch) {
    int nps = c->cl->num_ps;
    uint64_t ids[PS_MAX_PS];
    uint32_t counts[PS_MAX_PS] = {0};
    for (int j = 0; j < nps; j++) {
        ps_link *l = &c->links[j];
        DIST_TRY(pull_request(c, j, (const void *const *)dst, &counts[j]));
        if (!counts[j]) continue;
        if (use_prefetch && l->fd >= 0 && l->prefetch_id && l->prefetch_count == counts[j] &&
            net_now() - l->prefetch_at < PS_PREFETCH_MAX_AGE_S) {
            DIST_TRY(link_drain_acks(c, l));
            ids[j] = l->prefetch_id;
            l->prefetch_id = 0;
            continue;
        }
        ps_piece piece = {c->req.p, c->req.len};
        DIST_TRY(link_send(c, l, PS_MSG_PULL, &piece, 1, &ids[j]));
    }
    /* every ps is working on its reply by now; read them in turn, straight into place */
    for (int j = 0; j < nps; j++) {
        if (!counts[j]) continue;
        ps_link *l = &c->links[j];
        ps_header h;
        DIST_TRY(link_reply(c, l, PS_MSG_PULL, ids[j], &h, PS_DEFAULT_FRAME_CAP));
        ps_rx rx;
        ps_rx_begin(&rx, l->fd, &h, l->who);
        unsigned char n4[4];
        dist_status st = ps_rx_part(&rx, n4, 4);
        if (st == DIST_OK && get32(n4) != counts[j])
            st = dist_error(DIST_FORMAT, "%s sent %u variables, %u asked", l->who, get32(n4),
                            counts[j]);
        for (int k = 0; k < c->num_groups && st == DIST_OK; k++)
            for (int i = 0; dst[k] && i < c->groups[k].num_shards && st == DIST_OK; i++) {
                const ps_shard *sh = &c->groups[k].shards[i];
                if (sh->ps != j) continue;
                unsigned char n8[8];
                st = ps_rx_part(&rx, n8, 8);
                if (st == DIST_OK && get64(n8) != (uint64_t)sh->numel)
                    st = dist_error(DIST_FORMAT,
                                    "%s holds %llu elements of '%s', this task expects %lld "
                                    "(every task must build the same model)",
                                    l->who, (unsigned long long)get64(n8), sh->name,
                                    (long long)sh->numel);
            }
        for (int k = 0; k < c->num_groups && st == DIST_OK; k++)
            for (int i = 0; dst[k] && i < c->groups[k].num_shards && st == DIST_OK; i++) {
                const ps_shard *sh = &c->groups[k].shards[i];
                if (sh->ps == j) st = ps_rx_part(&rx, dst[k] + sh->offset, (size_t)sh->numel * 4);
            }
        if (st == DIST_OK) st = ps_rx_end(&rx);
        if (st != DIST_OK) return link_lost(l, st);
    }
    return DIST_OK;
}

/* Every group's values from the ps tasks into every local replica's copy. */
static dist_status pull_all(dist_strategy *s, ps_ctx *c) {
    if (!c->num_groups) return DIST_OK;
    float **dst = calloc((size_t)c->num_groups, sizeof *dst);
    if (!dst) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    bool host = s->replicas.devices[0].kind == DIST_DEVICE_CPU;
    size_t total = 0;
    for (int k = 0; k < c->num_groups; k++) total += (size_t)c->groups[k].numel;
    dist_status st = DIST_OK;
    if (!host) {
        void *buf = NULL;
        st = staging(c, total * sizeof(float), &buf);
        for (int k = 0, off = 0; st == DIST_OK && k < c->num_groups;
             off += (int)c->groups[k].numel, k++)
            dst[k] = (float *)buf + off;
    } else {
        for (int k = 0; k < c->num_groups; k++) dst[k] = c->groups[k].copies[0]->data;
    }
    if (st == DIST_OK) st = pull(c, dst, true);
    for (int k = 0; k < c->num_groups && st == DIST_OK; k++) {
        size_t bytes = (size_t)c->groups[k].numel * sizeof(float);
        for (int r = host ? 1 : 0; r < s->num_replicas && st == DIST_OK; r++) {
            dist_backend *be = s->replicas.backends[r];
            st = dist_backend_from_host(be, dst[k], bytes, c->groups[k].copies[r]);
            if (st == DIST_OK) st = dist_backend_synchronize(be);
        }
    }
    free(dst);
    return st;
}

static ps_group *group_of(ps_ctx *c, dist_tensor *const *copies) {
    for (int k = 0; k < c->num_groups; k++)
        if (c->groups[k].copies[0] == copies[0]) return &c->groups[k];
    return NULL;
}

static dist_status ps_save_state(dist_strategy *s, dist_tensor *const *copies, void *dst,
                                 size_t bytes) {
    (void)s;
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    ps_group *g = group_of(c, copies);
    dist_status st = DIST_OK;
    size_t ngroups = c->num_groups > 0 ? (size_t)c->num_groups : 1;
    float **d = calloc(ngroups, sizeof *d);
    if (!g || bytes != (size_t)g->numel * sizeof(float))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks (made outside this strategy's scope?)");
    else if (!d)
        st = dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    else {
        d[g - c->groups] = dst;
        st = pull(c, d, false);
    }
    free(d);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* A RESTORE to every ps holding shards of the group: `values` (the group's layout) as `mode`
 * says (values only, or one optimizer slot with the update count `steps`). */
static dist_status restore_on_ps(ps_ctx *c, const ps_group *g, const float *values, uint64_t steps,
                                 uint32_t mode) {
    dist_status st = DIST_OK;
    for (int j = 0; j < c->cl->num_ps && st == DIST_OK; j++) {
        ps_buf b = {0};
        uint32_t count = 0;
        for (int i = 0; i < g->num_shards; i++) count += g->shards[i].ps == j;
        if (!count) continue;
        ps_put_u32(&b, count);
        for (int i = 0; i < g->num_shards; i++) {
            const ps_shard *sh = &g->shards[i];
            if (sh->ps != j) continue;
            ps_put_u32(&b, sh->id);
            ps_put_u64(&b, (uint64_t)sh->numel);
            ps_put_u64(&b, steps);
            ps_put_u32(&b, mode);
            ps_put_bytes(&b, values + sh->offset, (size_t)sh->numel * 4);
        }
        ps_piece piece = {b.p, b.len};
        uint64_t id = 0;
        ps_header h;
        st = b.failed ? dist_error(DIST_OUT_OF_MEMORY, "out of memory") : DIST_OK;
        if (st == DIST_OK) st = link_send(c, &c->links[j], PS_MSG_RESTORE, &piece, 1, &id);
        if (st == DIST_OK) st = link_reply(c, &c->links[j], PS_MSG_RESTORE, id, &h, 4096);
        ps_buf_free(&b);
    }
    return st;
}

/* set_weights / a restored checkpoint: the values go to the ps tasks (the optimizer's slots
 * there stay), and to the local copies. */
static dist_status ps_restore_state(dist_strategy *s, dist_tensor *const *copies, const void *src,
                                    size_t bytes) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    ps_group *g = group_of(c, copies);
    dist_status st = DIST_OK;
    if (!g || bytes != (size_t)g->numel * sizeof(float))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks (made outside this strategy's scope?)");
    if (st == DIST_OK) st = restore_on_ps(c, g, src, 0, PS_RESTORE_VALUES_ONLY);
    for (int r = 0; r < s->num_replicas && st == DIST_OK; r++) {
        dist_backend *be = s->replicas.backends[r];
        st = dist_backend_from_host(be, src, bytes, copies[r]);
        if (st == DIST_OK) st = dist_backend_synchronize(be);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- the optimizer's slots, for checkpoints ---- */

/* Slot `slot` (0: m or momentum, 1: v) of every shard of the group, read with SAVE from each
 * ps; a slot that a ps has not made yet (no update so far) reads as zeros, as Keras's. */
static dist_status ps_save_slot(dist_strategy *s, dist_tensor *const *copies, int slot, void *dst,
                                size_t bytes, int64_t *iterations) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    ps_group *g = group_of(c, copies);
    dist_status st = DIST_OK;
    if (!g || bytes != (size_t)g->numel * sizeof(float))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks");
    else
        memset(dst, 0, bytes);
    *iterations = 0;
    for (int j = 0; j < c->cl->num_ps && st == DIST_OK; j++) {
        ps_buf b = {0};
        uint32_t count = 0;
        for (int i = 0; i < g->num_shards; i++) count += g->shards[i].ps == j;
        if (!count) continue;
        ps_put_u32(&b, count);
        for (int i = 0; i < g->num_shards; i++)
            if (g->shards[i].ps == j) ps_put_u32(&b, g->shards[i].id);
        ps_piece piece = {b.p, b.len};
        uint64_t id = 0;
        ps_header h;
        unsigned char *p = NULL;
        ps_link *l = &c->links[j];
        st = b.failed ? dist_error(DIST_OUT_OF_MEMORY, "out of memory") : DIST_OK;
        if (st == DIST_OK) st = link_send(c, l, PS_MSG_SAVE, &piece, 1, &id);
        if (st == DIST_OK) st = link_reply(c, l, PS_MSG_SAVE, id, &h, PS_DEFAULT_FRAME_CAP);
        if (st == DIST_OK) {
            st = ps_recv_payload(l->fd, &h, &p, l->who);
            if (st != DIST_OK) st = link_lost(l, st);
        }
        ps_reader r = {p, p ? (size_t)h.length : 0, 0, false};
        if (st == DIST_OK && ps_get_u32(&r) != count)
            st = dist_error(DIST_FORMAT, "%s: a save reply of another size", l->who);
        for (int i = 0; i < g->num_shards && st == DIST_OK; i++) {
            const ps_shard *sh = &g->shards[i];
            if (sh->ps != j) continue;
            uint32_t vid = ps_get_u32(&r);
            uint64_t numel = ps_get_u64(&r), steps = ps_get_u64(&r);
            uint32_t has = ps_get_u32(&r);
            size_t n = (size_t)sh->numel * 4;
            const unsigned char *vals = numel == (uint64_t)sh->numel ? ps_get_bytes(&r, n) : NULL;
            const unsigned char *m = vals && (has & 1) ? ps_get_bytes(&r, n) : NULL;
            const unsigned char *v = vals && (has & 2) ? ps_get_bytes(&r, n) : NULL;
            if (r.failed || !vals || vid != sh->id) {
                st = dist_error(DIST_FORMAT, "%s: a malformed save reply for '%s'", l->who,
                                sh->name);
                break;
            }
            const unsigned char *want = slot == 0 ? m : v;
            if (want) memcpy((float *)dst + sh->offset, want, n);
            if ((int64_t)steps > *iterations) *iterations = (int64_t)steps;
        }
        free(p);
        ps_buf_free(&b);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

static dist_status ps_restore_slot(dist_strategy *s, dist_tensor *const *copies, int slot,
                                   const void *src, size_t bytes, int64_t iterations) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    ps_group *g = group_of(c, copies);
    dist_status st = DIST_OK;
    if (!g || bytes != (size_t)g->numel * sizeof(float) || slot < 0 || slot > 1)
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks");
    if (st == DIST_OK)
        st = restore_on_ps(c, g, src, (uint64_t)iterations, PS_RESTORE_SLOT + (uint32_t)slot);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- run and apply_gradients ---- */

static dist_status ps_run(dist_strategy *s, dist_step_fn step, void *user,
                          const dist_per_replica_element *inputs, dist_per_replica *results) {
    ps_ctx *c = ctx_of(s);
    if (c->cl->role == PS_ROLE_PS)
        return dist_error(DIST_INVALID_USAGE, "parameter_server: a ps task runs no steps");
    pthread_mutex_lock(&c->mu);
    dist_status st = pull_all(s, c);
    pthread_mutex_unlock(&c->mu);
    if (st != DIST_OK) return dist_error_context(st, "parameter_server: reading the variables");
    return dist_local_replicas_run(s, step, user, inputs, results);
}

static dist_status push_shards(ps_ctx *c, ps_group *g, const ps_rule *rule, const float *data,
                               bool assigned);

static dist_status push(dist_strategy *s, ps_ctx *c, ps_group *g, const dist_update_rule *rule,
                        dist_tensor *grads) {
    const float *gd = grads->data;
    if (grads->device.kind != DIST_DEVICE_CPU) {
        void *buf = NULL;
        size_t bytes = (size_t)g->numel * sizeof(float);
        DIST_TRY(staging(c, bytes, &buf));
        DIST_TRY(dist_backend_to_host(s->replicas.backends[0], grads, buf, bytes));
        gd = buf;
    }
    ps_rule r = {.kind = rule->kind == DIST_UPDATE_ADAM ? PS_RULE_ADAM : PS_RULE_SGD,
                 .lr = rule->lr,
                 .beta1 = rule->beta1,
                 .beta2 = rule->beta2,
                 .epsilon = rule->epsilon,
                 .momentum = rule->momentum,
                 .nesterov = (uint32_t)rule->nesterov,
                 .grad_scale = rule->grad_scale};
    DIST_TRY(push_shards(c, g, &r, gd, false));
    bool any_assign = false;
    for (int i = 0; i < g->num_shards; i++) any_assign |= g->shards[i].assign;
    if (!any_assign) return DIST_OK;
    /* the non-trainable variables (moving statistics) as replica 0 left them in this step */
    const float *vals = g->copies[0]->data;
    float *host = NULL;
    if (g->copies[0]->device.kind != DIST_DEVICE_CPU) {
        host = malloc((size_t)g->numel * sizeof *host);
        if (!host) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        dist_status st = dist_backend_to_host(s->replicas.backends[0], g->copies[0], host,
                                              (size_t)g->numel * sizeof *host);
        if (st != DIST_OK) {
            free(host);
            return st;
        }
        vals = host;
    }
    ps_rule assign = {.kind = PS_RULE_ASSIGN};
    dist_status st = push_shards(c, g, &assign, vals, true);
    free(host);
    return st;
}

/* One PUSH per ps of the group's shards whose `assign` flag is `assigned`, with `rule` and
 * their data at the shards' offsets into `data`. */
static dist_status push_shards(ps_ctx *c, ps_group *g, const ps_rule *rule, const float *data,
                               bool assigned) {
    const float *gd = data;
    for (int j = 0; j < c->cl->num_ps; j++) {
        ps_buf_reset(&c->req);
        unsigned char rb[PS_RULE_BYTES];
        ps_rule_encode(rule, rb);
        ps_put_bytes(&c->req, rb, sizeof rb);
        ps_put_u32(&c->req, 0);
        uint32_t count = 0;
        int npieces = 1;
        for (int i = 0; i < g->num_shards; i++)
            if (g->shards[i].ps == j && g->shards[i].assign == assigned) {
                ps_put_u32(&c->req, g->shards[i].id);
                ps_put_u64(&c->req, (uint64_t)g->shards[i].numel);
                count++;
            }
        if (!count) continue;
        if (c->req.failed) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        put32(c->req.p + PS_RULE_BYTES, count);
        /* the gradients go from their buffer to the socket; adjacent shards as one piece */
        ps_piece *pieces = malloc((size_t)(count + 1) * sizeof *pieces);
        if (!pieces) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        pieces[0] = (ps_piece){c->req.p, c->req.len};
        for (int i = 0; i < g->num_shards; i++) {
            const ps_shard *sh = &g->shards[i];
            if (sh->ps != j || sh->assign != assigned) continue;
            const float *p = gd + sh->offset;
            ps_piece *last = &pieces[npieces - 1];
            if (npieces > 1 && (const char *)last->p + last->n == (const char *)p)
                last->n += (size_t)sh->numel * 4;
            else
                pieces[npieces++] = (ps_piece){p, (size_t)sh->numel * 4};
        }
        uint64_t id = 0;
        dist_status st = link_send(c, &c->links[j], PS_MSG_PUSH, pieces, npieces, &id);
        free(pieces);
        DIST_TRY(st);
        /* its reply is read before the next request on this link: the ps applies the update
         * while this worker goes on */
        c->links[j].pending_acks++;
    }
    return DIST_OK;
}

/* Right behind the push, the values the worker's next run will read. */
static dist_status prefetch(ps_ctx *c) {
    const void **all = calloc((size_t)(c->num_groups > 0 ? c->num_groups : 1), sizeof *all);
    if (!all) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    for (int k = 0; k < c->num_groups; k++) all[k] = c->groups[k].copies[0];
    dist_status st = DIST_OK;
    for (int j = 0; j < c->cl->num_ps && st == DIST_OK; j++) {
        ps_link *l = &c->links[j];
        uint32_t count = 0;
        st = pull_request(c, j, all, &count);
        if (st != DIST_OK || !count || l->fd < 0 || l->prefetch_id) continue;
        ps_piece piece = {c->req.p, c->req.len};
        uint64_t id = 0;
        st = link_send_now(c, l, PS_MSG_PULL, &piece, 1, &id);
        if (st == DIST_OK) {
            l->prefetch_id = id;
            l->prefetch_count = count;
            l->prefetch_at = net_now();
        }
    }
    free(all);
    return st;
}

static dist_status ps_apply_gradients(dist_strategy *s, dist_replica_ctx *rc, dist_tensor *grads,
                                      dist_update_fn update, void *user) {
    ps_ctx *c = ctx_of(s);
    dist_update_rule rule;
    DIST_TRY(dist_update_rule_of(update, user, &rule));
    /* the worker's replicas are in sync with each other: their gradients are summed first */
    DIST_TRY(dist_strategy_all_reduce_tensor(s, rc->local_id, DIST_REDUCE_SUM, grads));
    if (rc->local_id != 0) return DIST_OK;
    pthread_mutex_lock(&c->mu);
    dist_status st = DIST_OK;
    if (!rule.model) { /* strategy variables: each is a group of its own */
        for (int i = 0; i < rule.num_variables && st == DIST_OK; i++) {
            dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_variable_value(rule.variables[i], 0)};
            ps_group *vg = group_of(c, copies);
            if (!vg) {
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "parameter_server: variable '%s' was not created in this "
                                "strategy's scope",
                                dist_variable_name(rule.variables[i]));
                break;
            }
            dist_tensor piece = *grads;
            piece.data = (float *)grads->data + rule.offsets[i];
            piece.ndim = 1;
            piece.shape[0] = vg->numel;
            st = push(s, c, vg, &rule, &piece);
        }
        if (st == DIST_OK && c->cl->role == PS_ROLE_WORKER) st = prefetch(c);
        pthread_mutex_unlock(&c->mu);
        if (st != DIST_OK) return dist_error_context(st, "parameter_server: pushing the gradients");
        return DIST_OK;
    }
    dist_tensor *params[DIST_MAX_REPLICAS] = {dist_model_params(rule.model, 0)};
    ps_group *g = group_of(c, params);
    if (!g)
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "parameter_server: the model was not built in this strategy's scope");
    else if (dist_tensor_numel(grads) != g->numel)
        st = dist_error(DIST_INTERNAL, "parameter_server: %lld gradients for %lld variables",
                        (long long)dist_tensor_numel(grads), (long long)g->numel);
    if (st == DIST_OK) st = push(s, c, g, &rule, grads);
    if (st == DIST_OK && c->cl->role == PS_ROLE_WORKER) st = prefetch(c);
    pthread_mutex_unlock(&c->mu);
    if (st != DIST_OK) return dist_error_context(st, "parameter_server: pushing the gradients");
    return DIST_OK;
}

/* Per-worker datasets: TF's InputContext for a worker (pipelines = workers, id = its index). */
static dist_status ps_distribute_datasets_from_function(dist_strategy *s, dist_dataset_fn fn,
                                                        void *user,
                                                        dist_distributed_dataset **out) {
    ps_ctx *c = ctx_of(s);
    int saved_n = s->num_workers, saved_id = s->worker_id;
    if (c->cl->role == PS_ROLE_WORKER) {
        s->num_workers = c->cl->num_workers;
        s->worker_id = c->cl->index;
    }
    dist_status st = dist_strategy_default_distribute_datasets_from_function(s, fn, user, out);
    s->num_workers = saved_n;
    s->worker_id = saved_id;
    return st;
}

static void ps_destroy(dist_strategy *s) {
    ps_ctx *c = ctx_of(s);
    if (!c) return;
    for (int j = 0; c->links && j < c->cl->num_ps; j++) {
        ps_ctx *cc = c;
        if (cc->links[j].fd >= 0 && cc->links[j].pending_acks) (void)link_ready(cc, &cc->links[j]);
        net_close(&c->links[j].fd);
    }
    for (int k = 0; k < c->num_groups; k++) free(c->groups[k].shards);
    free(c->groups);
    free(c->links);
    free(c->staging);
    ps_buf_free(&c->req);
    ps_cluster_destroy(c->cl);
    pthread_mutex_destroy(&c->mu);
    free(c);
    s->ctx = NULL;
}

static const struct dist_strategy_i parameter_server_iface = {
    .run = ps_run,
    .create_variable = ps_create_variable,
    .save_state = ps_save_state,
    .restore_state = ps_restore_state,
    .save_slot = ps_save_slot,
    .restore_slot = ps_restore_slot,
    .distribute_datasets_from_function = ps_distribute_datasets_from_function,
    .apply_gradients = ps_apply_gradients,
    .destroy = ps_destroy,
};

static dist_status init_parameter_server(dist_strategy *s, const dist_strategy_options *o) {
    s->iface = &parameter_server_iface;
    ps_ctx *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    s->ctx = c;
    c->partitioner = o->variable_partitioner ? *o->variable_partitioner
                                             : (dist_partitioner)DIST_PARTITIONER_INIT;
    c->timeout_s = s->collective_timeout_s;
    DIST_TRY(ps_cluster_resolve(o, &c->cl));
    c->links = calloc((size_t)c->cl->num_ps, sizeof *c->links);
    if (!c->links) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    for (int j = 0; j < c->cl->num_ps; j++) {
        c->links[j].fd = -1;
        c->links[j].rank = ps_ps_rank(c->cl, j);
        c->links[j].next_id = 1;
        ps_task_desc(c->cl, c->links[j].rank, c->links[j].who, sizeof c->links[j].who);
    }
    s->is_chief = c->cl->role == PS_ROLE_CHIEF;
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    DIST_TRY(dist_strategy_devices(s->desc->devices, o->devices, devs, &n));
    DIST_TRY(dist_local_replicas_init(s, devs, n, o));
    snprintf(s->cross_device, sizeof s->cross_device, "in-process+ps");
    if (n > 1)
        DIST_TRY(dist_comm_create_in_process(n, s->replicas.backends, s->collective_timeout_s,
                                             &s->replicas_comm));
    return DIST_OK;
}

/* ---- the public calls of dist/ps.h that need the strategy ---- */

int dist_strategy_num_placed_variables(const dist_strategy *s) {
    if (!s || s->iface != &parameter_server_iface || !s->ctx) return 0;
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    int n = 0;
    for (int k = 0; k < c->num_groups; k++) n += c->groups[k].num_shards;
    pthread_mutex_unlock(&c->mu);
    return n;
}

dist_status dist_strategy_placed_variable(const dist_strategy *s, int i,
                                          dist_placed_variable *out) {
    DIST_CHECK_ARG(s && out, "dist_strategy_placed_variable: NULL argument");
    DIST_CHECK_ARG(i >= 0 && i < dist_strategy_num_placed_variables(s),
                   "dist_strategy_placed_variable: no variable %d (%d placed)", i,
                   dist_strategy_num_placed_variables(s));
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    const ps_shard *sh = NULL;
    for (int k = 0; k < c->num_groups && !sh; k++) {
        if (i < c->groups[k].num_shards) sh = &c->groups[k].shards[i];
        i -= c->groups[k].num_shards;
    }
    *out = (dist_placed_variable){.ps = sh->ps,
                                  .shard = sh->shard,
                                  .num_shards = sh->num_shards,
                                  .first_row = sh->first_row,
                                  .rows = sh->rows,
                                  .numel = sh->numel};
    snprintf(out->name, sizeof out->name, "%s", sh->name);
    pthread_mutex_unlock(&c->mu);
    return DIST_OK;
}

static dist_status need_ps(const dist_strategy *s, const char *what) {
    if (!s) return dist_error(DIST_INVALID_ARGUMENT, "%s: NULL strategy", what);
    if (s->iface != &parameter_server_iface || !s->ctx)
        return dist_error(DIST_INVALID_USAGE,
                          "%s: needs the parameter_server strategy (this is %s)", what,
                          dist_strategy_name(s));
    return DIST_OK;
}

static dist_status check_name(const char *name, const char *what) {
    if (!name || !*name || strlen(name) >= PS_NAME_CAP)
        return dist_error(DIST_INVALID_ARGUMENT, "%s: a name of 1 to %d bytes, got '%s'", what,
                          PS_NAME_CAP - 1, name ? name : "(null)");
    return DIST_OK;
}

dist_status dist_strategy_register_function(dist_strategy *s, const char *name, dist_closure_fn fn,
                                            void *user) {
    DIST_TRY(need_ps(s, "register_function"));
    DIST_TRY(check_name(name, "register_function"));
    DIST_CHECK_ARG(fn, "register_function '%s': NULL function", name);
    ps_registry *r = &ctx_of(s)->reg;
    for (int i = 0; i < r->num_functions; i++)
        if (strcmp(r->functions[i].name, name) == 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "register_function: '%s' is registered already", name);
    if (r->num_functions == DIST_MAX_REGISTERED)
        return dist_error(DIST_OUT_OF_RANGE, "register_function: more than %d functions",
                          DIST_MAX_REGISTERED);
    snprintf(r->functions[r->num_functions].name, PS_NAME_CAP, "%s", name);
    r->functions[r->num_functions].fn = fn;
    r->functions[r->num_functions].user = user;
    r->num_functions++;
    return DIST_OK;
}

dist_status dist_strategy_register_dataset_function(dist_strategy *s, const char *name,
                                                    dist_dataset_fn fn, void *user) {
    DIST_TRY(need_ps(s, "register_dataset_function"));
    DIST_TRY(check_name(name, "register_dataset_function"));
    DIST_CHECK_ARG(fn, "register_dataset_function '%s': NULL function", name);
    ps_registry *r = &ctx_of(s)->reg;
    for (int i = 0; i < r->num_datasets; i++)
        if (strcmp(r->datasets[i].name, name) == 0)
            return dist_error(DIST_INVALID_ARGUMENT,
                              "register_dataset_function: '%s' is registered already", name);
    if (r->num_datasets == DIST_MAX_REGISTERED)
        return dist_error(DIST_OUT_OF_RANGE, "register_dataset_function: more than %d functions",
                          DIST_MAX_REGISTERED);
    snprintf(r->datasets[r->num_datasets].name, PS_NAME_CAP, "%s", name);
    r->datasets[r->num_datasets].fn = fn;
    r->datasets[r->num_datasets].user = user;
    r->num_datasets++;
    return DIST_OK;
}

const char *dist_strategy_task_type(const dist_strategy *s) {
    if (!s) return "";
    if (s->iface != &parameter_server_iface || !s->ctx) return s->is_chief ? "chief" : "worker";
    static const char *const roles[] = {"chief", "worker", "ps"};
    return roles[ctx_of(s)->cl->role];
}

int dist_strategy_task_index(const dist_strategy *s) {
    if (!s) return 0;
    if (s->iface != &parameter_server_iface || !s->ctx) return s->worker_id;
    return ctx_of(s)->cl->index;
}

static dist_status make_iterator(void *user, dist_dataset_fn fn, void *fn_user,
                                 dist_distributed_iterator **out) {
    dist_strategy *s = user;
    ps_ctx *c = ctx_of(s);
    int slot = -1;
    for (int i = 0; i < PS_MAX_SERVED && slot < 0; i++)
        if (!c->served[i].it) slot = i;
    if (slot < 0)
        return dist_error(DIST_OUT_OF_RANGE, "parameter_server: more than %d per-worker datasets",
                          PS_MAX_SERVED);
    dist_distributed_dataset *dds = NULL;
    DIST_TRY(dist_strategy_distribute_datasets_from_function(s, fn, fn_user, &dds));
    dist_status st = dist_distributed_dataset_iterator(dds, out);
    if (st != DIST_OK) {
        dist_distributed_dataset_destroy(dds);
        return st;
    }
    c->served[slot].it = *out; /* the iterator reads the dataset: both go together */
    c->served[slot].dds = dds;
    return DIST_OK;
}

static void free_iterator(void *user, dist_distributed_iterator *it) {
    ps_ctx *c = ctx_of(user);
    for (int i = 0; i < PS_MAX_SERVED; i++)
        if (c->served[i].it == it) {
            dist_distributed_iterator_destroy(it);
            dist_distributed_dataset_destroy(c->served[i].dds);
            c->served[i].it = NULL;
            c->served[i].dds = NULL;
        }
}

/* A closure is done when the ps tasks have applied what it pushed: the replies of its pushes
 * are read before the chief is told (a chief that joins, then reads variables or update
 * counts, sees every update; a test saw 59 of 60 updates without this). */
static dist_status drain_pushes(void *user) {
    dist_strategy *s = user;
    ps_ctx *c = ctx_of(s);
    for (int j = 0; c->links && j < c->cl->num_ps; j++)
        if (c->links[j].fd >= 0 && c->links[j].pending_acks)
            DIST_TRY(link_drain_acks(c, &c->links[j]));
    return DIST_OK;
}

dist_status dist_strategy_serve(dist_strategy *s) {
    DIST_TRY(need_ps(s, "dist_strategy_serve"));
    ps_ctx *c = ctx_of(s);
    if (c->cl->role == PS_ROLE_CHIEF)
        return dist_error(DIST_INVALID_USAGE,
                          "dist_strategy_serve: the chief coordinates (dist_coordinator_create); "
                          "ps and worker tasks serve");
    if (c->cl->role == PS_ROLE_PS) {
        ps_server *srv = NULL;
        DIST_TRY(ps_server_start(c->cl, &srv));
        dist_status st = ps_server_wait(srv);
        ps_server_destroy(srv);
        return st;
    }
    ps_worker_hooks hooks = {.strategy = s,
                             .user = s,
                             .make_iterator = make_iterator,
                             .free_iterator = free_iterator,
                             .after_closure = drain_pushes};
    return ps_worker_serve(c->cl, &c->reg, &hooks);
}

dist_status dist_coordinator_create(dist_strategy *s, const dist_coordinator_options *o,
                                    dist_coordinator **out) {
    DIST_CHECK_ARG(out, "dist_coordinator_create: NULL argument");
    *out = NULL;
    DIST_TRY(need_ps(s, "dist_coordinator_create"));
    ps_ctx *c = ctx_of(s);
    if (c->cl->role != PS_ROLE_CHIEF)
        return dist_error(DIST_INVALID_USAGE,
                          "dist_coordinator_create: only the chief coordinates (this is %s)",
                          ps_task_name(c->cl, c->cl->rank));
    DIST_CHECK_ARG(!o || o->version == DIST_COORDINATOR_OPTIONS_VERSION,
                   "coordinator options: version %d, expected %d", o ? o->version : 0,
                   DIST_COORDINATOR_OPTIONS_VERSION);
    /* A closure is one step or one evaluation batch, seconds at most: a worker that has not
     * answered one by the strategy's collective deadline is stopped, hung or cut off, so it
     * counts as lost and its closures go to another worker (TF re-queues them too), rather
     * than the job waiting for it. */
    dist_coordinator_options co = o ? *o : (dist_coordinator_options)DIST_COORDINATOR_OPTIONS_INIT;
    if (co.closure_timeout_s <= 0) co.closure_timeout_s = s->collective_timeout_s;
    return ps_coordinator_create(c->cl, &c->reg, &co, out);
}

const dist_strategy_kind_desc dist_strategy_kind_parameter_server = {
    .kind = DIST_STRATEGY_PARAMETER_SERVER,
    .name = "parameter_server",
    .init = init_parameter_server,
    .collective_timeout_s = DIST_NET_COLLECTIVE_TIMEOUT_S,
    /* a worker's replicas: the devices listed, else one */
    .devices = DIST_DEFAULT_DEVICES_ONE,
};
