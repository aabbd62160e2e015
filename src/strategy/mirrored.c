/* mirrored (tf.distribute.MirroredStrategy): N replicas in this process that meet through an
 * in-process communicator (CPU replicas, or forced) or NCCL (every device a GPU: TF's choice
 * rule). Every entry is the shared default; what makes it mirrored is its communicator. */
#include "backend/nccl.h"
#include "collective/local_comm.h"
#include "core/env.h"
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>

static const struct dist_strategy_i mirrored_iface = {0};

static dist_status init_mirrored(dist_strategy *s, const dist_strategy_options *o) {
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    DIST_TRY(dist_strategy_devices(s->desc->devices, o->devices, devs, &n));
    int nccl = 0;
    DIST_TRY(dist_strategy_cross_device_rule(o, devs, n, &nccl));
    s->iface = &mirrored_iface;
    DIST_TRY(dist_local_replicas_init(s, devs, n, o));
    snprintf(s->cross_device, sizeof s->cross_device, "in-process");
    if (n == 1) return DIST_OK;
    if (nccl) {
        DIST_TRY(dist_backend_nccl_comm_create(n, s->replicas.backends, s->collective_timeout_s,
                                               &s->replicas_comm));
        snprintf(s->cross_device, sizeof s->cross_device, "nccl");
        return DIST_OK;
    }
    DIST_TRY(dist_comm_create_in_process(n, s->replicas.backends, s->collective_timeout_s,
                                         &s->replicas_comm));
    /* CPU replicas share the host's memory: each can update its part of every copy */
    int cpus = 1;
    for (int r = 0; r < n; r++) cpus &= devs[r].kind == DIST_DEVICE_CPU;
    s->replicas.share_updates = cpus && dist_env_flag(DIST_ENV_SHARDED_UPDATE, 1);
    return DIST_OK;
}

const dist_strategy_kind_desc dist_strategy_kind_mirrored = {
    .kind = DIST_STRATEGY_MIRRORED,
    .name = "mirrored",
    .init = init_mirrored,
    .collective_timeout_s = DIST_LOCAL_COLLECTIVE_TIMEOUT_S,
    .devices = DIST_DEFAULT_DEVICES_EVERY,
};
