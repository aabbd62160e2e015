/* For strategies: ties a tape to the replica context it runs in, so that the optimizer and
 * compute_average_loss reach the replica's collectives and count through the tape. */
#ifndef DIST_AUTODIFF_TAPE_BIND_H
#define DIST_AUTODIFF_TAPE_BIND_H

#include "dist/tape.h"

void dist_tape_bind_replica(dist_tape *tape, dist_replica_ctx *rc);

#endif
