/* The parameter service (ps_server.h). */
#include "ps/ps_server.h"

#include "backend/backend.h"
#include "backend/layer_ops.h"
#include "core/error.h"
#include "ps/ps_wire.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A ps task serves at most this many connections from each task at once: the task's link, the
 * chief's shutdown, and a reconnection whose old connection the kernel has not reported closed
 * yet (a vanished host: keepalive, ~25 s). Each connection has its own thread, so without a
 * cap a token holder opening 300 connections made 300 threads; with it a task gets at most
 * PS_CONNS_PER_TASK x (tasks - 1) connection threads, and a task over its share is refused as
 * busy (it retries until its connect deadline) while the others are served. */
#define PS_CONNS_PER_TASK 4

void ps_rule_encode(const ps_rule *r, unsigned char out[PS_RULE_BYTES]) {
    const float f[6] = {r->lr, r->beta1, r->beta2, r->epsilon, r->momentum, r->grad_scale};
    put32(out, r->kind);
    for (int i = 0; i < 6; i++) {
        uint32_t u;
        memcpy(&u, &f[i], 4);
        put32(out + 4 + 4 * i, u);
    }
    put32(out + 28, r->nesterov);
}

void ps_rule_decode(const unsigned char in[PS_RULE_BYTES], ps_rule *r) {
    float f[6];
    r->kind = get32(in);
    for (int i = 0; i < 6; i++) {
        uint32_t u = get32(in + 4 + 4 * i);
        memcpy(&f[i], &u, 4);
    }
    r->lr = f[0], r->beta1 = f[1], r->beta2 = f[2], r->epsilon = f[3], r->momentum = f[4];
    r->grad_scale = f[5];
    r->nesterov = get32(in + 28);
}

typedef struct ps_var {
    pthread_mutex_t mu;
    char name[128];
    uint64_t numel;
    float *data, *m, *v; /* slots allocated by the first update that needs them */
    uint64_t steps;      /* updates applied: Adam's t */
} ps_var;

typedef struct ps_conn {
    ps_server *srv;
    int fd, rank;
    pthread_t thread;
    struct ps_conn *next;
    atomic_int done;
    char who[NET_NAME_CAP + NET_ADDR_CAP + 32];
    ps_buf out;
    float *scratch; /* pushed gradients */
    size_t scratch_cap;
} ps_conn;

struct ps_server {
    ps_cluster *cl;
    int listen_fd;
    ps_acceptor *acceptor;
    dist_backend *be; /* the optimizer kernels (one thread; called from every connection) */
    pthread_rwlock_t table_mu;
    ps_var **vars; /* by id */
    uint32_t vars_cap;
    pthread_mutex_t mu; /* conns, shutdown */
    pthread_cond_t cv;
    ps_conn *conns;
    int shutdown;
    /* The chief's connections open now; whether it ever had one; when the last one closed
     * (net_now()). A chief that has left and does not come back within the connect timeout
     * will not send shutdown: ps_server_wait gives up then. */
    int chief_conns;
    bool chief_seen;
    double chief_left_at;
    atomic_uint_fast64_t updates;
};

/* ---- the variables ---- */

static ps_var *find(ps_server *s, uint32_t id) {
    pthread_rwlock_rdlock(&s->table_mu);
    ps_var *v = id < s->vars_cap ? s->vars[id] : NULL;
    pthread_rwlock_unlock(&s->table_mu);
    return v;
}

