/* Keras 3's .keras model file: a zip archive of metadata.json, config.json and
 * model.weights.h5, in that order and stored uncompressed, as Keras 3.15's model.save writes
 * it (its zipfile entries, read back from a saved seed CNN). keras.models.load_model rebuilds
 * the model from config.json and loads model.weights.h5, whose layout is that of save_weights.
 *
 * The archive is built in memory by libzip (a buffer source opened as an archive) and written
 * by core/atomic_file.c, so a failure anywhere (a config Keras cannot hold, a full disk) leaves
 * whatever was at the path before and no partial file. */
#include "core/error.h"
#include "dist/file.h"
#include "nn/keras_impl.h"
#include "nn/model_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zip.h>

typedef struct keras_entry {
    const char *name;
    const void *data;
    size_t size;
} keras_entry;

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

/* metadata.json as Python's json.dumps writes Keras's dict: the Keras version whose format this
 * is, and the local time of the save in Keras's "%Y-%m-%d@%H:%M:%S". */
static void metadata_json(time_t now, char *buf, size_t size) {
    struct tm tm;
    char date[32] = "1970-01-01@00:00:00";
    if (localtime_r(&now, &tm)) strftime(date, sizeof date, "%Y-%m-%d@%H:%M:%S", &tm);
    snprintf(buf, size, "{\"keras_version\": \"%s\", \"date_saved\": \"%s\"}", KERAS_FORMAT_VERSION,
             date);
}

static dist_status zip_failure(const char *what, const char *why) {
    return dist_error(DIST_INTERNAL, "libzip: %s: %s", what, why);
}

/* Adds the entries to the open archive za, each stored, dated `now` and readable by its owner
 * only (what Python's zipfile records for Keras's entries). */
static dist_status add_entries(zip_t *za, const keras_entry *entries, int count, time_t now) {
    for (int i = 0; i < count; i++) {
        zip_source_t *src = zip_source_buffer(za, entries[i].data, entries[i].size, 0);
        zip_int64_t index = src ? zip_file_add(za, entries[i].name, src, 0) : -1;
        if (index < 0) {
            if (src) zip_source_free(src);
            char what[64];
            snprintf(what, sizeof what, "adding '%s'", entries[i].name);
            return zip_failure(what, zip_strerror(za));
        }
        zip_uint64_t at = (zip_uint64_t)index;
        if (zip_set_file_compression(za, at, ZIP_CM_STORE, 0) < 0 ||
            zip_file_set_mtime(za, at, now, 0) < 0 ||
            zip_file_set_external_attributes(za, at, 0, ZIP_OPSYS_UNIX, 0600u << 16) < 0)
            return zip_failure(entries[i].name, zip_strerror(za));
    }
    return DIST_OK;
}

/* The archive's bytes: entries written through libzip into a growing buffer; *out is malloc()ed. */
static dist_status zip_in_memory(const keras_entry *entries, int count, time_t now, void **out,
                                 size_t *out_size) {
    zip_error_t ze;
    zip_error_init(&ze);
    dist_status st = DIST_OK;
    zip_source_t *mem = zip_source_buffer_create(NULL, 0, 0, &ze);
    zip_t *za = mem ? zip_open_from_source(mem, ZIP_CREATE | ZIP_TRUNCATE, &ze) : NULL;
    if (!za) {
        st = zip_failure("making an archive in memory", zip_error_strerror(&ze));
        if (mem) zip_source_free(mem);
        zip_error_fini(&ze);
        return st;
    }
    zip_source_keep(mem); /* zip_close would free it; its buffer is the archive */
    st = add_entries(za, entries, count, now);
    if (st == DIST_OK && zip_close(za) < 0)
        st = zip_failure("writing the archive", zip_strerror(za));
    if (st != DIST_OK) {
        zip_discard(za);
        zip_source_free(mem);
        zip_error_fini(&ze);
        return st;
    }
    zip_stat_t zs;
    zip_stat_init(&zs);
    void *buf = NULL;
    if (zip_source_stat(mem, &zs) < 0 || !(zs.valid & ZIP_STAT_SIZE)) {
        st = zip_failure("sizing the archive", zip_error_strerror(zip_source_error(mem)));
    } else if (!(buf = malloc(zs.size ? (size_t)zs.size : 1))) {
        st = dist_error(DIST_OUT_OF_MEMORY, "out of memory for a %llu-byte archive",
                        (unsigned long long)zs.size);
    } else if (zip_source_open(mem) < 0) {
        st = zip_failure("reading the archive back", zip_error_strerror(zip_source_error(mem)));
    } else {
        zip_int64_t n = zip_source_read(mem, buf, zs.size);
        if (n < 0 || (zip_uint64_t)n != zs.size)
            st = zip_failure("reading the archive back", zip_error_strerror(zip_source_error(mem)));
        zip_source_close(mem);
    }
    zip_source_free(mem);
    zip_error_fini(&ze);
    if (st != DIST_OK) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_size = (size_t)zs.size;
    return DIST_OK;
}

dist_status dist_model_save_keras(dist_model *m, const char *path) {
    DIST_CHECK_ARG(m && path, "dist_model_save_keras: NULL argument");
    DIST_CHECK_ARG(has_suffix(path, ".keras"),
                   "saving a Keras model to '%s': the name must end in .keras (the only "
                   "model file keras.models.load_model opens as an archive)",
                   path);
    char *config = NULL;
    void *weights = NULL, *archive = NULL;
    size_t weights_size = 0, archive_size = 0;
    char metadata[128];
    time_t now = time(NULL);
    metadata_json(now, metadata, sizeof metadata);
    dist_status st = DIST_OK;
    DIST_TRY_GOTO(keras_model_config(m, &config), st, out);
    DIST_TRY_GOTO(keras_weights_image(m, &weights, &weights_size), st, out);
    const keras_entry entries[] = {{"metadata.json", metadata, strlen(metadata)},
                                   {"config.json", config, strlen(config)},
                                   {"model.weights.h5", weights, weights_size}};
    DIST_TRY_GOTO(zip_in_memory(entries, 3, now, &archive, &archive_size), st, out);
    DIST_TRY_GOTO(dist_file_write_atomic(path, archive, archive_size), st, out);
out:
    free(archive);
    free(weights);
    free(config);
    if (st != DIST_OK) return dist_error_context(st, "saving the Keras model to '%s'", path);
    return DIST_OK;
}
