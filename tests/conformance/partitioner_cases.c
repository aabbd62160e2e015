/* Our side of the partitioner conformance test: every case of CASES.json (a partitioner with
 * TF's argument names, a shape, a dtype name) through dist_partitioner_num_shards and
 * dist_partitioner_shard_rows, printed as the same JSON object partitioner_reference.py prints
 * from TensorFlow: {name: {"shards": N, "rows": [...]}} or {name: {"error": message}}.
 * Arguments a case leaves out take TF's constructor defaults (DIST_PARTITIONER_INIT, and
 * max_shards=None for MaxSizePartitioner). Exit status 2 on a malformed case file.
 *
 *   partitioner_cases CASES.json */
#include "dist/partitioner.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(const char *what, const char *name) {
    fprintf(stderr, "partitioner_cases: %s%s%s\n", what, name ? " in case " : "", name ? name : "");
    return 2;
}

/* An integer member of `obj` into *out when present and not null. */
static int read_int(const cJSON *obj, const char *key, int64_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!v || cJSON_IsNull(v)) return 1;
    if (!cJSON_IsNumber(v)) return 0;
    *out = (int64_t)v->valuedouble;
    return 1;
}

static int read_partitioner(const cJSON *spec, dist_partitioner *p) {
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(spec, "kind");
    if (!cJSON_IsString(kind)) return 0;
    dist_partitioner init = DIST_PARTITIONER_INIT;
    *p = init;
    int64_t num_shards = p->num_shards, min_bytes = p->min_shard_bytes;
    int64_t max_bytes = p->max_shard_bytes, max_shards = p->max_shards;
    int64_t bytes_per_string = p->bytes_per_string;
    if (strcmp(kind->valuestring, "none") == 0) {
        p->kind = DIST_PARTITIONER_NONE;
    } else if (strcmp(kind->valuestring, "fixed") == 0) {
        p->kind = DIST_PARTITIONER_FIXED_SHARDS;
    } else if (strcmp(kind->valuestring, "min_size") == 0) {
        p->kind = DIST_PARTITIONER_MIN_SIZE;
    } else if (strcmp(kind->valuestring, "max_size") == 0) {
        p->kind = DIST_PARTITIONER_MAX_SIZE;
        max_shards = 0; /* TF's None */
    } else {
        return 0;
    }
    if (!read_int(spec, "num_shards", &num_shards) ||
        !read_int(spec, "min_shard_bytes", &min_bytes) ||
        !read_int(spec, "max_shard_bytes", &max_bytes) ||
        !read_int(spec, "max_shards", &max_shards) ||
        !read_int(spec, "bytes_per_string", &bytes_per_string))
        return 0;
    p->num_shards = (int)num_shards;
    p->min_shard_bytes = min_bytes;
    p->max_shard_bytes = max_bytes;
    p->max_shards = (int)max_shards;
    p->bytes_per_string = (int)bytes_per_string;
    return 1;
}

static int read_dtype(const cJSON *name, dist_dtype *out) {
    if (!cJSON_IsString(name)) return 0;
    for (int d = 0; d < DIST_DTYPE_COUNT; ++d) {
        if (strcmp(dist_dtype_name((dist_dtype)d), name->valuestring) == 0) {
            *out = (dist_dtype)d;
            return 1;
        }
    }
    return 0;
}

/* The result of one case: {"shards": N, "rows": [...]} or {"error": message}. */
static cJSON *run_case(const dist_partitioner *p, int ndim, const int64_t *shape,
                       dist_dtype dtype) {
    cJSON *result = cJSON_CreateObject();
    int n = 0;
    dist_status st = dist_partitioner_num_shards(p, ndim, shape, dtype, &n);
    cJSON *rows = cJSON_CreateArray();
    int64_t next = 0; /* TF's shards are consecutive: each starts where the last one ended */
    for (int i = 0; st == DIST_OK && i < n; ++i) {
        int64_t offset = 0, count = 0;
        st = dist_partitioner_shard_rows(shape[0], n, i, &offset, &count);
        if (st == DIST_OK && offset != next) {
            cJSON_Delete(rows);
            cJSON_AddStringToObject(result, "error", "shards are not consecutive");
            return result;
        }
        next += count;
        cJSON_AddItemToArray(rows, cJSON_CreateNumber((double)count));
    }
    if (st != DIST_OK) {
        cJSON_Delete(rows);
        cJSON_AddStringToObject(result, "error", dist_last_error());
        return result;
    }
    cJSON_AddNumberToObject(result, "shards", n);
    cJSON_AddItemToObject(result, "rows", rows);
    return result;
}

int main(int argc, char **argv) {
    if (argc != 2) return fail("usage: partitioner_cases CASES.json", NULL);
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
        const cJSON *shape_json = cJSON_GetObjectItemCaseSensitive(c, "shape");
        const char *case_name = cJSON_IsString(name) ? name->valuestring : NULL;
        dist_partitioner p;
        dist_dtype dtype = DIST_F32;
        int64_t shape[16];
        int ndim = cJSON_GetArraySize(shape_json);
        if (!case_name || !cJSON_IsArray(shape_json) || ndim > 16 ||
            !read_partitioner(cJSON_GetObjectItemCaseSensitive(c, "partitioner"), &p) ||
            !read_dtype(cJSON_GetObjectItemCaseSensitive(c, "dtype"), &dtype)) {
            status = fail("a malformed case", case_name);
            break;
        }
        for (int i = 0; i < ndim; ++i)
            shape[i] = (int64_t)cJSON_GetArrayItem(shape_json, i)->valuedouble;
        cJSON_AddItemToObject(out, case_name, run_case(&p, ndim, shape, dtype));
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
