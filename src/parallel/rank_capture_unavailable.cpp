// A build without CUDA: no per-rank graphs (parallel/rank_capture.h).
#include "parallel/rank_capture.h"

namespace mxserve::parallel {

Result<std::unique_ptr<RankCapture>> make_rank_capture(const std::vector<backend::Backend*>&, const std::vector<int>&) {
  return unsupported("per-rank CUDA graphs: this mxserve was built without CUDA");
}

}  // namespace mxserve::parallel
