// Arrival schedules (see arrivals.h).
#include "bench/arrivals.h"

#include <cmath>
#include <limits>
#include <random>

namespace mxserve::bench {

Result<ArrivalKind> parse_arrival_kind(const std::string& name) {
  if (name == "poisson") return ArrivalKind::kPoisson;
  if (name == "constant") return ArrivalKind::kConstant;
  if (name == "gamma") return ArrivalKind::kGamma;
  return invalid_argument("--arrival " + name + ": expected poisson, constant or gamma");
}

const char* arrival_kind_name(ArrivalKind kind) {
  switch (kind) {
    case ArrivalKind::kPoisson: return "poisson";
    case ArrivalKind::kConstant: return "constant";
    case ArrivalKind::kGamma: return "gamma";
  }
  return "?";
}

Result<std::vector<double>> make_arrival_schedule(const ArrivalConfig& c, double rate, int64_t max_requests,
                                                  double duration_s, uint64_t stream) {
  if (max_requests < 0 && duration_s <= 0)
    return invalid_argument("an arrival schedule needs --num-requests or --duration");
  if (!(rate > 0)) return invalid_argument("request rate " + std::to_string(rate) + ": must be > 0");
  if (c.kind == ArrivalKind::kGamma && !(c.burstiness > 0))
    return invalid_argument("--burstiness " + std::to_string(c.burstiness) + ": must be > 0");
  std::vector<double> out;
  if (std::isinf(rate)) {
    if (max_requests < 0) return invalid_argument("--request-rate inf needs --num-requests");
    out.assign(static_cast<size_t>(max_requests), 0.0);
    return out;
  }
  constexpr int64_t kHardCap = 50'000'000;
  std::mt19937_64 rng(c.seed * 0x9e3779b97f4a7c15ull + stream + 1);
  const double shape = c.kind == ArrivalKind::kGamma ? c.burstiness : 1.0;
  std::gamma_distribution<double> gap(shape, 1.0 / (rate * shape));
  double t = 0;
  for (int64_t i = 0; max_requests < 0 || i < max_requests; ++i) {
    if (i > 0) t += c.kind == ArrivalKind::kConstant ? 1.0 / rate : gap(rng);
    if (duration_s > 0 && t > duration_s) break;
    if (i >= kHardCap) return invalid_argument("schedule exceeds 50M requests: lower --duration or --request-rate");
    out.push_back(t);
  }
  return out;
}

}  // namespace mxserve::bench
