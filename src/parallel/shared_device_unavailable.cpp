// The shared-device communicator in a build without CUDA: the factory says so (shared_device_communicator.h).
#include "parallel/shared_device_communicator.h"

namespace mxserve::parallel {

Result<std::vector<std::unique_ptr<Communicator>>> make_shared_device_communicators(
    const std::vector<RankLayout>&, const std::vector<backend::Backend*>&, const SharedDeviceOptions&) {
  return unsupported("the shared-device communicator: this mxserve was built without CUDA (rebuild where nvcc is "
                     "found, MXSERVE_CUDA=ON)");
}

}  // namespace mxserve::parallel
