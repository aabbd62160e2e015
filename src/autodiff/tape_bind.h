/* For strategies: ties a tape to the replica context it runs in, so that the optimizer and
 * compute_average_loss reach the replica's collectives and count through the tape, and lets a
 * strategy learn when each gradient of a dist_tape_gradient call is final (the bucketed,
 * overlapped all-reduce of strategy/grad_overlap.c; the tape sits below the strategy, so it
 * is handed these function pointers and knows nothing of collectives). */
#ifndef DIST_AUTODIFF_TAPE_BIND_H
#define DIST_AUTODIFF_TAPE_BIND_H

#include "dist/tape.h"

void dist_tape_bind_replica(dist_tape *tape, dist_replica_ctx *rc);

/* Calls around one dist_tape_gradient / dist_tape_gradient_with. */
typedef struct dist_tape_gradient_hooks {
    /* The call begins with `count` gradients to write, grads[i] for sources[i] (borrowed for
     * the call). *follow = 1 asks for `ready` per gradient; 0 (the default) leaves the call as
     * without hooks. An error fails the call before anything is written. */
    dist_status (*begin)(void *user, dist_tape *t, int count, dist_tensor *const *grads,
                         int *follow);
    /* grads[index] holds its final value (on a CPU backend, in memory): no later node of the
     * reverse sweep writes it. Called in the order the sweep finishes them (reverse layer
     * order for a Sequential model: the last layer's first), each index once. An error stops
     * the sweep and fails the call. */
    dist_status (*ready)(void *user, dist_tape *t, int index, const dist_tensor *grad);
    /* The call ends with status `st` (DIST_OK: every gradient was written and reported);
     * returns the call's status, so a hook that must wait for work it started can fail it.
     * Called only after a begin that asked to follow. */
    dist_status (*end)(void *user, dist_tape *t, dist_status st);
    void *user;
} dist_tape_gradient_hooks;

/* Installs hooks on the tape (copied; NULL removes them). Every hook must be set. */
void dist_tape_set_gradient_hooks(dist_tape *tape, const dist_tape_gradient_hooks *hooks);

#endif