static dist_status install(ps_server *s, uint32_t id, const char *name, uint64_t numel,
                           const float *values) {
    if (id >= PS_MAX_VARIABLES)
        return dist_error(DIST_INVALID_ARGUMENT, "variable id %u is over the limit %u", id,
                          PS_MAX_VARIABLES);
    ps_var *v = find(s, id);
    if (v) {
        pthread_mutex_lock(&v->mu);
        dist_status st = DIST_OK;
        if (v->numel != numel || strcmp(v->name, name) != 0)
            st = dist_error(DIST_INVALID_ARGUMENT,
                            "variable #%u is '%s' with %llu elements here, the coordinator "
                            "creates '%s' with %llu (another model?)",
                            id, v->name, (unsigned long long)v->numel, name,
                            (unsigned long long)numel);
        else {
            memcpy(v->data, values, numel * sizeof(float));
            free(v->m);
            free(v->v);
            v->m = v->v = NULL;
            v->steps = 0;
        }
        pthread_mutex_unlock(&v->mu);
        return st;
    }
    v = calloc(1, sizeof *v);
    float *data = malloc(numel ? numel * sizeof(float) : 4);
    if (!v || !data) {
        free(v);
        free(data);
        return dist_error(DIST_OUT_OF_MEMORY, "out of memory for variable '%s' (%llu elements)",
                          name, (unsigned long long)numel);
    }
    pthread_mutex_init(&v->mu, NULL);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->numel = numel;
    v->data = data;
    memcpy(data, values, numel * sizeof(float));
    pthread_rwlock_wrlock(&s->table_mu);
    dist_status st = DIST_OK;
    if (id >= s->vars_cap) {
        uint32_t cap = s->vars_cap ? s->vars_cap : 64;
        while (cap <= id) cap *= 2;
        ps_var **t = realloc(s->vars, cap * sizeof *t);
        if (!t)
            st = dist_error(DIST_OUT_OF_MEMORY, "out of memory for the variable table");
        else {
            memset(t + s->vars_cap, 0, (cap - s->vars_cap) * sizeof *t);
            s->vars = t;
            s->vars_cap = cap;
        }
    }
    if (st == DIST_OK) s->vars[id] = v;
    pthread_rwlock_unlock(&s->table_mu);
    if (st != DIST_OK) {
        pthread_mutex_destroy(&v->mu);
        free(v->data);
        free(v);
    }
    return st;
}

/* One variable's update, under its lock. */
static dist_status apply(ps_server *s, ps_var *v, const ps_rule *r, const float *g) {
    dist_status st = DIST_OK;
    pthread_mutex_lock(&v->mu);
    size_t bytes = v->numel * sizeof(float);
    if (r->kind == PS_RULE_ADD) {
        for (uint64_t i = 0; i < v->numel; i++) v->data[i] += g[i];
        pthread_mutex_unlock(&v->mu);
        return DIST_OK;
    }
    bool need_m = r->kind == PS_RULE_ADAM || r->momentum != 0.0f;
    if (need_m && !v->m) v->m = calloc(1, bytes ? bytes : 4);
    if (r->kind == PS_RULE_ADAM && !v->v) v->v = calloc(1, bytes ? bytes : 4);
    if ((need_m && !v->m) || (r->kind == PS_RULE_ADAM && !v->v)) {
        st = dist_error(DIST_OUT_OF_MEMORY, "out of memory for the slots of '%s'", v->name);
    } else if (r->kind == PS_RULE_ADAM) {
        v->steps++;
        double t = (double)v->steps;
        dist_adam_desc d = {
            .lr = (float)(r->lr * sqrt(1.0 - pow(r->beta2, t)) / (1.0 - pow(r->beta1, t))),
            .beta1 = r->beta1,
            .beta2 = r->beta2,
            .epsilon = r->epsilon,
            .grad_scale = r->grad_scale,
        };
        st = dist_be_adam_update(s->be->iface, s->be->ctx, &d, v->data, g, v->m, v->v, v->numel);
    } else {
        v->steps++;
        dist_sgd_desc d = {.lr = r->lr,
                           .momentum = r->momentum,
                           .nesterov = (int)r->nesterov,
                           .grad_scale = r->grad_scale};
        st = dist_be_sgd_update(s->be->iface, s->be->ctx, &d, v->data, g, v->m, v->numel);
    }
    pthread_mutex_unlock(&v->mu);
    if (st == DIST_OK) atomic_fetch_add(&s->updates, 1);
    return st;
}

