/* tf.debugging's assertions on a tape: assert_equal, assert_less, assert_all_finite and
 * assert_shape. They record nothing (no gradient flows through an assertion); each reads the
 * tensors back from the tape's device (any eager backend: CPU or GPU) and, when the condition
 * fails, fails with TensorFlow's message layout, prefixed with the step (the strategy's run
 * count) when the tape belongs to a strategy's replica (whose run adds "replica N: "). A
 * traced tape (the tpu strategy's one compiled program) cannot stop to read a value: there the
 * tensors become outputs of the program and the same check runs on their host copies after
 * the step (the replica context's defer_check), failing the run with the same message; the
 * step's updates have happened by then. */
#include "autodiff/tape_impl.h"
#include "core/error.h"
#include "core/replica_ctx.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The message text: grows as it is written, truncated at a bound a user can read. */
typedef struct text {
    char buf[2048];
    size_t n;
} text;

static void put(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *t, const char *fmt, ...) {
    if (t->n >= sizeof t->buf - 1) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(t->buf + t->n, sizeof t->buf - t->n, fmt, ap);
    va_end(ap);
    if (k > 0) t->n += (size_t)k < sizeof t->buf - t->n ? (size_t)k : sizeof t->buf - 1 - t->n;
}

/* What a deferred check needs besides the values: which check, the user's message. */
typedef struct deferred_args {
    int kind;
    char message[512];
} deferred_args;

/* On a traced tape: the check of `tensors` after the step (the replica context's defer_check),
 * or DIST_UNSUPPORTED naming op where the strategy has none. */
static dist_status defer(dist_tape *tape, const char *op, int count,
                         const dist_tensor *const *tensors, dist_deferred_check_fn fn, int kind,
                         const char *message) {
    dist_replica_ctx *rc = tape->replica;
    if (!rc || !rc->iface || !rc->iface->defer_check)
        return dist_error(DIST_UNSUPPORTED,
                          "%s: the step is compiled into one program, which cannot stop to read "
                          "a value on the host, and this strategy checks none after it",
                          op);
    deferred_args a = {.kind = kind};
    snprintf(a.message, sizeof a.message, "%s", message ? message : "");
    return rc->iface->defer_check(rc, count, tensors, fn, &a, sizeof a);
}

/* The tensor's values as doubles (integers exact to 2^53), read back through the tape, or
 * from host memory where tape is NULL. *out is malloc'ed. */
static dist_status values_of(dist_tape *tape, const dist_tensor *t, double **out) {
    size_t bytes = dist_tensor_bytes(t);
    int64_t n = dist_tensor_numel(t);
    unsigned char *raw = malloc(bytes ? bytes : 1);
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    if (!raw || !v) {
        free(raw);
        free(v);
        return dist_error(DIST_OUT_OF_MEMORY, "assert: out of memory reading %lld values",
                          (long long)n);
    }
    dist_status st = DIST_OK;
    if (tape)
        st = dist_tape_download(tape, t, raw, bytes);
    else if (bytes)
        memcpy(raw, t->data, bytes);
    for (int64_t i = 0; st == DIST_OK && i < n; i++) {
        switch (t->dtype) {
        case DIST_F32: {
            float f;
            memcpy(&f, raw + 4 * i, 4);
            v[i] = f;
            break;
        }
        case DIST_F16: {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            int e = (h >> 10) & 0x1f, m = h & 0x3ff;
            double mag = e == 0    ? ldexp(m, -24)
                         : e == 31 ? (m ? NAN : INFINITY)
                                   : ldexp(m | 0x400, e - 25);
            v[i] = (h & 0x8000) ? -mag : mag;
            break;
        }
        case DIST_BF16: {
            uint16_t h;
            memcpy(&h, raw + 2 * i, 2);
            uint32_t u = (uint32_t)h << 16;
            float f;
            memcpy(&f, &u, 4);
            v[i] = f;
            break;
        }
        case DIST_I32: {
            int32_t k;
            memcpy(&k, raw + 4 * i, 4);
            v[i] = k;
            break;
        }
        case DIST_I64: {
            int64_t k;
            memcpy(&k, raw + 8 * i, 8);
            v[i] = (double)k;
            break;
        }
        default: v[i] = raw[i]; break;
        }
    }
    free(raw);
    if (st != DIST_OK) {
        free(v);
        return st;
    }
    *out = v;
    return DIST_OK;
}

static int is_float(dist_dtype d) { return d == DIST_F32 || d == DIST_F16 || d == DIST_BF16; }

/* One value as numpy prints it: integers plainly, floats with a trailing '.' when whole. */
static void put_value(text *t, double v, dist_dtype d) {
    if (!is_float(d))
        put(t, "%.0f", v);
    else if (isnan(v))
        put(t, "nan");
    else if (isinf(v))
        put(t, v > 0 ? "inf" : "-inf");
    else if (v == floor(v) && fabs(v) < 1e16)
        put(t, "%.0f.", v);
    else
        put(t, "%g", v);
}

