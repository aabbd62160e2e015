/* libdist: checkpoints as safetensors files.
 *
 * A dist_checkpoint is an in-memory set of named host tensors (float32, int32, int64) and a
 * string-to-string metadata map. Saved, it is a safetensors file (8-byte little-endian header
 * length, JSON header with dtype / shape / data_offsets and "__metadata__", then the data,
 * 8-byte aligned) that safetensors.numpy.load_file reads. Saving is atomic: a temporary file in
 * the same directory is written, fsync()ed and renamed over the target, and the directory is
 * fsync()ed, so a crash leaves the old file or the new one, never half of one; temporaries
 * ("<path>.tmp.<pid>.<random>", created with O_EXCL: never through a planted symlink) that a
 * crashed save left behind are removed by the next save of that path. The file is created 0600:
 * it holds model state.
 * The metadata key "libdist.crc32c" holds the CRC-32C of the whole file (length, header, padding
 * and data) computed with its own 8 digits as "00000000"; loading verifies it before trusting any
 * header field, then checks every field, so a truncated or bit-flipped file is refused with
 * DIST_FORMAT and a message naming the file and the problem. Every file libdist writes also
 * carries "libdist.writer"; a file with a "libdist." key but no checksum is refused, and a file
 * from another writer (no "libdist." key) is read without a checksum. */
#ifndef DIST_CHECKPOINT_H
#define DIST_CHECKPOINT_H

#include "dist/export.h"
#include "dist/loss_scale.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/status.h"
#include "dist/strategy.h"
#include "dist/tensor.h"

#include <stdint.h>

DIST_BEGIN_DECLS

/* The metadata key holding the file's CRC-32C as 8 lower-case hex digits (see above). */
#define DIST_CHECKPOINT_CRC_KEY "libdist.crc32c"

typedef struct dist_checkpoint dist_checkpoint;

/* An empty checkpoint. Release with dist_checkpoint_destroy. */
DIST_API dist_status dist_checkpoint_create(dist_checkpoint **out);
/* Frees the checkpoint and its tensors. Accepts NULL. */
DIST_API void dist_checkpoint_destroy(dist_checkpoint *ckpt);

/* Copies a plain host tensor (F32, I32 or I64) into the checkpoint under name (both borrowed).
 * Errors: DIST_INVALID_ARGUMENT (a name already present, "__metadata__", empty), DIST_UNSUPPORTED
 * (another dtype, device memory, a blocked layout). */
DIST_API dist_status dist_checkpoint_add(dist_checkpoint *ckpt, const char *name,
                                         const dist_tensor *tensor);
/* Adds replica 0's variables of a built model, each under dist_model_variable_name. */
DIST_API dist_status dist_checkpoint_add_model(dist_checkpoint *ckpt, dist_model *model);

/* Sets (or replaces) a metadata entry; key and value are copied. The CRC key is reserved. */
DIST_API dist_status dist_checkpoint_set_metadata(dist_checkpoint *ckpt, const char *key,
                                                  const char *value);
/* The value of a metadata key, or NULL (borrowed; valid until the entry changes). */
DIST_API const char *dist_checkpoint_metadata(const dist_checkpoint *ckpt, const char *key);

/* The number of metadata entries and the key of entry i (borrowed; NULL when out of range), in
 * the order set (or, after load, in file order, the CRC key included). */
DIST_API int dist_checkpoint_num_metadata(const dist_checkpoint *ckpt);
DIST_API const char *dist_checkpoint_metadata_key(const dist_checkpoint *ckpt, int index);

DIST_API int dist_checkpoint_num_tensors(const dist_checkpoint *ckpt);
/* The name of tensor i, in the order added (or, after load, in file order). Borrowed. */
DIST_API const char *dist_checkpoint_tensor_name(const dist_checkpoint *ckpt, int index);
/* The tensor of that name, or NULL (borrowed; host memory owned by the checkpoint, read-only
 * after a load). Constant time: names are hashed. */
DIST_API const dist_tensor *dist_checkpoint_find(const dist_checkpoint *ckpt, const char *name);

/* Writes the checkpoint to path atomically (see above). Errors: DIST_IO. */
DIST_API dist_status dist_checkpoint_save(const dist_checkpoint *ckpt, const char *path);
/* Reads and validates a safetensors file. The file is not read into memory: every claim of the
 * header is checked against the file's size, the CRC streams over it, and the tensors are views
 * into a read-only mapping of the file (kept until dist_checkpoint_destroy), so memory grows by
 * the tensors that are read, not by what the file claims. A tensor the file does not align to
 * its element size is copied on first use. The mapping stays valid when the file is replaced
 * (rename, as every libdist save does); a file truncated in place while the checkpoint lives
 * faults (SIGBUS) when its tensors are read. Errors: DIST_NOT_FOUND, DIST_IO, DIST_FORMAT (any
 * inconsistency, a CRC mismatch), DIST_UNSUPPORTED (a dtype other than F32/I32/I64). */
DIST_API dist_status dist_checkpoint_load(const char *path, dist_checkpoint **out);

