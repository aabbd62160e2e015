/* Which PJRT plugin to load, and where the TPU is: TF's TPUClusterResolver rules for its `tpu`
 * argument, cut down to what runs here (chips attached to this host). */
#include "core/error.h"
#include "pjrt/pjrt.h"

#include <stdlib.h>
#include <string.h>

static dist_status copy_out(const char *value, const char *from, char *out, size_t n) {
    size_t len = strlen(value);
    if (len + 1 > n)
        return dist_error(DIST_INVALID_ARGUMENT,
                          "the PJRT plugin path from %s is %zu bytes, room for %zu", from, len,
                          n ? n - 1 : 0);
    memcpy(out, value, len + 1);
    return DIST_OK;
}

dist_status dist_pjrt_find_plugin(const char *option, char *out, size_t n) {
    DIST_CHECK_ARG(out != NULL && n > 0, "dist_pjrt_find_plugin: out must be given");
    out[0] = '\0';
    if (option != NULL && option[0] != '\0') return copy_out(option, "the option", out, n);
    static const char *const envs[] = {"DIST_PJRT_PLUGIN", "TPU_LIBRARY_PATH"};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        const char *v = getenv(envs[i]);
        if (v != NULL && v[0] != '\0') return copy_out(v, envs[i], out, n);
    }
    /* No '/': dlopen searches LD_LIBRARY_PATH, the cache and the default directories. */
    return copy_out("libtpu.so", "the default", out, n);
}

dist_status dist_tpu_resolve(const char *tpu, dist_tpu_target *out) {
    DIST_CHECK_ARG(out != NULL, "dist_tpu_resolve: out must be given");
    memset(out, 0, sizeof *out);
    out->kind = DIST_TPU_LOCAL;
    const char *from = "the tpu argument";
    if (tpu == NULL || tpu[0] == '\0') {
        tpu = getenv("TPU_NAME");
        from = "$TPU_NAME";
    }
    if (tpu == NULL || tpu[0] == '\0' || strcmp(tpu, "local") == 0) return DIST_OK;
    if (strlen(tpu) >= sizeof out->address)
        return dist_error(DIST_INVALID_ARGUMENT, "the TPU name from %s is %zu bytes, at most %zu",
                          from, strlen(tpu), sizeof out->address - 1);
    static const char grpc[] = "grpc://";
    if (strncmp(tpu, grpc, sizeof grpc - 1) == 0) {
        const char *hostport = tpu + sizeof grpc - 1;
        const char *colon = strrchr(hostport, ':');
        if (colon == NULL || colon == hostport || colon[1] == '\0' ||
            strspn(colon + 1, "0123456789") != strlen(colon + 1))
            return dist_error(DIST_INVALID_ARGUMENT,
                              "the TPU address '%s' from %s is not grpc://host:port", tpu, from);
    }
    out->kind = DIST_TPU_REMOTE;
    memcpy(out->address, tpu, strlen(tpu) + 1);
    return dist_error(DIST_UNSUPPORTED,
                      "TPU '%s' (from %s) is a remote TPU node; remote TPU nodes are not "
                      "supported: libdist runs on TPU chips attached to this host (a TPU VM), "
                      "with tpu \"local\" or no tpu and no $TPU_NAME",
                      tpu, from);
}
