#include "runtime/dp_placement.h"

#include <tuple>

#include "core/check.h"

namespace mxserve::runtime {

int place_on_dp_rank(const std::vector<DpRankLoad>& ranks) {
  MX_CHECK(!ranks.empty());
  // Better = longer hit, then more free blocks, then fewer running; the first (lowest) rank wins ties.
  auto key = [](const DpRankLoad& l) { return std::make_tuple(l.prefix_hit_tokens, l.free_blocks, -l.running); };
  int best = 0;
  for (int r = 1; r < static_cast<int>(ranks.size()); ++r)
    if (key(ranks[r]) > key(ranks[best])) best = r;
  return best;
}

}  // namespace mxserve::runtime