/* Copies the named tensors into caller-owned plain host tensors whose dtype and shape say what
 * is expected. Everything is checked before anything is copied: a missing name, a dtype or a
 * shape that differs fails with DIST_FORMAT naming the tensor and both values, and leaves every
 * destination untouched. */
DIST_API dist_status dist_checkpoint_restore(const dist_checkpoint *ckpt, int count,
                                             const char *const *names, dist_tensor *const *dst);
/* Sets every replica's variables of a built model from the checkpoint (by variable name, with
 * the same checks as dist_checkpoint_restore). */
DIST_API dist_status dist_checkpoint_restore_model(const dist_checkpoint *ckpt, dist_model *model);

/* Strategy variables (dist_strategy_create_variable), each under its name: their values where
 * they live (dist_variable_read), and back into every copy (dist_variable_write) after every
 * name, dtype and shape was checked. */
DIST_API dist_status dist_checkpoint_add_variables(dist_checkpoint *ckpt, int count,
                                                   dist_variable *const *vars);
DIST_API dist_status dist_checkpoint_restore_variables(const dist_checkpoint *ckpt, int count,
                                                       dist_variable *const *vars);
/* An optimizer's state for a variable list it trains (dist_optimizer_apply_to_variables),
 * named as for a model: "optimizer/iterations", "optimizer/learning_rate",
 * "optimizer/<slot>/<variable name>". Restoring binds the optimizer to the list. */
DIST_API dist_status dist_checkpoint_add_optimizer_for_variables(dist_checkpoint *ckpt,
                                                                 dist_optimizer *opt, int count,
                                                                 dist_variable *const *vars);
DIST_API dist_status dist_checkpoint_restore_optimizer_for_variables(const dist_checkpoint *ckpt,
                                                                     dist_optimizer *opt,
                                                                     int count,
                                                                     dist_variable *const *vars);

/* Adds an optimizer's state for `model`: "optimizer/iterations" (I64 scalar),
 * "optimizer/learning_rate" (F32 scalar) and each slot per variable as
 * "optimizer/<slot>/<variable name>" ("optimizer/m/conv2d/kernel"; slots of dist/optim.h). */
DIST_API dist_status dist_checkpoint_add_optimizer(dist_checkpoint *ckpt, dist_optimizer *opt,
                                                   dist_model *model);
/* Restores what add_optimizer saved into every replica, checking every name, dtype and shape
 * before anything changes. Errors: DIST_FORMAT naming the tensor that differs or is missing. */
DIST_API dist_status dist_checkpoint_restore_optimizer(const dist_checkpoint *ckpt,
                                                       dist_optimizer *opt, dist_model *model);
/* Adds "loss_scale/scale" (F32), "loss_scale/counter" and "loss_scale/skipped_steps" (I64). */
DIST_API dist_status dist_checkpoint_add_loss_scale(dist_checkpoint *ckpt,
                                                    const dist_loss_scale_optimizer *lso);
DIST_API dist_status dist_checkpoint_restore_loss_scale(const dist_checkpoint *ckpt,
                                                        dist_loss_scale_optimizer *lso);

/* Saves as TensorFlow's multi-worker rule says: the chief (dist_strategy_is_chief; every
 * single-process strategy) writes `path`; another worker writes the same file into
 * <dirname(path)>/workertemp_<worker id>/ and removes it and the directory again, so every
 * worker runs the same code and no two race on one path. Errors: those of save. */
DIST_API dist_status dist_checkpoint_save_for(const dist_checkpoint *ckpt, dist_strategy *strategy,
                                              const char *path);

/* ---- Keeping the last K checkpoints of a run ---------------------------------------------- */

typedef struct dist_checkpoint_manager dist_checkpoint_manager;

/* Manages dir/ckpt-<step>.safetensors, keeping the max_to_keep (>= 1) newest. dir is copied
 * and created when missing. */
DIST_API dist_status dist_checkpoint_manager_create(const char *dir, int max_to_keep,
                                                    dist_checkpoint_manager **out);
DIST_API void dist_checkpoint_manager_destroy(dist_checkpoint_manager *manager);

/* Saves ckpt as ckpt-<step>.safetensors (step >= 0; an existing file of that step is replaced),
 * then keeps that file and the max_to_keep - 1 highest other steps, deleting the rest. The file
 * just saved is never deleted, even when its step is below the others. When the save fails
 * (DIST_IO: disk full, a file-size limit) nothing is deleted, the previous file of that step is
 * unchanged and no temporary is left. Not for two threads saving the same step concurrently. */
DIST_API dist_status dist_checkpoint_manager_save(dist_checkpoint_manager *manager,
                                                  const dist_checkpoint *ckpt, int64_t step);
/* Loads the newest checkpoint that validates, skipping (and logging) corrupt newer ones. *step
 * (may be NULL) receives its step. Errors: DIST_NOT_FOUND when no file is good. */
DIST_API dist_status dist_checkpoint_manager_restore_latest(dist_checkpoint_manager *manager,
                                                            dist_checkpoint **out, int64_t *step);

DIST_END_DECLS

#endif
