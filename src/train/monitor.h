/* Which way a monitored metric improves, by each Keras callback's own "auto" rule. */
#ifndef DIST_TRAIN_MONITOR_H
#define DIST_TRAIN_MONITOR_H

#include "dist/fit.h"

#include <string.h>

/* EarlyStopping: names ending in "acc", "accuracy" or "auc" improve upwards. */
static inline int monitor_max_by_suffix(const char *monitor, dist_monitor_mode mode) {
    if (mode != DIST_MODE_AUTO) return mode == DIST_MODE_MAX;
    size_t n = strlen(monitor);
    static const char *const up[] = {"acc", "accuracy", "auc"};
    for (int i = 0; i < 3; i++) {
        size_t k = strlen(up[i]);
        if (n >= k && strcmp(monitor + n - k, up[i]) == 0) return 1;
    }
    return 0;
}

/* ReduceLROnPlateau and ModelCheckpoint: names containing "acc" (or starting with "fmeasure",
 * ModelCheckpoint) improve upwards. */
static inline int monitor_max_by_substring(const char *monitor, dist_monitor_mode mode) {
    if (mode != DIST_MODE_AUTO) return mode == DIST_MODE_MAX;
    return strstr(monitor, "acc") != NULL || strncmp(monitor, "fmeasure", 8) == 0;
}

#endif
