/* What the files of src/pjrt share: the loaded plugin and the call helpers. */
#ifndef DIST_PJRT_PJRT_IMPL_H
#define DIST_PJRT_PJRT_IMPL_H

#include "pjrt/pjrt.h"
#include "pjrt/pjrt_api.h"

struct dist_pjrt_plugin {
    char *path;
    const void *api; /* the plugin's table, read by slot */
    int major, minor;
    dist_pjrt_any_fn fn[DIST_PJRT_SLOT_COUNT]; /* the entries we call, NULL for slots we skip */
    struct dist_pjrt_plugin *next;             /* the cache of loaded plugins */
};

/* Turns a PJRT error into a dist_status carrying the plugin's message, prefixed with `what`
 * ("compiling the program"), and destroys the error. NULL error: DIST_OK. */
dist_status dist_pjrt_take_error(const dist_pjrt_plugin *p, dist_pjrt_c_error *err,
                                 const char *what);
/* Calls the entry in `slot` with args and converts its error as dist_pjrt_take_error does. */
dist_status dist_pjrt_call(const dist_pjrt_plugin *p, int slot, void *args, const char *what);
/* Waits for the event, destroys it; its error (if any) as a status. NULL event: DIST_OK. */
dist_status dist_pjrt_await(const dist_pjrt_plugin *p, dist_pjrt_c_event *event, const char *what);
/* Destroys a plugin object through an entry that only reports errors nobody can act on. */
void dist_pjrt_call_quietly(const dist_pjrt_plugin *p, int slot, void *args);

#endif
