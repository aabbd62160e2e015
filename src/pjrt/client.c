/* A PJRT client and what it makes: compiled executables, device buffers, runs on every device
 * at once. Each function fills our declaration of the argument struct (pjrt/pjrt_api.h), calls
 * the plugin's entry by slot, and turns its error into a dist_status (pjrt/plugin.c). */
#include "core/error.h"
#include "pjrt/pjrt_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dist_pjrt_client {
    dist_pjrt_plugin *plugin;
    dist_pjrt_c_client *c;
    int num_devices;
    dist_pjrt_c_device **devices; /* the addressable devices, owned by the plugin's client */
    char platform[64];
};

struct dist_pjrt_executable {
    dist_pjrt_client *client;
    dist_pjrt_c_loaded *loaded;
    int num_replicas;
    int num_outputs;
};

struct dist_pjrt_buffer {
    dist_pjrt_plugin *plugin;
    dist_pjrt_c_buffer *c;
    int device;
    size_t bytes;
};

static void destroy_c_client(dist_pjrt_plugin *p, dist_pjrt_c_client *c) {
    if (c == NULL) return;
    dist_pjrt_client_destroy_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_client_destroy_args, client);
    a.client = c;
    dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_CLIENT_DESTROY, &a);
}

dist_status dist_pjrt_client_create(dist_pjrt_plugin *plugin, int cpu_device_count,
                                    dist_pjrt_client **out) {
    DIST_CHECK_ARG(plugin != NULL && out != NULL, "dist_pjrt_client_create: plugin and out");
    DIST_CHECK_ARG(cpu_device_count >= 0, "dist_pjrt_client_create: cpu_device_count %d < 0",
                   cpu_device_count);
    *out = NULL;
    dist_status st = DIST_OK;
    dist_pjrt_client *cl = calloc(1, sizeof *cl);
    if (cl == NULL) return dist_error(DIST_OUT_OF_MEMORY, "creating a PJRT client");
    cl->plugin = plugin;

    static const char device_count_name[] = "cpu_device_count";
    dist_pjrt_named_value opt = {0};
    opt.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_named_value, value_size);
    opt.name = device_count_name;
    opt.name_size = sizeof device_count_name - 1;
    opt.type = DIST_PJRT_NAMED_INT64;
    opt.value.int64_value = cpu_device_count;
    opt.value_size = 1;
    dist_pjrt_client_create_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_client_create_args, kv_try_get_user_arg);
    if (cpu_device_count > 0) {
        a.create_options = &opt;
        a.num_options = 1;
    }
    DIST_TRY_GOTO(dist_pjrt_call(plugin, DIST_PJRT_SLOT_CLIENT_CREATE, &a, "creating a client"), st,
                  fail);
    cl->c = a.client;

    dist_pjrt_client_platform_name_args pn = {0};
    pn.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_client_platform_name_args, platform_name_size);
    pn.client = cl->c;
    DIST_TRY_GOTO(dist_pjrt_call(plugin, DIST_PJRT_SLOT_CLIENT_PLATFORM_NAME, &pn,
                                 "reading the platform name"),
                  st, fail);
    size_t n = pn.platform_name_size < sizeof cl->platform - 1 ? pn.platform_name_size
                                                               : sizeof cl->platform - 1;
    if (pn.platform_name) memcpy(cl->platform, pn.platform_name, n);
    cl->platform[n] = '\0';

    dist_pjrt_client_devices_args d = {0};
    d.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_client_devices_args, num_devices);
    d.client = cl->c;
    DIST_TRY_GOTO(dist_pjrt_call(plugin, DIST_PJRT_SLOT_CLIENT_ADDRESSABLE_DEVICES, &d,
                                 "listing the addressable devices"),
                  st, fail);
    if (d.num_devices == 0) {
        st = dist_error(DIST_UNAVAILABLE,
                        "PJRT plugin '%s': the %s client has no addressable "
                        "device",
                        plugin->path, cl->platform);
        goto fail;
    }
    cl->devices = malloc(d.num_devices * sizeof *cl->devices);
    if (cl->devices == NULL) {
        st = dist_error(DIST_OUT_OF_MEMORY, "listing PJRT devices");
        goto fail;
    }
    memcpy(cl->devices, d.devices, d.num_devices * sizeof *cl->devices);
    cl->num_devices = (int)d.num_devices;
    *out = cl;
    return DIST_OK;
