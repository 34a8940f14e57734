// The MoE kernel choices a backend reports (the start-up log, the mxserve:moe_kernel_config gauge),
// re-exported for the launch root's callers: the server includes this, never kernels/ or backend/.
#pragma once

#include "kernels/moe_tuning.h"

namespace mxserve::launch {

using MoeKernelConfigRow = kernels::MoeKernelConfigRow;

}  // namespace mxserve::launch
