/// @file dtp.h
/// @brief Everything a chapter needs: tensors, ops, Comm, launch and trace.
#pragma once

#include "dtp/comm.h"
#include "dtp/device.h"
#include "dtp/dtype.h"
#include "dtp/error.h"
#include "dtp/launch.h"
#include "dtp/memory.h"
#include "dtp/ops.h"
#include "dtp/tensor.h"
#include "dtp/trace.h"
