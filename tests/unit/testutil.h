/* Helpers shared by the unit tests. */
#ifndef DIST_TESTUTIL_H
#define DIST_TESTUTIL_H

#include <check.h>
#include <stddef.h>
#include <stdint.h>

/* Runs a Check suite; returns the process exit code (0 when all passed). */
int dist_test_run(Suite *s);

/* A CPU backend with this many compute threads (the test fails if it cannot be made). */
struct dist_backend;
struct dist_backend *dist_test_cpu_backend(int threads);

/* The watchdog. Tests run without forking (CK_FORK=no: OpenMP does not survive fork()), where
 * Check never enforces a timeout. So every test case made through these wrappers arms a timer
 * before each test (its checked setup) and disarms it after: the tcase's timeout, or
 * CK_DEFAULT_TIMEOUT (Check's 4 s when unset), times CK_TIMEOUT_MULTIPLIER, as Check computes it.
 * A test still running at the deadline ends the process with exit code 124 and a message naming
 * the test case and the timeout. With CK_FORK=yes Check's own timeouts apply and the watchdog
 * stays off. Every test that includes this header gets it: tcase_create and tcase_set_timeout
 * below are these wrappers. */
TCase *dist_test_tcase_create(const char *name);
void dist_test_tcase_set_timeout(TCase *tc, double timeout_s);
/* The timeout that the watchdog enforces for tc's tests, in seconds (multiplier applied). */
double dist_test_tcase_timeout(const TCase *tc);
#define tcase_create(name) dist_test_tcase_create(name)
#define tcase_set_timeout(tc, t) dist_test_tcase_set_timeout((tc), (t))
/* The longest a call configured with a timeout of `timeout_s` may take before a test calls it
 * late: 2 x timeout_s + 2 s (process start, scheduling on a loaded machine), times
 * CK_TIMEOUT_MULTIPLIER (the sanitizer stage of .ci/run sets it) as Check scales its timeouts.
 * Tests derive their timing bounds from the timeouts they configure through this, never from
 * fixed seconds. */
double dist_test_timeout_bound(double timeout_s);

/* What a test that needs `needed` GPUs returns from main when fewer are visible: 77 (CTest:
 * skipped) after printing why, or EXIT_FAILURE when DIST_REQUIRE_GPU (tests/gpu/check.sh sets 1)
 * says that at least `needed` GPUs are there, so that a GPU run whose tests cannot see the GPU
 * fails instead of passing. */
int dist_test_skip_without_gpu(int needed, const char *why);
/* What a test of the native bfloat16 kernels returns from main before its suite: 0 when the CPU
 * backend can run them here (AVX-512; emulated without AVX512_BF16), else 77 (CTest: skipped)
 * after printing why, or EXIT_FAILURE when DIST_REQUIRE_NATIVE_BF16=1 says the machine has
 * them. Call it outside a test (no ck_assert inside). */
int dist_test_skip_without_native_bf16(void);
/* What kind of kernel one of the CPU backend's cached oneDNN primitives is, asked of the
 * primitive itself (its operands' data types) and of oneDNN's name for it. A test must not match
 * one implementation name: oneDNN names a kernel after the ISA it was built for, so the same
 * bfloat16 matmul is brg:avx512_core_bf16 on AVX512_BF16, brg:avx512_core_amx_bf16 on AMX and
 * gemm:jit (no ISA in the name) on plain AVX-512 or where the brgemm kernel declines. */
typedef enum dist_test_kernel {
    DIST_TEST_KERNEL_DECLINED,      /* no primitive: the backend runs its float32 path instead
                                     * ("float32 (no bfloat16 kernel)") */
    DIST_TEST_KERNEL_REFERENCE,     /* oneDNN's reference loops ("ref:..."), any data type */
    DIST_TEST_KERNEL_F32,           /* a fast kernel on float32 operands */
    DIST_TEST_KERNEL_BF16,          /* a fast kernel on bfloat16 operands with the bfloat16
                                     * instructions (AVX512_BF16, AVX512_FP16, AMX, ...) */
    DIST_TEST_KERNEL_BF16_EMULATED, /* a fast kernel on bfloat16 operands that emulates them
                                     * (plain AVX-512: same results, slower) */
    DIST_TEST_KERNEL_OTHER,         /* anything else: reorders, other data types */
} dist_test_kernel;
/* 1 when oneDNN's implementation name (dnnl_query_impl_info_str, e.g. "brgconv:avx512_core_amx")
 * names an ISA with bfloat16 instructions: avx512_core_bf16, avx512_core_fp16, any AMX one
 * (avx512_core_amx, avx512_core_amx_bf16, ..._amx_fp16), avx10_*, avx2_vnni_2; 0 for one that
 * emulates them (avx512_core, avx512_core_vnni, avx2, ...) and -1 for a name without an ISA
 * ("gemm:jit", "jit:uni"). */
