// Reading byte ranges of a mapped file without mapping their pages into the process: a rank's slices of a
// checkpoint (model/layers/weight_loader_shard.cpp) are pread from the file behind the MappedFile holding
// them, so the process's RSS grows by the copies only, never by neighbouring pages the kernel would map
// around a fault (fault-around maps a whole aligned window of cached pages: a column window of every row
// would map the whole tensor). Invariant: the bytes copied equal a memcpy from the mapping.
#pragma once

#include <cstdint>

namespace mxserve::io {

// Copies n_chunks chunks of `chunk` bytes, chunk i at src + i * stride, packed into dst. When src lies in a
// live MappedFile the chunks are pread from its file; otherwise (or should the file not read back) memcpy.
void read_strided(void* dst, const void* src, uint64_t chunk, uint64_t stride, uint64_t n_chunks);

}  // namespace mxserve::io
