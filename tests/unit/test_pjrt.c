/* The PJRT client (src/pjrt).
 *
 * Without arguments (CTest unit.pjrt): the loader's error paths against tiny fake plugins built
 * by tests/CMakeLists.txt (tests/pjrt/fake_plugin.c), the CompileOptionsProto bytes, plugin
 * discovery and the TPU resolver. No real plugin needed.
 *
 * "cpu_plugin" (CTest pjrt.cpu_plugin): the real XLA CPU plugin from the pjrt venv
 * ($DIST_TEST_PJRT_PLUGIN, tests/pjrt/venv.sh) with 2 CPU devices: an all-reduce over two
 * replicas, input/output aliasing, a compile error. "libtpu" (CTest pjrt.libtpu): libtpu from the
 * same venv ($DIST_TEST_LIBTPU) on a machine without TPUs ends in a clear error. Both FAIL, not
 * skip, when their plugin is missing: the venv fixture failing must not read as a pass. */
#include "pjrt/pjrt.h"
#include "testutil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define ASSERT_MSG_HAS(needle)                                                                     \
    ck_assert_msg(strstr(dist_last_error(), (needle)) != NULL, "message '%s' lacks '%s'",          \
                  dist_last_error(), (needle))

/* ---- the loader's error paths (fake plugins) ---- */

START_TEST(test_a_missing_file_is_not_found_naming_the_path) {
    dist_pjrt_plugin *p = (dist_pjrt_plugin *)0x1;
    dist_status st = dist_pjrt_plugin_load("/nonexistent/libdist-test/libpjrt.so", &p);
    ck_assert_msg(st == DIST_NOT_FOUND, "got %s", dist_status_name(st));
    ck_assert_ptr_null(p);
    ASSERT_MSG_HAS("/nonexistent/libdist-test/libpjrt.so");
    ASSERT_MSG_HAS("No such file");
}
END_TEST

START_TEST(test_a_library_without_get_pjrt_api_is_not_a_plugin) {
    dist_pjrt_plugin *p = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_NOAPI, &p), DIST_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ASSERT_MSG_HAS("not a PJRT plugin");
    ASSERT_MSG_HAS("GetPjrtApi");
    ASSERT_MSG_HAS(FAKE_NOAPI);
}
END_TEST

START_TEST(test_a_wrong_major_version_is_refused_naming_it) {
    dist_pjrt_plugin *p = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_MAJOR1, &p), DIST_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ASSERT_MSG_HAS("PJRT C API 1.60");
    ASSERT_MSG_HAS("major version 0");
}
END_TEST

START_TEST(test_a_minor_older_than_57_is_refused_naming_both) {
    dist_pjrt_plugin *p = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_OLD, &p), DIST_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ASSERT_MSG_HAS("PJRT C API 0.40");
    ASSERT_MSG_HAS("older than the oldest libdist supports (0.57)");
}
END_TEST

START_TEST(test_a_function_table_too_short_is_refused_naming_the_entry) {
    dist_pjrt_plugin *p = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_SHORT, &p), DIST_UNSUPPORTED);
    ck_assert_ptr_null(p);
    ASSERT_MSG_HAS("function table is too short");
    ASSERT_MSG_HAS("30 entries");
    /* the first entry we call beyond slot 29 */
    ASSERT_MSG_HAS("PJRT_Executable_Destroy (slot 40)");
}
END_TEST

static int fake_initialize_calls(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    ck_assert_ptr_nonnull(h);
    int *calls = (int *)dlsym(h, "fake_pjrt_initialize_calls");
    ck_assert_ptr_nonnull(calls);
    int n = *calls;
    dlclose(h); /* drops only the reference RTLD_NOLOAD took */
    return n;
}

struct concurrent_load {
    pthread_barrier_t *go;
    dist_pjrt_plugin *plugin;
    dist_status st;
};

static void *load_after_barrier(void *arg) {
    struct concurrent_load *c = arg;
    pthread_barrier_wait(c->go);
    c->st = dist_pjrt_plugin_load(FAKE_NEWER, &c->plugin);
    return NULL;
}

