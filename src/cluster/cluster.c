/* The cluster object: storage, accessors, and TensorFlow's validation and numbering rules
 * (tensorflow/python/distribute/multi_worker_util.py: _validate_cluster_spec, is_chief,
 * worker_count, id_in_cluster, collective_leader). */
#include "cluster/cluster_impl.h"
#include "core/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TF_ALLOWED_TYPES "('chief', 'worker', 'evaluator', 'ps', None)"

dist_status dist_cluster_alloc(dist_cluster **out) {
    *out = calloc(1, sizeof(dist_cluster));
    if (!*out) return dist_error(DIST_OUT_OF_MEMORY, "allocating a cluster");
    (*out)->collective_leader = "";
    return DIST_OK;
}

void dist_cluster_destroy(dist_cluster *c) {
    if (!c) return;
    for (size_t j = 0; j < c->num_jobs; ++j) {
        for (size_t t = 0; t < c->jobs[j].num_tasks; ++t) free(c->jobs[j].tasks[t].address);
        free(c->jobs[j].tasks);
        free(c->jobs[j].name);
    }
    free(c->jobs);
    free(c->task_type);
    free(c->rpc_layer);
    free(c);
}

dist_status dist_cluster_set_string(char **field, const char *value) {
    char *copy = value ? strdup(value) : NULL;
    if (value && !copy) return dist_error(DIST_OUT_OF_MEMORY, "copying a string");
    free(*field);
    *field = copy;
    return DIST_OK;
}

dist_status dist_cluster_add_job(dist_cluster *c, const char *name, dist_cluster_job **job) {
    dist_cluster_job *jobs = realloc(c->jobs, (c->num_jobs + 1) * sizeof(*jobs));
    if (!jobs) return dist_error(DIST_OUT_OF_MEMORY, "adding job '%s'", name);
    c->jobs = jobs;
    dist_cluster_job *j = &jobs[c->num_jobs];
    memset(j, 0, sizeof(*j));
    j->name = strdup(name);
    if (!j->name) return dist_error(DIST_OUT_OF_MEMORY, "adding job '%s'", name);
    c->num_jobs++;
    *job = j;
    return DIST_OK;
}

dist_status dist_cluster_add_task(dist_cluster_job *job, long index, const char *address) {
    char *addr = strdup(address);
    if (!addr) return dist_error(DIST_OUT_OF_MEMORY, "adding a task");
    /* tasks usually come in index order: appending is O(1) (a job of 65,536 tasks was
     * quadratic before, found by fuzz_slurm) */
    size_t pos = job->num_tasks;
    if (pos > 0 && job->tasks[pos - 1].index >= index) {
        pos = 0;
        while (pos < job->num_tasks && job->tasks[pos].index < index) ++pos;
    }
    if (pos < job->num_tasks &&
        job->tasks[pos].index == index) { /* a later key wins, as in a dict */
        free(job->tasks[pos].address);
        job->tasks[pos].address = addr;
        return DIST_OK;
    }
    if (job->num_tasks == job->cap_tasks) {
        size_t cap = job->cap_tasks ? 2 * job->cap_tasks : 8;
        dist_cluster_task *grown = realloc(job->tasks, cap * sizeof(*grown));
        if (!grown) {
            free(addr);
            return dist_error(DIST_OUT_OF_MEMORY, "adding a task");
        }
        job->tasks = grown;
        job->cap_tasks = cap;
    }
    dist_cluster_task *tasks = job->tasks;
    memmove(&tasks[pos + 1], &tasks[pos], (job->num_tasks - pos) * sizeof(*tasks));
    tasks[pos].index = index;
    tasks[pos].address = addr;
    job->num_tasks++;
    return DIST_OK;
}

const dist_cluster_job *dist_cluster_find_job(const dist_cluster *c, const char *name) {
    if (!c || !name) return NULL;
    for (size_t j = 0; j < c->num_jobs; ++j)
        if (strcmp(c->jobs[j].name, name) == 0) return &c->jobs[j];
    return NULL;
}

static size_t task_count(const dist_cluster *c, const char *name) {
    const dist_cluster_job *j = dist_cluster_find_job(c, name);
    return j ? j->num_tasks : 0;
}

static bool is_allowed_type(const char *t) {
    return strcmp(t, "chief") == 0 || strcmp(t, "worker") == 0 || strcmp(t, "evaluator") == 0 ||
           strcmp(t, "ps") == 0;
}