/* ---- requests ---- */

/* The ids of a request: u32 count, then count ids that exist here. */
static dist_status read_ids(ps_server *s, ps_reader *r, uint32_t *count, ps_var ***vars) {
    *count = ps_get_u32(r);
    *vars = NULL;
    if (r->failed || *count > PS_MAX_VARIABLES || (uint64_t)*count * 4 > r->len - r->pos)
        return dist_error(DIST_FORMAT, "a malformed list of variable ids");
    *vars = malloc((*count ? *count : 1) * sizeof **vars);
    if (!*vars) return dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    for (uint32_t i = 0; i < *count; i++) {
        uint32_t id = ps_get_u32(r);
        (*vars)[i] = find(s, id);
        if (!(*vars)[i])
            return dist_error(DIST_NOT_FOUND,
                              "no variable #%u on this ps (created by the "
                              "coordinator? another cluster?)",
                              id);
    }
    return DIST_OK;
}

static dist_status on_create(ps_conn *c, const unsigned char *p, uint64_t n) {
    ps_reader r = {p, (size_t)n, 0, false};
    uint32_t count = ps_get_u32(&r);
    for (uint32_t i = 0; i < count && !r.failed; i++) {
        char name[128];
        uint32_t id = ps_get_u32(&r);
        ps_get_str(&r, name, sizeof name);
        uint64_t numel = ps_get_u64(&r);
        if (r.failed || numel > (r.len - r.pos) / 4) { /* values missing: not at the end */
            r.failed = true;
            break;
        }
        const void *values = ps_get_bytes(&r, numel * 4);
        float *tmp = malloc(numel ? numel * 4 : 4); /* the payload is not 4-byte aligned */
        if (!tmp) return dist_error(DIST_OUT_OF_MEMORY, "out of memory");
        memcpy(tmp, values, numel * 4);
        dist_status st = install(c->srv, id, name, numel, tmp);
        free(tmp);
        DIST_TRY(st);
    }
    if (r.failed || r.pos != r.len) return dist_error(DIST_FORMAT, "a malformed create request");
    return DIST_OK;
}

/* A reply the requester would refuse (its cap is the same) is refused before it is built. */
static dist_status reply_too_large(const char *what, uint64_t bytes) {
    return dist_error(DIST_OUT_OF_RANGE, "a %s whose reply takes %llu bytes (at most %llu)", what,
                      (unsigned long long)bytes, (unsigned long long)PS_DEFAULT_FRAME_CAP);
}

/* Values are copied under each variable's lock into the reply, then sent unlocked. */
static dist_status on_pull(ps_conn *c, const ps_header *h, const unsigned char *p, uint64_t n) {
    ps_reader r = {p, (size_t)n, 0, false};
    uint32_t count;
    ps_var **vars;
    dist_status st = read_ids(c->srv, &r, &count, &vars);
    if (st == DIST_OK && r.pos != r.len) st = dist_error(DIST_FORMAT, "a malformed pull request");
    if (st != DIST_OK) {
        free(vars);
        return st;
    }
    /* ids may repeat: 1M ids of one 1 MB variable would ask for a 4 TB reply */
    uint64_t bytes = 4;
    for (uint32_t i = 0; i < count; i++) bytes += 8 + vars[i]->numel * 4;
    if (bytes > PS_DEFAULT_FRAME_CAP) {
        free(vars);
        return reply_too_large("pull", bytes);
    }
    ps_buf_reset(&c->out);
    ps_put_u32(&c->out, count);
    for (uint32_t i = 0; i < count; i++) ps_put_u64(&c->out, vars[i]->numel);
    for (uint32_t i = 0; i < count; i++) {
        pthread_mutex_lock(&vars[i]->mu);
        ps_put_bytes(&c->out, vars[i]->data, vars[i]->numel * 4);
        pthread_mutex_unlock(&vars[i]->mu);
    }
    free(vars);
    if (c->out.failed) return dist_error(DIST_OUT_OF_MEMORY, "out of memory for a pull reply");
    ps_piece piece = {c->out.p, c->out.len};
    return ps_send_frame(c->fd, PS_MSG_PULL | PS_MSG_REPLY, h->id, DIST_OK, &piece, 1,
                         net_now() + PS_FRAME_STALL_S, c->who);
}