/* Runs before any other test loads FAKE_NEWER: the first load races in four threads. */
START_TEST(test_four_threads_loading_one_plugin_get_one_initialization) {
    enum { N = 4 };
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, N);
    pthread_t t[N];
    struct concurrent_load c[N];
    for (int i = 0; i < N; i++) {
        c[i] = (struct concurrent_load){&go, NULL, DIST_INTERNAL};
        ck_assert_int_eq(pthread_create(&t[i], NULL, load_after_barrier, &c[i]), 0);
    }
    for (int i = 0; i < N; i++) pthread_join(t[i], NULL);
    pthread_barrier_destroy(&go);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(c[i].st, DIST_OK);
        ck_assert_ptr_eq(c[i].plugin, c[0].plugin);
    }
    ck_assert_int_eq(fake_initialize_calls(FAKE_NEWER), 1);
}
END_TEST

START_TEST(test_a_plugin_is_loaded_and_initialized_once_per_process) {
    dist_pjrt_plugin *a = NULL, *b = NULL, *c = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_NEWER, &a), DIST_OK);
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_NEWER, &b), DIST_OK);
    ck_assert_ptr_eq(a, b);
    /* another spelling of the same file: the same table, no second initialization */
    char other[4096];
    const char *slash = strrchr(FAKE_NEWER, '/');
    snprintf(other, sizeof other, "%.*s/./%s", (int)(slash - FAKE_NEWER), FAKE_NEWER, slash + 1);
    ck_assert_int_eq(dist_pjrt_plugin_load(other, &c), DIST_OK);
    ck_assert_ptr_eq(a, c);
    ck_assert_int_eq(fake_initialize_calls(FAKE_NEWER), 1);
    int major = -1, minor = -1;
    dist_pjrt_plugin_version(a, &major, &minor);
    ck_assert_int_eq(major, 0);
    ck_assert_int_eq(minor, 200);
}
END_TEST

START_TEST(test_a_newer_plugin_refusing_a_struct_size_names_both_versions) {
    dist_pjrt_plugin *p = NULL;
    ck_assert_int_eq(dist_pjrt_plugin_load(FAKE_NEWER, &p), DIST_OK);
    dist_pjrt_client *cl = (dist_pjrt_client *)0x1;
    dist_status st = dist_pjrt_client_create(p, 2, &cl);
    ck_assert_msg(st == DIST_UNSUPPORTED, "got %s", dist_status_name(st));
    ck_assert_ptr_null(cl);
    ASSERT_MSG_HAS("(C API 0.200)");
    ASSERT_MSG_HAS("(C API 0.94)");
    ASSERT_MSG_HAS("creating a client");
    ASSERT_MSG_HAS("Unexpected PJRT_Client_Create_Args size: expected 4096, got 96");
}
END_TEST

/* ---- CompileOptionsProto, byte for byte ---- */

START_TEST(test_compile_options_bytes_for_one_replica) {
    /* 1a 0f: field 3 (executable_build_options), 15 bytes; 08 + ten bytes: device_ordinal -1;
     * 20 01: num_replicas 1; 28 01: num_partitions 1 */
    static const uint8_t want[] = {0x1a, 0x0f, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0x01, 0x20, 0x01, 0x28, 0x01};
    uint8_t got[64];
    size_t len = 0;
    ck_assert_int_eq(dist_pjrt_compile_options_bytes(1, got, sizeof got, &len), DIST_OK);
    ck_assert_uint_eq(len, sizeof want);
    ck_assert_mem_eq(got, want, sizeof want);
}
END_TEST

START_TEST(test_compile_options_bytes_for_two_replicas) {
    static const uint8_t want[] = {0x1a, 0x0f, 0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0x01, 0x20, 0x02, 0x28, 0x01};
    uint8_t got[64];
    size_t len = 0;
    ck_assert_int_eq(dist_pjrt_compile_options_bytes(2, got, sizeof got, &len), DIST_OK);
    ck_assert_uint_eq(len, sizeof want);
    ck_assert_mem_eq(got, want, sizeof want);
}
END_TEST

START_TEST(test_compile_options_too_small_a_buffer_reports_the_length) {
    uint8_t got[8];
    size_t len = 0;
    ck_assert_int_eq(dist_pjrt_compile_options_bytes(300, got, sizeof got, &len),
                     DIST_INVALID_ARGUMENT);
    ck_assert_uint_eq(len, 18); /* 300 takes two varint bytes */
    ck_assert_int_eq(dist_pjrt_compile_options_bytes(0, got, sizeof got, &len),
                     DIST_INVALID_ARGUMENT);
}
END_TEST

