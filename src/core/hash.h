// Small, fast, stateless hashes used for deterministic randomness (sampling, synthetic weights) and
// hashing token blocks. Not cryptographic.
#pragma once

#include <cstdint>
#include <string_view>

namespace mxserve {

// splitmix64 finalizer: a bijective 64-bit mix with good avalanche.
inline uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// FNV-1a over bytes.
inline uint64_t fnv1a(std::string_view bytes, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace mxserve
