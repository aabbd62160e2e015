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

/* A model wired as anything but a stack (Keras's Functional summary then adds a column). */
static int is_graph(const dist_model *m) {
    if (m->output >= 0 && m->output != m->nlayers - 1) return 1;
    for (int i = 0; i < m->nlayers; i++)
        if (m->layers[i].ninputs != 1 || m->layers[i].inputs[0] != i - 1) return 1;
    return 0;
}

static void shape_text(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t len = (size_t)snprintf(buf, size, "(None");
    for (int d = 0; d < ndim && len < size; d++)
        len += (size_t)snprintf(buf + len, size - len, ", %lld", (long long)shape[d]);
    if (len < size) snprintf(buf + len, size - len, ")");
}

dist_status dist_model_summary(const dist_model *m, char *buf, size_t size) {
    DIST_CHECK_ARG(m && buf && size > 0, "dist_model_summary: NULL argument");
    DIST_CHECK_ARG(m->built, "model '%s' is not built: its shapes are unknown", m->name);
    text t = {buf, size, 0};
    buf[0] = '\0';
    /* a graph's rows name the layers each reads ("Connected to", as Keras's Functional
     * summary), its input first as a row of its own */
    int graph = is_graph(m);
    const char *rule = "_________________________________________________________________";
    const char *dbl = "=================================================================";
    const char *wide_rule = "______________________________________________________________________"
                            "____________________________";
    const char *wide_dbl = "======================================================================"
                           "============================";
    if (graph) {
        rule = wide_rule;
        dbl = wide_dbl;
    }
    put(&t, "Model: \"%s\"\n%s\n", m->name, rule);
    if (graph)
        put(&t, " %-28s%-26s%-10s%s\n%s\n", "Layer (type)", "Output Shape", "Param #",
            "Connected to", dbl);
    else
        put(&t, " %-28s%-26s%-10s\n%s\n", "Layer (type)", "Output Shape", "Param #", dbl);
    char name[64], shape[64], params[32];
    if (graph) {
        snprintf(name, sizeof name, "%s (InputLayer)", m->input_name);
        name[27] = '\0';
        shape_text(m->in_ndim, m->in_shape, shape, sizeof shape);
        put(&t, " %-28s%-26s%-10s%s\n\n", name, shape, "0", "[]");
    }
    for (int i = 0; i < m->nlayers; i++) {
        const model_layer *l = &m->layers[i];
        snprintf(name, sizeof name, "%s (%s)", l->name, model_layer_class(l->kind));
        shape_text(l->out_ndim, l->out_shape, shape, sizeof shape);
        thousands(l->params, params, sizeof params);
        name[27] = '\0'; /* Keras cuts long names to the column */
        if (!graph) {
            put(&t, " %-28s%-26s%-10s\n\n", name, shape, params);
            continue;
        }
        for (int j = 0; j < l->ninputs; j++) {
            const char *from =
                l->inputs[j] == DIST_MODEL_INPUT ? m->input_name : m->layers[l->inputs[j]].name;
            if (j == 0)
                put(&t, " %-28s%-26s%-10s%s[0][0]\n", name, shape, params, from);
            else
                put(&t, " %-28s%-26s%-10s%s[0][0]\n", "", "", "", from);
        }
        put(&t, "\n");
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