void dist_cluster_py_repr(const char *s, char *buf, size_t cap) {
    if (cap == 0) return;
    char quote = (strchr(s, '\'') && !strchr(s, '"')) ? '"' : '\'';
    size_t n = 0;
#define PUT(ch)                                                                                    \
    do {                                                                                           \
        if (n + 1 < cap) buf[n++] = (ch);                                                          \
    } while (0)
    PUT(quote);
    for (const unsigned char *p = (const unsigned char *)s; *p; ++p) {
        if (*p == '\\' || *p == (unsigned char)quote) {
            PUT('\\');
            PUT((char)*p);
        } else if (*p == '\n') {
            PUT('\\');
            PUT('n');
        } else if (*p == '\t') {
            PUT('\\');
            PUT('t');
        } else if (*p == '\r') {
            PUT('\\');
            PUT('r');
        } else if (*p < 0x20 || *p == 0x7f) {
            char hex[5];
            snprintf(hex, sizeof hex, "\\x%02x", *p);
            for (int i = 0; i < 4; ++i) PUT(hex[i]);
        } else {
            PUT((char)*p);
        }
    }
    PUT(quote);
#undef PUT
    buf[n] = '\0';
}

/* ClusterSpec.__repr__: jobs sorted by name, dense jobs as lists, sparse ones as dicts. */
static void cluster_repr(const dist_cluster *c, char *buf, size_t cap) {
    size_t n = 0;
    const size_t item = 512;
    char *tmp = malloc(item);
    if (!tmp) {
        snprintf(buf, cap, "ClusterSpec(...)");
        return;
    }
    n += (size_t)snprintf(buf + n, cap - n, "ClusterSpec({");
    bool *done = calloc(c->num_jobs ? c->num_jobs : 1, sizeof(bool));
    for (size_t k = 0; k < c->num_jobs && done; ++k) {
        size_t best = c->num_jobs;
        for (size_t j = 0; j < c->num_jobs; ++j)
            if (!done[j] &&
                (best == c->num_jobs || strcmp(c->jobs[j].name, c->jobs[best].name) < 0))
                best = j;
        done[best] = true;
        const dist_cluster_job *job = &c->jobs[best];
        dist_cluster_py_repr(job->name, tmp, item);
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, "%s%s: ", k ? ", " : "", tmp);
        bool dense =
            job->num_tasks > 0 && job->tasks[job->num_tasks - 1].index + 1 == (long)job->num_tasks;
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, dense ? "[" : "{");
        for (size_t t = 0; t < job->num_tasks; ++t) {
            dist_cluster_py_repr(job->tasks[t].address, tmp, item);
            if (n >= cap) break;
            if (dense)
                n += (size_t)snprintf(buf + n, cap - n, "%s%s", t ? ", " : "", tmp);
            else
                n += (size_t)snprintf(buf + n, cap - n, "%s%ld: %s", t ? ", " : "",
                                      job->tasks[t].index, tmp);
        }
        if (n < cap) n += (size_t)snprintf(buf + n, cap - n, dense ? "]" : "}");
    }
    if (n < cap) snprintf(buf + n, cap - n, "})");
    free(done);
    free(tmp);
}