/* rule | u32 count | (u32 id, u64 numel) x count | gradients (or changes, for ADD): the gradients
 * go from the socket into one scratch buffer, then each variable is updated under its own lock. */
static dist_status on_push(ps_conn *c, const ps_header *h, ps_rx *rx, bool *reply_sent) {
    (void)h;
    *reply_sent = false;
    unsigned char head[PS_RULE_BYTES + 4];
    DIST_TRY(ps_rx_part(rx, head, sizeof head));
    ps_rule rule;
    ps_rule_decode(head, &rule);
    uint32_t count = get32(head + PS_RULE_BYTES);
    if (rule.kind != PS_RULE_ADAM && rule.kind != PS_RULE_SGD && rule.kind != PS_RULE_ADD)
        return dist_error(DIST_FORMAT, "a push with update rule %u", rule.kind);
    if (count > PS_MAX_VARIABLES || (uint64_t)count * 12 > rx->left)
        return dist_error(DIST_FORMAT, "a push of %u variables in %llu bytes", count,
                          (unsigned long long)rx->left);
    unsigned char *list = malloc(count ? (size_t)count * 12 : 1);
    ps_var **vars = malloc((count ? count : 1) * sizeof *vars);
    dist_status st = list && vars ? DIST_OK : dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    if (st == DIST_OK) st = ps_rx_part(rx, list, (size_t)count * 12);
    uint64_t total = 0;
    for (uint32_t i = 0; i < count && st == DIST_OK; i++) {
        uint32_t id = get32(list + 12 * i);
        uint64_t numel = get64(list + 12 * i + 4);
        vars[i] = find(c->srv, id);
        if (!vars[i])
            st = dist_error(DIST_NOT_FOUND, "a push to variable #%u, which is not on this ps", id);
        else if (vars[i]->numel != numel)
            st = dist_error(
                DIST_INVALID_ARGUMENT, "a push of %llu gradients to '%s', which has %llu elements",
                (unsigned long long)numel, vars[i]->name, (unsigned long long)vars[i]->numel);
        else
            total += numel;
    }
    if (st == DIST_OK && total * 4 != rx->left)
        st = dist_error(DIST_FORMAT, "a push whose gradients take %llu bytes, not %llu",
                        (unsigned long long)rx->left, (unsigned long long)(total * 4));
    if (st == DIST_OK && (total > c->scratch_cap || !c->scratch)) {
        /* never NULL: pushes of empty variables still index it */
        float *g = realloc(c->scratch, total ? total * 4 : 4);
        if (!g)
            st = dist_error(DIST_OUT_OF_MEMORY, "out of memory for %llu gradients",
                            (unsigned long long)total);
        else {
            c->scratch = g;
            c->scratch_cap = total;
        }
    }
    if (st == DIST_OK) st = ps_rx_part(rx, c->scratch, total * 4);
    if (st == DIST_OK) st = ps_rx_end(rx);
    uint64_t off = 0;
    for (uint32_t i = 0; i < count && st == DIST_OK; i++) {
        st = apply(c->srv, vars[i], &rule, c->scratch + off);
        off += vars[i]->numel;
    }
    free(list);
    free(vars);
    return st;
}

/* The reply of save, and the request of restore: u32 count, then per variable u32 id,
 * u64 numel, u64 steps, u32 slots (bit 0: m, bit 1: v), the values, then the slots. */
