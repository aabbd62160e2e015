#include "testutil.h"

#include "backend/backend.h"
#include "backend/cpu/cpu_internal.h"
#include "backend/layer_ops.h"
#include "dist/tape.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

/* The wrappers call Check's own functions. */
#undef tcase_create
#undef tcase_set_timeout

/* ---- the watchdog ------------------------------------------------------------------------ */

/* Checked fixtures take no argument, so each test case gets its own setup function: a slot. */
#define WATCHDOG_SLOTS 8

static struct {
    TCase *tc;
    char name[64];
    double timeout_s;
} g_slots[WATCHDOG_SLOTS];
static int g_slot_count;
static char g_expired_msg[160];
static size_t g_expired_len;

static double env_seconds(const char *name, double fallback) {
    const char *v = getenv(name);
    char *end;
    double x = v ? strtod(v, &end) : 0;
    return v && end != v && x > 0 ? x : fallback;
}

static int watchdog_enabled(void) {
    const char *fork_env = getenv("CK_FORK");
    return !fork_env || strcmp(fork_env, "yes") != 0;
}

static void watchdog_expired(int sig) {
    (void)sig;
    ssize_t w = write(STDERR_FILENO, g_expired_msg, g_expired_len);
    (void)w;
    _exit(124);
}

static void watchdog_arm(int slot) {
    if (!watchdog_enabled()) return;
    double t = g_slots[slot].timeout_s * env_seconds("CK_TIMEOUT_MULTIPLIER", 1.0);
    int n = snprintf(g_expired_msg, sizeof g_expired_msg,
                     "\nwatchdog: a test of test case '%s' ran past its timeout of %.1f s\n",
                     g_slots[slot].name, t);
    g_expired_len =
        n > 0 ? (size_t)n < sizeof g_expired_msg ? (size_t)n : sizeof g_expired_msg - 1 : 0;
    signal(SIGALRM, watchdog_expired);
    struct itimerval it = {{0, 0}, {(time_t)t, (suseconds_t)((t - floor(t)) * 1e6)}};
    if (it.it_value.tv_sec == 0 && it.it_value.tv_usec == 0) it.it_value.tv_usec = 1;
    setitimer(ITIMER_REAL, &it, NULL);
}

static void watchdog_disarm(void) {
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_REAL, &off, NULL);
}

#define WATCHDOG_SETUP(i)                                                                          \
    static void watchdog_setup_##i(void) { watchdog_arm(i); }
WATCHDOG_SETUP(0)
WATCHDOG_SETUP(1)
WATCHDOG_SETUP(2)
WATCHDOG_SETUP(3)
WATCHDOG_SETUP(4)
WATCHDOG_SETUP(5)
WATCHDOG_SETUP(6)
WATCHDOG_SETUP(7)
static void (*const g_setups[WATCHDOG_SLOTS])(void) = {
    watchdog_setup_0, watchdog_setup_1, watchdog_setup_2, watchdog_setup_3,
    watchdog_setup_4, watchdog_setup_5, watchdog_setup_6, watchdog_setup_7};

TCase *dist_test_tcase_create(const char *name) {
    TCase *tc = tcase_create(name);
    if (g_slot_count == WATCHDOG_SLOTS) {
        fprintf(stderr, "testutil: more than %d test cases in one program; raise WATCHDOG_SLOTS\n",
                WATCHDOG_SLOTS);
        abort();
    }
    int i = g_slot_count++;
    g_slots[i].tc = tc;
    snprintf(g_slots[i].name, sizeof g_slots[i].name, "%s", name);
    /* Check's default: CK_DEFAULT_TIMEOUT, else 4 s. */
    g_slots[i].timeout_s = env_seconds("CK_DEFAULT_TIMEOUT", 4.0);
    tcase_add_checked_fixture(tc, g_setups[i], watchdog_disarm);
    return tc;
}