/* ---- discovery ---- */

static void clear_plugin_env(void) {
    unsetenv("DIST_PJRT_PLUGIN");
    unsetenv("TPU_LIBRARY_PATH");
    unsetenv("TPU_NAME");
}

START_TEST(test_find_plugin_order_option_env_tpu_library_path_libtpu) {
    char out[256];
    clear_plugin_env();
    setenv("DIST_PJRT_PLUGIN", "/env/pjrt.so", 1);
    setenv("TPU_LIBRARY_PATH", "/tpu/libtpu.so", 1);
    ck_assert_int_eq(dist_pjrt_find_plugin("/opt/plugin.so", out, sizeof out), DIST_OK);
    ck_assert_str_eq(out, "/opt/plugin.so");
    ck_assert_int_eq(dist_pjrt_find_plugin("", out, sizeof out), DIST_OK);
    ck_assert_str_eq(out, "/env/pjrt.so");
    unsetenv("DIST_PJRT_PLUGIN");
    ck_assert_int_eq(dist_pjrt_find_plugin(NULL, out, sizeof out), DIST_OK);
    ck_assert_str_eq(out, "/tpu/libtpu.so");
    setenv("TPU_LIBRARY_PATH", "", 1);
    ck_assert_int_eq(dist_pjrt_find_plugin(NULL, out, sizeof out), DIST_OK);
    ck_assert_str_eq(out, "libtpu.so");
    clear_plugin_env();
}
END_TEST

START_TEST(test_find_plugin_too_long_a_path_is_an_error) {
    char out[8];
    ck_assert_int_eq(dist_pjrt_find_plugin("/a/long/path.so", out, sizeof out),
                     DIST_INVALID_ARGUMENT);
    ck_assert_str_eq(out, "");
}
END_TEST

START_TEST(test_tpu_resolver_local_by_default_and_by_name) {
    dist_tpu_target t;
    clear_plugin_env();
    ck_assert_int_eq(dist_tpu_resolve(NULL, &t), DIST_OK);
    ck_assert_int_eq(t.kind, DIST_TPU_LOCAL);
    ck_assert_int_eq(dist_tpu_resolve("", &t), DIST_OK);
    ck_assert_int_eq(t.kind, DIST_TPU_LOCAL);
    ck_assert_int_eq(dist_tpu_resolve("local", &t), DIST_OK);
    ck_assert_int_eq(t.kind, DIST_TPU_LOCAL);
    setenv("TPU_NAME", "local", 1);
    ck_assert_int_eq(dist_tpu_resolve(NULL, &t), DIST_OK);
    ck_assert_int_eq(t.kind, DIST_TPU_LOCAL);
    clear_plugin_env();
}
END_TEST

START_TEST(test_tpu_resolver_remote_address_is_unsupported_clearly) {
    dist_tpu_target t;
    clear_plugin_env();
    ck_assert_int_eq(dist_tpu_resolve("grpc://10.240.1.2:8470", &t), DIST_UNSUPPORTED);
    ck_assert_int_eq(t.kind, DIST_TPU_REMOTE);
    ck_assert_str_eq(t.address, "grpc://10.240.1.2:8470");
    ASSERT_MSG_HAS("remote TPU nodes are not supported");
    ASSERT_MSG_HAS("grpc://10.240.1.2:8470");
    ck_assert_int_eq(dist_tpu_resolve("my-tpu-v3-8", &t), DIST_UNSUPPORTED);
    ck_assert_int_eq(t.kind, DIST_TPU_REMOTE);
    ASSERT_MSG_HAS("'my-tpu-v3-8'");
    /* the explicit argument wins over $TPU_NAME */
    setenv("TPU_NAME", "from-env", 1);
    ck_assert_int_eq(dist_tpu_resolve("local", &t), DIST_OK);
    ck_assert_int_eq(dist_tpu_resolve(NULL, &t), DIST_UNSUPPORTED);
    ck_assert_str_eq(t.address, "from-env");
    ASSERT_MSG_HAS("$TPU_NAME");
    clear_plugin_env();
}
END_TEST

