// cuBLASLt plans for out = x @ w^T. Row-major x [M,K], w [N,K], out [M,N] are, column-major, x^T [K,M],
// w^T [K,N], out^T [N,M]; so out^T = op(A) * B with A = w^T stored [K,N] (ld K) and op = transpose,
// B = x^T stored [K,M] (ld K), C = out^T [N,M] (ld N): cuBLAS m = N, n = M, k = K. The bias epilogue
// adds bias[N] along cuBLAS rows, i.e. per output feature.
#include "kernels/cuda/gemm/cublaslt_gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/logging.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/gemm/skinny_gemm.h"

namespace mxserve::kernels::cuda {
namespace {

constexpr size_t kWorkspaceBytes = 32ull << 20;
// f32-out calls take the skinny path only up to this N (the MoE router's logits); the lm_head (N = vocab)
// already streams at copy bandwidth through cuBLASLt.
constexpr int64_t kSkinnyMaxF32N = 16384;
// Below this N the skinny kernel has too few 16-row tiles (blocks) to spread over the SMs (the MoE router's
// N = 128-256 would run on 8-16 SMs): cuBLASLt's split-K spreads them better.
constexpr int64_t kSkinnyMinN = 512;

bool skinny_env_enabled() {
  const char* v = std::getenv("MXSERVE_SKINNY_GEMM");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<uintptr_t>(p);
  int a = 256;
  while (a > 1 && v % a != 0) a /= 2;
  return a;
}

}  // namespace

LtGemm::LtGemm(cudaStream_t stream) : stream_(stream), skinny_(skinny_env_enabled()) {
  MX_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_bytes_ = kWorkspaceBytes;
  MX_CUDA_CHECK(cudaMalloc(&workspace_, workspace_bytes_));
}

LtGemm::~LtGemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.desc);
  }
  cudaFree(workspace_);  // teardown: errors here are not actionable
  cublasLtDestroy(handle_);
}

LtGemm::Plan& LtGemm::plan(const Key& key) {
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  const auto [m, n, k, out_f32, has_bias, align] = key;
  Plan p;
  MX_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  MX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)));
  MX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)));
  if (has_bias) {
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    MX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const cudaDataType_t bias_type = CUDA_R_16BF;
    MX_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
  }
  const cudaDataType_t out_type = out_f32 ? CUDA_R_32F : CUDA_R_16BF;
  MX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, k, n, k));
  MX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, k, m, k));
  MX_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, out_type, n, m, n));

  cublasLtMatmulPreference_t pref;
  MX_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  MX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                       &workspace_bytes_, sizeof(workspace_bytes_)));
  const uint32_t al = static_cast<uint32_t>(align);
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    MX_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &al, sizeof(al)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  MX_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  MX_CHECK_MSG(found > 0, "cuBLASLt has no algorithm for bf16 GEMM M=" << m << " N=" << n << " K=" << k
                                                                        << (out_f32 ? " f32 out" : " bf16 out")
                                                                        << (has_bias ? " +bias" : ""));
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void LtGemm::run(const void* x, const void* w, const void* bias, void* out, bool out_f32, int64_t m, int64_t n,
                 int64_t k) {
  if (m == 0 || n == 0) return;
  if (skinny_ && m <= kSkinnyMaxRows && n >= kSkinnyMinN && (!out_f32 || n <= kSkinnyMaxF32N)) {
    const char* why = skinny_gemm_unsupported_reason(x, w, bias, out, m, n, k);
    if (why == nullptr) {
      skinny_gemm_bf16(x, w, bias, out, out_f32, m, n, k, stream_);
      return;
    }
    MX_WARN_ONCE << "dense GEMM M=" << m << " N=" << n << " K=" << k << " runs on cuBLASLt, not the skinny M<=8 "
                 << "kernel: " << why << " (first such shape only; slower decode, correct results)";
  }
  int align = std::min({alignment_of(x), alignment_of(w), alignment_of(out)});
  if (bias) align = std::min(align, alignment_of(bias));
  Plan& p = plan({m, n, k, out_f32, bias != nullptr, align});
  if (bias)
    MX_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  const float alpha = 1.f, beta = 0.f;
  MX_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, out, p.c, out, p.c, &p.algo,
                                 workspace_, workspace_bytes_, stream_));
}

}  // namespace mxserve::kernels::cuda