dist_status dist_cluster_finalize(dist_cluster *c) {
    c->collective_leader = "";
    if (c->num_jobs == 0) {
        /* MultiWorkerMirroredStrategy's local mode (_initialize_local). */
        c->is_chief = true;
        c->has_worker_count = true;
        c->worker_count = 1;
        c->has_id_in_cluster = true;
        c->id_in_cluster = 0;
        return DIST_OK;
    }
    /* collective_all_reduce_strategy.py, _initialize_multi_worker. */
    if (!c->task_type || !c->has_task_id)
        return dist_error(DIST_INVALID_ARGUMENT, "When `cluster_spec` is given, you must also "
                                                 "specify `task_type` and `task_id`.");
    for (size_t j = 0; j < c->num_jobs; ++j) {
        if (!is_allowed_type(c->jobs[j].name)) {
            char repr[2048];
            cluster_repr(c, repr, sizeof repr);
            return dist_error(DIST_INVALID_ARGUMENT,
                              "Disallowed task type found in cluster spec. Allowed types are "
                              "%s and the cluster spec is %s.",
                              TF_ALLOWED_TYPES, repr);
        }
    }
    const char *type = c->task_type;
    char repr[512];
    if (!is_allowed_type(type))
        return dist_error(DIST_INVALID_ARGUMENT,
                          "Unrecognized task_type: %s, valid task types are: %s", type,
                          TF_ALLOWED_TYPES);
    const dist_cluster_job *own = dist_cluster_find_job(c, type);
    if (type[0] && !own && strcmp(type, "evaluator") != 0) {
        dist_cluster_py_repr(type, repr, sizeof repr);
        return dist_error(DIST_INVALID_ARGUMENT, "`task_type` %s not found in cluster_spec.", repr);
    }
    if (task_count(c, "chief") > 1)
        return dist_error(DIST_INVALID_ARGUMENT, "There must be at most one 'chief' job.");
    if (task_count(c, "evaluator") > 1)
        return dist_error(DIST_INVALID_ARGUMENT, "There must be at most one 'evaluator' job.");
    if (own && c->task_id >= (long)own->num_tasks)
        return dist_error(DIST_INVALID_ARGUMENT, "The `task_id` %ld exceeds the maximum id of %s.",
                          c->task_id, type);
    /* TensorFlow 2.20 lets a negative index through to a later failure; libdist stops here. */
    if (c->task_id < 0)
        return dist_error(DIST_INVALID_ARGUMENT, "The `task_id` %ld is negative.", c->task_id);

    bool has_chief_job = dist_cluster_find_job(c, "chief") != NULL;
    bool is_worker = strcmp(type, "worker") == 0, is_eval = strcmp(type, "evaluator") == 0;
    bool is_chief_type = strcmp(type, "chief") == 0;
    int chiefs = (int)task_count(c, "chief");

    c->is_chief = is_chief_type || is_eval || (is_worker && !has_chief_job && c->task_id == 0);

    c->has_worker_count = is_chief_type || is_worker || (is_eval && own);
    c->worker_count = !c->has_worker_count ? 0
                      : is_eval            ? (int)own->num_tasks
                                           : chiefs + (int)task_count(c, "worker");

    c->has_id_in_cluster = is_chief_type || is_worker || is_eval;
    c->id_in_cluster = is_chief_type ? 0
                       : is_worker   ? (int)c->task_id + chiefs
                       : is_eval     ? (int)c->task_id
                                     : 0;

    if (is_eval)
        c->collective_leader = "";
    else if (has_chief_job)
        c->collective_leader = "/job:chief/replica:0/task:0";
    else if (dist_cluster_find_job(c, "worker"))
        c->collective_leader = "/job:worker/replica:0/task:0";
    else
        c->collective_leader = NULL; /* TF asserts a worker job exists: undefined */
    return DIST_OK;
}

bool dist_cluster_is_empty(const dist_cluster *c) { return !c || c->num_jobs == 0; }
const char *dist_cluster_task_type(const dist_cluster *c) { return c ? c->task_type : NULL; }
int dist_cluster_task_id(const dist_cluster *c) {
    return c && c->has_task_id ? (int)c->task_id : -1;
}
bool dist_cluster_is_chief(const dist_cluster *c) { return c ? c->is_chief : true; }

int dist_cluster_worker_count(const dist_cluster *c, bool *has_value) {
    bool has = c && c->has_worker_count;
    if (has_value) *has_value = has;
    return has ? c->worker_count : 0;
}

int dist_cluster_id_in_cluster(const dist_cluster *c, bool *has_value) {
    bool has = c && c->has_id_in_cluster;
    if (has_value) *has_value = has;
    return has ? c->id_in_cluster : 0;
}

const char *dist_cluster_collective_leader(const dist_cluster *c) {
    return c && c->collective_leader ? c->collective_leader : "";
}
const char *dist_cluster_rpc_layer(const dist_cluster *c) { return c ? c->rpc_layer : NULL; }
size_t dist_cluster_num_jobs(const dist_cluster *c) { return c ? c->num_jobs : 0; }

const char *dist_cluster_job_name(const dist_cluster *c, size_t job) {
    return c && job < c->num_jobs ? c->jobs[job].name : NULL;
}

size_t dist_cluster_num_tasks(const dist_cluster *c, const char *job) { return task_count(c, job); }

const char *dist_cluster_task_address(const dist_cluster *c, const char *job, size_t i,
                                      int *index) {
    const dist_cluster_job *j = dist_cluster_find_job(c, job);
    if (!j || i >= j->num_tasks) return NULL;
    if (index) *index = (int)j->tasks[i].index;
    return j->tasks[i].address;
}