START_TEST(test_tpu_resolver_grpc_without_host_port_is_invalid) {
    dist_tpu_target t;
    ck_assert_int_eq(dist_tpu_resolve("grpc://host-only", &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_tpu_resolve("grpc://:8470", &t), DIST_INVALID_ARGUMENT);
    ck_assert_int_eq(dist_tpu_resolve("grpc://host:84x0", &t), DIST_INVALID_ARGUMENT);
    ASSERT_MSG_HAS("grpc://host:port");
}
END_TEST

static void write_pci_device(const char *root, const char *name, const char *vendor,
                             const char *device) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, name);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    const char *files[2] = {"vendor", "device"}, *values[2] = {vendor, device};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s/%s", root, name, files[i]);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "%s\n", values[i]);
        fclose(f);
    }
}

START_TEST(test_tpu_chips_are_google_pci_devices_with_a_tpu_id) {
    char root[] = "/tmp/dist-test-pci-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(root));
    write_pci_device(root, "0000:00:04.0", "0x1ae0", "0x0042"); /* gVNIC: not a TPU */
    write_pci_device(root, "0000:00:05.0", "0x1ae0", "0x0063"); /* v5e */
    write_pci_device(root, "0000:00:06.0", "0x1ae0", "0x0063"); /* v5e */
    write_pci_device(root, "0000:00:07.0", "0x8086", "0x0063"); /* another vendor's 0x0063 */
    int n = -1;
    ck_assert_int_eq(dist_tpu_count_local_chips(root, &n), DIST_OK);
    ck_assert_int_eq(n, 2);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    ck_assert_int_eq(system(cmd), 0);
    ck_assert_int_eq(dist_tpu_count_local_chips(root, &n), DIST_OK); /* gone: none */
    ck_assert_int_eq(n, 0);
    ck_assert_int_eq(dist_tpu_count_local_chips(NULL, NULL), DIST_INVALID_ARGUMENT);
}
END_TEST

/* ---- the real CPU plugin ---- */

static const char *plugin_path(const char *env) {
    const char *p = getenv(env);
    ck_assert_msg(p != NULL && p[0] != '\0',
                  "$%s is not set: run this through CTest (the pjrt.venv fixture installs the "
                  "plugin)",
                  env);
    FILE *f = fopen(p, "rb");
    ck_assert_msg(f != NULL,
                  "$%s names '%s', which cannot be opened: did the pjrt.venv fixture "
                  "fail?",
                  env, p);
    fclose(f);
    return p;
}

static dist_pjrt_client *cpu_client(int devices) {
    dist_pjrt_plugin *p = NULL;
    dist_status st = dist_pjrt_plugin_load(plugin_path("DIST_TEST_PJRT_PLUGIN"), &p);
    ck_assert_msg(st == DIST_OK, "load: %s", dist_last_error());
    dist_pjrt_client *cl = NULL;
    st = dist_pjrt_client_create(p, devices, &cl);
    ck_assert_msg(st == DIST_OK, "client: %s", dist_last_error());
    return cl;
}

static const char all_reduce_program[] =
    "module @all_reduce attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} "
    "{\n"
    "  func.func public @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
    "    %0 = \"stablehlo.all_reduce\"(%arg0) ({\n"
    "    ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
    "      %s = stablehlo.add %a, %b : tensor<f32>\n"
    "      stablehlo.return %s : tensor<f32>\n"
    "    }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} "
    ": (tensor<4xf32>) -> tensor<4xf32>\n"
    "    return %0 : tensor<4xf32>\n"
    "  }\n"
    "}\n";

START_TEST(test_cpu_plugin_gives_two_devices_with_the_option) {
    dist_pjrt_client *cl = cpu_client(2);
    ck_assert_int_eq(dist_pjrt_client_device_count(cl), 2);
    ck_assert_str_eq(dist_pjrt_client_platform(cl), "cpu");
    dist_pjrt_client_destroy(cl);
}
END_TEST