static dist_status on_save(ps_conn *c, const ps_header *h, const unsigned char *p, uint64_t n) {
    ps_reader r = {p, (size_t)n, 0, false};
    uint32_t count;
    ps_var **vars;
    dist_status st = read_ids(c->srv, &r, &count, &vars);
    if (st != DIST_OK) {
        free(vars);
        return st;
    }
    uint64_t bytes = 4;
    for (uint32_t i = 0; i < count; i++) bytes += 24 + vars[i]->numel * 4 * 3; /* at most */
    if (bytes > PS_DEFAULT_FRAME_CAP) {
        free(vars);
        return reply_too_large("save", bytes);
    }
    ps_reader ids = {p, (size_t)n, 4, false};
    ps_buf_reset(&c->out);
    ps_put_u32(&c->out, count);
    for (uint32_t i = 0; i < count; i++) {
        ps_var *v = vars[i];
        pthread_mutex_lock(&v->mu);
        ps_put_u32(&c->out, ps_get_u32(&ids));
        ps_put_u64(&c->out, v->numel);
        ps_put_u64(&c->out, v->steps);
        ps_put_u32(&c->out, (v->m ? 1u : 0u) | (v->v ? 2u : 0u));
        ps_put_bytes(&c->out, v->data, v->numel * 4);
        if (v->m) ps_put_bytes(&c->out, v->m, v->numel * 4);
        if (v->v) ps_put_bytes(&c->out, v->v, v->numel * 4);
        pthread_mutex_unlock(&v->mu);
    }
    free(vars);
    if (c->out.failed) return dist_error(DIST_OUT_OF_MEMORY, "out of memory for a save reply");
    ps_piece piece = {c->out.p, c->out.len};
    return ps_send_frame(c->fd, PS_MSG_SAVE | PS_MSG_REPLY, h->id, DIST_OK, &piece, 1,
                         net_now() + PS_FRAME_STALL_S, c->who);
}

static dist_status on_restore(ps_conn *c, const unsigned char *p, uint64_t n) {
    ps_reader r = {p, (size_t)n, 0, false};
    uint32_t count = ps_get_u32(&r);
    /* everything is checked before anything changes */
    for (int pass = 0; pass < 2; pass++) {
        r.pos = 4;
        for (uint32_t i = 0; i < count; i++) {
            uint32_t id = ps_get_u32(&r);
            uint64_t numel = ps_get_u64(&r), steps = ps_get_u64(&r);
            uint32_t slots = ps_get_u32(&r);
            ps_var *v = find(c->srv, id);
            if (r.failed) return dist_error(DIST_FORMAT, "a malformed restore request");
            if (!v) return dist_error(DIST_NOT_FOUND, "restore: no variable #%u on this ps", id);
            bool one_slot = slots == PS_RESTORE_SLOT || slots == PS_RESTORE_SLOT + 1;
            if (v->numel != numel || (slots > 3 && slots != PS_RESTORE_VALUES_ONLY && !one_slot))
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "restore: '%s' has %llu elements, the checkpoint %llu", v->name,
                                  (unsigned long long)v->numel, (unsigned long long)numel);
            bool values_only = slots == PS_RESTORE_VALUES_ONLY;
            int k = values_only || one_slot ? 1 : 1 + (slots & 1) + (slots >> 1);
            if (numel > (r.len - r.pos) / 4 / (uint64_t)k)
                return dist_error(DIST_FORMAT, "restore: '%s' is truncated", v->name);
            const unsigned char *vals = ps_get_bytes(&r, numel * 4 * (uint64_t)k);
            if (pass == 0) continue;
            pthread_mutex_lock(&v->mu);
            if (values_only) { /* set_weights: the optimizer's state stays */
                memcpy(v->data, vals, numel * 4);
                pthread_mutex_unlock(&v->mu);
                continue;
            }
            if (one_slot) { /* a checkpoint's optimizer slot and update count */
                float **slot = slots == PS_RESTORE_SLOT ? &v->m : &v->v;
                if (!*slot) *slot = malloc(numel ? numel * 4 : 4);
                if (*slot) {
                    memcpy(*slot, vals, numel * 4);
                    v->steps = steps;
                }
                pthread_mutex_unlock(&v->mu);
                if (!*slot)
                    return dist_error(DIST_OUT_OF_MEMORY, "out of memory restoring '%s'", v->name);
                continue;
            }
            size_t bytes = numel * 4;
            float *m = slots & 1 ? (v->m ? v->m : malloc(bytes ? bytes : 4)) : NULL;
            float *vv = slots & 2 ? (v->v ? v->v : malloc(bytes ? bytes : 4)) : NULL;
            dist_status st = DIST_OK;
            if (((slots & 1) && !m) || ((slots & 2) && !vv)) {
                st = dist_error(DIST_OUT_OF_MEMORY, "out of memory restoring '%s'", v->name);
            } else {
                memcpy(v->data, vals, bytes);
                if (m) memcpy(m, vals + bytes, bytes);
                if (vv) memcpy(vv, vals + bytes * (m ? 2 : 1), bytes);
                if (!m) free(v->m);
                if (!vv) free(v->v);
                v->m = m;
                v->v = vv;
                v->steps = steps;
            }
            pthread_mutex_unlock(&v->mu);
            DIST_TRY(st);
        }
        if (r.failed || r.pos != r.len)
            return dist_error(DIST_FORMAT, "a malformed restore request");
    }
    return DIST_OK;
}

