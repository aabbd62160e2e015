/* The environment under which a test starts Open MPI ranks (mpiexec) on the project's
 * machines. */
#ifndef DIST_MPI_TESTUTIL_H
#define DIST_MPI_TESTUTIL_H

#include <stdlib.h>

static inline void dist_test_mpi_environment(void) {
    /* CI containers run as root; more ranks than cores */
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
    setenv("OMPI_MCA_rmaps_base_oversubscribe", "1", 1);
    /* Containers often forbid the cross-process reads (CMA) of Open MPI's shared-memory
     * transport; copying through the shared segment works everywhere. */
    setenv("OMPI_MCA_btl_vader_single_copy_mechanism", "none", 0);
    /* Under AddressSanitizer: Open MPI's own leaks are not the tests' (mpi_lsan.supp). */
    setenv("LSAN_OPTIONS",
           "suppressions=" DIST_SOURCE_DIR "/tests/unit/mpi_lsan.supp:fast_unwind_on_malloc=0", 0);
    setenv("ASAN_OPTIONS", "fast_unwind_on_malloc=0", 0);
#ifdef DIST_TEST_MPI_MODULE
    /* linked statically: name the build tree's module unless CTest already did */
    setenv("DIST_MPI_MODULE", DIST_TEST_MPI_MODULE, 0);
#endif
}

#endif