START_TEST(test_cpu_plugin_all_reduce_sums_over_two_replicas) {
    dist_pjrt_client *cl = cpu_client(2);
    dist_pjrt_executable *e = NULL;
    dist_status st = dist_pjrt_compile(cl, all_reduce_program, strlen(all_reduce_program), 2, &e);
    ck_assert_msg(st == DIST_OK, "compile: %s", dist_last_error());
    ck_assert_int_eq(dist_pjrt_executable_num_outputs(e), 1);
    const int64_t dims[1] = {4};
    const float x0[4] = {1, 2, 3, 4}, x1[4] = {10, 20, 30, 40};
    dist_pjrt_buffer *args[2] = {NULL, NULL}, *outs[2] = {NULL, NULL};
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_F32, 1, dims, x0, &args[0]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 1, DIST_F32, 1, dims, x1, &args[1]), DIST_OK);
    st = dist_pjrt_execute(e, 2, 1, args, 1, outs);
    ck_assert_msg(st == DIST_OK, "execute: %s", dist_last_error());
    for (int d = 0; d < 2; d++) {
        float y[4] = {0};
        ck_assert_uint_eq(dist_pjrt_buffer_bytes(outs[d]), sizeof y);
        dist_dtype dt = DIST_I64;
        int nd = -1;
        int64_t shape[DIST_MAX_DIMS];
        ck_assert_int_eq(dist_pjrt_buffer_shape(outs[d], &dt, &nd, shape), DIST_OK);
        ck_assert_int_eq(dt, DIST_F32);
        ck_assert_int_eq(nd, 1);
        ck_assert_int_eq(shape[0], 4);
        st = dist_pjrt_buffer_to_host(outs[d], y, sizeof y);
        ck_assert_msg(st == DIST_OK, "read back: %s", dist_last_error());
        ck_assert_float_eq(y[0], 11);
        ck_assert_float_eq(y[1], 22);
        ck_assert_float_eq(y[2], 33);
        ck_assert_float_eq(y[3], 44);
    }
    /* a second run with the same inputs: compiled once, run again */
    dist_pjrt_buffer *outs2[2] = {NULL, NULL};
    ck_assert_int_eq(dist_pjrt_execute(e, 2, 1, args, 1, outs2), DIST_OK);
    float y[4];
    ck_assert_int_eq(dist_pjrt_buffer_to_host(outs2[1], y, sizeof y), DIST_OK);
    ck_assert_float_eq(y[3], 44);
    for (int d = 0; d < 2; d++) {
        dist_pjrt_buffer_destroy(args[d]);
        dist_pjrt_buffer_destroy(outs[d]);
        dist_pjrt_buffer_destroy(outs2[d]);
    }
    dist_pjrt_executable_destroy(e);
    dist_pjrt_client_destroy(cl);
}
END_TEST

START_TEST(test_cpu_plugin_execute_checks_devices_and_counts) {
    dist_pjrt_client *cl = cpu_client(2);
    dist_pjrt_executable *e = NULL;
    ck_assert_int_eq(dist_pjrt_compile(cl, all_reduce_program, strlen(all_reduce_program), 2, &e),
                     DIST_OK);
    const int64_t dims[1] = {4};
    const float x[4] = {1, 2, 3, 4};
    dist_pjrt_buffer *args[2] = {NULL, NULL}, *outs[2] = {NULL, NULL};
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_F32, 1, dims, x, &args[0]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_F32, 1, dims, x, &args[1]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_execute(e, 2, 1, args, 1, outs), DIST_INVALID_ARGUMENT);
    ASSERT_MSG_HAS("argument 0 of device 1 lives on device 0");
    ck_assert_int_eq(dist_pjrt_execute(e, 1, 1, args, 1, outs), DIST_INVALID_ARGUMENT);
    ASSERT_MSG_HAS("compiled for 2 replica(s)");
    float small[2];
    ck_assert_int_eq(dist_pjrt_buffer_to_host(args[0], small, sizeof small), DIST_INVALID_ARGUMENT);
    ASSERT_MSG_HAS("the buffer holds 16");
    ck_assert_int_eq(dist_pjrt_compile(cl, all_reduce_program, strlen(all_reduce_program), 3, NULL),
                     DIST_INVALID_ARGUMENT);
    dist_pjrt_executable *e3 = NULL;
    ck_assert_int_eq(dist_pjrt_compile(cl, all_reduce_program, strlen(all_reduce_program), 3, &e3),
                     DIST_INVALID_ARGUMENT);
    ASSERT_MSG_HAS("has 2 device(s)");
    dist_pjrt_buffer_destroy(args[0]);
    dist_pjrt_buffer_destroy(args[1]);
    dist_pjrt_executable_destroy(e);
    dist_pjrt_client_destroy(cl);
}
END_TEST