fail:
    dist_pjrt_client_destroy(cl);
    return st;
}

int dist_pjrt_client_device_count(const dist_pjrt_client *client) {
    return client ? client->num_devices : 0;
}

const char *dist_pjrt_client_platform(const dist_pjrt_client *client) {
    return client ? client->platform : "";
}

void dist_pjrt_client_destroy(dist_pjrt_client *client) {
    if (client == NULL) return;
    destroy_c_client(client->plugin, client->c);
    free(client->devices);
    free(client);
}

/* ---- compile ---- */

static void destroy_loaded(dist_pjrt_plugin *p, dist_pjrt_c_loaded *loaded) {
    if (loaded == NULL) return;
    dist_pjrt_loaded_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_loaded_args, executable);
    a.executable = loaded;
    dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_LOADED_DESTROY, &a);
}

static dist_status count_outputs(dist_pjrt_plugin *p, dist_pjrt_c_loaded *loaded, int *out) {
    dist_pjrt_loaded_get_executable_args g = {0};
    g.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_loaded_get_executable_args, executable);
    g.loaded = loaded;
    DIST_TRY(dist_pjrt_call(p, DIST_PJRT_SLOT_LOADED_GET_EXECUTABLE, &g,
                            "reading the compiled executable"));
    dist_pjrt_executable_num_outputs_args n = {0};
    n.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_executable_num_outputs_args, num_outputs);
    n.executable = g.executable;
    dist_status st = dist_pjrt_call(p, DIST_PJRT_SLOT_EXECUTABLE_NUM_OUTPUTS, &n,
                                    "counting the executable's outputs");
    dist_pjrt_executable_args d = {0};
    d.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_executable_args, executable);
    d.executable = g.executable;
    dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_EXECUTABLE_DESTROY, &d);
    if (st == DIST_OK) *out = (int)n.num_outputs;
    return st;
}

dist_status dist_pjrt_compile(dist_pjrt_client *client, const char *mlir, size_t len,
                              int num_replicas, dist_pjrt_executable **out) {
    DIST_CHECK_ARG(client != NULL && mlir != NULL && len > 0 && out != NULL,
                   "dist_pjrt_compile: client, a non-empty program and out must be given");
    *out = NULL;
    DIST_CHECK_ARG(num_replicas >= 1 && num_replicas <= client->num_devices,
                   "dist_pjrt_compile: %d replicas asked, the %s client has %d device(s)",
                   num_replicas, client->platform, client->num_devices);
    uint8_t options[64];
    size_t options_len = 0;
    DIST_TRY(dist_pjrt_compile_options_bytes(num_replicas, options, sizeof options, &options_len));

    static const char format[] = "mlir";
    dist_pjrt_program prog = {0};
    prog.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_program, format_size);
    prog.code = (char *)mlir; /* the API's field is not const; compile only reads it */
    prog.code_size = len;
    prog.format = format;
    prog.format_size = sizeof format - 1;
    dist_pjrt_client_compile_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_client_compile_args, executable);
    a.client = client->c;
    a.program = &prog;
    a.compile_options = (const char *)options;
    a.compile_options_size = options_len;
    char what[96];
    snprintf(what, sizeof what, "compiling the program for %d replica(s)", num_replicas);
    DIST_TRY(dist_pjrt_call(client->plugin, DIST_PJRT_SLOT_CLIENT_COMPILE, &a, what));

    dist_status st = DIST_OK;
    dist_pjrt_executable *e = calloc(1, sizeof *e);
    if (e == NULL) {
        st = dist_error(DIST_OUT_OF_MEMORY, "compiling a PJRT program");
        goto fail;
    }
    e->client = client;
    e->loaded = a.executable;
    e->num_replicas = num_replicas;
    DIST_TRY_GOTO(count_outputs(client->plugin, a.executable, &e->num_outputs), st, fail);
    *out = e;
    return DIST_OK;
fail:
    destroy_loaded(client->plugin, a.executable);
    free(e);
    return st;
}

int dist_pjrt_executable_num_outputs(const dist_pjrt_executable *exec) {
    return exec ? exec->num_outputs : 0;
}

int dist_pjrt_executable_num_replicas(const dist_pjrt_executable *exec) {
    return exec ? exec->num_replicas : 0;
}

