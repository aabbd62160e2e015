/* model.summary() as Keras prints it. */
#include "core/error.h"
#include "nn/model_impl.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

typedef struct text {
    char *buf;
    size_t size, len;
} text;

static void put(text *t, const char *fmt, ...) {
    if (t->len + 1 >= t->size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(t->buf + t->len, t->size - t->len, fmt, ap);
    va_end(ap);
    if (n > 0) t->len += (size_t)n < t->size - t->len ? (size_t)n : t->size - t->len - 1;
}

static void thousands(int64_t v, char *out, size_t size) {
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", (long long)v);
    size_t n = strlen(digits), j = 0;
    for (size_t i = 0; i < n && j + 2 < size; i++) {
        if (i > 0 && (n - i) % 3 == 0) out[j++] = ',';
        out[j++] = digits[i];
    }
    out[j] = '\0';
}

dist_status dist_model_summary(const dist_model *m, char *buf, size_t size) {
    DIST_CHECK_ARG(m && buf && size > 0, "dist_model_summary: NULL argument");
    DIST_CHECK_ARG(m->built, "model '%s' is not built: its shapes are unknown", m->name);
    text t = {buf, size, 0};
    buf[0] = '\0';
    const char *rule = "_________________________________________________________________";
    const char *dbl = "=================================================================";
    put(&t, "Model: \"%s\"\n%s\n", m->name, rule);
    put(&t, " %-28s%-26s%-10s\n%s\n", "Layer (type)", "Output Shape", "Param #", dbl);
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *l = &m->layers[i];
        char name[64], shape[64], params[32];
        snprintf(name, sizeof name, "%s (%s)", l->name, model_layer_class(l->kind));
        size_t len = (size_t)snprintf(shape, sizeof shape, "(None");
        for (int d = 0; d < l->out_ndim; d++)
            len += (size_t)snprintf(shape + len, sizeof shape - len, ", %lld",
                                    (long long)l->out_shape[d]);
        snprintf(shape + len, sizeof shape - len, ")");
        thousands(l->params, params, sizeof params);
        name[27] = '\0'; /* Keras cuts long names to the column */
        put(&t, " %-28s%-26s%-10s\n\n", name, shape, params);
    }
    char total[32], trainable[32], frozen[32];
    int64_t fixed = 0;
    for (int i = 0; i < m->nvars; i++)
        if (!m->vars[i].trainable) fixed += m->vars[i].numel;
    thousands(m->nparams, total, sizeof total);
    thousands(m->nparams - fixed, trainable, sizeof trainable);
    thousands(fixed, frozen, sizeof frozen);
    if (t.len >= 1 && buf[t.len - 1] == '\n') t.len--; /* no blank line after the last layer */
    put(&t, "%s\nTotal params: %s\nTrainable params: %s\nNon-trainable params: %s\n%s\n", dbl,
        total, trainable, frozen, rule);
    return DIST_OK;
}