START_TEST(test_cpu_plugin_bad_mlir_is_a_status_with_the_plugins_message) {
    dist_pjrt_client *cl = cpu_client(2);
    static const char bad[] = "module { func.func @main( this is not MLIR";
    dist_pjrt_executable *e = (dist_pjrt_executable *)0x1;
    dist_status st = dist_pjrt_compile(cl, bad, strlen(bad), 1, &e);
    ck_assert_msg(st != DIST_OK, "a broken program compiled");
    ck_assert_ptr_null(e);
    ASSERT_MSG_HAS("compiling the program for 1 replica(s): ");
    /* the plugin's own text follows ours */
    const char *tail = strstr(dist_last_error(), "replica(s): ") + strlen("replica(s): ");
    ck_assert_msg(strlen(tail) > 10, "no plugin message in '%s'", dist_last_error());
    ASSERT_MSG_HAS("Failed to parse"); /* the XLA CPU plugin's words */
    dist_pjrt_client_destroy(cl);
}
END_TEST

START_TEST(test_cpu_plugin_aliased_input_is_donated_and_the_output_right) {
    static const char program[] =
        "module @alias attributes {mhlo.num_replicas = 2 : i32, mhlo.num_partitions = 1 : i32} {\n"
        "  func.func public @main(%arg0: tensor<4xf32> {tf.aliasing_output = 0 : i32},\n"
        "                         %arg1: tensor<4xf32>) -> tensor<4xf32> {\n"
        "    %0 = stablehlo.add %arg0, %arg1 : tensor<4xf32>\n"
        "    return %0 : tensor<4xf32>\n"
        "  }\n"
        "}\n";
    dist_pjrt_client *cl = cpu_client(2);
    dist_pjrt_executable *e = NULL;
    dist_status st = dist_pjrt_compile(cl, program, strlen(program), 2, &e);
    ck_assert_msg(st == DIST_OK, "compile: %s", dist_last_error());
    const int64_t dims[1] = {4};
    const float w[4] = {1, 2, 3, 4}, g0[4] = {0.5f, 0.5f, 0.5f, 0.5f}, g1[4] = {-1, -1, -1, -1};
    dist_pjrt_buffer *args[4] = {NULL}, *outs[2] = {NULL};
    /* args[d * 2 + i] */
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_F32, 1, dims, w, &args[0]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_F32, 1, dims, g0, &args[1]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 1, DIST_F32, 1, dims, w, &args[2]), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 1, DIST_F32, 1, dims, g1, &args[3]), DIST_OK);
    st = dist_pjrt_execute(e, 2, 2, args, 1, outs);
    ck_assert_msg(st == DIST_OK, "execute: %s", dist_last_error());
    float y[4];
    ck_assert_int_eq(dist_pjrt_buffer_to_host(outs[0], y, sizeof y), DIST_OK);
    ck_assert_float_eq(y[0], 1.5f);
    ck_assert_float_eq(y[3], 4.5f);
    ck_assert_int_eq(dist_pjrt_buffer_to_host(outs[1], y, sizeof y), DIST_OK);
    ck_assert_float_eq(y[0], 0);
    ck_assert_float_eq(y[3], 3);
    /* the non-aliased argument is intact; the donated one is consumed: the caller replaces it
     * with the output and destroys the dead handle */
    float g[4];
    ck_assert_int_eq(dist_pjrt_buffer_to_host(args[1], g, sizeof g), DIST_OK);
    ck_assert_float_eq(g[0], 0.5f);
    /* the XLA CPU plugin does donate: the handle is dead, and says so */
    ck_assert_int_ne(dist_pjrt_buffer_to_host(args[0], g, sizeof g), DIST_OK);
    ASSERT_MSG_HAS("donated");
    /* running again on the dead handle fails cleanly: a status, no outputs */
    dist_pjrt_buffer *stale[2] = {(dist_pjrt_buffer *)0x1, (dist_pjrt_buffer *)0x1};
    st = dist_pjrt_execute(e, 2, 2, args, 1, stale);
    ck_assert_int_ne(st, DIST_OK);
    ck_assert_ptr_null(stale[0]);
    ck_assert_ptr_null(stale[1]);
    ASSERT_MSG_HAS("executing on 2 device(s): ");
    for (int d = 0; d < 2; d++) {
        dist_pjrt_buffer_destroy(args[d * 2]);
        args[d * 2] = outs[d]; /* the updated variable */
    }
    /* run again with the outputs in the donated slots */
    dist_pjrt_buffer *outs2[2] = {NULL};
    ck_assert_int_eq(dist_pjrt_execute(e, 2, 2, args, 1, outs2), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_to_host(outs2[1], y, sizeof y), DIST_OK);
    ck_assert_float_eq(y[0], -1);
    ck_assert_float_eq(y[3], 2);
    for (int k = 0; k < 4; k++) dist_pjrt_buffer_destroy(args[k]);
    dist_pjrt_buffer_destroy(outs2[0]);
    dist_pjrt_buffer_destroy(outs2[1]);
    dist_pjrt_executable_destroy(e);
    dist_pjrt_client_destroy(cl);
}
END_TEST

