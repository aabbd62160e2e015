/* libdist: everything at once. */
#ifndef DIST_DIST_H
#define DIST_DIST_H

#include "dist/backend.h"
#include "dist/checkpoint.h"
#include "dist/cluster.h"
#include "dist/data.h"
#include "dist/export.h"
#include "dist/file.h"
#include "dist/fit.h"
#include "dist/idx.h"
#include "dist/loss_scale.h"
#include "dist/mnist.h"
#include "dist/nn.h"
#include "dist/optim.h"
#include "dist/partitioner.h"
#include "dist/policy.h"
#include "dist/ps.h"
#include "dist/replica.h"
#include "dist/status.h"
#include "dist/strategy.h"
#include "dist/tape.h"
#include "dist/tensor.h"
#include "dist/tensorboard.h"
#include "dist/train.h"

#endif
