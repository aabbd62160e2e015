/* parameter_server (ParameterServerStrategy, TF 2's form): variables live on ps tasks, placed
 * round-robin in creation order (each shard of a partitioned variable counts, as in TF), and
 * workers compute. Every task runs this kind; its role comes from TF_CONFIG:
 *   - ps: dist_strategy_serve runs the parameter service (src/ps/ps_server.c);
 *   - worker: dist_strategy_serve runs the closures the chief schedules; before each run the
 *     worker pulls every variable from the ps tasks into its local replicas' copies, and an
 *     optimizer's apply_gradients sums the gradients over the local replicas and pushes them
 *     with the optimizer's rule to the ps tasks, which apply it (asynchronously across workers),
 *     and pushes the change the step made to the non-trainable variables (BatchNormalization's
 *     moving statistics), which the ps tasks add to theirs;
 *   - chief: creates the variables on the ps tasks (their initial values are the chief's),
 *     runs the coordinator (dist/ps.h), evaluates with pulled values, and reads and writes the
 *     variables for checkpoints.
 * A lost ps is DIST_UNAVAILABLE naming the ps and its address.
 * What talks to the ps tasks (placement, the links, the requests) is the client,
 * src/ps/ps_client.c; this file is the strategy kind: the vtable, the replicas' copies of each
 * group of variables and their host staging, the roles' entry points of dist/ps.h. */
#include "backend/backend.h"
#include "collective/local_comm.h"
#include "core/error.h"
#include "core/update_rule.h"
#include "dist/nn.h"
#include "dist/ps.h"
#include "ps/ps_client.h"
#include "ps/ps_server.h"
#include "ps/ps_service.h"
#include "strategy/strategy_impl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The replicas' copies of one group of the client's variables (the same index). */
typedef struct ps_block {
    dist_tensor *copies[DIST_MAX_REPLICAS];
} ps_block;

#define PS_MAX_SERVED 64

typedef struct ps_ctx {
    ps_cluster *cl;
    ps_client *client;
    ps_registry reg;
    pthread_mutex_t mu; /* the client and the blocks */
    ps_block *blocks;   /* per group of the client */
    int num_blocks;
    struct {
        dist_distributed_iterator *it;
        dist_distributed_dataset *dds;
    } served[PS_MAX_SERVED]; /* a worker's per-worker datasets */
    void *staging;           /* host copies of device blocks */
    size_t staging_cap;
} ps_ctx;

static ps_ctx *ctx_of(const dist_strategy *s) { return s->ctx; }

/* ---- placing variables ---- */

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

static dist_status ps_create_variable(dist_strategy *s, dist_tensor *const *copies,
                                      const dist_variable_desc *vars, int count) {
    ps_ctx *c = ctx_of(s);
    if (c->cl->role == PS_ROLE_PS)
        return dist_error(DIST_INVALID_USAGE,
                          "parameter_server: %s holds variables for the others; it builds no "
                          "model (call dist_strategy_serve)",
                          ps_task_name(c->cl, c->cl->rank));
    pthread_mutex_lock(&c->mu);
    int64_t numel = dist_tensor_numel(copies[0]);
    float *host = NULL;
    dist_status st = DIST_OK;
    /* room for the block first: a group the client placed always has its block */
    ps_block *grown = realloc(c->blocks, (size_t)(c->num_blocks + 1) * sizeof *grown);
    if (!grown)
        st = dist_error(DIST_OUT_OF_MEMORY, "out of memory");
    else
        c->blocks = grown;
    if (st == DIST_OK && c->cl->role == PS_ROLE_CHIEF) {
        /* the chief creates the variables on the ps tasks with its initial values */
        size_t bytes = (size_t)numel * sizeof(float);
        host = malloc(bytes ? bytes : 4);
        st = host ? dist_backend_to_host(s->replicas.backends[0], copies[0], host, bytes)
                  : dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    }
    int group = -1;
    if (st == DIST_OK) st = ps_client_add_group(c->client, vars, count, numel, host, &group);
    free(host);
    if (st == DIST_OK) {
        ps_block *b = &c->blocks[c->num_blocks++];
        memset(b, 0, sizeof *b);
        for (int r = 0; r < s->num_replicas; r++) b->copies[r] = copies[r];
    }
    pthread_mutex_unlock(&c->mu);
    if (st != DIST_OK)
        return dist_error_context(st, "parameter_server: placing variables on the ps tasks");
    return DIST_OK;
}

