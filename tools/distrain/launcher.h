/* The local multi-worker launcher of distrain (--workers N). */
#ifndef DISTRAIN_LAUNCHER_H
#define DISTRAIN_LAUNCHER_H

#include "options.h"

/* Runs N workers of this program on loopback and returns distrain's exit code: 0 when every
 * worker succeeded, else the code of the first that failed. */
int distrain_launch(int argc, char **argv, const distrain_options *o);

#endif
