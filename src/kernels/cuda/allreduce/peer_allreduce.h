// Fused all-reduce + residual add + RMSNorm over the ranks of one node, one process (each rank a thread
// with its own stream and device): every rank's kernel reads the other ranks' staging buffers through
// plain peer device pointers (cudaDeviceEnablePeerAccess; no CUDA IPC, no NVLink multicast objects) and
// meets them at flag barriers. Per rank, with x_r = rank r's partial sums [rows, cols] bf16:
//     residual = bf16(float(residual) + (x_0 + x_1 + ... + x_{N-1}))   (f32 sum in rank order 0..N-1)
//     out      = bf16(w * (float(residual) * 1 / sqrt(mean(float(residual)^2) + eps)))
// so every rank ends with the same bits, and the norm reads the rounded residual exactly like the unfused
// add + rmsnorm.
// Algorithms: one-shot (each rank reads all N inputs of every row: N x bytes in, lowest latency), two-shot
// (rank r reduces its 1/N of the rows, then everyone gathers the reduced rows: 2 x bytes, better at large
// sizes), local (N = 1 or after an NCCL all-reduce: the fused add + RMSNorm alone, no barrier), direct
// (every rank's x already in one device memory -- the shared-device stand-in: buffers[r] IS rank r's x, read in
// place, no staging copy and NO barrier: the caller orders the kernel after every rank's x is written, and
// every rank's later reuse of its x after all reads, with stream events; parallel/device_group_communicator.h).
// Synchronization: rank r's block b signals peer p by storing an epoch into p's flags[b][r] and waits for
// its own flags[b][*] to reach the epoch; epochs are per-block device counters (graph-replay safe). Rows
// are tied to blocks by one mapping in every phase, so a block only ever waits for its own peers. A wait
// that outlasts ~10 s sets *error (1) and gives up instead of hanging.
// Invariant: every rank launches the same algorithm with the same rows, cols and blocks, and all ranks'
// kernels are resident at once (blocks <= kPeerMaxBlocks; the host caps it).
#pragma once

#include <cstdint>

#include <cuda_runtime.h>

namespace mxserve::kernels::cuda {

constexpr int kPeerMaxRanks = 8;
constexpr int kPeerMaxBlocks = 64;
// Flag words per rank: [barrier blocks][ranks].
constexpr int kPeerFlagWords = kPeerMaxBlocks * kPeerMaxRanks;

enum class PeerAlgo { kLocal, kOneShot, kTwoShot, kDirect };
const char* peer_algo_name(PeerAlgo a);

struct PeerAllReduceArgs {
  int world = 1, rank = 0;
  const void* x = nullptr;                         // this rank's partial sums [rows, cols] bf16
  void* buffers[kPeerMaxRanks] = {};                // every rank's staging buffer: [input: cap][result: cap]
                                                   // (kDirect: every rank's x [rows, cols] itself)
  uint32_t* flags[kPeerMaxRanks] = {};              // every rank's flag words [kPeerFlagWords]
  uint32_t* counters = nullptr;                    // this rank's per-block epochs [kPeerMaxBlocks]
  int* error = nullptr;                            // this rank's error word (1: a barrier timed out)
  uint64_t capacity_bytes = 0;                     // bytes of each half of a staging buffer
  void* residual = nullptr;                        // [rows, cols] bf16, updated in place
  const void* weight = nullptr;                    // [cols] bf16
  void* out = nullptr;                             // [rows, cols] bf16 (may not alias residual or x)
  int64_t rows = 0, cols = 0;
  float eps = 1e-5f;
};

// Launches `algo` on `stream` with `blocks` blocks (1..kPeerMaxBlocks; kLocal ignores buffers and flags).
cudaError_t launch_peer_allreduce_rmsnorm(const PeerAllReduceArgs& args, PeerAlgo algo, int blocks,
                                          cudaStream_t stream);

}  // namespace mxserve::kernels::cuda
