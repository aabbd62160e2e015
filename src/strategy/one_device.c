/* one_device (tf.distribute.OneDeviceStrategy): one replica, nothing to meet. Every entry is
 * the shared default: run on the local replica, no aggregation, variables on its device. */
#include "core/error.h"
#include "strategy/strategy_impl.h"

#include <stdio.h>

static const struct dist_strategy_i one_device_iface = {0};

static dist_status init_one_device(dist_strategy *s, const dist_strategy_options *o) {
    dist_device devs[DIST_MAX_REPLICAS];
    int n = 0;
    DIST_TRY(dist_strategy_devices(s->desc->devices, o->devices, devs, &n));
    if (n != 1)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "one_device takes exactly one device, got %d ('%s')", n, o->devices);
    int nccl = 0; /* one replica: nothing to meet, but a forced NCCL must still be possible */
    DIST_TRY(dist_strategy_cross_device_rule(o, devs, n, &nccl));
    s->iface = &one_device_iface;
    snprintf(s->cross_device, sizeof s->cross_device, "in-process");
    return dist_local_replicas_init(s, devs, n, o);
}

const dist_strategy_kind_desc dist_strategy_kind_one_device = {
    .kind = DIST_STRATEGY_ONE_DEVICE,
    .name = "one_device",
    .init = init_one_device,
    .collective_timeout_s = DIST_LOCAL_COLLECTIVE_TIMEOUT_S,
    .devices = DIST_DEFAULT_DEVICES_ONE,
};