START_TEST(test_cpu_plugin_s32_and_bf16_buffers_round_trip) {
    dist_pjrt_client *cl = cpu_client(2);
    const int64_t dims[2] = {2, 3};
    const int32_t xi[6] = {1, -2, 3, -4, 5, 2147483647};
    const uint16_t xb[6] = {0x3f80, 0x4000, 0xbf80, 0x0000, 0x7f80, 0x3e00}; /* bf16 bits */
    dist_pjrt_buffer *bi = NULL, *bb = NULL;
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 1, DIST_I32, 2, dims, xi, &bi), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 0, DIST_BF16, 2, dims, xb, &bb), DIST_OK);
    int32_t yi[6] = {0};
    uint16_t yb[6] = {0};
    ck_assert_int_eq(dist_pjrt_buffer_to_host(bi, yi, sizeof yi), DIST_OK);
    ck_assert_int_eq(dist_pjrt_buffer_to_host(bb, yb, sizeof yb), DIST_OK);
    ck_assert_mem_eq(yi, xi, sizeof xi);
    ck_assert_mem_eq(yb, xb, sizeof xb);
    dist_dtype dt = DIST_F32;
    int nd = -1;
    int64_t shape[DIST_MAX_DIMS];
    ck_assert_int_eq(dist_pjrt_buffer_shape(bb, &dt, &nd, shape), DIST_OK);
    ck_assert_int_eq(dt, DIST_BF16);
    ck_assert_int_eq(nd, 2);
    ck_assert_int_eq(shape[0], 2);
    ck_assert_int_eq(shape[1], 3);
    ck_assert_int_eq(dist_pjrt_buffer_shape(bi, &dt, &nd, shape), DIST_OK);
    ck_assert_int_eq(dt, DIST_I32);
    dist_pjrt_buffer *none = NULL;
    ck_assert_int_eq(dist_pjrt_buffer_from_host(cl, 2, DIST_I32, 2, dims, xi, &none),
                     DIST_INVALID_ARGUMENT);
    ck_assert_ptr_null(none);
    dist_pjrt_buffer_destroy(bi);
    dist_pjrt_buffer_destroy(bb);
    dist_pjrt_client_destroy(cl);
}
END_TEST

/* ---- libtpu without a TPU ---- */

