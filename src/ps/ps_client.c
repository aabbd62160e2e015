/* The parameter-server client (ps_client.h): placement, the links to the ps tasks and the
 * requests on them. */
#include "ps/ps_client.h"

#include "core/error.h"
#include "ps/ps_server.h"
#include "ps/ps_wire.h"

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
    bool assign;         /* non-trainable: the worker pushes its step's change, not gradients */
    int64_t base_offset; /* assign: elements into the group's base (the assigned shards in order) */
} ps_shard;

/* The variables made by one create_variable call: one block, and the shards that make it up. */
typedef struct ps_group {
    int64_t numel;
    int num_shards;
    ps_shard *shards;
    /* The non-trainable shards' values the caller's copy started from (pulled or restored),
     * packed in shard order (base_numel elements), and room for their change: a push adds the
     * change on the ps tasks. NULL when the group has none. */
    int64_t base_numel;
    float *base, *delta;
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

struct ps_client {
    const ps_cluster *cl;
    dist_partitioner partitioner;
    ps_link *links;
    ps_group *groups;
    int num_groups;
    uint32_t next_id;
    double timeout_s; /* each request's deadline */
    ps_buf req;
    double pull_s, push_s; /* spent in ps_client_pull, and sending pushes and prefetches */
};

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
static dist_status link_drain_acks(ps_client *c, ps_link *l) {
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

static dist_status link_reply(ps_client *c, ps_link *l, uint32_t type, uint64_t id, ps_header *h,
                              uint64_t cap);

/* Connected, with every earlier reply read (a prefetched pull nobody uses is dropped). */
static dist_status link_ready(ps_client *c, ps_link *l) {
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
static dist_status link_send_now(ps_client *c, ps_link *l, uint32_t type, const ps_piece *pieces,
                                 int n, uint64_t *id) {
    *id = l->next_id++;
    dist_status st =
        ps_send_frame(l->fd, type, *id, 0, pieces, n, net_now() + c->timeout_s, l->who);
    if (st != DIST_OK) return link_lost(l, st);
    return DIST_OK;
}

static dist_status link_send(ps_client *c, ps_link *l, uint32_t type, const ps_piece *pieces, int n,
                             uint64_t *id) {
    DIST_TRY(link_ready(c, l));
    *id = l->next_id++;
    dist_status st =
        ps_send_frame(l->fd, type, *id, 0, pieces, n, net_now() + c->timeout_s, l->who);
    if (st != DIST_OK) return link_lost(l, st);
    return DIST_OK;
}

static dist_status link_reply(ps_client *c, ps_link *l, uint32_t type, uint64_t id, ps_header *h,
                              uint64_t cap) {
    dist_status st = ps_recv_reply(l->fd, type, id, h, cap, net_now() + c->timeout_s, l->who);
    if (st == DIST_PEER_LOST || st == DIST_TIMEOUT || st == DIST_FORMAT) return link_lost(l, st);
    return st;
}

/* ---- placement ---- */

/* Shards of one variable: TF's partitioner decides how many, rows split with the earlier
 * shards one row larger, each shard takes the next id and ps in round-robin order. */
static dist_status place(ps_client *c, const dist_variable_desc *v, ps_shard *out, int cap,
                         int *n) {
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
static dist_status create_on_ps(ps_client *c, const ps_group *g, const float *values) {
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

/* ---- pull: every shard of the groups with dst[k] non-NULL ---- */

/* A pull request for ps j's shards of the groups with want[k] into c->req; *count shards. */
static dist_status pull_request(ps_client *c, int j, const void *const *want, uint32_t *count) {
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

static dist_status pull_now(ps_client *c, float *const *dst, bool use_prefetch) {
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

/* st, after adding the seconds since t0 to *clock (the client's pull or push time). */
static dist_status timed(double *clock, double t0, dist_status st) {
    *clock += net_now() - t0;
    return st;
}

dist_status ps_client_pull(ps_client *c, float *const *dst, bool use_prefetch) {
    double t0 = net_now();
    return timed(&c->pull_s, t0, pull_now(c, dst, use_prefetch));
}

void ps_client_seconds(const ps_client *c, double *pull_s, double *push_s) {
    *pull_s = c->pull_s;
    *push_s = c->push_s;
}

/* ---- restore ---- */

/* A RESTORE to every ps holding shards of the group: `values` (the group's layout) as `mode`
 * says (values only, or one optimizer slot with the update count `steps`). */
static dist_status restore_on_ps(ps_client *c, const ps_group *g, const float *values,
                                 uint64_t steps, uint32_t mode) {
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

/* ---- push ---- */

/* One PUSH per ps of the group's shards whose `assign` flag is `assigned`, with `rule` and
 * their data at the shards' offsets into `data` (the group's layout; for the assigned shards,
 * their packed layout, base_offset). */
static dist_status push_now(ps_client *c, ps_group *g, const ps_rule *rule, const float *data,
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
            const float *p = gd + (assigned ? sh->base_offset : sh->offset);
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

static dist_status push_shards(ps_client *c, ps_group *g, const ps_rule *rule, const float *data,
                               bool assigned) {
    double t0 = net_now();
    return timed(&c->push_s, t0, push_now(c, g, rule, data, assigned));
}

/* Right behind the push, the values the worker's next run will read. */
static dist_status prefetch_now(ps_client *c) {
    const void **all = calloc((size_t)(c->num_groups > 0 ? c->num_groups : 1), sizeof *all);
    if (!all) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    for (int k = 0; k < c->num_groups; k++) all[k] = &c->groups[k];
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

dist_status ps_client_prefetch(ps_client *c) {
    double t0 = net_now();
    return timed(&c->push_s, t0, prefetch_now(c));
}

dist_status ps_client_push_gradients(ps_client *c, int group, const dist_update_rule *rule,
                                     const float *grads) {
    ps_rule r = {.kind = rule->kind == DIST_UPDATE_ADAM ? PS_RULE_ADAM : PS_RULE_SGD,
                 .lr = rule->lr,
                 .beta1 = rule->beta1,
                 .beta2 = rule->beta2,
                 .epsilon = rule->epsilon,
                 .momentum = rule->momentum,
                 .nesterov = (uint32_t)rule->nesterov,
                 .grad_scale = rule->grad_scale};
    return push_shards(c, &c->groups[group], &r, grads, false);
}

bool ps_client_group_has_assigned(const ps_client *c, int group) {
    const ps_group *g = &c->groups[group];
    bool any_assign = false;
    for (int i = 0; i < g->num_shards; i++) any_assign |= g->shards[i].assign;
    return any_assign;
}

/* The non-trainable shards of `values` (the group's layout) become the group's base. */
static void group_set_base(ps_group *g, const float *values) {
    for (int i = 0; g->base && i < g->num_shards; i++) {
        const ps_shard *sh = &g->shards[i];
        if (sh->assign)
            memcpy(g->base + sh->base_offset, values + sh->offset, (size_t)sh->numel * 4);
    }
}

bool ps_client_assigned_shard(const ps_client *c, int group, int i, int64_t *offset,
                              int64_t *numel) {
    const ps_group *g = &c->groups[group];
    for (int k = 0; k < g->num_shards; k++)
        if (g->shards[k].assign && i-- == 0) {
            *offset = g->shards[k].offset;
            *numel = g->shards[k].numel;
            return true;
        }
    return false;
}

dist_status ps_client_set_assigned_base(ps_client *c, int group, const float *values) {
    group_set_base(&c->groups[group], values);
    return DIST_OK;
}

dist_status ps_client_push_assigned(ps_client *c, int group, const float *values) {
    ps_group *g = &c->groups[group];
    if (!g->base) return DIST_OK;
    for (int i = 0; i < g->num_shards; i++) {
        const ps_shard *sh = &g->shards[i];
        if (!sh->assign) continue;
        const float *v = values + sh->offset;
        float *b = g->base + sh->base_offset, *d = g->delta + sh->base_offset;
        for (int64_t e = 0; e < sh->numel; e++) {
            d[e] = v[e] - b[e];
            b[e] = v[e];
        }
    }
    ps_rule add = {.kind = PS_RULE_ADD};
    return push_shards(c, g, &add, g->delta, true);
}

dist_status ps_client_drain_pushes(ps_client *c) {
    for (int j = 0; c->links && j < c->cl->num_ps; j++)
        if (c->links[j].fd >= 0 && c->links[j].pending_acks)
            DIST_TRY(link_drain_acks(c, &c->links[j]));
    return DIST_OK;
}

/* ---- checkpoints: values and the optimizer's slots ---- */

dist_status ps_client_restore_values(ps_client *c, int group, const float *values) {
    return restore_on_ps(c, &c->groups[group], values, 0, PS_RESTORE_VALUES_ONLY);
}

dist_status ps_client_restore_slot(ps_client *c, int group, int slot, const float *src,
                                   int64_t iterations) {
    return restore_on_ps(c, &c->groups[group], src, (uint64_t)iterations,
                         PS_RESTORE_SLOT + (uint32_t)slot);
}

/* Slot `slot` of every shard of the group, read with SAVE from each ps. */
dist_status ps_client_save_slot(ps_client *c, int group, int slot, float *dst,
                                int64_t *iterations) {
    const ps_group *g = &c->groups[group];
    dist_status st = DIST_OK;
    memset(dst, 0, (size_t)g->numel * sizeof(float));
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
    return st;
}

/* ---- groups ---- */

dist_status ps_client_add_group(ps_client *c, const dist_variable_desc *vars, int count,
                                int64_t numel, const float *initial, int *group) {
    ps_group g = {.numel = numel};
    dist_status st = DIST_OK;
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
    for (int i = 0; st == DIST_OK && i < g.num_shards; i++)
        if (g.shards[i].assign) {
            g.shards[i].base_offset = g.base_numel;
            g.base_numel += g.shards[i].numel;
        }
    if (st == DIST_OK && g.base_numel) {
        g.base = calloc((size_t)g.base_numel, sizeof *g.base);
        g.delta = calloc((size_t)g.base_numel, sizeof *g.delta);
        if (!g.base || !g.delta) st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    }
    if (st == DIST_OK && initial) st = create_on_ps(c, &g, initial);
    if (st == DIST_OK && initial) group_set_base(&g, initial);
    ps_group *grown =
        st == DIST_OK ? realloc(c->groups, (size_t)(c->num_groups + 1) * sizeof *grown) : NULL;
    if (st == DIST_OK && !grown) st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    if (st != DIST_OK) {
        free(g.shards);
        free(g.base);
        free(g.delta);
        return st;
    }
    c->groups = grown;
    *group = c->num_groups;
    c->groups[c->num_groups++] = g;
    return DIST_OK;
}

int ps_client_num_groups(const ps_client *c) { return c->num_groups; }

int64_t ps_client_group_numel(const ps_client *c, int group) { return c->groups[group].numel; }

int ps_client_num_placed(const ps_client *c) {
    int n = 0;
    for (int k = 0; k < c->num_groups; k++) n += c->groups[k].num_shards;
    return n;
}

void ps_client_placed(const ps_client *c, int i, dist_placed_variable *out) {
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
}

/* ---- create and destroy ---- */

dist_status ps_client_create(const ps_cluster *cl, const dist_partitioner *partitioner,
                             double timeout_s, ps_client **out) {
    *out = NULL;
    ps_client *c = calloc(1, sizeof *c);
    if (!c) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    c->cl = cl;
    c->partitioner = partitioner ? *partitioner : (dist_partitioner)DIST_PARTITIONER_INIT;
    c->timeout_s = timeout_s;
    c->links = calloc((size_t)cl->num_ps, sizeof *c->links);
    if (!c->links) {
        free(c);
        return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    }
    for (int j = 0; j < cl->num_ps; j++) {
        c->links[j].fd = -1;
        c->links[j].rank = ps_ps_rank(cl, j);
        c->links[j].next_id = 1;
        ps_task_desc(cl, c->links[j].rank, c->links[j].who, sizeof c->links[j].who);
    }
    *out = c;
    return DIST_OK;
}

void ps_client_destroy(ps_client *c) {
    if (!c) return;
    for (int j = 0; j < c->cl->num_ps; j++) {
        if (c->links[j].fd >= 0 && c->links[j].pending_acks) (void)link_ready(c, &c->links[j]);
        net_close(&c->links[j].fd);
    }
    for (int k = 0; k < c->num_groups; k++) {
        free(c->groups[k].shards);
        free(c->groups[k].base);
        free(c->groups[k].delta);
    }
    free(c->groups);
    free(c->links);
    ps_buf_free(&c->req);
    free(c);
}
