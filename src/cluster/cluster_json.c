/* The resolved cluster as one JSON object (distrain --print-cluster, the conformance test). */
#include "cluster/cluster_impl.h"
#include "core/error.h"

#include <cjson/cJSON.h>
#include <stdlib.h>

static cJSON *add_int_or_null(cJSON *o, const char *key, bool has, double v) {
    return has ? cJSON_AddNumberToObject(o, key, v) : cJSON_AddNullToObject(o, key);
}

static cJSON *add_string_or_null(cJSON *o, const char *key, const char *s) {
    return s ? cJSON_AddStringToObject(o, key, s) : cJSON_AddNullToObject(o, key);
}

dist_status dist_cluster_to_json(const dist_cluster *c, char **out) {
    DIST_CHECK_ARG(c && out, "dist_cluster_to_json: cluster and out must not be NULL");
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    bool ok = root != NULL;
    ok = ok && add_string_or_null(root, "task_type", c->task_type);
    ok = ok && add_int_or_null(root, "task_id", c->has_task_id, (double)c->task_id);
    ok = ok && cJSON_AddBoolToObject(root, "is_chief", c->is_chief);
    ok = ok && add_int_or_null(root, "worker_count", c->has_worker_count, c->worker_count);
    ok = ok && add_int_or_null(root, "id_in_cluster", c->has_id_in_cluster, c->id_in_cluster);
    ok = ok && add_string_or_null(root, "collective_leader", c->collective_leader);
    ok = ok && add_string_or_null(root, "rpc_layer", c->rpc_layer);
    cJSON *cluster = ok ? cJSON_AddObjectToObject(root, "cluster") : NULL;
    ok = ok && cluster;
    for (size_t j = 0; ok && j < c->num_jobs; ++j) {
        cJSON *tasks = cJSON_AddArrayToObject(cluster, c->jobs[j].name);
        ok = tasks != NULL;
        for (size_t t = 0; ok && t < c->jobs[j].num_tasks; ++t) {
            cJSON *a = cJSON_CreateString(c->jobs[j].tasks[t].address);
            ok = a && cJSON_AddItemToArray(tasks, a);
        }
    }
    char *text = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!text) return dist_error(DIST_OUT_OF_MEMORY, "printing the cluster as JSON");
    *out = text;
    return DIST_OK;
}
