/* fuzz_cli_options parses --strategy through the library's registry (src/strategy/kinds.c),
 * whose entries are the kinds' descriptors, each defined in its kind's file beside the whole
 * strategy (constructors, backends, communicators) that the fuzz build does not compile. The
 * target links kinds.c itself with these descriptors: the same kinds and names, no constructor
 * (nothing is created while options are parsed). unit.strategy_registry checks the library's
 * names; a kind added there and not here makes the fuzz target fail to link. */
#include "strategy/strategy_impl.h"

#define FUZZ_KIND(k, value, text)                                                                  \
    const dist_strategy_kind_desc dist_strategy_kind_##k = {.kind = value, .name = text};

FUZZ_KIND(one_device, DIST_STRATEGY_ONE_DEVICE, "one_device")
FUZZ_KIND(mirrored, DIST_STRATEGY_MIRRORED, "mirrored")
FUZZ_KIND(multi_worker, DIST_STRATEGY_MULTI_WORKER, "multi_worker")
FUZZ_KIND(parameter_server, DIST_STRATEGY_PARAMETER_SERVER, "parameter_server")
FUZZ_KIND(tpu, DIST_STRATEGY_TPU, "tpu")
FUZZ_KIND(central_storage, DIST_STRATEGY_CENTRAL_STORAGE, "central_storage")
