#include "core/update_rule.h"

#include "core/error.h"

dist_status dist_update_rule_source_fn(dist_replica_ctx *rc, dist_tensor *grads, void *user) {
    dist_update_rule_source *src = user;
    return src->apply(rc, grads, src);
}

dist_status dist_update_rule_of(dist_update_fn update, void *user, dist_update_rule *out) {
    if (update != dist_update_rule_source_fn)
        return dist_error(DIST_UNSUPPORTED,
                          "this update is applied where the variables live (on the ps tasks), "
                          "which can run only a dist_optimizer's Adam or SGD (not a loss-scale "
                          "optimizer's or a custom update function)");
    dist_update_rule_source *src = user;
    return src->describe(src, out);
}
