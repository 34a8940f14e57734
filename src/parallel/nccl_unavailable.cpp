// The NCCL entry points of a build without CUDA: every factory says so (nccl_communicator.h).
#include "parallel/nccl_communicator.h"

namespace mxserve::parallel {

Result<NcclId> make_nccl_unique_id() {
  return unsupported("NCCL: this mxserve was built without CUDA (rebuild where nvcc is found, MXSERVE_CUDA=ON)");
}

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_communicators(const std::vector<RankLayout>&,
                                                                           const std::vector<backend::Backend*>&,
                                                                           const NcclId*, const NcclOptions&) {
  return unsupported("the NCCL communicator: this mxserve was built without CUDA (rebuild where nvcc is found, "
                     "MXSERVE_CUDA=ON)");
}

int visible_cuda_devices() { return 0; }
void bind_thread_to_device(int) {}

}  // namespace mxserve::parallel
