/* mixed_bfloat16 kernels chosen by measurement (cpu_internal.h, cpu_bf16_choice).
 *
 * A convolution or matmul marked bf16 can run two ways with the same products: oneDNN's native
 * bfloat16 kernel (bfloat16 copies of the operands, float32 accumulation) or the float32
 * kernel on the values the tape already rounded. Which is faster depends on the CPU and the
 * shape, not on the ISA's name alone: on a 2-core Xeon with AVX512_BF16 but no AMX, oneDNN
 * 2.6's bfloat16 brgemm matmul takes 1.3-1.8 ms at 64x1024x1024 against float32's 0.5-0.7 ms,
 * while the seed CNN's convolutions gain from bfloat16 on Zen 4 (bench/RESULTS.md). So where
 * the CPU has bfloat16 instructions, each distinct call (the kernel's cache key: op, shapes,
 * layouts, geometry) is measured on its first calls: one untimed call of each path (primitive
 * creation, first touch of its scratch), then CPU_BF16_TRIALS timed calls of each, alternating;
 * the faster path's best time decides, and every later call of that key takes it. The
 * decision is logged (INFO) with both times. The trials are real work of the step (both paths
 * compute the same values up to the order of the sums), so nothing is run twice.
 *
 * Runs are then reproducible only up to that order (another run may choose otherwise); the
 * strategy's `deterministic` option, DIST_CPU_NATIVE_BF16=1 or =0 fix the path instead. */
#include "backend/cpu/cpu_internal.h"
#include "core/error.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

#define CPU_BF16_TRIALS 3

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static cpu_bf16_choice *find_or_add(cpu_ctx *c, const void *key, size_t key_bytes) {
    for (int i = 0; i < c->nchoices; i++)
        if (memcmp(c->choices[i].key, key, key_bytes) == 0) return &c->choices[i];
    if (c->nchoices == CPU_BF16_CHOICES) return NULL;
    cpu_bf16_choice *e = &c->choices[c->nchoices++];
    memset(e, 0, sizeof *e);
    memcpy(e->key, key, key_bytes);
    return e;
}

int cpu_bf16_choose(cpu_ctx *c, const void *key, size_t key_bytes, cpu_bf16_trial *t) {
    t->entry = -1;
    if (c->native_bf16 != CPU_BF16_MEASURE) return c->native_bf16 != CPU_BF16_OFF;
    if (key_bytes > sizeof c->choices[0].key) return 1;
    cpu_bf16_choice *e = find_or_add(c, key, key_bytes);
    if (!e) return 1; /* more distinct calls than the table holds: the rule's default */
    if (e->decided) {
        e->runs[e->native]++;
        return e->native;
    }
    /* calls 0 and 1: one untimed call of each path; then native, rounding, native, ... */
    int native = (e->calls & 1) == 0;
    t->entry = (int)(e - c->choices);
    t->native = native;
    t->timed = e->calls >= 2;
    t->t0 = now_s();
    return native;
}

void cpu_bf16_measured(cpu_ctx *c, const cpu_bf16_trial *t, dist_status st, const char *what,
                       const dist_tensor *a, const dist_tensor *b) {
    if (t->entry < 0) return;
    cpu_bf16_choice *e = &c->choices[t->entry];
    double dt = now_s() - t->t0;
    e->runs[t->native]++;
    if (st != DIST_OK) return; /* a failed call measures nothing; the next call tries again */
    if (t->timed && (e->best[t->native] == 0.0 || dt < e->best[t->native])) e->best[t->native] = dt;
    if (++e->calls < 2 + 2 * CPU_BF16_TRIALS) return;
    e->decided = 1;
    e->native = e->best[1] <= e->best[0];
    if (e->native)
        c->bf16_native_chosen++;
    else
        c->bf16_rounding_chosen++;
    char sa[64] = "", sb[64] = "";
    for (int i = 0, n = 0; a && i < a->ndim && n < (int)sizeof sa - 1; i++)
        n +=
            snprintf(sa + n, sizeof sa - (size_t)n, "%s%lld", i ? "x" : "", (long long)a->shape[i]);
    for (int i = 0, n = 0; b && i < b->ndim && n < (int)sizeof sb - 1; i++)
        n +=
            snprintf(sb + n, sizeof sb - (size_t)n, "%s%lld", i ? "x" : "", (long long)b->shape[i]);
    dist_log(DIST_LOG_INFO,
             "mixed_bfloat16: %s [%s] [%s]: native bfloat16 %.3f ms, float32 on rounded values "
             "%.3f ms: %s",
             what, sa, sb, 1e3 * e->best[1], 1e3 * e->best[0],
             e->native ? "native bfloat16" : "float32 on rounded values");
}

static int is_cpu(const dist_backend *backend) {
    return backend && backend->iface && backend->iface->run_op == cpu_run_op;
}

int cpu_bf16_mode_for(int deterministic) {
    int mode = cpu_dnnl_native_bf16_default();
    return deterministic && mode == CPU_BF16_MEASURE ? CPU_BF16_NATIVE : mode;
}

const char *dist_cpu_bfloat16_kernels(int deterministic) {
    switch (cpu_bf16_mode_for(deterministic)) {
    case CPU_BF16_MEASURE:
        return "per call the faster of native bfloat16 and float32 on bfloat16 values, measured on "
               "its first calls";
    case CPU_BF16_NATIVE: return "native bfloat16 kernels";
    default: return "float32 kernels on values stored at bfloat16 precision";
    }
}

dist_status dist_cpu_backend_bf16_choices(const dist_backend *backend, int *mode,
                                          long *native_chosen, long *rounding_chosen) {
    if (!is_cpu(backend))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "dist_cpu_backend_bf16_choices: not a CPU backend");
    const cpu_ctx *c = backend->ctx;
    if (mode) *mode = c->native_bf16;
    if (native_chosen) *native_chosen = c->bf16_native_chosen;
    if (rounding_chosen) *rounding_chosen = c->bf16_rounding_chosen;
    return DIST_OK;
}

dist_status dist_cpu_backend_bf16_choice(const dist_backend *backend, int i, double *native_s,
                                         double *rounding_s, int *native, long runs[2]) {
    if (!is_cpu(backend))
        return dist_error(DIST_INVALID_ARGUMENT, "dist_cpu_backend_bf16_choice: not a CPU backend");
    const cpu_ctx *c = backend->ctx;
    if (i < 0 || i >= c->nchoices)
        return dist_error(DIST_NOT_FOUND, "bfloat16 choice %d: the backend has %d", i, c->nchoices);
    const cpu_bf16_choice *e = &c->choices[i];
    if (!e->decided) return dist_error(DIST_NOT_FOUND, "bfloat16 choice %d: still measuring", i);
    *native_s = e->best[1];
    *rounding_s = e->best[0];
    *native = e->native;
    runs[0] = e->runs[0];
    runs[1] = e->runs[1];
    return DIST_OK;
}
