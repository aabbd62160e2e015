/* Which PJRT plugin to load, and where the TPU is: TF's TPUClusterResolver rules for its `tpu`
 * argument, cut down to what runs here (chips attached to this host), and whether this host
 * has TPU chips at all. */
#include "core/env.h"
#include "core/error.h"
#include "pjrt/pjrt.h"

#include <dirent.h>
#include <stdio.h>
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
    static const dist_env_var envs[] = {DIST_ENV_PJRT_PLUGIN, DIST_ENV_TPU_LIBRARY_PATH};
    for (size_t i = 0; i < sizeof envs / sizeof envs[0]; i++) {
        const char *v = dist_env(envs[i]);
        if (v != NULL) return copy_out(v, dist_env_info_of(envs[i])->name, out, n);
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
        tpu = dist_env_raw(DIST_ENV_TPU_NAME);
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

/* The PCI device ids of Google's TPU chips, as JAX's hardware_utils lists them. */
static const unsigned tpu_device_ids[] = {
    0x0027, /* v2, v3 */
    0x0056, /* no public name */
    0x005e, /* v4 */
    0x0062, /* v5p */
    0x0063, /* v5e */
    0x006f, /* v6e */
    0x0076, /* 7x */
};

static int read_hex_file(const char *dir, const char *name, const char *file, unsigned *out) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", dir, name, file);
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    int ok = fscanf(f, "%x", out) == 1;
    fclose(f);
    return ok;
}

dist_status dist_tpu_count_local_chips(const char *pci_devices_dir, int *count) {
    DIST_CHECK_ARG(count != NULL, "dist_tpu_count_local_chips: count must be given");
    *count = 0;
    const char *dir = pci_devices_dir ? pci_devices_dir : "/sys/bus/pci/devices";
    DIR *d = opendir(dir);
    if (d == NULL) return DIST_OK;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        unsigned vendor = 0, device = 0;
        if (!read_hex_file(dir, e->d_name, "vendor", &vendor) || vendor != 0x1ae0) continue;
        if (!read_hex_file(dir, e->d_name, "device", &device)) continue;
        for (size_t i = 0; i < sizeof tpu_device_ids / sizeof tpu_device_ids[0]; i++)
            if (device == tpu_device_ids[i]) ++*count;
    }
    closedir(d);
    return DIST_OK;
}