void dist_pjrt_executable_destroy(dist_pjrt_executable *exec) {
    if (exec == NULL) return;
    destroy_loaded(exec->client->plugin, exec->loaded);
    free(exec);
}

/* ---- buffers ---- */

static int pjrt_type_of(dist_dtype dtype, size_t *elem) {
    switch (dtype) {
    case DIST_F32: *elem = 4; return DIST_PJRT_TYPE_F32;
    case DIST_I32: *elem = 4; return DIST_PJRT_TYPE_S32;
    case DIST_I64: *elem = 8; return DIST_PJRT_TYPE_S64;
    case DIST_BF16: *elem = 2; return DIST_PJRT_TYPE_BF16;
    case DIST_F16: *elem = 2; return DIST_PJRT_TYPE_F16;
    case DIST_U8: *elem = 1; return DIST_PJRT_TYPE_U8;
    default: return -1;
    }
}

static void destroy_c_buffer(dist_pjrt_plugin *p, dist_pjrt_c_buffer *b) {
    if (b == NULL) return;
    dist_pjrt_buffer_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_args, buffer);
    a.buffer = b;
    dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_BUFFER_DESTROY, &a);
}

dist_status dist_pjrt_buffer_from_host(dist_pjrt_client *client, int device, dist_dtype dtype,
                                       int ndim, const int64_t *dims, const void *data,
                                       dist_pjrt_buffer **out) {
    DIST_CHECK_ARG(client != NULL && data != NULL && out != NULL && (ndim == 0 || dims != NULL),
                   "dist_pjrt_buffer_from_host: client, data, dims and out must be given");
    *out = NULL;
    DIST_CHECK_ARG(device >= 0 && device < client->num_devices,
                   "dist_pjrt_buffer_from_host: device %d, the %s client has %d device(s)", device,
                   client->platform, client->num_devices);
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS,
                   "dist_pjrt_buffer_from_host: ndim %d outside 0..%d", ndim, DIST_MAX_DIMS);
    size_t elem = 0;
    int type = pjrt_type_of(dtype, &elem);
    if (type < 0)
        return dist_error(DIST_UNSUPPORTED,
                          "dist_pjrt_buffer_from_host: dtype %d has no PJRT "
                          "buffer type here",
                          (int)dtype);
    size_t bytes = elem;
    for (int i = 0; i < ndim; i++) {
        DIST_CHECK_ARG(dims[i] >= 0, "dist_pjrt_buffer_from_host: dimension %d is %lld", i,
                       (long long)dims[i]);
        bytes *= (size_t)dims[i];
    }
    dist_pjrt_buffer *b = calloc(1, sizeof *b);
    if (b == NULL) return dist_error(DIST_OUT_OF_MEMORY, "allocating a PJRT buffer handle");
    b->plugin = client->plugin;
    b->device = device;
    b->bytes = bytes;

    dist_pjrt_buffer_from_host_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_from_host_args, buffer);
    a.client = client->c;
    a.data = data;
    a.type = type;
    a.dims = dims;
    a.num_dims = (size_t)ndim;
    a.host_buffer_semantics = DIST_PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL;
    a.device = client->devices[device];
    char what[64];
    snprintf(what, sizeof what, "copying %zu bytes to device %d", bytes, device);
    dist_status st =
        dist_pjrt_call(client->plugin, DIST_PJRT_SLOT_CLIENT_BUFFER_FROM_HOST, &a, what);
    if (st == DIST_OK) {
        b->c = a.buffer;
        /* The data are copied once this fires; wait so the caller may reuse `data` at once. */
        st = dist_pjrt_await(client->plugin, a.done_with_host_data, what);
    }
    if (st != DIST_OK) {
        dist_error_breadcrumb(__FILE__, __LINE__);
        dist_pjrt_buffer_destroy(b);
        return st;
    }
    *out = b;
    return DIST_OK;
}

dist_status dist_pjrt_buffer_to_host(dist_pjrt_buffer *buf, void *dst, size_t bytes) {
    DIST_CHECK_ARG(buf != NULL && (dst != NULL || bytes == 0),
                   "dist_pjrt_buffer_to_host: buffer and dst must be given");
    DIST_CHECK_ARG(bytes == buf->bytes,
                   "dist_pjrt_buffer_to_host: %zu bytes asked, the buffer holds %zu", bytes,
                   buf->bytes);
    dist_pjrt_buffer_to_host_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_to_host_args, event);
    a.src = buf->c;
    a.dst = dst;
    a.dst_size = bytes;
    char what[64];
    snprintf(what, sizeof what, "reading %zu bytes from device %d", bytes, buf->device);
    DIST_TRY(dist_pjrt_call(buf->plugin, DIST_PJRT_SLOT_BUFFER_TO_HOST, &a, what));
    DIST_TRY(dist_pjrt_await(buf->plugin, a.event, what));
    return DIST_OK;
}

