#include "parallel/fused_path.h"

namespace mxserve::parallel {

const char* fused_allreduce_kind_name(FusedAllReduceKind k) {
  switch (k) {
    case FusedAllReduceKind::kOff: return "unfused (all-reduce, then add, then RMSNorm)";
    case FusedAllReduceKind::kPeer:
      return "fused peer all-reduce + add + RMSNorm (one-shot / two-shot by size, NCCL above the peer buffers)";
    case FusedAllReduceKind::kEventOrdered:
      return "fused event-ordered all-reduce + add + RMSNorm (shared-device stand-in: one kernel per rank reads "
             "every rank's input in place)";
    case FusedAllReduceKind::kReference: return "fused seam, reference (all-reduce, add, RMSNorm behind it)";
  }
  return "?";
}

Result<FusedAllReduceChoice> choose_fused_allreduce(const FusedAllReduceRequest& req) {
  const std::string env = req.env != nullptr ? req.env : "";
  if (env != "" && env != "0" && env != "1")
    return invalid_argument("MXSERVE_FUSED_ALLREDUCE=" + env + ": expected 1 (on), 0 (off) or unset (the default)");
  const bool on = req.config_on || env == "1";
  const bool off = req.config_off || env == "0";
  if (on && off)
    return invalid_argument(std::string("the fused all-reduce was both asked for (") +
                            (req.config_on ? "LaunchConfig::fused_allreduce" : "MXSERVE_FUSED_ALLREDUCE=1") +
                            ") and turned off (" +
                            (req.config_off ? "--disable-custom-all-reduce" : "MXSERVE_FUSED_ALLREDUCE=0") +
                            "): give one of them");
  FusedAllReduceChoice c;
  c.required = on;
  auto off_because = [&](const std::string& why) -> Result<FusedAllReduceChoice> {
    if (on) return unsupported("the fused all-reduce was asked for, but " + why);
    c.kind = FusedAllReduceKind::kOff;
    c.why = why;
    return c;
  };
  if (off) {
    c.kind = FusedAllReduceKind::kOff;
    c.why = req.config_off ? "--disable-custom-all-reduce" : "--disable-custom-all-reduce / MXSERVE_FUSED_ALLREDUCE=0";
    return c;
  }
  if (req.tp <= 1) {  // nothing to fuse, asked or not (a one-rank reference run of a fused test keeps the flag)
    c.kind = FusedAllReduceKind::kOff;
    c.why = "tp 1 has no tensor-parallel all-reduce";
    return c;
  }
  if (req.multinode) return off_because("--nnodes > 1: the fused all-reduce runs within one node (NCCL across nodes)");
  if (req.tp > kFusedMaxRanks)
    return off_because("--tensor-parallel-size " + std::to_string(req.tp) + " is above the fused kernel's " +
                       std::to_string(kFusedMaxRanks) + " ranks");
  if (req.backend == "cuda") {
    c.kind = req.shared_device ? FusedAllReduceKind::kEventOrdered : FusedAllReduceKind::kPeer;
    c.why = on ? "asked for" : "the default at tp > 1 on --backend cuda; --disable-custom-all-reduce turns it off";
    return c;
  }
  if (!on) {
    c.kind = FusedAllReduceKind::kOff;
    c.why = "--backend " + req.backend + " (the fused seam's reference runs only when asked for: MXSERVE_FUSED_ALLREDUCE=1)";
    return c;
  }
  c.kind = FusedAllReduceKind::kReference;
  c.why = "asked for on --backend " + req.backend;
  return c;
}

std::string describe_fused_allreduce(const FusedAllReduceChoice& c, int tp, int groups) {
  return "all-reduce + add + RMSNorm at tp " + std::to_string(tp) + " (" + std::to_string(groups) + " group(s)): " +
         fused_allreduce_kind_name(c.kind) + " (" + c.why + ")";
}

}  // namespace mxserve::parallel
