/* The parameter service of a ps task: it owns variables (or shards of them) by id, serves
 * reads, and applies pushed gradients with the optimizer, whose slots live beside each
 * variable. Each connection is served on its own thread; each variable's update holds that
 * variable's lock only while it computes (never across the network), so pushes from several
 * workers apply concurrently to different variables and one after another to the same one. */
#ifndef DIST_PS_SERVER_H
#define DIST_PS_SERVER_H

#include "ps/ps_cluster.h"

#include <stdint.h>

/* The update a push asks for: Keras's Adam or SGD with the worker's hyperparameters. */
/* PS_RULE_ADD: the pushed values are added to the variable's, under its lock: the change a
 * worker's step made to a non-trainable variable it updates itself, as BatchNormalization's
 * moving statistics (TF's assign_sub((var - value) * (1 - momentum)) on the ps variable), so
 * concurrent workers' changes add up (an assignment of each worker's values lost the updates of
 * the pushes made since its step began); its slots and update count stay. */
typedef enum ps_rule_kind { PS_RULE_ADAM = 1, PS_RULE_SGD = 2, PS_RULE_ADD = 4 } ps_rule_kind;
typedef struct ps_rule {
    uint32_t kind;
    float lr, beta1, beta2, epsilon; /* Adam */
    float momentum;                  /* SGD */
    uint32_t nesterov;               /* SGD */
    float grad_scale;                /* gradients are multiplied by it first */
} ps_rule;
#define PS_RULE_BYTES 32
void ps_rule_encode(const ps_rule *r, unsigned char out[PS_RULE_BYTES]);
void ps_rule_decode(const unsigned char in[PS_RULE_BYTES], ps_rule *r);

/* Variable ids are below this (the coordinator numbers variables and shards in creation
 * order); a request naming more is refused before anything is allocated for it. */
#define PS_MAX_VARIABLES (1u << 20)

/* The slots field of a restore that sets values and leaves slots and update counts alone. */
#define PS_RESTORE_VALUES_ONLY 4u
/* ... that sets slot k (PS_RESTORE_SLOT + k, k = 0 or 1: m or momentum, v) and the update
 * count, and leaves the values alone. */
#define PS_RESTORE_SLOT 8u

typedef struct ps_server ps_server;
/* Listens on this task's address and serves every authenticated connection. */
dist_status ps_server_start(ps_cluster *cl, ps_server **out);
/* Waits until the coordinator sends shutdown (DIST_OK), or until the chief, having connected,
 * has had no connection here for the cluster's connect timeout: DIST_UNAVAILABLE saying so
 * (its job is over or it is gone; nobody will send shutdown). A ps task serves at most a few
 * connections from each task at once (ps_server.c: PS_CONNS_PER_TASK). */
dist_status ps_server_wait(ps_server *s);
/* Updates applied so far (one per variable per push). */
uint64_t ps_server_updates(const ps_server *s);
void ps_server_destroy(ps_server *s);

#endif
