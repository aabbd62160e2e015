/* Our declarations of the part of the PJRT C API that src/pjrt uses.
 *
 * Written from the public header's rules (xla/pjrt/c/pjrt_c_api.h), not copied from it:
 *   - every argument struct starts with struct_size and an extension pointer; the caller sets
 *     struct_size to the offset of the struct's last field plus that field's size
 *     (DIST_PJRT_ARGS_SIZE), and a plugin refuses a struct_size smaller than its own;
 *   - the function table (what GetPjrtApi returns) only ever grows at its end, so an entry
 *     is read by its slot, after checking that the slot lies inside the table's struct_size;
 *   - every call returns an error object (NULL: success) that the caller must destroy.
 * The layouts are those of API 0.94; a plugin with a newer minor is tried, and a struct-size
 * refusal from it is reported naming both versions (pjrt/plugin.c). */
#ifndef DIST_PJRT_PJRT_API_H
#define DIST_PJRT_PJRT_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define DIST_PJRT_API_MAJOR 0
#define DIST_PJRT_API_MINOR 94
/* The oldest plugin we accept (issue #16's floor). Nothing older has been tried: the plugins
 * tested are 0.115 (the XLA CPU plugin) and 0.117 (libtpu 0.0.52). */
#define DIST_PJRT_API_MIN_MINOR 57

/* struct_size for an argument struct: up to the end of its last field, not sizeof (which may
 * add tail padding that an older plugin would not expect). */
#define DIST_PJRT_ARGS_SIZE(type, last) (offsetof(type, last) + sizeof(((type *)0)->last))

typedef struct dist_pjrt_c_error dist_pjrt_c_error;   /* PJRT_Error */
typedef struct dist_pjrt_c_event dist_pjrt_c_event;   /* PJRT_Event */
typedef struct dist_pjrt_c_client dist_pjrt_c_client; /* PJRT_Client */
typedef struct dist_pjrt_c_device dist_pjrt_c_device; /* PJRT_Device */
typedef struct dist_pjrt_c_loaded dist_pjrt_c_loaded; /* PJRT_LoadedExecutable */
typedef struct dist_pjrt_c_exec dist_pjrt_c_exec;     /* PJRT_Executable */
typedef struct dist_pjrt_c_buffer dist_pjrt_c_buffer; /* PJRT_Buffer */

/* The head of every argument struct. */
#define DIST_PJRT_ARGS_HEAD                                                                        \
    size_t struct_size;                                                                            \
    void *extension_start

/* PJRT_Api_Version, embedded in the table's head. */
typedef struct dist_pjrt_c_version {
    DIST_PJRT_ARGS_HEAD;
    int major_version;
    int minor_version;
} dist_pjrt_c_version;

/* The fixed head of the function table; the function pointers follow it, one per slot. */
typedef struct dist_pjrt_c_api_head {
    size_t struct_size;
    void *extension_start;
    dist_pjrt_c_version version;
} dist_pjrt_c_api_head;

/* Slots of the entries we call, counted from the first function pointer. */
enum dist_pjrt_slot {
    DIST_PJRT_SLOT_ERROR_DESTROY = 0,
    DIST_PJRT_SLOT_ERROR_MESSAGE = 1,
    DIST_PJRT_SLOT_ERROR_GET_CODE = 2,
    DIST_PJRT_SLOT_PLUGIN_INITIALIZE = 3,
    DIST_PJRT_SLOT_EVENT_DESTROY = 5,
    DIST_PJRT_SLOT_EVENT_AWAIT = 8,
    DIST_PJRT_SLOT_CLIENT_CREATE = 10,
    DIST_PJRT_SLOT_CLIENT_DESTROY = 11,
    DIST_PJRT_SLOT_CLIENT_PLATFORM_NAME = 12,
    DIST_PJRT_SLOT_CLIENT_ADDRESSABLE_DEVICES = 16,
    DIST_PJRT_SLOT_CLIENT_COMPILE = 20,
    DIST_PJRT_SLOT_CLIENT_BUFFER_FROM_HOST = 22,
    DIST_PJRT_SLOT_EXECUTABLE_DESTROY = 40,
    DIST_PJRT_SLOT_EXECUTABLE_NUM_OUTPUTS = 44,
    DIST_PJRT_SLOT_LOADED_DESTROY = 50,
    DIST_PJRT_SLOT_LOADED_GET_EXECUTABLE = 51,
    DIST_PJRT_SLOT_LOADED_EXECUTE = 55,
    DIST_PJRT_SLOT_BUFFER_DESTROY = 58,
    DIST_PJRT_SLOT_BUFFER_ELEMENT_TYPE = 59,
    DIST_PJRT_SLOT_BUFFER_DIMENSIONS = 60,
    DIST_PJRT_SLOT_BUFFER_TO_HOST = 70,
    DIST_PJRT_SLOT_COUNT = 71 /* the table must hold at least this many entries */
};