int dist_test_impl_isa_has_bf16(const char *impl);
/* The kind a bfloat16 kernel has where oneDNN runs now: DIST_TEST_KERNEL_BF16 when its effective
 * ISA (dnnl_get_effective_cpu_isa, which ONEDNN_MAX_CPU_ISA caps) has AVX512_BF16's bits, else
 * DIST_TEST_KERNEL_BF16_EMULATED. */
dist_test_kernel dist_test_bf16_kernel_here(void);
/* The kind of the backend's i-th cached primitive: the i-th "op=impl;" entry of
 * dist_cpu_backend_impl_info, whose op name goes to *op (may be NULL; a static string). Fails
 * the test if there is no such entry. */
dist_test_kernel dist_test_cpu_kernel(struct dist_backend *be, int i, const char **op);
/* How many of the backend's cached primitives of operation `op` (dist_cpu_backend_impl_info's
 * names: "conv_fwd", "conv_bwd_data", "conv_bwd_filter", "matmul", ...; NULL: all) are of
 * `kind`. */
int dist_test_cpu_kernel_count(struct dist_backend *be, const char *op, dist_test_kernel kind);
/* float32 -> bfloat16 -> float32, round to nearest even (finite values). */
float dist_test_round_bf16(float f);
/* The lanes the CPU backend's own fused convolution kernels use for a channel block of B here:
 * 16 (AVX-512 F/BW/VL, B a multiple of 16), 8 (AVX2 and FMA, B a multiple of 8), 0 (they
 * decline). */
int dist_test_fused_lanes(int B);
/* t (any layout) copied to host in plain row-major order: numel floats into out. */
struct dist_tensor;
void dist_test_to_host_plain(struct dist_backend *be, const struct dist_tensor *t, float *out);
/* On tape t: conv2d(x, w, b, 3x3 VALID, ReLU) then a 2x2 / stride-2 VALID max pool, as
 * dist_op_conv2d_max_pool2d (one_op) or as the two ops (then *h, if given, is the convolution's
 * output; NULL for one_op). Returns the pooled tensor. */
struct dist_tape;
struct dist_tensor *dist_test_conv_relu_pool(struct dist_tape *t, const struct dist_tensor *x,
                                             const struct dist_tensor *w,
                                             const struct dist_tensor *b, int one_op,
                                             struct dist_tensor **h);
/* A plain NHWC float32 array of `shape` (4-D) copied into layout l by the backend's to_layout:
 * *t views the returned buffer (caller frees). */
#include "dist/tensor.h"
float *dist_test_in_layout(struct dist_backend *be, const float *plain, const int64_t *shape,
                           dist_layout l, dist_tensor *t);
/* The bytes of a file (malloc'd, NUL-terminated; caller frees), their count in *n. Fails the test
 * when the file cannot be read. */
unsigned char *dist_test_read_file(const char *path, size_t *n);
/* Removes a test's scratch folder of plain files (no subfolders); a missing one is fine. */
void dist_test_remove_flat_dir(const char *dir);
/* A deterministic uniform random float in [lo, hi) from a 64-bit state. */
float dist_test_uniform(uint64_t *state, float lo, float hi);
/* The relative error ||a - b|| / max(||a||, ||b||, tiny). */
double dist_test_rel_err(const float *a, const float *b, int64_t n);

/* A port of 127.0.0.1 from the OS (bind to port 0), held by the returned socket (*fd_out),
 * bound, not listening, with SO_REUSEADDR, until the caller closes it: the library's listener
 * (SO_REUSEADDR too) binds the same port beside it, while the kernel gives the port to no
 * other socket that binds port 0 or connects (another test's cluster running at the same
 * time, or an outgoing connection's local port). Fails the test when no port is had. */
int dist_test_hold_port(int *fd_out);

/* Sets the thread's error message (like the library's dist_error) and returns the status. */
#include "dist/status.h"
dist_status dist_error_for_test(dist_status st, const char *msg);

/* DIST_TRY for test code: returns the status of a failed call. */
#define DIST_TRY_TEST(call)                                                                        \
    do {                                                                                           \
        dist_status st_ = (call);                                                                  \
        if (st_ != DIST_OK) return st_;                                                            \
    } while (0)

#endif
