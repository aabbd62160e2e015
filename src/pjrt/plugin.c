/* Loading a PJRT plugin: dlopen, GetPjrtApi, version negotiation, the function table read by
 * slot, PJRT_Plugin_Initialize once; and turning PJRT errors into dist_status.
 *
 * Plugins are never dlclose()d: a plugin's threads and static destructors outlive any client
 * (libtpu and the XLA CPU plugin both start thread pools), and unloading under them crashes.
 * So loaded plugins are kept in one process-wide list, keyed by path and by table address (two
 * paths to one file share one initialization). */
#include "core/error.h"
#include "pjrt/pjrt_impl.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static pthread_mutex_t plugins_lock = PTHREAD_MUTEX_INITIALIZER;
static struct dist_pjrt_plugin *plugins;

static const struct {
    int slot;
    const char *name;
} used_slots[] = {
    {DIST_PJRT_SLOT_ERROR_DESTROY, "PJRT_Error_Destroy"},
    {DIST_PJRT_SLOT_ERROR_MESSAGE, "PJRT_Error_Message"},
    {DIST_PJRT_SLOT_ERROR_GET_CODE, "PJRT_Error_GetCode"},
    {DIST_PJRT_SLOT_PLUGIN_INITIALIZE, "PJRT_Plugin_Initialize"},
    {DIST_PJRT_SLOT_EVENT_DESTROY, "PJRT_Event_Destroy"},
    {DIST_PJRT_SLOT_EVENT_AWAIT, "PJRT_Event_Await"},
    {DIST_PJRT_SLOT_CLIENT_CREATE, "PJRT_Client_Create"},
    {DIST_PJRT_SLOT_CLIENT_DESTROY, "PJRT_Client_Destroy"},
    {DIST_PJRT_SLOT_CLIENT_PLATFORM_NAME, "PJRT_Client_PlatformName"},
    {DIST_PJRT_SLOT_CLIENT_ADDRESSABLE_DEVICES, "PJRT_Client_AddressableDevices"},
    {DIST_PJRT_SLOT_CLIENT_COMPILE, "PJRT_Client_Compile"},
    {DIST_PJRT_SLOT_CLIENT_BUFFER_FROM_HOST, "PJRT_Client_BufferFromHostBuffer"},
    {DIST_PJRT_SLOT_EXECUTABLE_DESTROY, "PJRT_Executable_Destroy"},
    {DIST_PJRT_SLOT_EXECUTABLE_NUM_OUTPUTS, "PJRT_Executable_NumOutputs"},
    {DIST_PJRT_SLOT_LOADED_DESTROY, "PJRT_LoadedExecutable_Destroy"},
    {DIST_PJRT_SLOT_LOADED_GET_EXECUTABLE, "PJRT_LoadedExecutable_GetExecutable"},
    {DIST_PJRT_SLOT_LOADED_EXECUTE, "PJRT_LoadedExecutable_Execute"},
    {DIST_PJRT_SLOT_BUFFER_DESTROY, "PJRT_Buffer_Destroy"},
    {DIST_PJRT_SLOT_BUFFER_ELEMENT_TYPE, "PJRT_Buffer_ElementType"},
    {DIST_PJRT_SLOT_BUFFER_DIMENSIONS, "PJRT_Buffer_Dimensions"},
    {DIST_PJRT_SLOT_BUFFER_TO_HOST, "PJRT_Buffer_ToHostBuffer"},
};

/* absl status codes (PJRT_Error_Code) to ours. */
static dist_status status_of_code(int code) {
    switch (code) {
    case 1: return DIST_CANCELLED;
    case 3: return DIST_INVALID_ARGUMENT;
    case 4: return DIST_TIMEOUT;
    case 5: return DIST_NOT_FOUND;
    case 8: return DIST_OUT_OF_MEMORY;
    case 9: return DIST_INVALID_USAGE; /* failed precondition */
    case 11: return DIST_OUT_OF_RANGE;
    case 12: return DIST_UNSUPPORTED;
    case 14: return DIST_UNAVAILABLE;
    default: return DIST_INTERNAL; /* unknown, internal, data loss, aborted, ... */
    }
}

