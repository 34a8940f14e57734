// PLACEHOLDER (to be replaced by the real kernels, issue 9): lets the backend and the selection logic build
// against moe_mxfp4.h before the kernels land. Every entry point that would compute fails loudly.
#include <cstdio>
#include <cstdlib>

#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"

namespace mxserve::kernels::cuda {

const std::vector<std::string>& moe_mxfp4_variants(MoeGemm) {
  static const std::vector<std::string> names = {"unimplemented"};
  return names;
}
int moe_mxfp4_variant_index(MoeGemm gemm, const std::string& name) {
  const auto& v = moe_mxfp4_variants(gemm);
  for (size_t i = 0; i < v.size(); ++i)
    if (v[i] == name) return static_cast<int>(i);
  return -1;
}
bool moe_mxfp4_variant_supports(MoeGemm, int, const MoeShape&) { return false; }
MoeMxfp4Plan moe_mxfp4_heuristic_plan(const MoeShape&) { return {}; }
size_t moe_mxfp4_workspace_bytes(const MoeShape&) { return 0; }
void moe_experts_mxfp4(const void*, const int32_t*, const float*, const MoeMxfp4Weights&, void*, const MoeShape&,
                       const MoeMxfp4Plan&, void*, cudaStream_t) {
  std::fprintf(stderr, "moe_experts_mxfp4: the MXFP4 MoE kernels are not built yet (issue 9)\n");
  std::abort();
}

}  // namespace mxserve::kernels::cuda