/* ---- pull ---- */

/* Every group's values from the ps tasks into every local replica's copy. */
static dist_status pull_all(dist_strategy *s, ps_ctx *c) {
    if (!c->num_blocks) return DIST_OK;
    float **dst = calloc((size_t)c->num_blocks, sizeof *dst);
    if (!dst) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    bool host = s->replicas.devices[0].kind == DIST_DEVICE_CPU;
    size_t total = 0;
    for (int k = 0; k < c->num_blocks; k++) total += (size_t)ps_client_group_numel(c->client, k);
    dist_status st = DIST_OK;
    if (!host) {
        void *buf = NULL;
        st = staging(c, total * sizeof(float), &buf);
        for (int k = 0, off = 0; st == DIST_OK && k < c->num_blocks;
             off += (int)ps_client_group_numel(c->client, k), k++)
            dst[k] = (float *)buf + off;
    } else {
        for (int k = 0; k < c->num_blocks; k++) dst[k] = c->blocks[k].copies[0]->data;
    }
    if (st == DIST_OK) st = ps_client_pull(c->client, dst, true);
    /* what the step's changes to the non-trainable variables are measured from */
    for (int k = 0; k < c->num_blocks && st == DIST_OK; k++)
        if (ps_client_group_has_assigned(c->client, k))
            st = ps_client_set_assigned_base(c->client, k, dst[k]);
    for (int k = 0; k < c->num_blocks && st == DIST_OK; k++) {
        size_t bytes = (size_t)ps_client_group_numel(c->client, k) * sizeof(float);
        for (int r = host ? 1 : 0; r < s->num_replicas && st == DIST_OK; r++) {
            dist_backend *be = s->replicas.backends[r];
            st = dist_backend_from_host(be, dst[k], bytes, c->blocks[k].copies[r]);
            if (st == DIST_OK) st = dist_backend_synchronize(be);
        }
    }
    free(dst);
    return st;
}

/* The group whose replica 0 copy is copies[0], or -1. */
static int group_of(ps_ctx *c, dist_tensor *const *copies) {
    for (int k = 0; k < c->num_blocks; k++)
        if (c->blocks[k].copies[0] == copies[0]) return k;
    return -1;
}

/* 1 when copies are a group of `bytes` bytes (*group its index). */
static bool group_fits(ps_ctx *c, dist_tensor *const *copies, size_t bytes, int *group) {
    *group = group_of(c, copies);
    return *group >= 0 && bytes == (size_t)ps_client_group_numel(c->client, *group) * sizeof(float);
}

static dist_status ps_save_state(dist_strategy *s, dist_tensor *const *copies, void *dst,
                                 size_t bytes) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    int g;
    dist_status st = DIST_OK;
    size_t ngroups = c->num_blocks > 0 ? (size_t)c->num_blocks : 1;
    float **d = calloc(ngroups, sizeof *d);
    if (!group_fits(c, copies, bytes, &g))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks (made outside this strategy's scope?)");
    else if (!d)
        st = dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
    else {
        d[g] = dst;
        st = ps_client_pull(c->client, d, false);
    }
    free(d);
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* set_weights / a restored checkpoint: the values go to the ps tasks (the optimizer's slots
 * there stay), and to the local copies. */
static dist_status ps_restore_state(dist_strategy *s, dist_tensor *const *copies, const void *src,
                                    size_t bytes) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    int g;
    dist_status st = DIST_OK;
    if (!group_fits(c, copies, bytes, &g))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks (made outside this strategy's scope?)");
    if (st == DIST_OK) st = ps_client_restore_values(c->client, g, src);
    if (st == DIST_OK) st = ps_client_set_assigned_base(c->client, g, src);
    for (int r = 0; r < s->num_replicas && st == DIST_OK; r++) {
        dist_backend *be = s->replicas.backends[r];
        st = dist_backend_from_host(be, src, bytes, copies[r]);
        if (st == DIST_OK) st = dist_backend_synchronize(be);
    }
    pthread_mutex_unlock(&c->mu);
    return st;
}

/* ---- the optimizer's slots, for checkpoints ---- */

static dist_status ps_save_slot(dist_strategy *s, dist_tensor *const *copies, int slot, void *dst,
                                size_t bytes, int64_t *iterations) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    int g;
    dist_status st = DIST_OK;
    *iterations = 0;
    if (!group_fits(c, copies, bytes, &g))
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks");
    else
        st = ps_client_save_slot(c->client, g, slot, dst, iterations);
    pthread_mutex_unlock(&c->mu);
    return st;
}

