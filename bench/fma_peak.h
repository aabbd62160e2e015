/* The FP32 FMA peak of one core, measured (bench_train's "% of FP32 peak"). */
#ifndef DIST_BENCH_FMA_PEAK_H
#define DIST_BENCH_FMA_PEAK_H

/* FP32 FLOP/s of the calling thread (2 per FMA lane): twelve independent chains of vector FMAs
 * in registers, best of `runs` timed runs of ~`seconds` each. zmm where the CPU has AVX-512F,
 * ymm where it has AVX2 + FMA; *isa says which ("avx512f", "avx2+fma"). Returns 0 (and isa
 * "none") on a CPU with neither, or off x86-64. Pin nothing: the caller runs it on one
 * thread with the machine otherwise as quiet as it gets. */
double dist_bench_fma_peak(int runs, double seconds, const char **isa);

#endif
