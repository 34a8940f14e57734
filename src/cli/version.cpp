// `mxserve --version` (see version.h). CUDA versions are asked of the runtime at call time: the driver's can
// differ from the toolkit's the binary was built with, and a machine without a GPU says so.
#include "cli/version.h"

#include <string>

#ifdef MXSERVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mxserve::cli {
namespace {

#ifdef MXSERVE_HAVE_CUDA
std::string cuda_version_text(int v) {  // 12040 -> "12.4"
  if (v <= 0) return "none";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}
#endif

}  // namespace

std::string version_report() {
  const BuildInfo& b = build_info();
  std::string r = std::string("mxserve ") + b.version + "\n";
  r += std::string("commit: ") + b.git_commit + (b.git_date[0] ? std::string(" (") + b.git_date + ")" : "") + "\n";
  r += std::string("build: ") + b.build_type + "\n";
#ifdef MXSERVE_HAVE_CUDA
  int runtime = 0, driver = 0;
  const bool rt_ok = cudaRuntimeGetVersion(&runtime) == cudaSuccess;
  const bool drv_ok = cudaDriverGetVersion(&driver) == cudaSuccess;
  r += std::string("cuda: built with toolkit ") + b.cuda_toolkit + ", runtime " +
       (rt_ok ? cuda_version_text(runtime) : "unavailable") + ", driver " +
       (drv_ok ? (driver > 0 ? cuda_version_text(driver) : "none (no NVIDIA driver found)") : "unavailable") + "\n";
  r += std::string("cuda architectures: ") + b.cuda_archs + "\n";
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  r += "gpus visible: " + std::to_string(devices) + "\n";
#else
  r += "cuda: cpu only (built without the CUDA backend)\n";
#endif
  return r;
}

}  // namespace mxserve::cli