dist_status dist_pjrt_take_error(const dist_pjrt_plugin *p, dist_pjrt_c_error *err,
                                 const char *what) {
    if (err == NULL) return DIST_OK;
    dist_pjrt_error_message_args m = {0};
    m.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_error_message_args, message_size);
    m.error = err;
    ((dist_pjrt_void_fn)p->fn[DIST_PJRT_SLOT_ERROR_MESSAGE])(&m);
    dist_pjrt_error_code_args c = {0};
    c.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_error_code_args, code);
    c.error = err;
    int code = 2;
    dist_pjrt_c_error *cerr = ((dist_pjrt_fn)p->fn[DIST_PJRT_SLOT_ERROR_GET_CODE])(&c);
    if (cerr == NULL) code = c.code;
    int len = m.message ? (int)(m.message_size > 4000 ? 4000 : m.message_size) : 0;
    const char *msg = m.message ? m.message : "(no message)";
    /* A plugin newer than our declarations refuses our argument structs by their size
     * ("Unexpected PJRT_X_Args size: expected 96, got 88"): say which versions disagree. */
    int size_refusal = p->minor > DIST_PJRT_API_MINOR && m.message &&
                       memmem(m.message, m.message_size, " size", 5) &&
                       memmem(m.message, m.message_size, "xpected", 7);
    dist_status st;
    if (size_refusal)
        st = dist_error(DIST_UNSUPPORTED,
                        "PJRT plugin '%s' (C API %d.%d) refused an argument struct of libdist's "
                        "declarations (C API %d.%d) while %s: %.*s",
                        p->path, p->major, p->minor, DIST_PJRT_API_MAJOR, DIST_PJRT_API_MINOR, what,
                        len, msg);
    else
        st =
            dist_error(status_of_code(code), "PJRT plugin '%s': %s: %.*s", p->path, what, len, msg);
    dist_pjrt_error_destroy_args d = {0};
    d.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_error_destroy_args, error);
    if (cerr != NULL) {
        d.error = cerr;
        ((dist_pjrt_void_fn)p->fn[DIST_PJRT_SLOT_ERROR_DESTROY])(&d);
    }
    d.error = err;
    ((dist_pjrt_void_fn)p->fn[DIST_PJRT_SLOT_ERROR_DESTROY])(&d);
    return st;
}

dist_status dist_pjrt_call(const dist_pjrt_plugin *p, int slot, void *args, const char *what) {
    return dist_pjrt_take_error(p, ((dist_pjrt_fn)p->fn[slot])(args), what);
}

void dist_pjrt_call_quietly(const dist_pjrt_plugin *p, int slot, void *args) {
    dist_pjrt_c_error *err = ((dist_pjrt_fn)p->fn[slot])(args);
    if (err == NULL) return;
    dist_pjrt_error_destroy_args d = {0};
    d.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_error_destroy_args, error);
    d.error = err;
    ((dist_pjrt_void_fn)p->fn[DIST_PJRT_SLOT_ERROR_DESTROY])(&d);
}

dist_status dist_pjrt_await(const dist_pjrt_plugin *p, dist_pjrt_c_event *event, const char *what) {
    if (event == NULL) return DIST_OK;
    dist_pjrt_event_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_event_args, event);
    a.event = event;
    dist_status st = dist_pjrt_call(p, DIST_PJRT_SLOT_EVENT_AWAIT, &a, what);
    dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_EVENT_DESTROY, &a);
    return st;
}

/* Checks the table GetPjrtApi returned and copies the entries we call into p->fn. */
static dist_status read_table(struct dist_pjrt_plugin *p, const char *path) {
    dist_pjrt_c_api_head head;
    memcpy(&head, p->api, sizeof head);
    if (head.struct_size < sizeof head)
        return dist_error(DIST_UNSUPPORTED,
                          "PJRT plugin '%s': its function table is %zu bytes, smaller than the "
                          "table's own header (%zu bytes): not a PJRT plugin, or a broken one",
                          path, head.struct_size, sizeof head);
    p->major = head.version.major_version;
    p->minor = head.version.minor_version;
    if (p->major != DIST_PJRT_API_MAJOR)
        return dist_error(DIST_UNSUPPORTED,
                          "PJRT plugin '%s' implements PJRT C API %d.%d; libdist speaks major "
                          "version %d only (0.%d to 0.%d, newer 0.x minors are tried)",
                          path, p->major, p->minor, DIST_PJRT_API_MAJOR, DIST_PJRT_API_MIN_MINOR,
                          DIST_PJRT_API_MINOR);
    if (p->minor < DIST_PJRT_API_MIN_MINOR)
        return dist_error(DIST_UNSUPPORTED,
                          "PJRT plugin '%s' implements PJRT C API %d.%d, older than the oldest "
                          "libdist supports (%d.%d): install a newer plugin",
                          path, p->major, p->minor, DIST_PJRT_API_MAJOR, DIST_PJRT_API_MIN_MINOR);
    size_t entries = (head.struct_size - sizeof head) / sizeof(void *);
    for (size_t i = 0; i < sizeof used_slots / sizeof used_slots[0]; i++) {
        int slot = used_slots[i].slot;
        size_t end = DIST_PJRT_SLOT_OFFSET(slot) + sizeof(void *);
        if (end > head.struct_size)
            return dist_error(DIST_UNSUPPORTED,
                              "PJRT plugin '%s' (C API %d.%d): its function table is too short "
                              "(struct_size %zu bytes, %zu entries) for %s (slot %d); libdist "
                              "needs %d entries",
                              path, p->major, p->minor, head.struct_size, entries,
                              used_slots[i].name, slot, (int)DIST_PJRT_SLOT_COUNT);
        memcpy(&p->fn[slot], (const char *)p->api + DIST_PJRT_SLOT_OFFSET(slot), sizeof(void *));
        if (p->fn[slot] == NULL)
            return dist_error(DIST_UNSUPPORTED,
                              "PJRT plugin '%s' (C API %d.%d) leaves %s (slot %d) empty", path,
                              p->major, p->minor, used_slots[i].name, slot);
    }
    return DIST_OK;
}

