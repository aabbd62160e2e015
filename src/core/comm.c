/* The communicator entry points (argument checks) and the typed arithmetic every
 * implementation shares (core/comm.h). */
#include "core/comm.h"

#include "core/error.h"
#include "core/timeouts.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

dist_comm *dist_comm_alloc(const struct dist_comm_i *iface, void *ctx, const char *name) {
    dist_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->iface = iface;
    c->ctx = ctx;
    c->size = 1;
    c->local_ranks = 1;
    c->timeout_s = DIST_NET_COLLECTIVE_TIMEOUT_S;
    snprintf(c->name, sizeof c->name, "%s", name ? name : "");
    return c;
}

dist_status dist_comm_check_types(dist_dtype dtype, dist_reduce_op op) {
    if ((int)dtype < 0 || dtype >= DIST_DTYPE_COUNT)
        return dist_error(DIST_INVALID_ARGUMENT, "communicator: unknown dtype %d", (int)dtype);
    if ((int)op < DIST_REDUCE_SUM || op > DIST_REDUCE_MIN)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "communicator: unknown reduction %d (SUM, MEAN, MAX or MIN)", (int)op);
    return DIST_OK;
}

static dist_status check_local(const dist_comm *c, int local, const char *what) {
    if (!c) return dist_error(DIST_INVALID_ARGUMENT, "communicator %s: NULL communicator", what);
    if (local < 0 || local >= c->local_ranks)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "communicator '%s' %s: local rank %d (this process holds %d)", c->name,
                          what, local, c->local_ranks);
    return DIST_OK;
}

dist_status dist_comm_all_reduce(dist_comm *c, int local, void *data, size_t count,
                                 dist_dtype dtype, dist_reduce_op op, double timeout_s) {
    DIST_TRY(check_local(c, local, "all_reduce"));
    DIST_TRY(dist_comm_check_types(dtype, op));
    DIST_CHECK_ARG(data || count == 0, "communicator all_reduce: NULL data");
    if (count == 0) return DIST_OK;
    return c->iface->all_reduce(c, local, data, count, dtype, op, timeout_s);
}

dist_status dist_comm_all_gather(dist_comm *c, int local, const void *in, void *out, size_t count,
                                 dist_dtype dtype, double timeout_s) {
    DIST_TRY(check_local(c, local, "all_gather"));
    DIST_TRY(dist_comm_check_types(dtype, DIST_REDUCE_SUM));
    DIST_CHECK_ARG((in && out) || count == 0, "communicator all_gather: NULL buffer");
    return c->iface->all_gather(c, local, in, out, count, dtype, timeout_s);
}

dist_status dist_comm_broadcast(dist_comm *c, int local, void *data, size_t count, dist_dtype dtype,
                                int root, double timeout_s) {
    DIST_TRY(check_local(c, local, "broadcast"));
    DIST_TRY(dist_comm_check_types(dtype, DIST_REDUCE_SUM));
    DIST_CHECK_ARG(root >= 0 && root < c->size, "communicator '%s' broadcast: root %d of %d ranks",
                   c->name, root, c->size);
    DIST_CHECK_ARG(data || count == 0, "communicator broadcast: NULL data");
    return c->iface->broadcast(c, local, data, count, dtype, root, timeout_s);
}

dist_status dist_comm_barrier(dist_comm *c, int local, double timeout_s) {
    DIST_TRY(check_local(c, local, "barrier"));
    return c->iface->barrier(c, local, timeout_s);
}

void dist_comm_cancel(dist_comm *c, int local) {
    if (c && c->iface->cancel) c->iface->cancel(c, local);
}

void dist_comm_reset(dist_comm *c) {
    if (c && c->iface->reset) c->iface->reset(c);
}

void dist_comm_destroy(dist_comm *c) {
    if (!c) return;
    if (c->iface && c->iface->destroy) c->iface->destroy(c);
    free(c);
}

double dist_comm_deadline(const dist_comm *c, double timeout_s) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    double now = (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
    double limit = timeout_s > 0           ? timeout_s
                   : c && c->timeout_s > 0 ? c->timeout_s
                                           : DIST_NET_COLLECTIVE_TIMEOUT_S;
    return now + limit;
}

/* ---- arithmetic ---------------------------------------------------------------------------- */

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static uint16_t float_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (isnan(f)) return (uint16_t)((u >> 16) | 0x40); /* stays a (quiet) NaN */
    u += 0x7fff + ((u >> 16) & 1);                     /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static float f16_to_float(uint16_t h) {
    _Float16 x;
    memcpy(&x, &h, sizeof x);
    return (float)x;
}

