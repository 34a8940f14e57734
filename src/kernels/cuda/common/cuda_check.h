// CUDA / cuBLAS error checks: every runtime and library call in the CUDA backend goes through one of
// these. A failure is fatal (a CUDA error leaves the context unusable), reported with file:line, the
// call's text and the library's own error string.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/check.h"

#define MX_CUDA_CHECK(expr)                                                                          \
  do {                                                                                               \
    const cudaError_t mx_err_ = (expr);                                                              \
    if (mx_err_ != cudaSuccess)                                                                      \
      ::mxserve::detail::check_failed(__FILE__, __LINE__, #expr,                                     \
                                      std::string(cudaGetErrorName(mx_err_)) + ": " +                \
                                          cudaGetErrorString(mx_err_));                              \
  } while (0)

#define MX_CUBLAS_CHECK(expr)                                                                        \
  do {                                                                                               \
    const cublasStatus_t mx_st_ = (expr);                                                            \
    if (mx_st_ != CUBLAS_STATUS_SUCCESS)                                                             \
      ::mxserve::detail::check_failed(__FILE__, __LINE__, #expr,                                     \
                                      std::string("cuBLAS status ") + std::to_string(mx_st_) + " (" + \
                                          cublasLtGetStatusString(mx_st_) + ")");                    \
  } while (0)

namespace mxserve::kernels::cuda {
// True when MXSERVE_CUDA_SYNC=1: every launch is followed by a device synchronize, so an asynchronous
// fault is reported at the launch that caused it (debugging; off by default).
bool sync_after_launch();
}  // namespace mxserve::kernels::cuda

// After every kernel launch: launch-configuration errors at once, faults at once under MXSERVE_CUDA_SYNC.
#define MX_CUDA_CHECK_LAUNCH()                                                                       \
  do {                                                                                               \
    MX_CUDA_CHECK(cudaGetLastError());                                                               \
    if (::mxserve::kernels::cuda::sync_after_launch()) MX_CUDA_CHECK(cudaDeviceSynchronize());       \
  } while (0)
