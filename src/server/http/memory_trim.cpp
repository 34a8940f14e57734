#include "server/http/memory_trim.h"

#include <malloc.h>

#include <chrono>

namespace mxserve::server::http {
namespace {

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

bool MemoryTrimmer::due() const { return pending_.load() && now_ms() - last_ms_.load() >= 1000; }

void MemoryTrimmer::run_if_due() {
  if (!pending_.load()) return;
  const int64_t now = now_ms();
  int64_t prev = last_ms_.load();
  if (now - prev < 1000 || !last_ms_.compare_exchange_strong(prev, now)) return;
  pending_.store(false);
  malloc_trim(0);
}

}  // namespace mxserve::server::http