/* The byte offset of a slot's entry in the table. */
#define DIST_PJRT_SLOT_OFFSET(slot) (sizeof(dist_pjrt_c_api_head) + (size_t)(slot) * sizeof(void *))

/* ---- errors ---- */
typedef struct dist_pjrt_error_destroy_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_error *error;
} dist_pjrt_error_destroy_args;

typedef struct dist_pjrt_error_message_args {
    DIST_PJRT_ARGS_HEAD;
    const dist_pjrt_c_error *error;
    const char *message; /* out, lives as long as the error */
    size_t message_size; /* out */
} dist_pjrt_error_message_args;

typedef struct dist_pjrt_error_code_args {
    DIST_PJRT_ARGS_HEAD;
    const dist_pjrt_c_error *error;
    int code; /* out: absl status codes (3 invalid argument, 5 not found, 12 unimplemented...) */
} dist_pjrt_error_code_args;

/* ---- plugin ---- */
typedef struct dist_pjrt_plugin_init_args {
    DIST_PJRT_ARGS_HEAD;
} dist_pjrt_plugin_init_args;

/* ---- events ---- */
typedef struct dist_pjrt_event_args { /* destroy and await share this layout */
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_event *event;
} dist_pjrt_event_args;

/* ---- named values (client create options) ---- */
enum { DIST_PJRT_NAMED_STRING = 0, DIST_PJRT_NAMED_INT64 = 1, DIST_PJRT_NAMED_BOOL = 4 };

typedef struct dist_pjrt_named_value {
    DIST_PJRT_ARGS_HEAD;
    const char *name;
    size_t name_size;
    int type;
    union {
        const char *string_value;
        int64_t int64_value;
        bool bool_value;
    } value;
    size_t value_size; /* 1 for a scalar */
} dist_pjrt_named_value;

/* ---- client ---- */
typedef struct dist_pjrt_client_create_args {
    DIST_PJRT_ARGS_HEAD;
    const dist_pjrt_named_value *create_options;
    size_t num_options;
    void *kv_get_callback;
    void *kv_get_user_arg;
    void *kv_put_callback;
    void *kv_put_user_arg;
    dist_pjrt_c_client *client; /* out */
    void *kv_try_get_callback;
    void *kv_try_get_user_arg;
} dist_pjrt_client_create_args;

typedef struct dist_pjrt_client_destroy_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_client *client;
} dist_pjrt_client_destroy_args;

typedef struct dist_pjrt_client_platform_name_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_client *client;
    const char *platform_name; /* out, lives as long as the client */
    size_t platform_name_size; /* out */
} dist_pjrt_client_platform_name_args;

typedef struct dist_pjrt_client_devices_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_client *client;
    dist_pjrt_c_device *const *devices; /* out, lives as long as the client */
    size_t num_devices;                 /* out */
} dist_pjrt_client_devices_args;

typedef struct dist_pjrt_program {
    DIST_PJRT_ARGS_HEAD;
    char *code;
    size_t code_size;
    const char *format; /* "mlir": MLIR text or bytecode */
    size_t format_size;
} dist_pjrt_program;

typedef struct dist_pjrt_client_compile_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_client *client;
    const dist_pjrt_program *program;
    const char *compile_options; /* a serialized xla.CompileOptionsProto */
    size_t compile_options_size;
    dist_pjrt_c_loaded *executable; /* out */
} dist_pjrt_client_compile_args;