dist_status dist_pjrt_buffer_shape(const dist_pjrt_buffer *buf, dist_dtype *dtype, int *ndim,
                                   int64_t dims[DIST_MAX_DIMS]) {
    DIST_CHECK_ARG(buf != NULL && dtype != NULL && ndim != NULL && dims != NULL,
                   "dist_pjrt_buffer_shape: buffer, dtype, ndim and dims must be given");
    dist_pjrt_buffer_element_type_args t = {0};
    t.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_element_type_args, type);
    t.buffer = buf->c;
    DIST_TRY(dist_pjrt_call(buf->plugin, DIST_PJRT_SLOT_BUFFER_ELEMENT_TYPE, &t,
                            "reading a buffer's element type"));
    dist_pjrt_buffer_dimensions_args d = {0};
    d.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_dimensions_args, num_dims);
    d.buffer = buf->c;
    DIST_TRY(dist_pjrt_call(buf->plugin, DIST_PJRT_SLOT_BUFFER_DIMENSIONS, &d,
                            "reading a buffer's dimensions"));
    int found = 0;
    for (int k = 0; k < DIST_DTYPE_COUNT && !found; k++) {
        size_t elem;
        if (pjrt_type_of((dist_dtype)k, &elem) == t.type) {
            *dtype = (dist_dtype)k;
            found = 1;
        }
    }
    if (!found)
        return dist_error(DIST_UNSUPPORTED,
                          "a PJRT buffer on device %d has element type %d (PJRT_Buffer_Type), "
                          "which libdist has no dtype for",
                          buf->device, t.type);
    if (d.num_dims > DIST_MAX_DIMS)
        return dist_error(DIST_UNSUPPORTED,
                          "a PJRT buffer on device %d has %zu dimensions, libdist at most %d",
                          buf->device, d.num_dims, DIST_MAX_DIMS);
    *ndim = (int)d.num_dims;
    for (size_t i = 0; i < d.num_dims; i++) dims[i] = d.dims[i];
    return DIST_OK;
}

size_t dist_pjrt_buffer_bytes(const dist_pjrt_buffer *buf) { return buf ? buf->bytes : 0; }

void dist_pjrt_buffer_destroy(dist_pjrt_buffer *buf) {
    if (buf == NULL) return;
    destroy_c_buffer(buf->plugin, buf->c);
    free(buf);
}

/* ---- execute ---- */

/* Output sizes are not known before the run; we read them from the plugin only on demand, so
 * an output's dense size comes from its host copy request (to_host with dst NULL). */
static dist_status output_bytes(dist_pjrt_plugin *p, dist_pjrt_c_buffer *b, size_t *bytes) {
    dist_pjrt_buffer_to_host_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_buffer_to_host_args, event);
    a.src = b;
    DIST_TRY(dist_pjrt_call(p, DIST_PJRT_SLOT_BUFFER_TO_HOST, &a, "sizing an output buffer"));
    DIST_TRY(dist_pjrt_await(p, a.event, "sizing an output buffer"));
    *bytes = a.dst_size;
    return DIST_OK;
}