void dist_test_tcase_set_timeout(TCase *tc, double timeout_s) {
    tcase_set_timeout(tc, timeout_s);
    for (int i = 0; i < g_slot_count; i++)
        if (g_slots[i].tc == tc) g_slots[i].timeout_s = timeout_s;
}

double dist_test_tcase_timeout(const TCase *tc) {
    for (int i = 0; i < g_slot_count; i++)
        if (g_slots[i].tc == tc)
            return g_slots[i].timeout_s * env_seconds("CK_TIMEOUT_MULTIPLIER", 1.0);
    return 0;
}

void dist_test_remove_flat_dir(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[4400];
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

unsigned char *dist_test_read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open '%s'", path);
    ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
    long size = ftell(f);
    ck_assert_int_ge(size, 0);
    rewind(f);
    unsigned char *b = malloc((size_t)size + 1);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(fread(b, 1, (size_t)size, f), (size_t)size);
    b[size] = '\0';
    fclose(f);
    *n = (size_t)size;
    return b;
}

double dist_test_timeout_bound(double timeout_s) {
    return (2.0 * timeout_s + 2.0) * env_seconds("CK_TIMEOUT_MULTIPLIER", 1.0);
}

int dist_test_skip_without_gpu(int needed, const char *why) {
    const char *require = getenv("DIST_REQUIRE_GPU");
    int required = require ? atoi(require) : 0;
    if (required >= needed) {
        fprintf(stderr, "%s; DIST_REQUIRE_GPU=%d, so this is a failure\n", why, required);
        return EXIT_FAILURE;
    }
    printf("%s; skipped\n", why);
    return 77;
}

