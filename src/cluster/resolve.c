/* dist_cluster_resolve: explicit options > TF_CONFIG > Slurm > the empty cluster. */
#include "cluster/cluster_impl.h"
#include "core/env.h"
#include "core/error.h"

#include <stdlib.h>

dist_status dist_cluster_resolve(const dist_cluster_options *opts, dist_cluster **out) {
    static const dist_cluster_options defaults = DIST_CLUSTER_OPTIONS_INIT;
    DIST_CHECK_ARG(out, "dist_cluster_resolve: out is NULL");
    *out = NULL;
    if (!opts) opts = &defaults;
    DIST_CHECK_ARG(opts->version == DIST_CLUSTER_OPTIONS_VERSION,
                   "dist_cluster_options: version %d, expected %d", opts->version,
                   DIST_CLUSTER_OPTIONS_VERSION);
    dist_cluster *c = NULL;
    dist_status st;
    DIST_TRY(dist_cluster_alloc(&c));
    const char *env = dist_env_raw(DIST_ENV_TF_CONFIG);
    if (opts->tf_config)
        DIST_TRY_GOTO(dist_cluster_parse_tf_config(opts->tf_config, c), st, fail);
    else if (env && env[0])
        DIST_TRY_GOTO(dist_cluster_parse_tf_config(env, c), st, fail);
    else if (dist_env_raw(DIST_ENV_SLURM_PROCID) &&
             (dist_env_raw(DIST_ENV_SLURM_JOB_NODELIST) || dist_env_raw(DIST_ENV_SLURM_NODELIST)))
        DIST_TRY_GOTO(dist_cluster_slurm_from_env(c, opts->slurm_port_base), st, fail);

    if (opts->task_type)
        DIST_TRY_GOTO(dist_cluster_set_string(&c->task_type, opts->task_type), st, fail);
    if (opts->task_id >= 0) {
        c->task_id = opts->task_id;
        c->has_task_id = true;
    }
    if (opts->rpc_layer)
        DIST_TRY_GOTO(dist_cluster_set_string(&c->rpc_layer, opts->rpc_layer), st, fail);
    DIST_TRY_GOTO(dist_cluster_finalize(c), st, fail);
    *out = c;
    return DIST_OK;
fail:
    dist_cluster_destroy(c);
    return st;
}