/* Element types: the PJRT_Buffer_Type numbering. */
enum {
    DIST_PJRT_TYPE_S32 = 4,
    DIST_PJRT_TYPE_S64 = 5,
    DIST_PJRT_TYPE_U8 = 6,
    DIST_PJRT_TYPE_F16 = 10,
    DIST_PJRT_TYPE_F32 = 11,
    DIST_PJRT_TYPE_BF16 = 13
};

/* Host buffer semantics: the runtime copies the data before the call returns. */
enum { DIST_PJRT_HOST_IMMUTABLE_ONLY_DURING_CALL = 0 };

typedef struct dist_pjrt_buffer_from_host_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_client *client;
    const void *data;
    int type;
    const int64_t *dims;
    size_t num_dims;
    const int64_t *byte_strides; /* NULL: dense, row-major */
    size_t num_byte_strides;
    int host_buffer_semantics;
    dist_pjrt_c_device *device;
    void *memory;                           /* NULL: the device's default memory */
    void *device_layout;                    /* NULL: dense, row-major */
    dist_pjrt_c_event *done_with_host_data; /* out */
    dist_pjrt_c_buffer *buffer;             /* out */
} dist_pjrt_buffer_from_host_args;

/* ---- executables ---- */
typedef struct dist_pjrt_loaded_args { /* loaded-executable destroy */
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_loaded *executable;
} dist_pjrt_loaded_args;

typedef struct dist_pjrt_loaded_get_executable_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_loaded *loaded;
    dist_pjrt_c_exec *executable; /* out, destroyed with the executable destroy entry */
} dist_pjrt_loaded_get_executable_args;

typedef struct dist_pjrt_executable_args { /* executable destroy */
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_exec *executable;
} dist_pjrt_executable_args;

typedef struct dist_pjrt_executable_num_outputs_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_exec *executable;
    size_t num_outputs; /* out */
} dist_pjrt_executable_num_outputs_args;

typedef struct dist_pjrt_execute_options {
    DIST_PJRT_ARGS_HEAD;
    void **send_callbacks;
    void **recv_callbacks;
    size_t num_send_ops;
    size_t num_recv_ops;
    int launch_id;
    const int64_t *non_donatable_input_indices;
    size_t num_non_donatable_input_indices;
    void *context;
    const char *call_location;
    size_t num_tasks;
    int *task_ids;
    int64_t *incarnation_ids;
} dist_pjrt_execute_options;

typedef struct dist_pjrt_execute_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_loaded *executable;
    dist_pjrt_execute_options *options;
    dist_pjrt_c_buffer *const *const *argument_lists; /* [num_devices][num_args] */
    size_t num_devices;
    size_t num_args;
    dist_pjrt_c_buffer **const *output_lists;   /* [num_devices][num_outputs], filled */
    dist_pjrt_c_event **device_complete_events; /* [num_devices], filled */
    dist_pjrt_c_device *execute_device;         /* NULL: the compiled device assignment */
} dist_pjrt_execute_args;

/* ---- buffers ---- */
typedef struct dist_pjrt_buffer_args { /* buffer destroy */
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_buffer *buffer;
} dist_pjrt_buffer_args;

typedef struct dist_pjrt_buffer_element_type_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_buffer *buffer;
    int type; /* out: the PJRT_Buffer_Type numbering */
} dist_pjrt_buffer_element_type_args;

typedef struct dist_pjrt_buffer_dimensions_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_buffer *buffer;
    const int64_t *dims; /* out, lives as long as the buffer */
    size_t num_dims;     /* out */
} dist_pjrt_buffer_dimensions_args;

typedef struct dist_pjrt_buffer_to_host_args {
    DIST_PJRT_ARGS_HEAD;
    dist_pjrt_c_buffer *src;
    void *host_layout; /* NULL: the buffer's own layout (dense row-major for ours) */
    void *dst;
    size_t dst_size;
    dist_pjrt_c_event *event; /* out */
} dist_pjrt_buffer_to_host_args;

/* A table entry as stored; cast to its real type (below) to call it. */
typedef void (*dist_pjrt_any_fn)(void);
typedef dist_pjrt_c_error *(*dist_pjrt_fn)(void *args);
typedef void (*dist_pjrt_void_fn)(void *args);
typedef const void *(*dist_pjrt_get_api_fn)(void);

#endif