static uint16_t float_to_f16(float f) {
    _Float16 x = (_Float16)f;
    uint16_t h;
    memcpy(&h, &x, sizeof h);
    return h;
}

/* MAX and MIN that let a NaN win, as NCCL's and TF's reductions do. */
#define PICK_MAX(a, b) ((a) != (a) || (b) != (b) ? (a) + (b) : (a) > (b) ? (a) : (b))
#define PICK_MIN(a, b) ((a) != (a) || (b) != (b) ? (a) + (b) : (a) < (b) ? (a) : (b))

#define ACCUMULATE(T, acc, x, n, op)                                                               \
    do {                                                                                           \
        T *a_ = (T *)(acc);                                                                        \
        const T *x_ = (const T *)(x);                                                              \
        switch (op) {                                                                              \
        case DIST_REDUCE_MAX:                                                                      \
            for (size_t i_ = 0; i_ < (n); i_++) a_[i_] = PICK_MAX(a_[i_], x_[i_]);                 \
            break;                                                                                 \
        case DIST_REDUCE_MIN:                                                                      \
            for (size_t i_ = 0; i_ < (n); i_++) a_[i_] = PICK_MIN(a_[i_], x_[i_]);                 \
            break;                                                                                 \
        default:                                                                                   \
            for (size_t i_ = 0; i_ < (n); i_++) a_[i_] = (T)(a_[i_] + x_[i_]);                     \
            break;                                                                                 \
        }                                                                                          \
    } while (0)

static void accumulate_half(uint16_t *a, const uint16_t *x, size_t n, dist_reduce_op op,
                            float (*to)(uint16_t), uint16_t (*from)(float)) {
    for (size_t i = 0; i < n; i++) {
        float p = to(a[i]), q = to(x[i]);
        float r = op == DIST_REDUCE_MAX   ? PICK_MAX(p, q)
                  : op == DIST_REDUCE_MIN ? PICK_MIN(p, q)
                                          : p + q;
        a[i] = from(r);
    }
}

void dist_comm_accumulate(dist_dtype dtype, dist_reduce_op op, void *acc, const void *x, size_t n) {
    switch (dtype) {
    case DIST_F32: ACCUMULATE(float, acc, x, n, op); break;
    case DIST_I32: ACCUMULATE(int32_t, acc, x, n, op); break;
    case DIST_I64: ACCUMULATE(int64_t, acc, x, n, op); break;
    case DIST_U8: ACCUMULATE(uint8_t, acc, x, n, op); break;
    case DIST_F16: accumulate_half(acc, x, n, op, f16_to_float, float_to_f16); break;
    case DIST_BF16: accumulate_half(acc, x, n, op, bf16_to_float, float_to_bf16); break;
    default: break;
    }
}

void dist_comm_to_half(dist_dtype dtype, const float *x, uint16_t *h, size_t n) {
    uint16_t (*from)(float) = dtype == DIST_F16 ? float_to_f16 : float_to_bf16;
    for (size_t i = 0; i < n; i++) h[i] = from(x[i]);
}

void dist_comm_from_half(dist_dtype dtype, const uint16_t *h, float *x, size_t n) {
    float (*to)(uint16_t) = dtype == DIST_F16 ? f16_to_float : bf16_to_float;
    for (size_t i = 0; i < n; i++) x[i] = to(h[i]);
}

void dist_comm_divide(dist_dtype dtype, void *acc, size_t n, int divisor) {
    if (divisor <= 1) return;
    switch (dtype) {
    case DIST_F32: {
        float *a = acc, d = (float)divisor;
        for (size_t i = 0; i < n; i++) a[i] /= d;
        break;
    }
    case DIST_I32: {
        int32_t *a = acc;
        for (size_t i = 0; i < n; i++) a[i] /= divisor;
        break;
    }
    case DIST_I64: {
        int64_t *a = acc;
        for (size_t i = 0; i < n; i++) a[i] /= divisor;
        break;
    }
    case DIST_U8: {
        uint8_t *a = acc;
        for (size_t i = 0; i < n; i++) a[i] = (uint8_t)(a[i] / divisor);
        break;
    }
    case DIST_F16: {
        uint16_t *a = acc;
        for (size_t i = 0; i < n; i++) a[i] = float_to_f16(f16_to_float(a[i]) / (float)divisor);
        break;
    }
    case DIST_BF16: {
        uint16_t *a = acc;
        for (size_t i = 0; i < n; i++) a[i] = float_to_bf16(bf16_to_float(a[i]) / (float)divisor);
        break;
    }
    default: break;
    }
}
