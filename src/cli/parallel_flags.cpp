#include "cli/parallel_flags.h"

#include <algorithm>
#include <cstdlib>

#include "launch/multinode.h"
#include "parallel/rendezvous.h"

namespace mxserve::cli {
namespace {

// One size given under either of two names (both: they must agree). 1 when neither is given.
Result<int> size_flag(const Args& args, const std::string& name, const std::string& alias) {
  int value = 1;
  bool seen = false;
  for (const std::string& flag : {name, alias}) {
    if (!args.has(flag)) continue;
    MX_ASSIGN_OR_RETURN(int64_t v, args.get_int(flag, 1));
    if (v < 1 || v > 1024) return invalid_argument(flag + " must be in [1, 1024], got " + std::to_string(v));
    if (seen && v != value)
      return invalid_argument(name + " " + std::to_string(value) + " and " + alias + " " + std::to_string(v) +
                              " disagree (they are the same flag)");
    value = static_cast<int>(v);
    seen = true;
  }
  return value;
}

// --communicator: checked here (the backend is known), handed to launch_model() through MXSERVE_COMMUNICATOR.
// NOTE: an environment variable rather than a ParallelConfig field, so parallel/rank_layout.h (included by the
// whole model tree) stays unchanged; a field is the cleaner carrier when that header next changes.
Status apply_communicator_flag(const Args& args) {
  if (!args.has("--communicator")) return Status::ok();
  const std::string kind = args.get_or("--communicator", "");
  if (kind != "nccl" && kind != "shared-device" && kind != "auto")
    return invalid_argument("--communicator " + kind + ": expected nccl, shared-device or auto");
  const std::string backend = args.get_or("--backend", "cpu");
  if (backend != "cuda")
    return invalid_argument("--communicator " + kind + " needs --backend cuda (the " + backend +
                            " backend's ranks use the CPU thread communicator)");
  const char* env = std::getenv("MXSERVE_COMMUNICATOR");
  if (env != nullptr && *env != '\0' && kind != env)
    return invalid_argument("--communicator " + kind + " and MXSERVE_COMMUNICATOR=" + env +
                            " disagree (give one of them)");
  setenv("MXSERVE_COMMUNICATOR", kind.c_str(), 1);
  return Status::ok();
}

// --disable-custom-all-reduce: handed to launch_model() as MXSERVE_FUSED_ALLREDUCE=0 (parallel/fused_path.h).
Status apply_custom_all_reduce_flag(const Args& args) {
  if (!args.has("--disable-custom-all-reduce")) return Status::ok();
  const char* env = std::getenv("MXSERVE_FUSED_ALLREDUCE");
  if (env != nullptr && std::string(env) == "1")
    return invalid_argument("--disable-custom-all-reduce and MXSERVE_FUSED_ALLREDUCE=1 disagree (give one of them)");
  setenv("MXSERVE_FUSED_ALLREDUCE", "0", 1);
  return Status::ok();
}

}  // namespace

Result<parallel::ParallelConfig> parse_parallel_flags(const Args& args) {
  parallel::ParallelConfig pc;
  MX_ASSIGN_OR_RETURN(pc.tp, size_flag(args, "--tensor-parallel-size", "--tp-size"));
  MX_ASSIGN_OR_RETURN(pc.dp, size_flag(args, "--data-parallel-size", "--dp-size"));
  MX_ASSIGN_OR_RETURN(pc.ep, size_flag(args, "--ep-size", "--expert-parallel-size"));  // sglang: both
  if (args.has("--enable-expert-parallel")) {
    if ((args.has("--ep-size") || args.has("--expert-parallel-size")) && pc.ep != pc.world())
      return invalid_argument("--enable-expert-parallel spreads the experts over all tp x dp = " +
                              std::to_string(pc.world()) + " ranks, but --ep-size is " + std::to_string(pc.ep));
    pc.ep = pc.world();
    if (pc.ep == 1)
      return invalid_argument("--enable-expert-parallel with one rank: give --tp-size or --dp-size > 1");
  }
  pc.dp_attention = args.has("--enable-dp-attention");  // validate() names it when dp < 2
  if (args.has("--nnodes") || args.has("--node-rank") || args.has("--dist-init-addr") || args.has("--dist-timeout")) {
    parallel::DistInit d;
    MX_ASSIGN_OR_RETURN(int64_t nnodes, args.get_int("--nnodes", 1));
    MX_ASSIGN_OR_RETURN(int64_t node_rank, args.get_int("--node-rank", 0));
    d.nnodes = static_cast<int>(std::clamp<int64_t>(nnodes, -1, 1 << 20));
    d.node_rank = static_cast<int>(std::clamp<int64_t>(node_rank, -1, 1 << 20));
    if (args.has("--dist-init-addr")) MX_RETURN_IF_ERROR(parallel::parse_dist_init_addr(args.get_or("--dist-init-addr", ""), &d));
    MX_RETURN_IF_ERROR(parallel::validate_dist_init(d));
    MX_ASSIGN_OR_RETURN(int64_t dist_timeout, args.get_int("--dist-timeout", 0));
    if (dist_timeout < 0 || dist_timeout > 86400)
      return invalid_argument("--dist-timeout must be in [1, 86400] seconds, got " + std::to_string(dist_timeout));
    d.timeout_s = static_cast<int>(dist_timeout);
    launch::set_process_dist_init(d);  // launch_model() reads it (launch/multinode.h)
  }
  MX_RETURN_IF_ERROR(pc.validate());
  MX_RETURN_IF_ERROR(apply_communicator_flag(args));
  MX_RETURN_IF_ERROR(apply_custom_all_reduce_flag(args));
  return pc;
}

}  // namespace mxserve::cli