static dist_status ps_restore_slot(dist_strategy *s, dist_tensor *const *copies, int slot,
                                   const void *src, size_t bytes, int64_t iterations) {
    ps_ctx *c = ctx_of(s);
    pthread_mutex_lock(&c->mu);
    int g;
    dist_status st = DIST_OK;
    if (!group_fits(c, copies, bytes, &g) || slot < 0 || slot > 1)
        st = dist_error(DIST_INVALID_ARGUMENT, "parameter_server: these variables are not on the "
                                               "ps tasks");
    if (st == DIST_OK) st = ps_client_restore_slot(c->client, g, slot, src, iterations);
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

/* Group g's gradients (replica 0's sum) with the rule, then the change this step made to its
 * non-trainable variables (moving statistics) on replica 0, since the pull: the ps adds it to
 * theirs, so the updates of workers stepping at the same time add up (TF's assign_sub on the
 * ps variable) instead of the last push overwriting the others. */
static dist_status push(dist_strategy *s, ps_ctx *c, int g, const dist_update_rule *rule,
                        dist_tensor *grads) {
    int64_t numel = ps_client_group_numel(c->client, g);
    const float *gd = grads->data;
    if (grads->device.kind != DIST_DEVICE_CPU) {
        void *buf = NULL;
        size_t bytes = (size_t)numel * sizeof(float);
        DIST_TRY(staging(c, bytes, &buf));
        DIST_TRY(dist_backend_to_host(s->replicas.backends[0], grads, buf, bytes));
        gd = buf;
    }
    DIST_TRY(ps_client_push_gradients(c->client, g, rule, gd));
    if (!ps_client_group_has_assigned(c->client, g)) return DIST_OK;
    const dist_tensor *v0 = c->blocks[g].copies[0];
    const float *vals = v0->data;
    float *host = NULL;
    if (v0->device.kind != DIST_DEVICE_CPU) {
        host = malloc((size_t)numel * sizeof *host);
        if (!host) return dist_error(DIST_OUT_OF_MEMORY, "parameter_server: out of memory");
        dist_status st =
            dist_backend_to_host(s->replicas.backends[0], v0, host, (size_t)numel * sizeof *host);
        if (st != DIST_OK) {
            free(host);
            return st;
        }
        vals = host;
    }
    dist_status st = ps_client_push_assigned(c->client, g, vals);
    free(host);
    return st;
}

/* The worker's replicas' non-trainable variables (moving statistics, each replica's from its
 * own part of the batch, all from the same pull) become their mean, so replica 0 pushes the
 * mean of the replicas' changes: TF's AggregatingVariable (MEAN) of a worker with several
 * replicas reduces their assign_sub deltas and applies the result once. */
static dist_status mean_non_trainable(dist_strategy *s, ps_ctx *c, dist_replica_ctx *rc,
                                      dist_model *model) {
    dist_tensor *params[DIST_MAX_REPLICAS] = {dist_model_params(model, 0)};
    pthread_mutex_lock(&c->mu);
    int g = group_of(c, params);
    pthread_mutex_unlock(&c->mu);
    if (g < 0) return DIST_OK; /* refused by the caller */
    dist_tensor *mine = dist_model_params(model, rc->local_id);
    int64_t off, numel;
    for (int i = 0; ps_client_assigned_shard(c->client, g, i, &off, &numel); i++) {
        dist_tensor piece = *mine;
        piece.data = (float *)mine->data + off;
        piece.ndim = 1;
        piece.shape[0] = numel;
        DIST_TRY(dist_strategy_all_reduce_tensor(s, rc->local_id, DIST_REDUCE_MEAN, &piece));
    }
    return DIST_OK;
}

static dist_status ps_apply_gradients(dist_strategy *s, dist_replica_ctx *rc, dist_tensor *grads,
                                      dist_update_fn update, void *user) {
    ps_ctx *c = ctx_of(s);
    dist_update_rule rule;
    DIST_TRY(dist_update_rule_of(update, user, &rule));
    /* the worker's replicas are in sync with each other: their gradients are summed first */
    DIST_TRY(dist_strategy_all_reduce_tensor(s, rc->local_id, DIST_REDUCE_SUM, grads));
    if (rule.model && s->num_replicas > 1) DIST_TRY(mean_non_trainable(s, c, rc, rule.model));
    if (rc->local_id != 0) return DIST_OK;
    pthread_mutex_lock(&c->mu);
    dist_status st = DIST_OK;
    if (!rule.model) { /* strategy variables: each is a group of its own */
        for (int i = 0; i < rule.num_variables && st == DIST_OK; i++) {
            dist_tensor *copies[DIST_MAX_REPLICAS] = {dist_variable_value(rule.variables[i], 0)};
            int vg = group_of(c, copies);
            if (vg < 0) {
                st = dist_error(DIST_INVALID_ARGUMENT,
                                "parameter_server: variable '%s' was not created in this "
                                "strategy's scope",
                                dist_variable_name(rule.variables[i]));
                break;
            }
            dist_tensor piece = *grads;
            piece.data = (float *)grads->data + rule.offsets[i];
            piece.ndim = 1;
            piece.shape[0] = ps_client_group_numel(c->client, vg);
            st = push(s, c, vg, &rule, &piece);
        }
        if (st == DIST_OK && c->cl->role == PS_ROLE_WORKER) st = ps_client_prefetch(c->client);
        pthread_mutex_unlock(&c->mu);
        if (st != DIST_OK) return dist_error_context(st, "parameter_server: pushing the gradients");
        return DIST_OK;
    }
    dist_tensor *params[DIST_MAX_REPLICAS] = {dist_model_params(rule.model, 0)};
    int g = group_of(c, params);
    if (g < 0)
        st = dist_error(DIST_INVALID_ARGUMENT,
                        "parameter_server: the model was not built in this strategy's scope");
    else if (dist_tensor_numel(grads) != ps_client_group_numel(c->client, g))
        st = dist_error(DIST_INTERNAL, "parameter_server: %lld gradients for %lld variables",
                        (long long)dist_tensor_numel(grads),
                        (long long)ps_client_group_numel(c->client, g));
    if (st == DIST_OK) st = push(s, c, g, &rule, grads);
    if (st == DIST_OK && c->cl->role == PS_ROLE_WORKER) st = ps_client_prefetch(c->client);
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
    ps_client_destroy(c->client); /* before the cluster it borrows */
    free(c->blocks);
    free(c->staging);
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
    DIST_TRY(ps_cluster_resolve(&o->cluster, &c->cl));
    /* each request's deadline: the strategy's collective deadline */
    DIST_TRY(
        ps_client_create(c->cl, o->ps.variable_partitioner, s->collective_timeout_s, &c->client));
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
    int n = ps_client_num_placed(c->client);
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
    ps_client_placed(c->client, i, out);
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
    return ps_client_drain_pushes(ctx_of(s)->client);
}

static void client_seconds(void *user, double *pull_s, double *push_s) {
    dist_strategy *s = user;
    *pull_s = *push_s = 0;
    if (ctx_of(s)->client) ps_client_seconds(ctx_of(s)->client, pull_s, push_s);
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
                             .after_closure = drain_pushes,
                             .client_seconds = client_seconds};
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
