#include "parallel/nccl_api.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/logging.h"

namespace mxserve::parallel {
namespace {

template <typename Fn>
bool bind(void* lib, const char* name, Fn* out, std::string* missing) {
  *out = reinterpret_cast<Fn>(::dlsym(lib, name));
  if (*out == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  return *out != nullptr;
}

Result<const NcclApi*> load() {
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("MXSERVE_NCCL_LIBRARY"); env != nullptr && *env != '\0') candidates.push_back(env);
  candidates.push_back("libnccl.so.2");
  candidates.push_back("libnccl.so");
  std::string tried;
  void* lib = nullptr;
  std::string path;
  for (const std::string& c : candidates) {
    lib = ::dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib != nullptr) {
      path = c;
      break;
    }
    const char* err = ::dlerror();
    tried += (tried.empty() ? "" : "; ") + c + (err ? std::string(" (") + err + ")" : "");
  }
  if (lib == nullptr)
    return unavailable("NCCL library not found (tried " + tried + "): install NCCL, add its lib folder to "
                       "LD_LIBRARY_PATH (pip's nvidia-nccl-cu13: python3 -c 'import nvidia.nccl; "
                       "print(nvidia.nccl.__path__[0])' + /lib), or set MXSERVE_NCCL_LIBRARY to libnccl.so.2's path");
  static NcclApi api;
  std::string missing;
  bind(lib, "ncclGetUniqueId", &api.GetUniqueId, &missing);
  bind(lib, "ncclCommInitRank", &api.CommInitRank, &missing);
  bind(lib, "ncclCommDestroy", &api.CommDestroy, &missing);
  bind(lib, "ncclCommAbort", &api.CommAbort, &missing);
  bind(lib, "ncclCommGetAsyncError", &api.CommGetAsyncError, &missing);
  bind(lib, "ncclGetErrorString", &api.GetErrorString, &missing);
  bind(lib, "ncclGetLastError", &api.GetLastError, &missing);
  bind(lib, "ncclAllReduce", &api.AllReduce, &missing);
  bind(lib, "ncclAllGather", &api.AllGather, &missing);
  bind(lib, "ncclReduceScatter", &api.ReduceScatter, &missing);
  bind(lib, "ncclSend", &api.Send, &missing);
  bind(lib, "ncclRecv", &api.Recv, &missing);
  bind(lib, "ncclGroupStart", &api.GroupStart, &missing);
  bind(lib, "ncclGroupEnd", &api.GroupEnd, &missing);
  bind(lib, "ncclGetVersion", &api.GetVersion, &missing);
  if (!missing.empty())
    return unavailable("NCCL library " + path + " lacks " + missing + " (NCCL 2.19 or newer is needed)");
  api.path = path;
  int version = 0;
  api.GetVersion(&version);
  MX_LOG(kInfo) << "NCCL " << version / 10000 << "." << (version / 100) % 100 << "." << version % 100 << " from "
                << path;
  return &api;
}

}  // namespace

Result<const NcclApi*> nccl_api() {
  static std::once_flag once;
  static Result<const NcclApi*> loaded = unavailable("NCCL not loaded");
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace mxserve::parallel