int dist_test_skip_without_native_bf16(void) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = 1;
    dist_backend *be = NULL;
    if (dist_backend_create(&o, &be) != DIST_OK) {
        fprintf(stderr, "FAIL: no CPU backend: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    dist_status st = dist_cpu_backend_set_native_bf16(be, 1);
    dist_backend_destroy(be);
    if (st == DIST_OK) return 0;
    if (st != DIST_UNSUPPORTED) {
        fprintf(stderr, "FAIL: dist_cpu_backend_set_native_bf16: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    const char *require = getenv("DIST_REQUIRE_NATIVE_BF16");
    if (require && strcmp(require, "1") == 0) {
        fprintf(stderr, "FAIL: DIST_REQUIRE_NATIVE_BF16=1, but: %s\n", dist_last_error());
        return EXIT_FAILURE;
    }
    printf("SKIP: no native bfloat16 kernels: %s\n", dist_last_error());
    return 77;
}

/* ---- which kernels ran ------------------------------------------------------------------- */

int dist_test_impl_isa_has_bf16(const char *impl) {
    const char *isa = strchr(impl, ':');
    if (!isa) return -1;
    isa++;
    /* longest names first: avx2_vnni_2 before avx2, avx512_core_bf16 before avx512_core; every
     * AMX name (avx512_core_amx, _amx_bf16, _amx_fp16) starts with avx512_core_amx, and avx10
     * covers the AVX10 ones */
    static const char *const with[] = {"avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx",
                                       "avx10", "avx2_vnni_2"};
    static const char *const without[] = {"avx512_core", "avx512_common", "avx512_mic",
                                          "avx2",        "avx",           "sse41"};
    for (size_t i = 0; i < sizeof with / sizeof *with; i++)
        if (strncmp(isa, with[i], strlen(with[i])) == 0) return 1;
    for (size_t i = 0; i < sizeof without / sizeof *without; i++)
        if (strncmp(isa, without[i], strlen(without[i])) == 0) return 0;
    return -1;
}

dist_test_kernel dist_test_bf16_kernel_here(void) {
    /* bits, not order: avx2_vnni (0x407) is numerically above avx512_core_amx (0x3e7) in 2.6 */
    unsigned isa = (unsigned)dnnl_get_effective_cpu_isa();
    unsigned bf16 = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return (isa & bf16) == bf16 ? DIST_TEST_KERNEL_BF16 : DIST_TEST_KERNEL_BF16_EMULATED;
}

static dnnl_data_type_t md_type(const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    const dnnl_memory_desc_t *md = dnnl_primitive_desc_query_md(pd, what, 0);
    return md && md->ndims > 0 ? md->data_type : dnnl_data_type_undef;
}

/* The kind of a cached primitive, from the primitive: its operands' data types (source,
 * weights and the gradient it takes) and oneDNN's name for it. */
static dist_test_kernel prim_kernel(const cpu_prim *p) {
    if (!p->prim)
        return p->impl && strstr(p->impl, "no bfloat16 kernel") ? DIST_TEST_KERNEL_DECLINED
                                                                : DIST_TEST_KERNEL_OTHER;
    const_dnnl_primitive_desc_t pd = NULL;
    ck_assert_int_eq(dnnl_primitive_get_primitive_desc(p->prim, &pd), dnnl_success);
    const char *impl = "";
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl);
    if (strncmp(impl, "ref", 3) == 0) return DIST_TEST_KERNEL_REFERENCE;
    dnnl_primitive_kind_t kind = dnnl_undefined_primitive;
    dnnl_primitive_desc_query(pd, dnnl_query_primitive_kind, 0, &kind);
    if (kind == dnnl_reorder) return DIST_TEST_KERNEL_OTHER;
    const dnnl_query_t inputs[3] = {dnnl_query_src_md, dnnl_query_weights_md,
                                    dnnl_query_diff_dst_md};
    int bf16 = 0, f32 = 0, other = 0;
    for (int i = 0; i < 3; i++) {
        dnnl_data_type_t t = md_type(pd, inputs[i]);
        bf16 += t == dnnl_bf16, f32 += t == dnnl_f32;
        other += t != dnnl_bf16 && t != dnnl_f32 && t != dnnl_data_type_undef;
    }
    if (bf16 && !f32 && !other) {
        int has = dist_test_impl_isa_has_bf16(impl);
        return has == 1   ? DIST_TEST_KERNEL_BF16
               : has == 0 ? DIST_TEST_KERNEL_BF16_EMULATED
                          : dist_test_bf16_kernel_here();
    }
    return f32 && !bf16 && !other ? DIST_TEST_KERNEL_F32 : DIST_TEST_KERNEL_OTHER;
}

dist_test_kernel dist_test_cpu_kernel(struct dist_backend *be, int i, const char **op) {
    ck_assert_msg(be->iface->run_op == cpu_run_op, "not a CPU backend");
    const cpu_ctx *c = be->ctx;
    ck_assert_msg(i >= 0 && i < c->nprims, "no cached primitive %d (%d cached)", i, c->nprims);
    if (op) {
        /* the op's name from the i-th entry of the implementation info, which lists the cache
         * in order */
        static char info[16384], name[32];
        dist_cpu_backend_impl_info(be, info, sizeof info);
        const char *e = info;
        for (int k = 0; k < i && e; k++)
            if ((e = strchr(e, ';')) != NULL) e++;
        const char *eq = e ? strchr(e, '=') : NULL;
        ck_assert_msg(eq && (size_t)(eq - e) < sizeof name, "entry %d missing in %s", i, info);
        memcpy(name, e, (size_t)(eq - e));
        name[eq - e] = '\0';
        *op = name;
    }
    return prim_kernel(&c->prims[i]);
}

int dist_test_cpu_kernel_count(struct dist_backend *be, const char *op, dist_test_kernel kind) {
    const cpu_ctx *c = be->ctx;
    int n = 0;
    for (int i = 0; i < c->nprims; i++) {
        const char *name;
        dist_test_kernel k = dist_test_cpu_kernel(be, i, &name);
        n += k == kind && (!op || strcmp(name, op) == 0);
    }
    return n;
}

int dist_test_fused_lanes(int B) {
    /* the backend's own flags: the CPU's, within oneDNN's ISA cap (ONEDNN_MAX_CPU_ISA) */
    return B % 16 == 0 && cpu_has_avx512_bw_vl() ? 16 : B % 8 == 0 && cpu_has_avx2_fma() ? 8 : 0;
}

void dist_test_to_host_plain(struct dist_backend *be, const dist_tensor *t, float *out) {
    dist_tensor *plain;
    ck_assert_int_eq(dist_backend_alloc_tensor(be, DIST_F32, t->ndim, t->shape, &plain), DIST_OK);
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, t, plain), DIST_OK);
    ck_assert_int_eq(dist_backend_to_host(be, plain, out, (size_t)dist_tensor_numel(t) * 4),
                     DIST_OK);
    dist_backend_free_tensor(be, plain);
}

