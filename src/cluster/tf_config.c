/* TF_CONFIG as TensorFlow reads it: TFConfigClusterResolver
 * (tensorflow/python/distribute/cluster_resolver/tfconfig_cluster_resolver.py) and the
 * ClusterSpec constructor (tensorflow/python/training/server_lib.py). Messages are TF's. */
#include "cluster/cluster_impl.h"
#include "core/env.h"
#include "core/error.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Limits TF itself does not have: a TF_CONFIG is an environment variable, never this large, and
 * a job of more tasks than this is a hostile value (each task is a process to wait for). */
#define TF_CONFIG_MAX_BYTES ((size_t)1 << 20)
#define TF_CONFIG_MAX_TASKS_PER_JOB 65536

/* Python's type name of a JSON value, for TypeError texts. */
static const char *py_type_name(const cJSON *v) {
    if (cJSON_IsNull(v)) return "NoneType";
    if (cJSON_IsBool(v)) return "bool";
    if (cJSON_IsNumber(v)) return v->valuedouble == floor(v->valuedouble) ? "int" : "float";
    if (cJSON_IsString(v)) return "str";
    if (cJSON_IsArray(v)) return "list";
    return "dict";
}

/* Python's int(s) for a str: surrounding whitespace, a sign, digits with single underscores. */
static bool py_int_of_string(const char *s, long *out) {
    while (isspace((unsigned char)*s)) ++s;
    size_t len = strlen(s);
    while (len > 0 && isspace((unsigned char)s[len - 1])) --len;
    size_t i = 0;
    bool neg = false;
    if (i < len && (s[i] == '+' || s[i] == '-')) neg = s[i++] == '-';
    if (i >= len || !isdigit((unsigned char)s[i])) return false;
    long v = 0;
    for (; i < len; ++i) {
        if (s[i] == '_') {
            if (i + 1 >= len || !isdigit((unsigned char)s[i + 1])) return false;
            continue;
        }
        if (!isdigit((unsigned char)s[i])) return false;
        if (v > (LONG_MAX - 9) / 10) return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = neg ? -v : v;
    return true;
}

/* Python's int(value) for a JSON value, with Python's error texts. */
static dist_status py_int(const cJSON *v, long *out) {
    char repr[256];
    if (cJSON_IsBool(v)) {
        *out = cJSON_IsTrue(v) ? 1 : 0;
        return DIST_OK;
    }
    if (cJSON_IsNumber(v)) {
        double d = trunc(v->valuedouble);
        if (!(d > (double)LONG_MIN && d < (double)LONG_MAX))
            return dist_error(DIST_INVALID_ARGUMENT, "task index %g is out of range", d);
        *out = (long)d;
        return DIST_OK;
    }
    if (cJSON_IsString(v)) {
        if (py_int_of_string(v->valuestring, out)) return DIST_OK;
        dist_cluster_py_repr(v->valuestring, repr, sizeof repr);
        return dist_error(DIST_INVALID_ARGUMENT, "invalid literal for int() with base 10: %s",
                          repr);
    }
    return dist_error(DIST_INVALID_ARGUMENT,
                      "int() argument must be a string, a bytes-like object or a real number, "
                      "not '%s'",
                      py_type_name(v));
}

/* Python's str(value) for task.type when it is not a JSON string. */
static void py_str(const cJSON *v, char *buf, size_t cap) {
    if (cJSON_IsNull(v))
        snprintf(buf, cap, "None");
    else if (cJSON_IsBool(v))
        snprintf(buf, cap, cJSON_IsTrue(v) ? "True" : "False");
    else if (cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
             fabs(v->valuedouble) < 1e15)
        snprintf(buf, cap, "%.0f", v->valuedouble);
    else if (cJSON_IsNumber(v))
        snprintf(buf, cap, "%.17g", v->valuedouble);
    else {
        char *s = cJSON_PrintUnformatted(v);
        snprintf(buf, cap, "%s", s ? s : "?");
        free(s);
    }
}

static dist_status parse_job(dist_cluster *c, const cJSON *tasks) {
    char repr[512];
    dist_cluster_job *job = NULL;
    if (!cJSON_IsArray(tasks) && !cJSON_IsObject(tasks)) {
        dist_cluster_py_repr(tasks->string, repr, sizeof repr);
        return dist_error(DIST_INVALID_ARGUMENT,
                          "The tasks for job %s must be a list or a dictionary from integers to "
                          "strings.",
                          repr);
    }
    if (cJSON_GetArraySize(tasks) > TF_CONFIG_MAX_TASKS_PER_JOB)
        return dist_error(DIST_INVALID_ARGUMENT, "TF_CONFIG: job '%.100s' has more than %d tasks",
                          tasks->string, TF_CONFIG_MAX_TASKS_PER_JOB);
    DIST_TRY(dist_cluster_add_job(c, tasks->string, &job));
    long position = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tasks) {
        long index = position++;
        if (cJSON_IsObject(tasks)) { /* the sparse form: {"index": address} */
            if (!py_int_of_string(t->string, &index)) {
                dist_cluster_py_repr(t->string, repr, sizeof repr);
                return dist_error(DIST_INVALID_ARGUMENT,
                                  "invalid literal for int() with base 10: %s", repr);
            }
        }
        if (!cJSON_IsString(t)) {
            py_str(t, repr, sizeof repr);
            return dist_error(DIST_INVALID_ARGUMENT, "Task address %s must be bytes or unicode",
                              repr);
        }
        DIST_TRY(dist_cluster_add_task(job, index, t->valuestring));
    }
    return DIST_OK;
}

