/* A callback's state in the training state's checkpoint (dist_callback's save_state and
 * restore_state): one metadata entry "<prefix><name>" per callback. */
#ifndef DIST_TRAIN_CALLBACK_STATE_H
#define DIST_TRAIN_CALLBACK_STATE_H

#include "dist/checkpoint.h"

#include <stdio.h>

static inline dist_status callback_state_set(dist_checkpoint *c, const char *prefix,
                                             const char *name, const char *value) {
    char key[128];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    return dist_checkpoint_set_metadata(c, key, value);
}

/* NULL when the checkpoint was saved without this callback: it then starts afresh. */
static inline const char *callback_state_get(const dist_checkpoint *c, const char *prefix,
                                             const char *name) {
    char key[128];
    snprintf(key, sizeof key, "%s%s", prefix, name);
    return dist_checkpoint_metadata(c, key);
}

#endif
