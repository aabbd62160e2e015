/* The settings every worker must share, compared across the cluster before training. */
#ifndef DISTRAIN_SETTINGS_CHECK_H
#define DISTRAIN_SETTINGS_CHECK_H

#include "options.h"

#include <dist/strategy.h>

/* Gathers each worker's settings (seed, optimizer, learning rate, mixed precision, batch size,
 * epochs, steps per epoch, validation split, transport) with one strategy run and compares
 * them on every worker. Returns 0 when they agree, 2 after printing which setting differs
 * with both values, 1 when the exchange itself failed (printed). */
int distrain_check_settings(dist_strategy *strategy, const distrain_options *o);

#endif