dist_tensor *dist_test_conv_relu_pool(dist_tape *t, const dist_tensor *x, const dist_tensor *w,
                                      const dist_tensor *b, int one_op, dist_tensor **h) {
    dist_tensor *p = NULL, *conv = NULL;
    if (one_op) {
        ck_assert_msg(dist_op_conv2d_max_pool2d(t, x, w, b, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU,
                                                2, 2, 2, 2, DIST_PADDING_VALID, &p) == DIST_OK,
                      "%s", dist_last_error());
    } else {
        ck_assert_msg(dist_op_conv2d(t, x, w, b, 1, 1, DIST_PADDING_VALID, DIST_ACT_RELU, &conv) ==
                          DIST_OK,
                      "%s", dist_last_error());
        ck_assert_msg(dist_op_max_pool2d(t, conv, 2, 2, 2, 2, DIST_PADDING_VALID, &p) == DIST_OK,
                      "%s", dist_last_error());
    }
    if (h) *h = conv;
    return p;
}

float dist_test_round_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

float *dist_test_in_layout(dist_backend *be, const float *plain, const int64_t *shape,
                           dist_layout l, dist_tensor *t) {
    dist_tensor src = dist_tensor_view((void *)plain, DIST_F32, 4, shape);
    float *buf = malloc(dist_tensor_bytes(&src));
    ck_assert_ptr_nonnull(buf);
    *t = dist_tensor_view(buf, DIST_F32, 4, shape);
    t->layout = l;
    ck_assert_int_eq(dist_be_to_layout(be->iface, be->ctx, &src, t), DIST_OK);
    return buf;
}

/* ---- running ----------------------------------------------------------------------------- */

int dist_test_run(Suite *s) {
    SRunner *sr = srunner_create(s);
    /* No fork per test: OpenMP (inside oneDNN) does not survive fork() once its threads exist,
     * and a forked child would hang. CK_FORK=yes in the environment still forces forking. */
    if (watchdog_enabled()) srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}

float dist_test_uniform(uint64_t *state, float lo, float hi) {
    *state = *state * 6364136223846793005ULL + 1442695040888963407ULL;
    uint32_t r = (uint32_t)(*state >> 40);
    return lo + (hi - lo) * ((float)r / 16777216.0f);
}

double dist_test_rel_err(const float *a, const float *b, int64_t n) {
    double num = 0.0, na = 0.0, nb = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - (double)b[i];
        num += d * d;
        na += (double)a[i] * a[i];
        nb += (double)b[i] * b[i];
    }
    double den = fmax(sqrt(na), sqrt(nb));
    return sqrt(num) / (den > 1e-30 ? den : 1e-30);
}

#include "core/error.h"

dist_status dist_error_for_test(dist_status st, const char *msg) {
    return dist_error(st, "%s", msg);
}

struct dist_backend *dist_test_cpu_backend(int threads) {
    dist_backend_options o = DIST_BACKEND_OPTIONS_INIT;
    o.threads = threads;
    dist_backend *be = NULL;
    ck_assert_int_eq(dist_backend_create(&o, &be), DIST_OK);
    return be;
}

int dist_test_hold_port(int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one), 0);
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof a), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&a, &l), 0);
    *fd_out = fd;
    return ntohs(a.sin_port);
}
