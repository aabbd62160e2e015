/* JPEG headers as the JPEG-folder source reads them: the size check with its pixel cap, then the
 * allocation and decode that the source does for an image that passes it. The cap is lowered to
 * 1 Mpx here so that each run stays fast; the check is the same. */
#include "data/dataset.h"

#include <stdlib.h>
#include <turbojpeg.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static tjhandle tj;
    if (!tj && !(tj = tjInitDecompress())) abort();
    int w = 0, h = 0;
    if (dist_jpeg_read_header(tj, data, size, "fuzz", (int64_t)1 << 20, &w, &h) != DIST_OK)
        return 0;
    unsigned char *pix = malloc((size_t)w * (size_t)h * 3);
    if (!pix) abort();
    tjDecompress2(tj, data, (unsigned long)size, pix, w, w * 3, h, TJPF_RGB, TJFLAG_STOPONWARNING);
    free(pix);
    return 0;
}
