/* BackupAndRestore: the training state saved into a checkpoint manager, restored at start. */
#include "core/error.h"
#include "dist/fit.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct dist_backup_and_restore {
    char *dir;
    int64_t save_freq_batches;
    int delete_on_end;
    dist_checkpoint_manager *manager;
    int resumed;
    int64_t resumed_step;
};

dist_status dist_backup_and_restore_create(const char *dir, int64_t save_freq_batches,
                                           int delete_on_end, dist_backup_and_restore **out) {
    DIST_CHECK_ARG(dir && dir[0] && out, "dist_backup_and_restore_create: needs a directory");
    DIST_CHECK_ARG(save_freq_batches >= 0, "BackupAndRestore: save_freq_batches must be >= 0");
    dist_backup_and_restore *br = calloc(1, sizeof *br);
    if (br) br->dir = strdup(dir);
    if (!br || !br->dir) {
        free(br);
        return dist_error(DIST_OUT_OF_MEMORY, "BackupAndRestore: out of memory");
    }
    br->save_freq_batches = save_freq_batches;
    br->delete_on_end = delete_on_end;
    *out = br;
    return DIST_OK;
}

void dist_backup_and_restore_destroy(dist_backup_and_restore *br) {
    if (!br) return;
    dist_checkpoint_manager_destroy(br->manager);
    free(br->dir);
    free(br);
}

static dist_status on_train_begin(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)logs;
    dist_backup_and_restore *br = user;
    br->resumed = 0;
    /* A backup inside an epoch must hold where the data stopped. Under a coordinator
     * (parameter_server) every worker reads its own stream, whose position the chief does not
     * have: such backups could be written but never resumed, so they are refused up front. */
    if (br->save_freq_batches && !fs->train_iterator)
        return dist_error(DIST_INVALID_USAGE,
                          "BackupAndRestore: a backup every %lld steps needs the training data's "
                          "position, which a coordinator's workers (parameter_server) keep to "
                          "themselves: back up at epoch ends (save_freq_batches 0)",
                          (long long)br->save_freq_batches);
    /* Only the chief writes (and makes the directory); another worker reads the chief's
     * backups where it can see them (one host, or a shared file system). */
    struct stat sb;
    if (!dist_strategy_is_chief(fs->strategy) && stat(br->dir, &sb) != 0) return DIST_OK;
    if (!br->manager) DIST_TRY(dist_checkpoint_manager_create(br->dir, 2, &br->manager));
    dist_checkpoint *c = NULL;
    int64_t step;
    dist_status st = dist_checkpoint_manager_restore_latest(br->manager, &c, &step);
    if (st == DIST_NOT_FOUND) {
        dist_clear_error();
        return DIST_OK;
    }
    if (st) return st;
    st = dist_fit_state_restore(fs, c);
    dist_checkpoint_destroy(c);
    if (st) return dist_error_context(st, "BackupAndRestore: restoring '%s'", br->dir);
    br->resumed = 1;
    br->resumed_step = fs->global_step;
    dist_log(DIST_LOG_INFO, "BackupAndRestore: resuming at epoch %d, step %lld from %s",
             fs->initial_epoch + 1, (long long)fs->initial_step, br->dir);
    return DIST_OK;
}

/* The manager numbers files by global step; only the chief writes (the state is the same on
 * every worker). */
static dist_status backup(dist_backup_and_restore *br, dist_fit_state *fs, int epoch,
                          int64_t step) {
    if (!dist_strategy_is_chief(fs->strategy)) return DIST_OK;
    dist_checkpoint *c;
    DIST_TRY(dist_fit_state_checkpoint(fs, epoch, step, &c));
    dist_status st = dist_checkpoint_manager_save(br->manager, c, fs->global_step);
    dist_checkpoint_destroy(c);
    return st;
}

static dist_status on_batch_end(void *user, dist_fit_state *fs, int64_t batch, dist_logs *logs) {
    (void)batch, (void)logs;
    dist_backup_and_restore *br = user;
    if (br->save_freq_batches == 0 || fs->global_step % br->save_freq_batches) return DIST_OK;
    return backup(br, fs, fs->epoch, fs->step);
}

static dist_status on_epoch_end(void *user, dist_fit_state *fs, int epoch, dist_logs *logs) {
    (void)logs;
    dist_backup_and_restore *br = user;
    if (br->save_freq_batches) return DIST_OK;
    return backup(br, fs, epoch + 1, 0);
}

static dist_status on_train_end(void *user, dist_fit_state *fs, dist_logs *logs) {
    (void)logs;
    dist_backup_and_restore *br = user;
    if (!br->delete_on_end || !dist_strategy_is_chief(fs->strategy)) return DIST_OK;
    DIR *d = opendir(br->dir);
    if (!d) return DIST_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "ckpt-", 5) || n < 12 || strcmp(e->d_name + n - 12, ".safetensors"))
            continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", br->dir, e->d_name);
        remove(path);
    }
    closedir(d);
    rmdir(br->dir); /* only when nothing else is in it */
    return DIST_OK;
}

dist_callback dist_backup_and_restore_callback(dist_backup_and_restore *br) {
    dist_callback c;
    memset(&c, 0, sizeof c);
    c.user = br;
    c.on_train_begin = on_train_begin;
    c.on_batch_end = on_batch_end;
    c.on_epoch_end = on_epoch_end;
    c.on_train_end = on_train_end;
    return c;
}

int dist_backup_and_restore_resumed(const dist_backup_and_restore *br, int64_t *step) {
    if (!br) return 0;
    if (step) *step = br->resumed ? br->resumed_step : 0;
    return br->resumed;
}
