/* unit.summed_update_three: test_summed_update.c's three-replica cases (mirrored over
 * cpu:0,cpu:1,cpu:2), a test of their own so that a machine with fewer than 3 cores reports
 * them skipped (exit 77) rather than passed. */
#define SUMMED_UPDATE_THREE
#include "test_summed_update.c"
