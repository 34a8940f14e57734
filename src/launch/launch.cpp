#include "launch/launch.h"

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/logging.h"
#include "io/checkpoint.h"
#include "model/mtp_presence.h"
#include "runtime/spec/self_test.h"

namespace mxserve::launch {
namespace {

// A "still loading" line every 5 s while fn runs (the loader has no progress callback yet).
template <typename Fn>
auto with_progress_ticker(bool enabled, Fn&& fn) {
  if (!enabled) return fn();
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  std::thread ticker([&] {
    std::unique_lock<std::mutex> lock(mutex);
    for (int s = 5; !cv.wait_for(lock, std::chrono::seconds(5), [&] { return done; }); s += 5)
      MX_LOG(kInfo) << "still loading weights (" << s << " s)";
  });
  auto result = fn();
  {
    std::lock_guard<std::mutex> lock(mutex);
    done = true;
  }
  cv.notify_all();
  ticker.join();
  return result;
}

model::LoadOptions load_options(const ModelSource& src) {
  model::LoadOptions lo;
  lo.load_mtp = src.load_mtp || src.require_mtp;
  lo.synthetic = src.synthetic;
  lo.seed = src.seed;
  lo.num_layers_override = src.num_layers;
  lo.synthetic_quantization = src.synthetic_quantization;
  return lo;
}

}  // namespace

LaunchedModel::~LaunchedModel() {
  model_.reset();  // weights go before the backends that hold their memory
  comm_.reset();
  backends_.clear();
}

Result<std::unique_ptr<LaunchedModel>> launch_model(const LaunchConfig& config) {
  if (config.model.path.empty()) return invalid_argument("no model given (--model DIR or --config FILE)");
  MX_ASSIGN_OR_RETURN(std::vector<parallel::RankLayout> ranks, config.parallel.ranks());
  if (ranks.size() != 1)
    return unsupported("a launch over " + std::to_string(ranks.size()) +
                       " ranks needs a multi-rank communicator, which is not built yet (run with tp = ep = dp = 1)");
  const parallel::RankLayout& rank = ranks.front();

  std::unique_ptr<LaunchedModel> lm(new LaunchedModel());
  if (!config.moe_tuning_dir.empty())  // before the backend: it validates every table's variant names
    MX_RETURN_IF_ERROR(kernels::add_global_moe_tuning_dir(config.moe_tuning_dir));
  backend::BackendOptions bo = config.backend_options;
  bo.device = rank.device;
  MX_ASSIGN_OR_RETURN(auto be, backend::make_backend(config.backend, bo));
  lm->backends_.push_back(std::move(be));
  MX_ASSIGN_OR_RETURN(lm->comm_, parallel::make_single_rank_communicator(rank));

  const model::LoadOptions lo = load_options(config.model);
  MX_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::resolve_model_config(config.model.path, lo));
  // The rank's share of every declared weight; an uneven split fails here, before any weight is read.
  MX_ASSIGN_OR_RETURN(lm->table_, model::shard_weight_table(model::declared_weights(cfg, lo.load_mtp &&
                                                                                         cfg.n_mtp_layers > 0),
                                                            rank));
  MX_LOG(kDebug) << "launch: " << rank.describe() << ", communicator " << lm->comm_->name();
  if (config.model.require_mtp && !lo.synthetic && cfg.n_mtp_layers > 0) {  // before any weight is read
    MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(config.model.path));
    MX_RETURN_IF_ERROR(model::mtp_layer_present(*ckpt, *cfg.arch, cfg, true, /*require_mtp=*/true).status());
  }

  if (config.log_progress)
    MX_LOG(kInfo) << "loading " << (lo.synthetic ? "synthetic weights for " : "weights from ") << config.model.path
                  << " on " << lm->backend().name() << " ...";
  const auto t0 = std::chrono::steady_clock::now();
  auto model = with_progress_ticker(config.log_progress,
                                    [&] { return model::load_causal_lm(config.model.path, lm->backend(), lo); });
  if (!model.is_ok()) return model.status().with_context("loading the model " + config.model.path);
  lm->model_ = std::move(*model);
  if (lo.load_mtp && cfg.n_mtp_layers > 0 && !lm->model_->has_mtp()) {  // the checkpoint lacks it (warned)
    MX_ASSIGN_OR_RETURN(lm->table_, model::shard_weight_table(model::declared_weights(cfg, false), rank));
  }
  lm->backend().synchronize();
  lm->load_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (config.model.require_mtp && !lm->model_->has_mtp())
    return invalid_argument("--speculative-algorithm mtp: the model has no MTP layer (num_nextn_predict_layers)");
  return lm;
}

uint64_t LaunchedModel::kv_bytes_per_block(int64_t block_size) const { return model_->kv_spec(1, block_size).bytes(); }

int64_t LaunchedModel::kv_blocks_for_bytes(int64_t block_size, uint64_t bytes) const {
  return runtime::kv_blocks_for_bytes(*model_, block_size, bytes);
}

std::unique_ptr<runtime::ModelExecutor> LaunchedModel::make_executor(int64_t n_blocks, int64_t block_size) {
  return runtime::make_model_executor(*model_, backend(), n_blocks, block_size);
}

std::unique_ptr<runtime::Engine> LaunchedModel::make_engine(const runtime::EngineConfig& config) {
  return std::make_unique<runtime::Engine>(config, make_executor(config.n_blocks, config.scheduler.block_size));
}

Status LaunchedModel::spec_self_test(const runtime::SpecConfig& spec, int64_t block_size) {
  return runtime::spec_self_test_after_load(*model_, backend(), spec, block_size);
}

std::vector<MoeKernelConfigRow> LaunchedModel::moe_kernel_configs() const {
  return backends_.front()->moe_kernel_configs();
}

}  // namespace mxserve::launch