dist_status dist_pjrt_execute(dist_pjrt_executable *exec, int num_devices, int num_args,
                              dist_pjrt_buffer *const *args, int num_outputs,
                              dist_pjrt_buffer **outs) {
    DIST_CHECK_ARG(exec != NULL && outs != NULL && (num_args == 0 || args != NULL),
                   "dist_pjrt_execute: executable, args and outs must be given");
    DIST_CHECK_ARG(num_devices == exec->num_replicas,
                   "dist_pjrt_execute: %d device(s) given, the executable was compiled for %d "
                   "replica(s)",
                   num_devices, exec->num_replicas);
    DIST_CHECK_ARG(num_outputs == exec->num_outputs,
                   "dist_pjrt_execute: room for %d output(s) per device, the executable has %d",
                   num_outputs, exec->num_outputs);
    DIST_CHECK_ARG(num_args >= 0, "dist_pjrt_execute: num_args %d", num_args);
    for (int d = 0; d < num_devices; d++)
        for (int i = 0; i < num_args; i++) {
            const dist_pjrt_buffer *b = args[d * num_args + i];
            DIST_CHECK_ARG(b != NULL, "dist_pjrt_execute: argument %d of device %d is NULL", i, d);
            DIST_CHECK_ARG(b->device == d,
                           "dist_pjrt_execute: argument %d of device %d lives on device %d", i, d,
                           b->device);
        }
    dist_pjrt_plugin *p = exec->client->plugin;
    size_t nd = (size_t)num_devices, na = (size_t)num_args, no = (size_t)num_outputs;
    for (size_t k = 0; k < nd * no; k++) outs[k] = NULL;

    dist_status st = DIST_OK;
    dist_pjrt_c_buffer **arg_flat = calloc(nd * na + 1, sizeof *arg_flat);
    dist_pjrt_c_buffer **out_flat = calloc(nd * no + 1, sizeof *out_flat);
    dist_pjrt_c_buffer ***arg_lists = calloc(nd, sizeof *arg_lists);
    dist_pjrt_c_buffer ***out_lists = calloc(nd, sizeof *out_lists);
    dist_pjrt_c_event **events = calloc(nd, sizeof *events);
    if (!arg_flat || !out_flat || !arg_lists || !out_lists || !events) {
        st = dist_error(DIST_OUT_OF_MEMORY, "preparing a PJRT run on %d device(s)", num_devices);
        goto out;
    }
    for (size_t d = 0; d < nd; d++) {
        for (size_t i = 0; i < na; i++) arg_flat[d * na + i] = args[d * na + i]->c;
        arg_lists[d] = arg_flat + d * na;
        out_lists[d] = out_flat + d * no;
    }
    dist_pjrt_execute_options opts = {0};
    opts.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_execute_options, incarnation_ids);
    dist_pjrt_execute_args a = {0};
    a.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_execute_args, execute_device);
    a.executable = exec->loaded;
    a.options = &opts;
    a.argument_lists = (dist_pjrt_c_buffer *const *const *)arg_lists;
    a.num_devices = nd;
    a.num_args = na;
    a.output_lists = out_lists;
    a.device_complete_events = events;
    char what[64];
    snprintf(what, sizeof what, "executing on %d device(s)", num_devices);
    DIST_TRY_GOTO(dist_pjrt_call(p, DIST_PJRT_SLOT_LOADED_EXECUTE, &a, what), st, out);
    /* Await every device, even after one failed, so no event outlives this call. */
    for (size_t d = 0; d < nd; d++) {
        dist_status sd = dist_pjrt_await(p, events[d], what);
        events[d] = NULL;
        if (sd != DIST_OK && st == DIST_OK) st = sd;
    }
    if (st != DIST_OK) goto out;
    for (size_t k = 0; k < nd * no; k++) {
        dist_pjrt_buffer *b = calloc(1, sizeof *b);
        if (b == NULL) {
            st = dist_error(DIST_OUT_OF_MEMORY, "wrapping PJRT outputs");
            goto out;
        }
        b->plugin = p;
        b->device = (int)(k / no);
        b->c = out_flat[k];
        out_flat[k] = NULL;
        outs[k] = b;
        DIST_TRY_GOTO(output_bytes(p, b->c, &b->bytes), st, out);
    }
out:
    if (st != DIST_OK) {
        for (size_t k = 0; k < nd * no; k++) {
            dist_pjrt_buffer_destroy(outs[k]);
            outs[k] = NULL;
        }
        if (out_flat)
            for (size_t k = 0; k < nd * no; k++) destroy_c_buffer(p, out_flat[k]);
    }
    if (events)
        for (size_t d = 0; d < nd; d++) {
            dist_pjrt_event_args e = {0};
            e.struct_size = DIST_PJRT_ARGS_SIZE(dist_pjrt_event_args, event);
            e.event = events[d];
            if (e.event) dist_pjrt_call_quietly(p, DIST_PJRT_SLOT_EVENT_DESTROY, &e);
        }
    free(arg_flat);
    free(out_flat);
    free(arg_lists);
    free(out_lists);
    free(events);
    return st;
}