static dist_status reply_ok(ps_conn *c, uint32_t type, uint64_t id) {
    return ps_send_frame(c->fd, type | PS_MSG_REPLY, id, DIST_OK, NULL, 0,
                         net_now() + PS_FRAME_STALL_S, c->who);
}

/* One request; a failure of the request itself is answered, a failure of the connection (or
 * a frame that cannot be trusted) ends it. Returns DIST_OK to go on. */
/* A request refused before all of its payload was read: the rest is read (the header's
 * length is under the cap, its CRC is checked) and the refusal answered, so that the sender
 * learns why instead of seeing the ps vanish (a worker takes a lost connection for a lost
 * ps). A frame that ends early or fails its CRC ends the connection. */
static dist_status refuse_rest(ps_conn *c, const ps_header *h, ps_rx *rx, dist_status why) {
    char msg[512];
    snprintf(msg, sizeof msg, "%s", dist_last_error());
    dist_status st = ps_rx_skip(rx, (size_t)rx->left); /* under the cap */
    if (st == DIST_OK) st = ps_rx_end(rx);
    if (st != DIST_OK) return st;
    dist_error(why, "%s", msg);
    return ps_send_error(c->fd, h->type, h->id, why, net_now() + 5, c->who);
}

static dist_status serve_one(ps_conn *c, const ps_header *h, bool *stop) {
    ps_server *s = c->srv;
    uint32_t type = h->type;
    if (type & PS_MSG_REPLY) return dist_error(DIST_FORMAT, "%s sent a reply as a request", c->who);
    bool from_chief = c->rank == 0;
    dist_status st = DIST_OK;
    if ((type == PS_MSG_CREATE || type == PS_MSG_RESTORE || type == PS_MSG_SHUTDOWN) && !from_chief)
        st = dist_error(DIST_INVALID_USAGE, "%s sent %s, which only the chief may", c->who,
                        ps_msg_name(type));
    else if (type == PS_MSG_EXEC || type == PS_MSG_DATASET)
        st = dist_error(DIST_INVALID_USAGE, "%s sent %s to a ps task", c->who, ps_msg_name(type));
    if (st != DIST_OK) {
        ps_rx rx;
        ps_rx_begin(&rx, c->fd, h, c->who);
        return refuse_rest(c, h, &rx, st);
    }
    if (type == PS_MSG_PUSH) {
        ps_rx rx;
        ps_rx_begin(&rx, c->fd, h, c->who);
        bool sent = false;
        st = on_push(c, h, &rx, &sent);
        if (st == DIST_PEER_LOST || st == DIST_TIMEOUT) return st;
        if (st != DIST_OK && rx.left) return refuse_rest(c, h, &rx, st);
        if (st != DIST_OK) return ps_send_error(c->fd, type, h->id, st, net_now() + 5, c->who);
        return reply_ok(c, type, h->id);
    }
    unsigned char *p = NULL;
    DIST_TRY(ps_recv_payload(c->fd, h, &p, c->who));
    switch (type) {
    case PS_MSG_CREATE:
        st = on_create(c, p, h->length);
        if (st == DIST_OK) st = reply_ok(c, type, h->id);
        break;
    case PS_MSG_PULL: st = on_pull(c, h, p, h->length); break;
    case PS_MSG_SAVE: st = on_save(c, h, p, h->length); break;
    case PS_MSG_RESTORE:
        st = on_restore(c, p, h->length);
        if (st == DIST_OK) st = reply_ok(c, type, h->id);
        break;
    case PS_MSG_STATS: {
        unsigned char b[8];
        put64(b, (uint64_t)atomic_load(&s->updates));
        ps_piece piece = {b, 8};
        st = ps_send_frame(c->fd, type | PS_MSG_REPLY, h->id, DIST_OK, &piece, 1,
                           net_now() + PS_FRAME_STALL_S, c->who);
        break;
    }
    case PS_MSG_SHUTDOWN:
        st = reply_ok(c, type, h->id);
        *stop = true;
        break;
    default: st = dist_error(DIST_FORMAT, "unexpected %s", ps_msg_name(type)); break;
    }
    free(p);
    /* a request that failed is answered with its error; the connection goes on */
    if (st != DIST_OK && st != DIST_PEER_LOST && st != DIST_TIMEOUT)
        return ps_send_error(c->fd, type, h->id, st, net_now() + 5, c->who);
    return st;
}

