/* Where a variable made by dist_strategy_create_variable lives, for the layers above the
 * strategy that allocate beside it (the optimizer's slots). core/scope.h declared these before:
 * a core header naming the strategy's functions. */
#ifndef DIST_STRATEGY_VARIABLE_PLACEMENT_H
#define DIST_STRATEGY_VARIABLE_PLACEMENT_H

#include "core/scope.h"
#include "dist/strategy.h"

/* The placement of the strategy that made `v` (borrowed, alive as long as the strategy). */
const dist_placement *dist_variable_placement(const dist_variable *v);
/* How many local copies `v` has (0 for NULL). */
int dist_variable_num_replicas(const dist_variable *v);

#endif
