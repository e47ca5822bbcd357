// The core library's public API in one include (library tvc, pkg-config tvc): tensors and ops,
// autograd, modules and layers, optimizers and schedulers, weight files, the version. The other
// libraries have their own headers: tvc/models/*.h (tvc-models), tvc/vision/*.h (tvc-vision),
// tvc/swa/*.h (tvc-swa), tvc/hybrid/*.h (tvc-hybrid), tvc/c_api.h (tvc-c), tvc/cuda.h (tvc-cuda).
#pragma once

#include "tvc/autograd.h"
#include "tvc/dtype.h"
#include "tvc/error.h"
#include "tvc/lr_scheduler.h"
#include "tvc/modes.h"
#include "tvc/nn/attention.h"
#include "tvc/nn/containers.h"
#include "tvc/nn/init.h"
#include "tvc/nn/layers.h"
#include "tvc/nn/module.h"
#include "tvc/ops.h"
#include "tvc/optim.h"
#include "tvc/profiler.h"
#include "tvc/serialize.h"
#include "tvc/storage.h"
#include "tvc/tensor.h"
#include "tvc/version.h"