static void *conn_main(void *arg) {
    ps_conn *c = arg;
    ps_server *s = c->srv;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int down = s->shutdown;
        pthread_mutex_unlock(&s->mu);
        if (down) break;
        ps_header h;
        dist_status st = ps_recv_header(c->fd, &h, PS_DEFAULT_FRAME_CAP, net_now() + 0.2, c->who);
        if (st == DIST_TIMEOUT) continue;
        bool stop = false;
        if (st == DIST_OK) st = serve_one(c, &h, &stop);
        if (st != DIST_OK) {
            if (st != DIST_PEER_LOST)
                dist_log(DIST_LOG_WARN, "parameter_server %s: dropped the connection of %s: %s",
                         ps_task_name(s->cl, s->cl->rank), c->who, dist_last_error());
            break;
        }
        if (stop) {
            pthread_mutex_lock(&s->mu);
            s->shutdown = 1;
            pthread_cond_broadcast(&s->cv);
            pthread_mutex_unlock(&s->mu);
            break;
        }
    }
    net_close(&c->fd);
    if (c->rank == 0) {
        pthread_mutex_lock(&s->mu);
        if (--s->chief_conns == 0) s->chief_left_at = net_now();
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
    }
    atomic_store(&c->done, 1);
    return NULL;
}

/* Finished connections are joined and freed when a new one arrives (and at the end). */
static void reap(ps_server *s, bool all) {
    ps_conn **pp = &s->conns;
    while (*pp) {
        ps_conn *c = *pp;
        if (all || atomic_load(&c->done)) {
            pthread_join(c->thread, NULL);
            *pp = c->next;
            ps_buf_free(&c->out);
            free(c->scratch);
            free(c);
        } else {
            pp = &c->next;
        }
    }
}

static void on_accept(void *user, int rank, int fd) {
    ps_server *s = user;
    ps_conn *c = calloc(1, sizeof *c);
    if (!c) {
        net_close(&fd);
        return;
    }
    c->srv = s;
    c->fd = fd;
    c->rank = rank;
    ps_task_desc(s->cl, rank, c->who, sizeof c->who);
    pthread_mutex_lock(&s->mu);
    reap(s, false);
    if (s->shutdown || pthread_create(&c->thread, NULL, conn_main, c) != 0) {
        pthread_mutex_unlock(&s->mu);
        net_close(&c->fd);
        free(c);
        return;
    }
    c->next = s->conns;
    s->conns = c;
    if (rank == 0) {
        s->chief_conns++;
        s->chief_seen = true;
    }
    pthread_mutex_unlock(&s->mu);
}