static void put_list(text *t, const double *v, const int64_t *at, int64_t n, dist_dtype d) {
    put(t, "[");
    for (int64_t i = 0; i < n; i++) {
        if (i) put(t, " ");
        put_value(t, v[at ? at[i] : i], d);
    }
    put(t, "]");
}

/* "replica 1: " comes from the strategy's run; the step from the tape's replica context. */
static void put_prefix(text *t, int64_t step, const char *message) {
    if (step > 0) put(t, "step %lld: ", (long long)step);
    if (message && *message) put(t, "%s\n", message);
}

static int64_t step_of(const dist_tape *tape) { return tape->replica ? tape->replica->step : 0; }

typedef enum { CMP_EQUAL, CMP_LESS } cmp_kind;

static dist_status compare_values(dist_tape *tape, int64_t step, const dist_tensor *x,
                                  const dist_tensor *y, const char *message, cmp_kind kind) {
    int64_t nx = dist_tensor_numel(x), ny = dist_tensor_numel(y);
    double *vx = NULL, *vy = NULL;
    DIST_TRY(values_of(tape, x, &vx));
    dist_status st = values_of(tape, y, &vy);
    if (st != DIST_OK) {
        free(vx);
        return st;
    }
    int64_t n = nx > ny ? nx : ny, bad[3], nbad = 0;
    for (int64_t i = 0; i < n && nbad < 3; i++) {
        double a = vx[nx == 1 ? 0 : i], b = vy[ny == 1 ? 0 : i];
        int ok = kind == CMP_EQUAL ? a == b : a < b;
        if (!ok) bad[nbad++] = i;
    }
    if (nbad == 0) {
        free(vx);
        free(vy);
        return DIST_OK;
    }
    /* TensorFlow's layout (tf.debugging.assert_less / assert_equal in eager mode) */
    const dist_tensor *big = nx >= ny ? x : y;
    text t = {.n = 0};
    put_prefix(&t, step, message);
    put(&t, "Condition x %s y did not hold.\nIndices of first %lld different values:\n[",
        kind == CMP_EQUAL ? "==" : "<", (long long)nbad);
    for (int64_t k = 0; k < nbad; k++) {
        put(&t, "%s[", k ? "\n " : "");
        int64_t rest = bad[k], idx[DIST_MAX_DIMS];
        for (int d = big->ndim - 1; d >= 0; d--) {
            idx[d] = big->shape[d] ? rest % big->shape[d] : 0;
            rest = big->shape[d] ? rest / big->shape[d] : 0;
        }
        if (big->ndim == 0) put(&t, "0");
        for (int d = 0; d < big->ndim; d++) put(&t, "%s%lld", d ? " " : "", (long long)idx[d]);
        put(&t, "]");
    }
    put(&t, "]\nCorresponding x values:\n");
    int64_t at[3];
    for (int64_t k = 0; k < nbad; k++) at[k] = nx == 1 ? 0 : bad[k];
    put_list(&t, vx, at, nbad, x->dtype);
    put(&t, "\nCorresponding y values:\n");
    for (int64_t k = 0; k < nbad; k++) at[k] = ny == 1 ? 0 : bad[k];
    put_list(&t, vy, at, nbad, y->dtype);
    put(&t, "\nFirst 3 elements of x:\n");
    put_list(&t, vx, NULL, nx < 3 ? nx : 3, x->dtype);
    put(&t, "\nFirst 3 elements of y:\n");
    put_list(&t, vy, NULL, ny < 3 ? ny : 3, y->dtype);
    free(vx);
    free(vy);
    return dist_error(DIST_INVALID_ARGUMENT, "%s", t.buf);
}

static dist_status compare_deferred(const dist_tensor *const *v, int count, const void *args,
                                    int64_t step) {
    const deferred_args *a = args;
    (void)count;
    return compare_values(NULL, step, v[0], v[1], a->message, (cmp_kind)a->kind);
}

static dist_status compare(dist_tape *tape, const dist_tensor *x, const dist_tensor *y,
                           const char *message, cmp_kind kind) {
    const char *op = kind == CMP_EQUAL ? "dist_debug_assert_equal" : "dist_debug_assert_less";
    DIST_CHECK_ARG(tape && x && y, "%s: NULL argument", op);
    int64_t nx = dist_tensor_numel(x), ny = dist_tensor_numel(y);
    if (nx != ny && nx != 1 && ny != 1) {
        char a[96], b[96];
        return dist_error(DIST_INVALID_ARGUMENT,
                          "%s: x %s and y %s have %lld and %lld values (equal counts, or a scalar "
                          "against a tensor)",
                          op, dist_shape_str(x, a, sizeof a), dist_shape_str(y, b, sizeof b),
                          (long long)nx, (long long)ny);
    }
    if (dist_backend_is_traced(tape->backend)) {
        const dist_tensor *xy[2] = {x, y};
        return defer(tape, op, 2, xy, compare_deferred, kind, message);
    }
    return compare_values(tape, step_of(tape), x, y, message, kind);
}

