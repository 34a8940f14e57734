// The shared-device communicator and the fused all-reduce in a build without CUDA: the factories say so
// (shared_device_communicator.h, fused_add_norm.h).
#include "parallel/fused_add_norm.h"
#include "parallel/shared_device_communicator.h"

namespace mxserve::parallel {

Result<std::vector<std::unique_ptr<Communicator>>> make_shared_device_communicators(
    const std::vector<RankLayout>&, const std::vector<backend::Backend*>&, const SharedDeviceOptions&) {
  return unsupported("the shared-device communicator: this mxserve was built without CUDA (rebuild where nvcc is "
                     "found, MXSERVE_CUDA=ON)");
}

Result<std::vector<std::unique_ptr<FusedAddNorm>>> make_fused_add_norm_group(const std::vector<backend::Backend*>&,
                                                                             const std::vector<int>&,
                                                                             const std::vector<Communicator*>&) {
  return unsupported("the fused all-reduce: this mxserve was built without CUDA");
}

}  // namespace mxserve::parallel
