// measure_rank_loading: per-rank host memory and backend (device) memory of rank-sliced loading (issue 32
// item 3's target: per-rank host RSS and device memory at tp T <= 0.3x of tp 1). Writes a random bf16
// checkpoint for a config (truncated / shrunk by flags so it fits a CPU box), then loads it once per rank --
// tp 1, then every rank of tp T -- each in a forked child (so each rank's peak RSS is its own) on the CPU
// backend, or --backend cuda (device memory = the backend bytes the loader allocated), and prints one line
// per rank and the worst tp-T / tp-1 ratios. Not a ctest: a tool the lead runs (docs/parallel.md).
// On a device backend it also reports the allocator's high-water mark over the load (device_memory.h: every
// temporary the loader made counts, not only the weights it kept), the device memory a user would see.
//   measure_rank_loading --config tests/data/configs/GLM-5.2.json --num-layers 2 --first-dense 1
//     --experts 8 --vocab 8192 --tp 4 [--dir /tmp/ckpt] [--backend cpu|cuda]
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_memory.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/causal_lm.h"
#include "model/config.h"
#include "model/layers/weight_loader.h"
#include "model/registry.h"

namespace fs = std::filesystem;
using namespace mxserve;

namespace {

// kB of a /proc/self/status field ("VmHWM", "VmRSS").
int64_t proc_status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  const std::string key = std::string(field) + ":";
  while (std::getline(in, line))
    if (line.rfind(key, 0) == 0) return std::stoll(line.substr(key.size()));
  return -1;
}

struct Flags {
  std::string config, dir = "/tmp/mxserve_rank_loading_ckpt", backend = "cpu";
  int64_t num_layers = 2, first_dense = -1, experts = 0, vocab = 0;
  int tp = 4;
};

struct RankResult {
  int64_t rss_before_kb = 0, hwm_kb = 0;
  uint64_t bytes_read = 0, bytes_share = 0, backend_bytes = 0;
  uint64_t device_peak = 0;  // the backend allocator's high-water mark over the load (0: no device memory)
  double seconds = 0;
  int ok = 0;
};

Result<model::ModelConfig> shrunk_config(const Flags& f) {
  MX_ASSIGN_OR_RETURN(model::ModelConfig cfg, model::load_model_config(f.config));
  if (f.num_layers > 0) cfg.n_layers = std::min(cfg.n_layers, f.num_layers);
  if (f.first_dense >= 0) cfg.first_k_dense = f.first_dense;
  cfg.first_k_dense = std::min(cfg.first_k_dense, cfg.n_layers);
  if (f.experts > 0) {
    cfg.n_experts = f.experts;
    cfg.top_k = std::min(cfg.top_k, f.experts);
    cfg.n_group = 1, cfg.topk_group = 1;
  }
  if (f.vocab > 0) cfg.vocab_size = f.vocab;
  return cfg;
}

// A random-ish bf16 (or f32 where bf16 is not allowed) tensor of every declared weight (no MTP layer).
Status write_checkpoint(const model::ModelConfig& cfg, const std::string& dir) {
  if (fs::exists(fs::path(dir) / "model.safetensors")) {
    std::printf("reusing %s/model.safetensors (delete it after changing the flags)\n", dir.c_str());
    return Status::ok();
  }
  fs::create_directories(dir);
  io::NamedTensors tensors;
  uint32_t state = 12345;
  for (const model::WeightSpec& w : model::declared_weights(cfg, /*include_mtp=*/false)) {
    const bool bf16 = std::find(w.allowed.begin(), w.allowed.end(), model::Precision::kBF16) != w.allowed.end();
    Tensor t = Tensor::empty(bf16 ? DType::kBF16 : DType::kF32, w.shape);
    for (int64_t i = 0; i < t.numel(); ++i) {
      state = state * 1664525u + 1013904223u;
      const float v = (static_cast<float>(state >> 9) / static_cast<float>(1u << 23) - 0.5f) * 0.05f;
      if (bf16) {
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        t.data<uint16_t>()[i] = static_cast<uint16_t>(bits >> 16);
      } else {
        t.data<float>()[i] = v;
      }
    }
    tensors.emplace_back(w.name, std::move(t));
  }
  return io::write_safetensors((fs::path(dir) / "model.safetensors").string(), tensors);
}

// One rank's load, in a child process: writes a RankResult to fd.
void load_rank(const Flags& f, const parallel::RankLayout& rank, int fd) {
  RankResult r;
  r.rss_before_kb = proc_status_kb("VmRSS");
  auto cfg = shrunk_config(f);
  if (cfg.is_ok()) {
    auto made = backend::make_backend(f.backend);
    if (!made.is_ok()) std::fprintf(stderr, "%s\n", made.status().to_string().c_str());
    std::shared_ptr<backend::Backend> be = made.is_ok() ? std::shared_ptr<backend::Backend>(std::move(made).value())
                                                        : nullptr;
    const model::DeclaredWeights declared = model::record_weights(*cfg->arch, *cfg, false);
    auto ckpt = io::Checkpoint::open(f.dir);
    if (be && ckpt.is_ok()) {
      auto bound = model::bind_weights(**ckpt, declared.table, declared.bind);
      if (bound.is_ok()) {
        backend::reset_memory_peak(*be);
        const auto t0 = std::chrono::steady_clock::now();
        model::WeightLoader wl(*be, *bound);
        wl.set_rank(rank, nullptr);
        auto m = cfg->arch->build(*cfg, wl, *be, false);
        be->synchronize();
        r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        r.ok = m.is_ok();
        if (!m.is_ok()) std::fprintf(stderr, "%s\n", m.status().to_string().c_str());
        r.bytes_read = wl.stats().bytes_read, r.bytes_share = wl.stats().bytes_share;
        r.backend_bytes = wl.stats().backend_bytes;
        const backend::DeviceMemory mem = backend::device_memory(*be);
        if (mem.known) r.device_peak = mem.peak_in_use;
      } else {
        std::fprintf(stderr, "%s\n", bound.status().to_string().c_str());
      }
    } else if (!ckpt.is_ok()) {
      std::fprintf(stderr, "%s\n", ckpt.status().to_string().c_str());
    }
  } else {
    std::fprintf(stderr, "%s\n", cfg.status().to_string().c_str());
  }
  r.hwm_kb = proc_status_kb("VmHWM");
  (void)!::write(fd, &r, sizeof(r));
}