dist_status dist_debug_assert_equal(dist_tape *tape, const dist_tensor *x, const dist_tensor *y,
                                    const char *message) {
    return compare(tape, x, y, message, CMP_EQUAL);
}

dist_status dist_debug_assert_less(dist_tape *tape, const dist_tensor *x, const dist_tensor *y,
                                   const char *message) {
    return compare(tape, x, y, message, CMP_LESS);
}

/* TensorFlow's CheckNumerics text: "<message> : Tensor had NaN values" (NaN first); v holds
 * a non-finite value. */
static dist_status not_finite(int64_t step, const double *v, int64_t n, const char *message) {
    int nan = 0;
    for (int64_t i = 0; i < n && !nan; i++) nan = isnan(v[i]);
    text t = {.n = 0};
    put_prefix(&t, step, NULL);
    put(&t, "%s : Tensor had %s values", message ? message : "", nan ? "NaN" : "Inf");
    return dist_error(DIST_INVALID_ARGUMENT, "%s", t.buf);
}

static dist_status all_finite_deferred(const dist_tensor *const *v, int count, const void *args,
                                       int64_t step) {
    const deferred_args *a = args;
    (void)count;
    double *vals = NULL;
    DIST_TRY(values_of(NULL, v[0], &vals));
    int64_t n = dist_tensor_numel(v[0]), bad = 0;
    for (int64_t i = 0; i < n && !bad; i++) bad = !isfinite(vals[i]);
    dist_status st = bad ? not_finite(step, vals, n, a->message) : DIST_OK;
    free(vals);
    return st;
}

dist_status dist_debug_assert_all_finite(dist_tape *tape, const dist_tensor *x,
                                         const char *message) {
    DIST_CHECK_ARG(tape && x, "dist_debug_assert_all_finite: NULL argument");
    if (!is_float(x->dtype)) return DIST_OK; /* integers are always finite */
    if (dist_backend_is_traced(tape->backend))
        return defer(tape, "dist_debug_assert_all_finite", 1, &x, all_finite_deferred, 0,
                     message);
    int ok = 1;
    DIST_TRY(tape->backend->iface->all_finite(tape->backend->ctx, x, &ok));
    if (ok) return DIST_OK;
    double *v = NULL;
    DIST_TRY(values_of(tape, x, &v));
    dist_status st = not_finite(step_of(tape), v, dist_tensor_numel(x), message);
    free(v);
    return st;
}

/* A shape as Python prints a tuple: (), (4,), (2, 3). */
static void tuple_str(const dist_tensor *x, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "(");
    for (int d = 0; d < x->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, "%s%lld", d ? ", " : "", (long long)x->shape[d]);
    if (n < size) snprintf(buf + n, size - n, x->ndim == 1 ? ",)" : ")");
}

dist_status dist_debug_assert_shape(dist_tape *tape, const dist_tensor *x, int ndim,
                                    const int64_t *shape, const char *message) {
    DIST_CHECK_ARG(tape && x && (shape || ndim == 0), "dist_debug_assert_shape: NULL argument");
    DIST_CHECK_ARG(ndim >= 0 && ndim <= DIST_MAX_DIMS, "dist_debug_assert_shape: rank %d", ndim);
    char have[96];
    tuple_str(x, have, sizeof have);
    text t = {.n = 0};
    put_prefix(&t, step_of(tape), NULL);
    if (message && *message) put(&t, "%s.  ", message);
    if (x->ndim != ndim) {
        put(&t,
            "Specified explicitly.  Tensor shape=%s dtype=%s must have rank %d.  Received "
            "rank %d, shape %s",
            have, dist_dtype_name(x->dtype), ndim, x->ndim, have);
        return dist_error(DIST_INVALID_ARGUMENT, "%s", t.buf);
    }
    for (int d = 0; d < ndim; d++)
        if (shape[d] >= 0 && x->shape[d] != shape[d]) {
            /* tf.debugging.assert_shapes' text */
            put(&t,
                "Specified explicitly.  Tensor shape=%s dtype=%s dimension %d must have size "
                "%lld.  Received size %lld, shape %s",
                have, dist_dtype_name(x->dtype), d, (long long)shape[d], (long long)x->shape[d],
                have);
            return dist_error(DIST_INVALID_ARGUMENT, "%s", t.buf);
        }
    return DIST_OK;
}
