/* The PJRT C API client: load a PJRT plugin (libtpu.so, a CPU or GPU plugin), make a client,
 * compile StableHLO (MLIR text) for N replicas, move buffers, run on all devices at once.
 *
 * Every PJRT error becomes a dist_status whose message (dist_last_error) carries the plugin's
 * own text; the plugin's error object is destroyed before the call returns. The declarations
 * of the C API we use are in pjrt/pjrt_api.h; docs/architecture.md ("PJRT") says how it fits. */
#ifndef DIST_PJRT_PJRT_H
#define DIST_PJRT_PJRT_H

#include "dist/status.h"
#include "dist/tensor.h"

#include <stddef.h>
#include <stdint.h>

typedef struct dist_pjrt_plugin dist_pjrt_plugin; /* loaded once per path, never unloaded */
typedef struct dist_pjrt_client dist_pjrt_client;
typedef struct dist_pjrt_executable dist_pjrt_executable;
typedef struct dist_pjrt_buffer dist_pjrt_buffer;

/* Loads the plugin at `path` (a file name without '/' goes through the dlopen search), checks
 * its API version (major 0, minor >= 57; a newer minor is tried) and its function table, and
 * initializes it. The same path returns the same plugin (thread-safe); plugins are never
 * unloaded, so *out stays valid for the life of the process (nothing to destroy). Errors:
 * DIST_NOT_FOUND (the file cannot be opened: dlerror's text), DIST_UNSUPPORTED (no GetPjrtApi,
 * a wrong major, a too-old minor, a table too short for the entries we call), the plugin's
 * initialize error. A failed load is not cached: the next call tries again. */
dist_status dist_pjrt_plugin_load(const char *path, dist_pjrt_plugin **out);
/* The API version the plugin was built with. */
void dist_pjrt_plugin_version(const dist_pjrt_plugin *plugin, int *major, int *minor);

/* Creates a client. cpu_device_count > 0 sends the CPU plugin's "cpu_device_count" option
 * (an int64: that many CPU devices); 0 sends no options. Devices are the client's addressable
 * devices, numbered 0..count-1 in the plugin's order. Errors: the plugin's (a TPU plugin on a
 * machine without TPUs fails here), DIST_UNAVAILABLE when the client has no addressable device. */
dist_status dist_pjrt_client_create(dist_pjrt_plugin *plugin, int cpu_device_count,
                                    dist_pjrt_client **out);
int dist_pjrt_client_device_count(const dist_pjrt_client *client);
/* "cpu", "tpu", "cuda"...: owned by the client. */
const char *dist_pjrt_client_platform(const dist_pjrt_client *client);
/* Destroys the client. Every executable and buffer made from it must be destroyed first.
 * NULL is a no-op. */
void dist_pjrt_client_destroy(dist_pjrt_client *client);

/* Compiles `mlir` (StableHLO as MLIR text or bytecode, `len` bytes; borrowed) for num_replicas
 * replicas on devices 0..num_replicas-1 (one partition). Errors: DIST_INVALID_ARGUMENT
 * (num_replicas out of 1..device count), the plugin's compile error with its message (the XLA
 * CPU plugin reports a program that does not parse as DIST_INTERNAL, "Failed to parse ..."). */
dist_status dist_pjrt_compile(dist_pjrt_client *client, const char *mlir, size_t len,
                              int num_replicas, dist_pjrt_executable **out);
int dist_pjrt_executable_num_outputs(const dist_pjrt_executable *exec);
int dist_pjrt_executable_num_replicas(const dist_pjrt_executable *exec);
/* NULL is a no-op. Buffers made by executing it stay valid. */
void dist_pjrt_executable_destroy(dist_pjrt_executable *exec);

/* Copies `data` (dense, row-major; borrowed, copied before the call returns) to `device` as a
 * new buffer of dtype DIST_F32, DIST_I32, DIST_I64, DIST_BF16, DIST_F16 or DIST_U8 and shape
 * dims[0..ndim) (ndim 0: a scalar). Errors: DIST_INVALID_ARGUMENT (device out of range, a
 * negative dimension), DIST_UNSUPPORTED (another dtype), the plugin's. */
dist_status dist_pjrt_buffer_from_host(dist_pjrt_client *client, int device, dist_dtype dtype,
                                       int ndim, const int64_t *dims, const void *data,
                                       dist_pjrt_buffer **out);
/* Copies the buffer's contents (dense, row-major) into dst and waits for the copy. `bytes` must
 * be the buffer's exact size. Errors: DIST_INVALID_ARGUMENT (a size mismatch: the message
 * gives both), the plugin's (a buffer consumed by a donation reads as an error here). */