RankResult run_rank(const Flags& f, int tp, int rank_index) {
  int fds[2];
  RankResult r;
  if (::pipe(fds) != 0) return r;
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    parallel::RankLayout rank;
    rank.tp = tp, rank.rank = rank_index;
    rank.device = f.backend == "cuda" ? 0 : rank_index;  // one GPU: every rank on device 0, one at a time
    load_rank(f, rank, fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  if (::read(fds[0], &r, sizeof(r)) != static_cast<ssize_t>(sizeof(r))) r.ok = 0;
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  Flags f;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--config") f.config = v;
    else if (k == "--dir") f.dir = v;
    else if (k == "--backend") f.backend = v;
    else if (k == "--num-layers") f.num_layers = std::stoll(v);
    else if (k == "--first-dense") f.first_dense = std::stoll(v);
    else if (k == "--experts") f.experts = std::stoll(v);
    else if (k == "--vocab") f.vocab = std::stoll(v);
    else if (k == "--tp") f.tp = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown flag %s (see the header of tests/model/measure_rank_loading.cpp)\n", k.c_str());
      return 2;
    }
  }
  if (f.config.empty() || f.tp < 1 || (f.backend != "cpu" && f.backend != "cuda")) {
    std::fprintf(stderr, "usage: measure_rank_loading --config FILE [--num-layers N --first-dense K --experts E "
                         "--vocab V] --tp T [--dir DIR] [--backend cpu|cuda]\n");
    return 2;
  }
  auto cfg = shrunk_config(f);
  if (!cfg.is_ok()) {
    std::fprintf(stderr, "%s\n", cfg.status().to_string().c_str());
    return 1;
  }
  if (Status s = write_checkpoint(*cfg, f.dir); !s.is_ok()) {
    std::fprintf(stderr, "%s\n", s.to_string().c_str());
    return 1;
  }
  auto ckpt = io::Checkpoint::open(f.dir);
  if (!ckpt.is_ok()) return 1;
  const uint64_t total = (*ckpt)->tensor_bytes();
  ckpt->reset();
  std::printf("checkpoint %s: %.1f MiB (%lld layers, %lld dense, %lld experts, vocab %lld)\n", f.dir.c_str(),
              total / 1048576.0, (long long)cfg->n_layers, (long long)cfg->first_k_dense, (long long)cfg->n_experts,
              (long long)cfg->vocab_size);
  RankResult one;
  double worst_rss = 0, worst_dev = 0, worst_peak = 0;
  for (int tp : {1, f.tp}) {
    for (int r = 0; r < tp; ++r) {
      const RankResult x = run_rank(f, tp, r);
      if (!x.ok) {
        std::fprintf(stderr, "tp %d rank %d: load failed\n", tp, r);
        return 1;
      }
      const double rss = (x.hwm_kb - x.rss_before_kb) / 1024.0;  // MiB the load added at its peak
      std::printf("tp %d rank %d: read %.1f MiB (share %.1f MiB), backend weights %.1f MiB, device peak %.1f MiB, "
                  "peak RSS +%.1f MiB, %.2f s\n",
                  tp, r, x.bytes_read / 1048576.0, x.bytes_share / 1048576.0, x.backend_bytes / 1048576.0,
                  x.device_peak / 1048576.0, rss, x.seconds);
      if (tp == 1 && f.tp != 1 && r == 0) {
        one = x;
      } else if (tp == f.tp) {
        worst_rss = std::max(worst_rss, static_cast<double>(x.hwm_kb - x.rss_before_kb) /
                                            std::max<int64_t>(1, one.hwm_kb - one.rss_before_kb));
        worst_dev = std::max(worst_dev, static_cast<double>(x.backend_bytes) / std::max<uint64_t>(1, one.backend_bytes));
        if (one.device_peak > 0)
          worst_peak = std::max(worst_peak, static_cast<double>(x.device_peak) / static_cast<double>(one.device_peak));
      }
    }
    if (f.tp == 1) break;
  }
  std::printf("tp %d vs tp 1, worst rank: peak host RSS %.3fx, backend (device) weights %.3fx (target <= 0.3x)\n",
              f.tp, worst_rss, worst_dev);
  if (worst_peak > 0)
    std::printf("tp %d vs tp 1, worst rank: device allocator peak over the load %.3fx (target <= 0.3x)\n", f.tp,
                worst_peak);
  return 0;
}
