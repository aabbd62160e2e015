/* The parameter-server client: what a chief or worker task does with the ps tasks. It places
 * variables on them (round-robin in creation order, each shard of a partitioned variable
 * counting, as in TF), keeps a link to every ps (opened on first use, authenticated by
 * ps_connect), creates, pulls, pushes gradients or values, and saves and restores optimizer
 * slots, with the frames of ps_wire.h.
 *
 * Variables come in groups: the variables of one create_variable call (a model's parameters,
 * or one strategy variable) laid out in one float block; every value and gradient crosses
 * this interface as a host block in that layout.
 *
 * A ps whose connection broke has lost its variables (or is gone): every later request to it
 * fails at once with DIST_UNAVAILABLE naming the ps and its address (TF's semantics: a lost ps
 * fails the job). Not thread-safe: the caller serializes every call on one client. */
#ifndef DIST_PS_CLIENT_H
#define DIST_PS_CLIENT_H

#include "core/scope.h"
#include "core/update_rule.h"
#include "dist/partitioner.h"
#include "dist/ps.h"
#include "ps/ps_cluster.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct ps_client ps_client;

/* A client of cl's ps tasks (cl borrowed, outliving the client); requests time out after
 * timeout_s each. partitioner: how variables are split (NULL: none). */
dist_status ps_client_create(const ps_cluster *cl, const dist_partitioner *partitioner,
                             double timeout_s, ps_client **out);
/* Reads the replies of pushes still outstanding, closes the links. NULL is a no-op. */
void ps_client_destroy(ps_client *c);

/* Places vars[0..count) (a block of numel floats) as the next group, *group its index. With
 * initial (the block's values, host) the variables are created on the ps tasks with them:
 * the chief does this; the workers place the same model to learn where it lives. */
dist_status ps_client_add_group(ps_client *c, const dist_variable_desc *vars, int count,
                                int64_t numel, const float *initial, int *group);
int ps_client_num_groups(const ps_client *c);
int64_t ps_client_group_numel(const ps_client *c, int group);

/* The values of every group k with dst[k] non-NULL into dst[k] (host, the group's layout).
 * use_prefetch: a pull that ps_client_prefetch sent is used when it is still fresh. */
dist_status ps_client_pull(ps_client *c, float *const *dst, bool use_prefetch);
/* Behind a push, a pull of every group, read by the next ps_client_pull(..., true) while it
 * is fresh: the transfer and the ps's work overlap the caller's next steps. */
dist_status ps_client_prefetch(ps_client *c);

/* The seconds spent so far in ps_client_pull (sending, the ps's work, receiving) and in
 * sending pushes and prefetches (a full socket buffer waits there): a worker's per-closure
 * summary takes differences. */
void ps_client_seconds(const ps_client *c, double *pull_s, double *push_s);

/* Pushes the gradients of the group's trainable variables (grads: host, the group's layout)
 * with rule (Adam or SGD), which the ps tasks apply. The replies are read before the next
 * request on each link (ps_client_drain_pushes reads them now). */
dist_status ps_client_push_gradients(ps_client *c, int group, const dist_update_rule *rule,
                                     const float *grads);
/* 1 when the group has non-trainable variables (a step changes them itself, as
 * BatchNormalization's moving statistics; no gradients are pushed for them). */
bool ps_client_group_has_assigned(const ps_client *c, int group);
/* The values (host, the group's layout) that the caller's copy of the group's non-trainable
 * variables starts from: what it pulled (or restored). ps_client_push_assigned pushes the change
 * from them. */
dist_status ps_client_set_assigned_base(ps_client *c, int group, const float *values);
/* The i-th non-trainable shard of the group (elements into its layout); false past the last. */
bool ps_client_assigned_shard(const ps_client *c, int group, int i, int64_t *offset,
                              int64_t *numel);
/* The change of the group's non-trainable variables since their base (values - base, values:
 * host, the group's layout) is added to theirs on the ps tasks, a read-modify-write there, and
 * values become the base. Several workers' changes add up, as TF's moving-statistics update,
 * assign_sub((var - value) * (1 - momentum)) on the ps variable: a worker whose step started
 * from values that another worker has changed since does not overwrite that worker's update,
 * as an assignment of its values would. */
dist_status ps_client_push_assigned(ps_client *c, int group, const float *values);
/* Reads the replies of every push sent so far: what was pushed is applied. */
dist_status ps_client_drain_pushes(ps_client *c);

/* The group's values (host, its layout) replace theirs on the ps tasks; the optimizer's slots
 * there stay. */
dist_status ps_client_restore_values(ps_client *c, int group, const float *values);
/* Optimizer slot `slot` (0: m or momentum, 1: v) of the group's variables, read from the ps
 * tasks into dst (host, the group's layout); a slot a ps has not made yet (no update so far)
 * reads as zeros, as Keras's. *iterations: the most updates any of them has had. */
dist_status ps_client_save_slot(ps_client *c, int group, int slot, float *dst, int64_t *iterations);
/* Slot `slot` of the group's variables replaced by src, their update count by iterations. */
dist_status ps_client_restore_slot(ps_client *c, int group, int slot, const float *src,
                                   int64_t iterations);

/* The variables and shards placed so far, in creation order. */
int ps_client_num_placed(const ps_client *c);
/* The i-th (0 <= i < ps_client_num_placed). */
void ps_client_placed(const ps_client *c, int i, dist_placed_variable *out);

#endif
