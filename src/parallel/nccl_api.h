// NCCL's entry points, resolved at run time (dlopen of libnccl.so.2) instead of linked: an mxserve binary
// then starts on a machine without NCCL, or with NCCL only inside a Python wheel (nvidia-nccl-cu13), and
// only a launch that asks for NCCL fails -- with an error saying where it looked and what to set.
// Search order: $MXSERVE_NCCL_LIBRARY (a path), then libnccl.so.2 and libnccl.so on the loader's path
// (LD_LIBRARY_PATH). The header is the CUDA toolkit's nccl.h (types and the ABI of these functions).
// Invariant: a returned NcclApi has every pointer set; it lives for the process.
#pragma once

#include <nccl.h>

#include "core/status.h"

namespace mxserve::parallel {

struct NcclApi {
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRank) CommInitRank = nullptr;
  decltype(&ncclCommDestroy) CommDestroy = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&ncclSend) Send = nullptr;
  decltype(&ncclRecv) Recv = nullptr;
  decltype(&ncclGroupStart) GroupStart = nullptr;
  decltype(&ncclGroupEnd) GroupEnd = nullptr;
  decltype(&ncclGetVersion) GetVersion = nullptr;
  std::string path;  // the library that was loaded
};

// The process's NCCL (loaded on first call), or a Status naming the paths tried and what to set.
Result<const NcclApi*> nccl_api();

}  // namespace mxserve::parallel
