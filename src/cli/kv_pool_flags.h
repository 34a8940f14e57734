// How `mxserve serve` sizes the KV pool from its flags (docs/server.md "KV cache"):
//   --num-kv-blocks N          N blocks, nothing measured;
//   --kv-cache-memory SIZE     SIZE per rank, checked against the device at start-up, never resized;
//   --gpu-memory-utilization F each GPU's share F for weights + the measured forward peak + KV: the KV pool is what
//                              is left (launch/launch_memory.h), split among the ranks sharing the GPU;
//   none of them, on CUDA      as --gpu-memory-utilization 0.9 (vLLM's and sglang's default: the pool fills the GPU);
//   none of them, on the CPU   1 GiB per rank (a CPU rank has no device memory to measure).
// Both sizes named: --kv-cache-memory wins and the utilization caps it (the start-up refuses a size beyond it).
#pragma once

#include <string>

#include "cli/args.h"
#include "core/status.h"
#include "server/serving_model.h"

namespace mxserve::cli {

inline Status parse_kv_pool_flags(const Args& a, server::ServingConfig& sc) {
  if (a.has("--kv-cache-memory")) {
    auto bytes = server::parse_byte_size(a.get_or("--kv-cache-memory", ""));
    if (!bytes.is_ok()) return bytes.status().with_context("--kv-cache-memory");
    sc.kv_cache_bytes = *bytes;
    sc.kv_cache_bytes_given = true;
  }
  if (a.has("--gpu-memory-utilization")) {
    auto util = a.get_double("--gpu-memory-utilization", 0.9);
    if (!util.is_ok() || !(*util > 0 && *util <= 1))
      return invalid_argument("--gpu-memory-utilization must be in (0, 1], got " +
                              a.get_or("--gpu-memory-utilization", ""));
    sc.gpu_memory_utilization = *util;
    sc.gpu_memory_utilization_given = true;
  }
  // The CUDA default: size the pool from the device, as if --gpu-memory-utilization 0.9 were given.
  if (sc.backend == "cuda" && !a.has("--kv-cache-memory") && !a.has("--num-kv-blocks"))
    sc.gpu_memory_utilization_given = true;
  return Status::ok();
}

}  // namespace mxserve::cli
