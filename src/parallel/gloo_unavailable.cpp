// Builds without Gloo: multi-node CPU launches are refused naming the package that enables them.
#include "parallel/gloo_communicator.h"

namespace mxserve::parallel {

bool gloo_available() { return false; }

Result<std::vector<std::unique_ptr<Communicator>>> make_gloo_communicators(const std::vector<RankLayout>&,
                                                                           const GlooOptions&) {
  return unsupported("multi-node on the CPU backend (--nnodes > 1 --backend cpu) needs Gloo, and this mxserve was "
                     "built without it: install Debian's libgloo-dev (scripts/setup.sh does) and rebuild");
}

}  // namespace mxserve::parallel
