/* distrain --version. */
#ifndef DISTRAIN_VERSION_H
#define DISTRAIN_VERSION_H

#include <stdio.h>

/* Prints libdist's version, oneDNN's, the CPU ISA oneDNN dispatches to, and whether the CUDA
 * module loads (with the reason when it does not). */
void distrain_print_version(FILE *out);

#endif
