// Arrival schedules for open-loop load: when each request is due, as an offset from the run start.
// Owns: Poisson, constant and gamma (burstiness) inter-arrival draws. Does not own the closed loop
// (--max-concurrency without a rate), which the load runner drives directly.
// Invariant: offsets are non-decreasing and deterministic for (config, stream).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"

namespace mxserve::bench {

enum class ArrivalKind { kPoisson, kConstant, kGamma };

Result<ArrivalKind> parse_arrival_kind(const std::string& name);
const char* arrival_kind_name(ArrivalKind kind);

struct ArrivalConfig {
  ArrivalKind kind = ArrivalKind::kPoisson;
  double burstiness = 1.0;  // gamma shape k; inter-arrivals ~ Gamma(k, 1/(R k)); k = 1 is Poisson
  uint64_t seed = 0;
};

// Offsets for a rate R (req/s): at most max_requests (<0: unbounded) and none later than duration_s
// (<=0: unbounded); at least one bound must be set. R = +inf puts every request at 0.
Result<std::vector<double>> make_arrival_schedule(const ArrivalConfig& config, double rate, int64_t max_requests,
                                                  double duration_s, uint64_t stream);

}  // namespace mxserve::bench
