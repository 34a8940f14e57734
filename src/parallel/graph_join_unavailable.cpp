// A build without CUDA: no graphs over several ranks (parallel/graph_join.h).
#include "parallel/graph_join.h"

namespace mxserve::parallel {

Result<std::unique_ptr<GraphJoin>> make_graph_join(const std::vector<backend::Backend*>&) {
  return unsupported("graph join: this mxserve was built without CUDA");
}

}  // namespace mxserve::parallel