/* The cap (PS_CONNS_PER_TASK), asked on the acceptor's thread, the only one that adds
 * connections, so the count cannot grow between here and on_accept. */
static bool has_room(void *user, int rank) {
    ps_server *s = user;
    pthread_mutex_lock(&s->mu);
    reap(s, false);
    int open = 0;
    for (ps_conn *c = s->conns; c; c = c->next)
        if (c->rank == rank && !atomic_load(&c->done)) open++;
    pthread_mutex_unlock(&s->mu);
    return open < PS_CONNS_PER_TASK;
}

dist_status ps_server_start(ps_cluster *cl, ps_server **out) {
    ps_server *s = calloc(1, sizeof *s);
    if (!s) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    s->cl = cl;
    s->listen_fd = -1;
    pthread_rwlock_init(&s->table_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    bo.threads = 1;
    dist_status st = dist_backend_create(&bo, &s->be);
    if (st == DIST_OK) st = ps_listen(cl, &s->listen_fd);
    if (st == DIST_OK)
        st = ps_acceptor_start(cl, s->listen_fd, on_accept, has_room, s, &s->acceptor);
    if (st != DIST_OK) {
        ps_server_destroy(s);
        return st;
    }
    dist_log(DIST_LOG_INFO, "parameter_server: %s serves variables at %s",
             ps_task_name(cl, cl->rank), cl->auth->addrs[cl->rank]);
    *out = s;
    return DIST_OK;
}

dist_status ps_server_wait(ps_server *s) {
    const ps_cluster *cl = s->cl;
    dist_status st = DIST_OK;
    pthread_mutex_lock(&s->mu);
    while (!s->shutdown) {
        /* The chief never reconnects to a ps while its job runs (a lost link fails the job),
         * so a chief that closed every connection without shutting this task down has ended
         * (a failed job, a crash) or is gone: waiting for it would keep this process alive
         * forever, as a ps SIGSTOPped past the chief's deadline did after SIGCONT. */
        double gone_s = net_now() - s->chief_left_at;
        if (s->chief_seen && s->chief_conns == 0 && gone_s >= cl->connect_timeout_s) {
            char who[NET_NAME_CAP + NET_ADDR_CAP + 8];
            st = dist_error(DIST_UNAVAILABLE,
                            "parameter_server %s: the chief (%s) closed its last connection "
                            "%.0f s ago without shutting this task down and has not connected "
                            "again within the connect timeout (%g s): its job has ended or it is "
                            "gone; exiting",
                            ps_task_name(cl, cl->rank), ps_task_desc(cl, 0, who, sizeof who),
                            gone_s, cl->connect_timeout_s);
            break;
        }
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

uint64_t ps_server_updates(const ps_server *s) {
    return (uint64_t)atomic_load(&((ps_server *)s)->updates);
}

void ps_server_destroy(ps_server *s) {
    if (!s) return;
    ps_acceptor_stop(s->acceptor);
    pthread_mutex_lock(&s->mu);
    s->shutdown = 1; /* each connection's thread sees it within 0.2 s */
    pthread_mutex_unlock(&s->mu);
    reap(s, true);
    net_close(&s->listen_fd);
    for (uint32_t i = 0; i < s->vars_cap; i++) {
        ps_var *v = s->vars[i];
        if (!v) continue;
        pthread_mutex_destroy(&v->mu);
        free(v->data);
        free(v->m);
        free(v->v);
        free(v);
    }
    free(s->vars);
    dist_backend_destroy(s->be);
    pthread_rwlock_destroy(&s->table_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s);
}
