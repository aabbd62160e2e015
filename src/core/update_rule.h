/* An update described as data, for strategies that apply it somewhere else: the
 * parameter-server strategy sends it with the gradients to the ps tasks, which own the
 * variables and the optimizer's slots.
 *
 * The optimizer (above the strategy) describes its update; the strategy (below the optimizer)
 * reads the description. Neither names the other: the optimizer hands
 * dist_replica_apply_gradients the update function of this header, whose user is a
 * dist_update_rule_source filled by the optimizer, and the strategy asks dist_update_rule_of. */
#ifndef DIST_CORE_UPDATE_RULE_H
#define DIST_CORE_UPDATE_RULE_H

#include "dist/replica.h"

typedef enum dist_update_kind { DIST_UPDATE_ADAM = 1, DIST_UPDATE_SGD = 2 } dist_update_kind;

struct dist_model;
struct dist_variable;

typedef struct dist_update_rule {
    dist_update_kind kind;
    float lr, beta1, beta2, epsilon;        /* Adam (Keras's: epsilon added to sqrt(v_hat)) */
    float momentum;                         /* SGD */
    int nesterov;                           /* SGD */
    float grad_scale;                       /* gradients are multiplied by it first */
    struct dist_model *model;               /* whose variables the gradients are for; NULL: */
    int num_variables;                      /* these strategy variables', packed side by side */
    struct dist_variable *const *variables; /* (gradient of variables[i] at offsets[i]) */
    const int64_t *offsets;
} dist_update_rule;

/* An update that can run here or be described for elsewhere. Borrowed by the strategy for the
 * dist_replica_apply_gradients call it was handed to; the caller owns it (on its stack). */
typedef struct dist_update_rule_source dist_update_rule_source;
struct dist_update_rule_source {
    /* Runs the update on this replica's copy (what a plain dist_update_fn does). */
    dist_status (*apply)(dist_replica_ctx *rc, dist_tensor *grads, dist_update_rule_source *src);
    /* Fills *out for a strategy that applies the update where the variables live; the source
     * learns that way that it will not run here. DIST_UNSUPPORTED naming why where the update
     * cannot be applied elsewhere. */
    dist_status (*describe)(dist_update_rule_source *src, dist_update_rule *out);
    /* 1 when apply can take the local replicas' gradients unsummed (dist_replica_ctx's
     * update_grads) and sum them itself as it updates; 0: the strategy sums them first. */
    int sums_replicas;
};

/* The dist_update_fn to hand dist_replica_apply_gradients with a dist_update_rule_source as
 * user: it calls the source's apply. */
dist_status dist_update_rule_source_fn(dist_replica_ctx *rc, dist_tensor *grads, void *user);

/* The rule behind `update` as handed to dist_replica_apply_gradients (user is what was passed
 * along): the source's description when update is dist_update_rule_source_fn, DIST_UNSUPPORTED
 * naming why for any other update function (a loss scale's, a user's). */
dist_status dist_update_rule_of(dist_update_fn update, void *user, dist_update_rule *out);

#endif
