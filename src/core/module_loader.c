/* The search and dlopen() shared by the plug-in module loaders (core/module_loader.h). */
#include "core/module_loader.h"

#include "core/env.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "<directory of the loaded libdist>/<file>": libdist.so's own directory in the build tree and
 * in installs; the program's directory when libdist is linked statically. */
static int path_next_to_libdist(const char *file, char *buf, size_t size) {
    static const char anchor; /* any address inside libdist */
    Dl_info info;
    if (!dladdr(&anchor, &info) || !info.dli_fname) return 0;
    const char *slash = strrchr(info.dli_fname, '/');
    if (!slash) return 0;
    int n = snprintf(buf, size, "%.*s/%s", (int)(slash - info.dli_fname), info.dli_fname, file);
    return n > 0 && (size_t)n < size;
}

void *dist_module_open(const struct dist_module_spec *spec, char *where, size_t where_size,
                       char *why, size_t why_size) {
    char next[PATH_MAX];
    const char *env = dist_env_raw(spec->env);
    const char *env_name = dist_env_info_of(spec->env)->name;
    const char *path = spec->file;
    if (env && *env) {
        path = env;
        snprintf(where, where_size, "%s (from $%s)", env, env_name);
    } else if (path_next_to_libdist(spec->file, next, sizeof next) && access(next, F_OK) == 0) {
        path = next;
        snprintf(where, where_size, "%s (next to libdist)", next);
    } else {
        snprintf(where, where_size, "%s (%s)", spec->file, spec->search_how);
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, why_size, "the %s module %s could not be loaded: %s", spec->what, where,
                 e ? e : "unknown dlopen error");
        return NULL;
    }
    void *entry = dlsym(h, spec->entry);
    if (!entry)
        snprintf(why, why_size, "the %s module %s has no %s entry point", spec->what, where,
                 spec->entry);
    return entry;
}
