/* What an optimizer's update does, for strategies that apply it somewhere else: the
 * parameter-server strategy sends it with the gradients to the ps tasks, which own the
 * variables and the optimizer's slots. */
#ifndef DIST_OPTIM_UPDATE_RULE_H
#define DIST_OPTIM_UPDATE_RULE_H

#include "dist/nn.h"
#include "dist/replica.h"
#include "dist/strategy.h"

typedef enum dist_update_kind { DIST_UPDATE_ADAM = 1, DIST_UPDATE_SGD = 2 } dist_update_kind;

typedef struct dist_update_rule {
    dist_update_kind kind;
    float lr, beta1, beta2, epsilon; /* Adam (Keras's: epsilon added to sqrt(v_hat)) */
    float momentum;                  /* SGD */
    int nesterov;                    /* SGD */
    float grad_scale;                /* gradients are multiplied by it first */
    dist_model *model;               /* whose variables the gradients are for; NULL: */
    int num_variables;               /* these strategy variables', packed side by side */
    dist_variable *const *variables; /* (gradient of variables[i] at offsets[i]) */
    const int64_t *offsets;
} dist_update_rule;

/* The rule behind `update` when a dist_optimizer handed it to dist_replica_apply_gradients
 * (user is what it passed along). DIST_UNSUPPORTED for any other update function (a loss
 * scale's, a user's), naming why. */
dist_status dist_update_rule_of(dist_update_fn update, void *user, dist_update_rule *out);

#endif