START_TEST(test_libtpu_without_a_tpu_ends_in_a_clear_error) {
    /* Off a Cloud TPU VM, libtpu asks the GCE metadata server for each of these, 30 tries each,
     * for minutes; given, it goes straight to looking for chips. */
    setenv("TPU_SKIP_MDS_QUERY", "1", 0);
    setenv("TPU_ACCELERATOR_TYPE", "v5litepod-1", 0);
    setenv("TPU_WORKER_ID", "0", 0);
    setenv("TPU_WORKER_HOSTNAMES", "localhost", 0);
    int chips = -1;
    ck_assert_int_eq(dist_tpu_count_local_chips(NULL, &chips), DIST_OK);
    ck_assert_msg(chips == 0, "this test expects a host without TPUs, found %d chip(s)", chips);
    dist_pjrt_plugin *p = NULL;
    dist_status st = dist_pjrt_plugin_load(plugin_path("DIST_TEST_LIBTPU"), &p);
    ck_assert_msg(st == DIST_OK, "loading libtpu: %s", dist_last_error());
    int major, minor;
    dist_pjrt_plugin_version(p, &major, &minor);
    fprintf(stderr, "libtpu: PJRT C API %d.%d\n", major, minor);
    ck_assert_int_eq(major, 0);
    dist_pjrt_client *cl = (dist_pjrt_client *)0x1;
    st = dist_pjrt_client_create(p, 0, &cl);
    ck_assert_msg(st != DIST_OK, "a libtpu client was created on a machine without TPUs");
    ck_assert_ptr_null(cl);
    fprintf(stderr, "libtpu: %s: %s\n", dist_status_name(st), dist_last_error());
    /* libtpu 0.0.52: NOT_FOUND, "TPU initialization failed: No jellyfish device found." */
    ck_assert_msg(st == DIST_NOT_FOUND || st == DIST_UNAVAILABLE, "got %s: %s",
                  dist_status_name(st), dist_last_error());
    ASSERT_MSG_HAS("creating a client: ");
    ASSERT_MSG_HAS("TPU");
}
END_TEST

int main(int argc, char **argv) {
    const char *which = argc > 1 ? argv[1] : "unit";
    Suite *s = suite_create("pjrt");
    TCase *tc;
    if (strcmp(which, "cpu_plugin") == 0) {
        tc = tcase_create("cpu_plugin");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_cpu_plugin_gives_two_devices_with_the_option);
        tcase_add_test(tc, test_cpu_plugin_all_reduce_sums_over_two_replicas);
        tcase_add_test(tc, test_cpu_plugin_execute_checks_devices_and_counts);
        tcase_add_test(tc, test_cpu_plugin_bad_mlir_is_a_status_with_the_plugins_message);
        tcase_add_test(tc, test_cpu_plugin_aliased_input_is_donated_and_the_output_right);
        tcase_add_test(tc, test_cpu_plugin_s32_and_bf16_buffers_round_trip);
        suite_add_tcase(s, tc);
    } else if (strcmp(which, "libtpu") == 0) {
        tc = tcase_create("libtpu");
        tcase_set_timeout(tc, 300);
        tcase_add_test(tc, test_libtpu_without_a_tpu_ends_in_a_clear_error);
        suite_add_tcase(s, tc);
    } else {
        tc = tcase_create("loader");
        tcase_add_test(tc, test_a_missing_file_is_not_found_naming_the_path);
        tcase_add_test(tc, test_a_library_without_get_pjrt_api_is_not_a_plugin);
        tcase_add_test(tc, test_a_wrong_major_version_is_refused_naming_it);
        tcase_add_test(tc, test_a_minor_older_than_57_is_refused_naming_both);
        tcase_add_test(tc, test_a_function_table_too_short_is_refused_naming_the_entry);
        tcase_add_test(tc, test_four_threads_loading_one_plugin_get_one_initialization);
        tcase_add_test(tc, test_a_plugin_is_loaded_and_initialized_once_per_process);
        tcase_add_test(tc, test_a_newer_plugin_refusing_a_struct_size_names_both_versions);
        suite_add_tcase(s, tc);
        tc = tcase_create("compile_options");
        tcase_add_test(tc, test_compile_options_bytes_for_one_replica);
        tcase_add_test(tc, test_compile_options_bytes_for_two_replicas);
        tcase_add_test(tc, test_compile_options_too_small_a_buffer_reports_the_length);
        suite_add_tcase(s, tc);
        tc = tcase_create("discovery");
        tcase_add_test(tc, test_find_plugin_order_option_env_tpu_library_path_libtpu);
        tcase_add_test(tc, test_find_plugin_too_long_a_path_is_an_error);
        tcase_add_test(tc, test_tpu_resolver_local_by_default_and_by_name);
        tcase_add_test(tc, test_tpu_resolver_remote_address_is_unsupported_clearly);
        tcase_add_test(tc, test_tpu_resolver_grpc_without_host_port_is_invalid);
        tcase_add_test(tc, test_tpu_chips_are_google_pci_devices_with_a_tpu_id);
        suite_add_tcase(s, tc);
    }
    return dist_test_run(s);
}
