/* Our side of the learning-rate schedule and clipping conformance test: every case of
 * CASES.json through libdist, printed as the JSON object lr_schedule_reference.py prints from
 * TensorFlow. A schedule case goes through the command-line form (its args written as
 * `kind:key=value,...`, lists joined with ';') and dist_lr_schedule_parse, then
 * dist_lr_schedule_value at steps 0..steps-1; a clipping case is one SGD(learning_rate=1) step
 * with dist_optimizer_set_clipping on a Dense(units) model over `inputs` features. Exit status
 * 2 on a malformed case file.
 *
 *   lr_schedule_cases CASES.json */
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/tape.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *name) {
    fprintf(stderr, "lr_schedule_cases: %s%s%s\n", what, name ? " in case " : "", name ? name : "");
    return 2;
}

static cJSON *error_result(void) {
    cJSON *r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "error", dist_last_error());
    return r;
}

/* The shortest of %.15g and %.17g that reads back as v, so that messages show 0.1. */
static int print_number(char *buf, size_t size, double v) {
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%.15g", v);
    if (strtod(tmp, NULL) != v) snprintf(tmp, sizeof tmp, "%.17g", v);
    return snprintf(buf, size, "%s", tmp);
}

/* "kind:key=value,..." from the case's kind and args; 0 when an arg is of no known type. */
static int spec_of(const cJSON *kind, const cJSON *args, char *buf, size_t size) {
    size_t len = (size_t)snprintf(buf, size, "%s:", kind->valuestring);
    const cJSON *a = NULL;
    int first = 1;
    cJSON_ArrayForEach(a, args) {
        len += (size_t)snprintf(buf + len, size - len, "%s%s=", first ? "" : ",", a->string);
        first = 0;
        if (cJSON_IsBool(a)) {
            len += (size_t)snprintf(buf + len, size - len, "%d", cJSON_IsTrue(a) ? 1 : 0);
        } else if (cJSON_IsNumber(a)) {
            len += (size_t)print_number(buf + len, size - len, a->valuedouble);
        } else if (cJSON_IsNull(a)) {
            len += (size_t)snprintf(buf + len, size - len, "none");
        } else if (cJSON_IsArray(a)) {
            const cJSON *x = NULL;
            int i = 0;
            cJSON_ArrayForEach(x, a) {
                if (i++) len += (size_t)snprintf(buf + len, size - len, ";");
                len += (size_t)print_number(buf + len, size - len, x->valuedouble);
            }
        } else {
            return 0;
        }
        if (len >= size) return 0;
    }
    return 1;
}

static cJSON *schedule_case(const cJSON *c) {
    char spec[4096];
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(c, "kind");
    const cJSON *steps = cJSON_GetObjectItemCaseSensitive(c, "steps");
    if (!cJSON_IsString(kind) || !cJSON_IsNumber(steps) ||
        !spec_of(kind, cJSON_GetObjectItemCaseSensitive(c, "args"), spec, sizeof spec))
        return NULL;
    dist_lr_schedule s;
    if (dist_lr_schedule_parse(spec, &s) != DIST_OK) return error_result();
    cJSON *values = cJSON_CreateArray();
    for (int step = 0; step < steps->valueint; step++) {
        float lr;
        if (dist_lr_schedule_value(&s, step, &lr) != DIST_OK) {
            cJSON_Delete(values);
            return error_result();
        }
        cJSON_AddItemToArray(values, cJSON_CreateNumber((double)lr));
    }
    cJSON *r = cJSON_CreateObject();
    cJSON_AddItemToObject(r, "values", values);
    return r;
}

static float clip_arg(const cJSON *clip, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(clip, key);
    return cJSON_IsNumber(v) ? (float)v->valuedouble : 0.0f;
}

static int read_floats(const cJSON *arr, float *out, int n) {
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n) return 0;
    for (int i = 0; i < n; i++) out[i] = (float)cJSON_GetArrayItem(arr, i)->valuedouble;
    return 1;
}

static cJSON *clip_case(const cJSON *c) {
    const cJSON *clip = cJSON_GetObjectItemCaseSensitive(c, "clip");
    int inputs = cJSON_GetObjectItemCaseSensitive(c, "inputs")->valueint;
    int units = cJSON_GetObjectItemCaseSensitive(c, "units")->valueint;
    int n = inputs * units + units;
    float w[256], g[256];
    if (n > 256 || !read_floats(cJSON_GetObjectItemCaseSensitive(c, "weights"), w, n) ||
        !read_floats(cJSON_GetObjectItemCaseSensitive(c, "grads"), g, n))
        return NULL;
    dist_model *m = NULL;
    dist_tape *t = NULL;
    dist_optimizer *o = NULL;
    dist_sgd_options so = DIST_SGD_OPTIONS_INIT;
    so.learning_rate = 1.0f;
    int64_t shape[1] = {inputs};
    cJSON *r = NULL;
    if (dist_model_create(NULL, &m) != DIST_OK || dist_model_add_dense(m, units, DIST_ACT_NONE) ||
        dist_model_build(m, 1, shape, 1) || dist_model_set_weights(m, w, n) ||
        dist_tape_create(dist_model_backend(m, 0), &t) ||
        dist_backend_from_host(dist_model_backend(m, 0), g, (size_t)n * sizeof(float),
                               dist_model_grads(m, 0)) ||
        dist_optimizer_create_sgd(&so, &o) ||
        dist_optimizer_set_clipping(o, clip_arg(clip, "clipnorm"), clip_arg(clip, "clipvalue"),
                                    clip_arg(clip, "global_clipnorm")) ||
        dist_optimizer_apply_gradients(o, m, t) || dist_model_get_weights(m, 0, w, n)) {
        r = error_result();
    } else {
        r = cJSON_CreateObject();
        cJSON *weights = cJSON_AddArrayToObject(r, "weights");
        for (int i = 0; i < n; i++) cJSON_AddItemToArray(weights, cJSON_CreateNumber(w[i]));
    }
    dist_optimizer_destroy(o);
    dist_tape_destroy(t);
    dist_model_destroy(m);
    return r;
}

int main(int argc, char **argv) {
    if (argc != 2) return fail("usage: lr_schedule_cases CASES.json", NULL);
    FILE *f = fopen(argv[1], "rb");
    if (!f) return fail("cannot open the case file", NULL);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    cJSON *cases = cJSON_Parse(text);
    if (!cJSON_IsArray(cases)) return fail("the case file is not a JSON array", NULL);
    cJSON *out = cJSON_CreateObject();
    const cJSON *c = NULL;
    int status = 0;
    cJSON_ArrayForEach(c, cases) {
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(c, "name");
        const char *case_name = cJSON_IsString(name) ? name->valuestring : NULL;
        cJSON *r = NULL;
        if (case_name)
            r = cJSON_GetObjectItemCaseSensitive(c, "clip") ? clip_case(c) : schedule_case(c);
        if (!r) {
            status = fail("a malformed case", case_name);
            break;
        }
        cJSON_AddItemToObject(out, case_name, r);
    }
    if (status == 0) {
        char *printed = cJSON_Print(out);
        printf("%s\n", printed);
        free(printed);
    }
    cJSON_Delete(out);
    cJSON_Delete(cases);
    return status;
}
