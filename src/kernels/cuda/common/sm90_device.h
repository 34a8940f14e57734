// Whether the current CUDA device is sm_90 (Hopper: wgmma, TMA), asked once per process: the engine runs one
// device per backend, and the kernels that need sm_90 (the MoE wg_* / wg8 GEMMs, the MXFP4 prefill dequant
// path) check it before choosing their path. False when the runtime cannot say (no device).
#pragma once

#include <cuda_runtime_api.h>

namespace mxserve::kernels::cuda {

inline bool cuda_device_is_sm90() {
  static const bool ok = [] {
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess) return false;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    return major == 9 && minor == 0;
  }();
  return ok;
}

}  // namespace mxserve::kernels::cuda
