#include "version.h"

#include <dist/backend.h>
#include <dist/strategy.h>
#include <dist/tensor.h>
#include <dnnl.h>

static const char *isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_sse41: return "SSE4.1";
    case dnnl_cpu_isa_avx: return "AVX";
    case dnnl_cpu_isa_avx2: return "AVX2";
    case dnnl_cpu_isa_avx2_vnni: return "AVX2 VNNI";
    case dnnl_cpu_isa_avx512_mic: return "AVX-512 MIC";
    case dnnl_cpu_isa_avx512_mic_4ops: return "AVX-512 MIC 4OPS";
    case dnnl_cpu_isa_avx512_core: return "AVX-512";
    case dnnl_cpu_isa_avx512_core_vnni: return "AVX-512 VNNI";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX-512 BF16";
    case dnnl_cpu_isa_avx512_core_amx: return "AVX-512 AMX";
    default: return "baseline";
    }
}

void distrain_print_version(FILE *out) {
    const dnnl_version_t *v = dnnl_version();
    fprintf(out, "distrain (libdist) %s\n", DISTRAIN_VERSION);
    fprintf(out, "Strategies:");
    for (int k = 0; k < dist_strategy_kind_count(); k++)
        fprintf(out, "%s %s", k ? "," : "", dist_strategy_kind_name((dist_strategy_kind)k));
    fputc('\n', out);
    fprintf(out, "oneDNN %d.%d.%d, CPU ISA in use: %s\n", v->major, v->minor, v->patch,
            isa_name(dnnl_get_effective_cpu_isa()));
    fprintf(out, "mixed_bfloat16 on CPUs: %s\n", dist_cpu_bfloat16_kernels(0));
    /* Creating a GPU backend is how the library loads the module: its error says why not. */
    dist_backend_options bo = DIST_BACKEND_OPTIONS_INIT;
    bo.device.kind = DIST_DEVICE_CUDA;
    bo.device.index = 0;
    dist_backend *be = NULL;
    if (dist_backend_create(&bo, &be) == DIST_OK) {
        fprintf(out, "CUDA module: found, %d GPU(s)\n", dist_device_count(DIST_DEVICE_CUDA));
        dist_backend_destroy(be);
    } else {
        fprintf(out, "CUDA module: not usable: %s\n", dist_last_error());
    }
}
