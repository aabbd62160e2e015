/* Checkpoints (dist_checkpoint_load: the length, the JSON header, shapes, offsets, the CRC). The
 * seeds carry no CRC key, as another writer's files do, so mutations reach the header checks;
 * the CRC-covered path is reached by mutating the CRC key itself. */
#include "dist/checkpoint.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    dist_checkpoint *c = NULL;
    if (dist_checkpoint_load(dist_fuzz_file("safetensors", data, size), &c) == DIST_OK) {
        /* Touch every tensor's bytes: shapes and data must agree. */
        volatile uint8_t sink = 0;
        for (int i = 0; i < dist_checkpoint_num_tensors(c); i++) {
            const dist_tensor *t = dist_checkpoint_find(c, dist_checkpoint_tensor_name(c, i));
            size_t bytes = dist_tensor_bytes(t);
            for (size_t k = 0; k < bytes; k++) sink ^= ((const uint8_t *)t->data)[k];
        }
        (void)sink;
        dist_checkpoint_destroy(c);
    }
    return 0;
}