static dist_status open_plugin(const char *path, struct dist_pjrt_plugin *p, void **handle) {
    dlerror();
    *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (*handle == NULL) {
        const char *why = dlerror();
        struct stat sb;
        int missing = strchr(path, '/') ? stat(path, &sb) != 0 : 1;
        return dist_error(missing ? DIST_NOT_FOUND : DIST_UNSUPPORTED,
                          "PJRT plugin '%s' could not be loaded: %s", path,
                          why ? why : "unknown dlopen error");
    }
    void *sym = dlsym(*handle, "GetPjrtApi");
    if (sym == NULL)
        return dist_error(DIST_UNSUPPORTED,
                          "'%s' is not a PJRT plugin: it has no GetPjrtApi symbol", path);
    dist_pjrt_get_api_fn get_api;
    memcpy(&get_api, &sym, sizeof get_api);
    p->api = get_api();
    if (p->api == NULL)
        return dist_error(DIST_UNSUPPORTED, "PJRT plugin '%s': GetPjrtApi returned NULL", path);
    return read_table(p, path);
}

dist_status dist_pjrt_plugin_load(const char *path, dist_pjrt_plugin **out) {
    DIST_CHECK_ARG(path != NULL && path[0] != '\0' && out != NULL,
                   "dist_pjrt_plugin_load: path and out must be given");
    *out = NULL;
    pthread_mutex_lock(&plugins_lock);
    dist_status st = DIST_OK;
    struct dist_pjrt_plugin *p = NULL;
    for (p = plugins; p != NULL; p = p->next)
        if (strcmp(p->path, path) == 0) goto found;
    p = calloc(1, sizeof *p);
    char *dup = strdup(path);
    if (p == NULL || dup == NULL) {
        free(p);
        free(dup);
        p = NULL;
        st = dist_error(DIST_OUT_OF_MEMORY, "loading PJRT plugin '%s'", path);
        goto out;
    }
    p->path = dup;
    void *handle = NULL;
    st = open_plugin(path, p, &handle);
    if (st == DIST_OK) {
        /* Another path to a plugin already loaded: its table, its initialization. */
        for (struct dist_pjrt_plugin *q = plugins; q != NULL; q = q->next)
            if (q->api == p->api) {
                free(p->path);
                free(p);
                p = q;
                goto found;
            }
        dist_pjrt_plugin_init_args a = {0};
        a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_plugin_init_args, extension_start);
        st = dist_pjrt_call(p, DIST_PJRT_SLOT_PLUGIN_INITIALIZE, &a, "initializing the plugin");
    }
    if (st != DIST_OK) {
        /* Not cached, and the handle stays open: dlclose under a half-started plugin is what
         * this file avoids. */
        (void)handle;
        free(p->path);
        free(p);
        p = NULL;
        dist_error_breadcrumb(__FILE__, __LINE__);
        goto out;
    }
    p->next = plugins;
    plugins = p;
found:
    *out = p;
out:
    pthread_mutex_unlock(&plugins_lock);
    return st;
}

void dist_pjrt_plugin_version(const dist_pjrt_plugin *plugin, int *major, int *minor) {
    if (major) *major = plugin ? plugin->major : -1;
    if (minor) *minor = plugin ? plugin->minor : -1;
}