static dist_status parse_document(const cJSON *root, dist_cluster *c) {
    if (!cJSON_IsObject(root)) return dist_error(DIST_FORMAT, "TF_CONFIG must be a JSON object");
    const cJSON *cluster = cJSON_GetObjectItemCaseSensitive(root, "cluster");
    if (cluster) {
        if (!cJSON_IsObject(cluster))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "`cluster` must be a dictionary mapping one or more job names to "
                              "lists of network addresses, or a `ClusterDef` protocol buffer");
        const cJSON *tasks;
        cJSON_ArrayForEach(tasks, cluster) DIST_TRY(parse_job(c, tasks));
    }
    const cJSON *task = cJSON_GetObjectItemCaseSensitive(root, "task");
    if (task && !cJSON_IsObject(task))
        return dist_error(DIST_FORMAT, "TF_CONFIG: task must be a JSON object");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(task, "type");
    if (type) {
        char buf[256];
        if (!cJSON_IsString(type)) py_str(type, buf, sizeof buf);
        DIST_TRY(
            dist_cluster_set_string(&c->task_type, cJSON_IsString(type) ? type->valuestring : buf));
    }
    const cJSON *index = cJSON_GetObjectItemCaseSensitive(task, "index");
    if (index) {
        DIST_TRY(py_int(index, &c->task_id));
        c->has_task_id = true;
    }
    const cJSON *rpc = cJSON_GetObjectItemCaseSensitive(root, "rpc_layer");
    if (rpc && !cJSON_IsNull(rpc)) {
        if (!cJSON_IsString(rpc))
            return dist_error(DIST_FORMAT, "TF_CONFIG: rpc_layer must be a string");
        DIST_TRY(dist_cluster_set_string(&c->rpc_layer, rpc->valuestring));
    }
    return DIST_OK;
}

dist_status dist_cluster_parse_tf_config(const char *json, dist_cluster *c) {
    if (!json) json = dist_env_raw(DIST_ENV_TF_CONFIG);
    if (!json || !json[0]) return DIST_OK; /* unset or empty: the empty cluster */
    if (strnlen(json, TF_CONFIG_MAX_BYTES + 1) > TF_CONFIG_MAX_BYTES)
        return dist_error(DIST_FORMAT, "TF_CONFIG is longer than %zu bytes", TF_CONFIG_MAX_BYTES);
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        return dist_error(DIST_FORMAT, "TF_CONFIG is not valid JSON (near offset %ld)",
                          at ? (long)(at - json) : 0L);
    }
    dist_status st = parse_document(root, c);
    cJSON_Delete(root);
    return st;
}

dist_status dist_cluster_from_tf_config(const char *json, dist_cluster **out) {
    DIST_CHECK_ARG(out, "dist_cluster_from_tf_config: out is NULL");
    *out = NULL;
    dist_cluster *c = NULL;
    dist_status st;
    DIST_TRY(dist_cluster_alloc(&c));
    DIST_TRY_GOTO(dist_cluster_parse_tf_config(json, c), st, fail);
    DIST_TRY_GOTO(dist_cluster_finalize(c), st, fail);
    *out = c;
    return DIST_OK;
fail:
    dist_cluster_destroy(c);
    return st;
}
