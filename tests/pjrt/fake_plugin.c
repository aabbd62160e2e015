/* A fake PJRT plugin for the loader's error paths (tests/unit/test_pjrt.c). Built several times
 * (tests/CMakeLists.txt) with:
 *   FAKE_MAJOR, FAKE_MINOR   the API version it claims;
 *   FAKE_ENTRIES             how many function-table entries it has;
 *   FAKE_NO_GET_API          export no GetPjrtApi (an ordinary shared library);
 * Its client-create refuses our argument struct by size, as a plugin newer than our
 * declarations does, so the test can check that the message names both versions. Every other
 * entry is a stub that is never called. */
#include "pjrt/pjrt_api.h"

#include <stdlib.h>
#include <string.h>

#ifndef FAKE_MAJOR
#define FAKE_MAJOR 0
#endif
#ifndef FAKE_MINOR
#define FAKE_MINOR 200
#endif
#ifndef FAKE_ENTRIES
#define FAKE_ENTRIES DIST_PJRT_SLOT_COUNT
#endif

#define FAKE_EXPORT __attribute__((visibility("default")))

struct dist_pjrt_c_error {
    int code;
    const char *message;
};

/* How often the loader initialized this plugin (the test asserts once). */
FAKE_EXPORT int fake_pjrt_initialize_calls;

static void error_destroy(void *p) { free(((dist_pjrt_error_destroy_args *)p)->error); }

static void error_message(void *p) {
    dist_pjrt_error_message_args *a = p;
    a->message = a->error->message;
    a->message_size = strlen(a->error->message);
}

static dist_pjrt_c_error *error_get_code(void *p) {
    dist_pjrt_error_code_args *a = p;
    a->code = a->error->code;
    return NULL;
}

static dist_pjrt_c_error *plugin_initialize(void *p) {
    fake_pjrt_initialize_calls++;
    return NULL;
}

static dist_pjrt_c_error *client_create(void *p) {
    dist_pjrt_c_error *e = malloc(sizeof *e);
    if (e == NULL) return NULL;
    e->code = 3;
    e->message = "Unexpected PJRT_Client_Create_Args size: expected 4096, got 96. Check "
                 "installed software versions.";
    return e;
}

static dist_pjrt_c_error *unused(void *p) { return NULL; }

static struct {
    dist_pjrt_c_api_head head;
    dist_pjrt_any_fn fn[FAKE_ENTRIES];
} table;

static const void *get_api(void) {
    table.head.struct_size = sizeof table.head + FAKE_ENTRIES * sizeof(void *);
    table.head.version.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_c_version, minor_version);
    table.head.version.major_version = FAKE_MAJOR;
    table.head.version.minor_version = FAKE_MINOR;
    for (int i = 0; i < FAKE_ENTRIES; i++) table.fn[i] = (dist_pjrt_any_fn)unused;
    if (FAKE_ENTRIES > DIST_PJRT_SLOT_CLIENT_CREATE) {
        table.fn[DIST_PJRT_SLOT_ERROR_DESTROY] = (dist_pjrt_any_fn)error_destroy;
        table.fn[DIST_PJRT_SLOT_ERROR_MESSAGE] = (dist_pjrt_any_fn)error_message;
        table.fn[DIST_PJRT_SLOT_ERROR_GET_CODE] = (dist_pjrt_any_fn)error_get_code;
        table.fn[DIST_PJRT_SLOT_PLUGIN_INITIALIZE] = (dist_pjrt_any_fn)plugin_initialize;
        table.fn[DIST_PJRT_SLOT_CLIENT_CREATE] = (dist_pjrt_any_fn)client_create;
    }
    return &table;
}

#ifdef FAKE_NO_GET_API
FAKE_EXPORT const void *NotPjrtApi(void) { return get_api(); }
#else
FAKE_EXPORT const void *GetPjrtApi(void) { return get_api(); }
#endif