dist_status dist_pjrt_buffer_to_host(dist_pjrt_buffer *buf, void *dst, size_t bytes);
/* The buffer's dtype and shape as the plugin holds them (an output's, after a run): *ndim
 * dimensions into dims (room for DIST_MAX_DIMS). Errors: DIST_UNSUPPORTED (an element type or a
 * rank libdist has no dist_dtype / room for: the message names it), the plugin's (a donated
 * buffer). */
dist_status dist_pjrt_buffer_shape(const dist_pjrt_buffer *buf, dist_dtype *dtype, int *ndim,
                                   int64_t dims[DIST_MAX_DIMS]);
/* Size in bytes of the buffer's dense host copy. */
size_t dist_pjrt_buffer_bytes(const dist_pjrt_buffer *buf);
/* NULL is a no-op. */
void dist_pjrt_buffer_destroy(dist_pjrt_buffer *buf);

/* Runs the executable once on num_devices devices at once (num_devices must equal its replica
 * count) and waits until every device has finished.
 *   args[d * num_args + i]: argument i on device d (borrowed; each must live on device d);
 *   outs[d * num_outputs + o]: filled with new buffers the caller owns and destroys.
 * num_outputs must equal dist_pjrt_executable_num_outputs.
 *
 * DONATION: an argument that the program aliases to an output (an input/output alias, as the
 * `tf.aliasing_output = k : i32` argument attribute makes) is consumed by the run: its device
 * memory becomes output k's. The dist_pjrt_buffer handle stays allocated but is dead (reading it
 * fails); the caller destroys it and uses output k in its place (a variable updated in place:
 * replace the variable's buffer with the output). Arguments that are not aliased are untouched.
 * On failure, outs is all NULL and nothing needs destroying. */
dist_status dist_pjrt_execute(dist_pjrt_executable *exec, int num_devices, int num_args,
                              dist_pjrt_buffer *const *args, int num_outputs,
                              dist_pjrt_buffer **outs);

/* The serialized xla.CompileOptionsProto that dist_pjrt_compile sends: executable build options
 * with device_ordinal -1 (any), num_replicas, num_partitions 1. Writes at most `cap` bytes to
 * out and the full length to *len; DIST_INVALID_ARGUMENT when it does not fit or
 * num_replicas < 1. */
dist_status dist_pjrt_compile_options_bytes(int num_replicas, uint8_t *out, size_t cap,
                                            size_t *len);

/* ---- discovery ---- */

/* Which plugin file to load: `option` when non-empty, else $DIST_PJRT_PLUGIN, else
 * $TPU_LIBRARY_PATH, else "libtpu.so" (left to the dlopen search). The chosen name goes to
 * out (n bytes, NUL-terminated). Errors: DIST_INVALID_ARGUMENT when it does not fit. */
dist_status dist_pjrt_find_plugin(const char *option, char *out, size_t n);

/* Where a TPU is, as TF's TPUClusterResolver reads its `tpu` argument. */
typedef enum dist_tpu_kind {
    DIST_TPU_LOCAL = 0, /* chips attached to this host */
    DIST_TPU_REMOTE     /* a TPU node elsewhere: a name or grpc://host:port */
} dist_tpu_kind;

typedef struct dist_tpu_target {
    dist_tpu_kind kind;
    char address[256]; /* the remote name or grpc:// address as given; "" when local */
} dist_tpu_target;

/* Resolves `tpu` as TPUClusterResolver does: NULL or "" means $TPU_NAME, and when that is unset
 * or empty too, the local chips; "local" is the local chips; "grpc://host:port" and any other
 * name are a remote TPU node. Only local chips run here: a remote target comes back in *out
 * (for messages) with DIST_UNSUPPORTED ("remote TPU nodes are not supported ..."). Errors:
 * DIST_INVALID_ARGUMENT (a grpc:// address without host:port, a name too long). */
dist_status dist_tpu_resolve(const char *tpu, dist_tpu_target *out);

/* Counts the TPU chips attached to this host: PCI devices under `pci_devices_dir` (NULL:
 * /sys/bus/pci/devices) whose vendor is Google (0x1ae0) and whose device id is a TPU's (v2/v3,
 * v4, v5e, v5p, v6e, 7x; Google's virtual NIC is not one). Call it before loading libtpu: off a
 * TPU VM, libtpu first asks the GCE metadata server for its topology, 30 tries per value, for
 * minutes, before failing. A missing directory counts 0. Errors: DIST_INVALID_ARGUMENT (count
 * NULL). */
dist_status dist_tpu_count_local_chips(const char *pci_devices_dir, int *count);

#endif
