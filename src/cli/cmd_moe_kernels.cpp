// `mxserve tune-moe` and `mxserve bench-kernels moe`: the offline tuner that writes a per-GPU MXFP4 MoE
// kernel table (format mxserve-moe-tuning/1, read by src/kernels/moe_tuning.*) and the MoE kernel
// microbenchmark (markdown: time, bytes, TB/s, TFLOP/s, fraction of the ceilings measured in the same
// run, speedup over the bf16 grouped GEMM). Synthetic weights generated on the GPU; routing is uniform
// random with distinct experts per token, rotated over several sets so decode timings are not L2 hits.
// Both need the CUDA backend; without it they fail with a clear error.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "cli/args.h"
#include "cli/commands.h"

#ifdef MXSERVE_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "core/numeric.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/cuda_kernels.h"
#include "kernels/moe_tuning.h"
#include "kernels/cuda/moe_mxfp4/moe_mxfp4.h"
#endif

namespace mxserve::cli {
namespace {

struct MoeArgs {
  int64_t experts = 0, hidden = 0, inter = 0, top_k = 0;
  std::vector<int64_t> ms;
  std::string command;  // the command line, for the table
};

std::vector<int64_t> default_ms() {
  std::vector<int64_t> v;
  for (int64_t m = 1; m <= 16384; m *= 2) v.push_back(m);
  return v;
}

int parse_moe_args(const Args& a, MoeArgs* out) {
  for (auto [flag, dst] : {std::pair{"--experts", &out->experts}, {"--hidden", &out->hidden},
                           {"--inter", &out->inter}, {"--top-k", &out->top_k}}) {
    auto v = a.get_int(flag, 0);
    if (!v.is_ok() || *v <= 0) {
      std::fprintf(stderr, "error: %s must be a positive integer\n", flag);
      return 2;
    }
    *dst = *v;
  }
  if (out->top_k > out->experts) {
    std::fprintf(stderr, "error: --top-k %lld exceeds --experts %lld\n", static_cast<long long>(out->top_k),
                 static_cast<long long>(out->experts));
    return 2;
  }
  if (out->hidden % 32 != 0 || out->inter % 32 != 0) {
    std::fprintf(stderr, "error: --hidden and --inter must be multiples of 32 (MXFP4 blocks)\n");
    return 2;
  }
  out->ms = default_ms();
  if (a.has("--m")) {
    auto ids = parse_id_list(a.get_or("--m", ""), "--m");
    if (!ids.is_ok()) {
      std::fprintf(stderr, "error: %s\n", ids.status().to_string().c_str());
      return 2;
    }
    out->ms.assign(ids->begin(), ids->end());
    for (int64_t m : out->ms)
      if (m <= 0) {
        std::fprintf(stderr, "error: --m values must be positive\n");
        return 2;
      }
  }
  return 0;
}

#ifdef MXSERVE_HAVE_CUDA
namespace kc = kernels::cuda;

std::string json_escape(const std::string& s) {
  std::string r;
  for (char c : s) {
    if (c == '"' || c == '\\') r += '\\';
    r += c;
  }
  return r;
}


// Everything one MoE shape needs on the device: MXFP4 (and optionally bf16) weights, routing sets,
// activations, output, workspace; timing with CUDA events on the backend's stream.
class MoeRig {
 public:
  MoeRig(backend::Backend& be, const MoeArgs& a, bool with_bf16) : be_(be), a_(a), stream_(backend::cuda_backend_stream(be)) {
    MX_CUDA_CHECK(cudaEventCreate(&e0_));
    MX_CUDA_CHECK(cudaEventCreate(&e1_));
    const int64_t E = a.experts, H = a.hidden, I = a.inter;
    gu_q_ = alloc(E * 2 * I * H / 2);
    gu_s_ = alloc(E * 2 * I * H / 32);
    dn_q_ = alloc(E * H * I / 2);
    dn_s_ = alloc(E * H * I / 32);
    // Codes: any byte is a valid E2M1 pair, so random bf16 bits serve. Scales: one sane exponent (2^-8),
    // so every candidate's output is finite and comparable.
    kc::fill_random_bf16(gu_q_, E * 2 * I * H / 4, 11, 1.f, stream_);
    kc::fill_random_bf16(dn_q_, E * H * I / 4, 12, 1.f, stream_);
    MX_CUDA_CHECK(cudaMemsetAsync(gu_s_, 119, E * 2 * I * H / 32, stream_));
    MX_CUDA_CHECK(cudaMemsetAsync(dn_s_, 119, E * H * I / 32, stream_));
    if (with_bf16) {
      gu_bf16_ = alloc(E * 2 * I * H * 2);
      dn_bf16_ = alloc(E * H * I * 2);
      kc::fill_random_bf16(gu_bf16_, E * 2 * I * H, 13, 0.02f, stream_);
      kc::fill_random_bf16(dn_bf16_, E * H * I, 14, 0.02f, stream_);
    }
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  ~MoeRig() {
    for (void* p : allocs_) cudaFree(p);
    for (void* p : per_m_) cudaFree(p);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
  }

  // Sets up M tokens: n_rot routing sets (distinct experts per token), x, out, workspaces.
  void setup(int64_t m, uint64_t seed) {
    for (void* p : per_m_) cudaFree(p);
    per_m_.clear();
    m_ = m;
    s_ = kc::MoeShape{m, a_.hidden, a_.inter, static_cast<int32_t>(a_.experts), static_cast<int32_t>(a_.top_k)};
    // NOTE: enough routing sets that the experts one call hits are not still in L2 from the previous call
    // (at least ~4 x 60 MB of distinct expert bytes between reuses), capped for large M.
    const double bytes_call = experts_hit_estimate() * bytes_per_expert();
    n_rot_ = static_cast<int>(std::clamp(std::ceil(256e6 / std::max(bytes_call, 1.0)), 1.0, 8.0));
    std::mt19937_64 rng(seed);
    std::vector<int32_t> ids(m * a_.top_k), perm(a_.experts);
    std::uniform_real_distribution<float> u(0.05f, 1.f);
    std::vector<float> w(m * a_.top_k);
    hit_ = 0;
    for (int r = 0; r < n_rot_; ++r) {
      std::set<int32_t> hit;
      for (int64_t t = 0; t < m; ++t) {
        // Partial Fisher-Yates: top_k distinct experts.
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t k = 0; k < a_.top_k; ++k) {
          std::uniform_int_distribution<int64_t> pick(k, a_.experts - 1);
          std::swap(perm[k], perm[pick(rng)]);
          ids[t * a_.top_k + k] = perm[k];
          hit.insert(perm[k]);
          w[t * a_.top_k + k] = u(rng);
        }
      }
      hit_ += static_cast<double>(hit.size()) / n_rot_;
      ids_.push_back(upload(ids.data(), ids.size() * 4));
      wts_.push_back(upload(w.data(), w.size() * 4));
    }
    x_ = per(alloc(m * a_.hidden * 2));
    kc::fill_random_bf16(x_, m * a_.hidden, seed + 1, 1.f, stream_);
    out_ = per(alloc(m * a_.hidden * 2));
    MX_CUDA_CHECK(cudaMemsetAsync(out_, 0, m * a_.hidden * 2, stream_));
    ws_bytes_ = kc::moe_mxfp4_workspace_bytes(s_);
    ws_ = per(alloc(std::max<size_t>(ws_bytes_, 256)));
    if (gu_bf16_) ws_bf16_ = per(alloc(std::max<size_t>(kc::moe_workspace_bytes(s_), 256)));
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

  void run_mxfp4(const kc::MoeMxfp4Plan& plan, int i) {
    const kc::MoeMxfp4Weights w{static_cast<const uint8_t*>(gu_q_), static_cast<const uint8_t*>(gu_s_),
                                static_cast<const uint8_t*>(dn_q_), static_cast<const uint8_t*>(dn_s_)};
    kc::moe_experts_mxfp4(x_, static_cast<const int32_t*>(ids_[i % n_rot_]), static_cast<const float*>(wts_[i % n_rot_]),
                          w, out_, s_, plan, ws_, stream_);
  }
  void run_bf16(int i) {
    kc::moe_experts_bf16(x_, static_cast<const int32_t*>(ids_[i % n_rot_]), static_cast<const float*>(wts_[i % n_rot_]),
                         gu_bf16_, dn_bf16_, out_, s_, ws_bf16_, stream_);
  }
  // out = MoE(x) with routing set 0 under `plan` (out zeroed first), as host floats.
  // NOTE: only the first 4M elements come back (whole token rows), to keep the tuner's budget at M=16384.
  std::vector<float> output(const kc::MoeMxfp4Plan& plan) {
    MX_CUDA_CHECK(cudaMemsetAsync(out_, 0, m_ * a_.hidden * 2, stream_));
    run_mxfp4(plan, 0);
    std::vector<uint16_t> h(std::min<int64_t>(m_, std::max<int64_t>(1, (4 << 20) / a_.hidden)) * a_.hidden);
    MX_CUDA_CHECK(cudaMemcpyAsync(h.data(), out_, h.size() * 2, cudaMemcpyDeviceToHost, stream_));
    MX_CUDA_CHECK(cudaStreamSynchronize(stream_));
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = bf16_to_f32(h[i]);
    return f;
  }

  // Median ms per call over `regions` event-timed regions; reps per region sized from a first call.
  double time_ms(const std::function<void(int)>& fn, int regions) {
    int call = 0;
    MX_CUDA_CHECK(cudaEventRecord(e0_, stream_));
    fn(call++);
    MX_CUDA_CHECK(cudaEventRecord(e1_, stream_));
    MX_CUDA_CHECK(cudaEventSynchronize(e1_));
    float first = 0;
    MX_CUDA_CHECK(cudaEventElapsedTime(&first, e0_, e1_));
    const int reps = static_cast<int>(std::clamp(2.0 / std::max(first, 1e-3f), 1.0, 50.0));
    std::vector<double> v;
    for (int r = 0; r < regions; ++r) {
      MX_CUDA_CHECK(cudaEventRecord(e0_, stream_));
      for (int i = 0; i < reps; ++i) fn(call++);
      MX_CUDA_CHECK(cudaEventRecord(e1_, stream_));
      MX_CUDA_CHECK(cudaEventSynchronize(e1_));
      float ms = 0;
      MX_CUDA_CHECK(cudaEventElapsedTime(&ms, e0_, e1_));
      v.push_back(ms / reps);
    }
    MX_CUDA_CHECK(cudaGetLastError());
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

  double bytes_per_expert() const {
    return 3.0 * a_.hidden * a_.inter / 2 + 3.0 * a_.hidden * a_.inter / 32;  // packed + scales
  }
  // Bytes one call must read at least: the experts hit (mean over the routing sets) + x + out (read, write).
  double bytes_read() const { return hit_ * bytes_per_expert() + 3.0 * m_ * a_.hidden * 2; }
  double experts_hit() const { return hit_; }
  double flops() const { return 6.0 * a_.hidden * a_.inter * m_ * a_.top_k; }
  const kc::MoeShape& shape() const { return s_; }
  cudaStream_t stream() const { return stream_; }
  bool has_bf16() const { return gu_bf16_ != nullptr; }

 private:
  double experts_hit_estimate() const {
    const double p_miss = std::pow(1.0 - static_cast<double>(a_.top_k) / a_.experts, static_cast<double>(m_));
    return a_.experts * (1.0 - p_miss);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    MX_CUDA_CHECK(cudaMalloc(&p, bytes));
    allocs_.push_back(p);
    return p;
  }
  void* per(void* p) {  // moves an allocation to the per-M list
    allocs_.erase(std::find(allocs_.begin(), allocs_.end(), p));
    per_m_.push_back(p);
    return p;
  }
  void* upload(const void* host, size_t bytes) {
    void* p = per(alloc(bytes));
    MX_CUDA_CHECK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
  }

  backend::Backend& be_;
  MoeArgs a_;
  cudaStream_t stream_;
  cudaEvent_t e0_, e1_;
  std::vector<void*> allocs_, per_m_;
  void *gu_q_ = nullptr, *gu_s_ = nullptr, *dn_q_ = nullptr, *dn_s_ = nullptr, *gu_bf16_ = nullptr, *dn_bf16_ = nullptr;
  void *x_ = nullptr, *out_ = nullptr, *ws_ = nullptr, *ws_bf16_ = nullptr;
  std::vector<void*> ids_, wts_;
  int64_t m_ = 0;
  kc::MoeShape s_;
  size_t ws_bytes_ = 0;
  int n_rot_ = 1;
  double hit_ = 0;

 public:
  void reset_routing() {
    ids_.clear();
    wts_.clear();
  }
};

double rel_l2(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

std::string gpu_name() {
  cudaDeviceProp prop{};
  MX_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  return prop.name;
}

// Candidate outputs must match the heuristic plan's (same weights, same routing) within this rel L2:
// only the summation order differs (the GPU test checks every variant against the CPU reference).
constexpr double kTuneTol = 2e-2;

int tune(backend::Backend& be, const MoeArgs& a, const std::string& out_path) {
  MoeRig rig(be, a, false);
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  std::ostringstream js;
  js << "{\"format\":\"mxserve-moe-tuning/1\",\"gpu\":\"" << json_escape(gpu_name()) << "\",\"experts\":" << a.experts
     << ",\"hidden\":" << a.hidden << ",\"inter\":" << a.inter << ",\"top_k\":" << a.top_k
     << ",\"dtype\":\"mxfp4\",\"command\":\"" << json_escape(a.command) << "\",\"entries\":[";
  int failures = 0;
  for (size_t bi = 0; bi < a.ms.size(); ++bi) {
    const int64_t m = a.ms[bi];
    rig.reset_routing();
    rig.setup(m, 1000 + m);
    const kc::MoeShape& s = rig.shape();
    const kc::MoeMxfp4Plan heur = kc::moe_mxfp4_heuristic_plan(s);
    const std::vector<float> ref = rig.output(heur);
    const int regions = m >= 4096 ? 3 : 5;
    auto pick = [&](kc::MoeGemm gemm, kc::MoeMxfp4Plan base) {
      int best = gemm == kc::MoeGemm::kGateUp ? base.gate_up : base.down;
      double best_ms = INFINITY;
      for (int v = 0; v < static_cast<int>(names.size()); ++v) {
        if (!kc::moe_mxfp4_variant_supports(gemm, v, s)) continue;
        kc::MoeMxfp4Plan p = base;
        (gemm == kc::MoeGemm::kGateUp ? p.gate_up : p.down) = v;
        const double err = rel_l2(rig.output(p), ref);
        if (!(err <= kTuneTol)) {
          std::fprintf(stderr, "tune-moe: m=%lld %s variant %s REJECTED: rel_l2 %.3g vs the heuristic plan\n",
                       static_cast<long long>(m), gemm == kc::MoeGemm::kGateUp ? "gate_up" : "down",
                       names[v].c_str(), err);
          ++failures;
          continue;
        }
        const double ms = rig.time_ms([&](int i) { rig.run_mxfp4(p, i); }, regions);
        std::printf("  m=%-6lld %-7s %-12s %10.1f us\n", static_cast<long long>(m),
                    gemm == kc::MoeGemm::kGateUp ? "gate_up" : "down", names[v].c_str(), ms * 1e3);
        if (ms < best_ms) {
          best_ms = ms;
          best = v;
        }
      }
      return best;
    };
    kc::MoeMxfp4Plan plan = heur;
    plan.gate_up = pick(kc::MoeGemm::kGateUp, plan);
    plan.down = pick(kc::MoeGemm::kDown, plan);
    const double us = rig.time_ms([&](int i) { rig.run_mxfp4(plan, i); }, regions) * 1e3;
    const double heur_us = rig.time_ms([&](int i) { rig.run_mxfp4(heur, i); }, regions) * 1e3;
    std::printf("m=%-6lld best gate_up %-12s down %-12s %10.1f us  (heuristic %s/%s %.1f us)\n",
                static_cast<long long>(m), names[plan.gate_up].c_str(), names[plan.down].c_str(), us,
                names[heur.gate_up].c_str(), names[heur.down].c_str(), heur_us);
    std::fflush(stdout);
    js << (bi ? "," : "") << "{\"m\":" << m << ",\"gate_up\":\"" << names[plan.gate_up] << "\",\"down\":\""
       << names[plan.down] << "\",\"us\":" << us << "}";
    // The table is rewritten after every bucket: a run cut short still leaves a valid (partial) table.
    std::ofstream f(out_path);
    f << js.str() << "]}\n";
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", out_path.c_str());
      return 1;
    }
  }
  std::printf("wrote %s%s\n", out_path.c_str(), failures ? " (some candidates were rejected, see stderr)" : "");
  return failures ? 3 : 0;
}

using kernels::MoeTuningEntry;
using kernels::MoeTuningTable;
using kernels::read_moe_tuning_file;
using kernels::select_moe_bucket;

int bench(backend::Backend& be, const MoeArgs& a, const std::string& md_path, const std::string& table_path,
          bool probe) {
  // The same reader and bucket rule the engine uses at run time (kernels/moe_tuning.h), so the bench times
  // exactly the plan serving would pick for each M.
  std::optional<MoeTuningTable> table;
  if (!table_path.empty()) {
    auto t = read_moe_tuning_file(table_path);
    if (!t.is_ok()) {
      std::fprintf(stderr, "error: %s\n", t.status().to_string().c_str());
      return 2;
    }
    table = std::move(*t);
  }
  cudaStream_t stream = backend::cuda_backend_stream(be);
  MoeRig rig(be, a, true);
  const auto& names = kc::moe_mxfp4_variants(kc::MoeGemm::kGateUp);
  struct Row {
    int64_t m;
    kc::MoeMxfp4Plan plan;
    double ms, bf_ms, bytes, hit, flops;
    double gu_bytes = 0, gu_ms = 0, loads_ms = 0, math_ms = 0;  // --probe
  };
  std::vector<Row> rows;
  // NOTE: the kernels are timed BEFORE the ceilings: right after the 8192^3 GEMM the SM clock is still
  // power-limited for a while, which cost the first (M = 1) row ~20% in earlier runs.
  for (int64_t m : a.ms) {
    rig.reset_routing();
    rig.setup(m, 7000 + m);
    const kc::MoeShape& s = rig.shape();
    kc::MoeMxfp4Plan plan = kc::moe_mxfp4_heuristic_plan(s);
    const int bucket = table ? select_moe_bucket(*table, m) : -1;
    if (bucket >= 0) {
      const MoeTuningEntry& best = table->entries[bucket];
      const int gu = kc::moe_mxfp4_variant_index(kc::MoeGemm::kGateUp, best.gate_up),
                dn = kc::moe_mxfp4_variant_index(kc::MoeGemm::kDown, best.down);
      if (gu < 0 || dn < 0) {
        std::fprintf(stderr, "error: %s names an unknown variant (%s / %s)\n", table_path.c_str(), best.gate_up.c_str(),
                     best.down.c_str());
        return 2;
      }
      plan = {gu, dn};
    }
    const int regions = m >= 4096 ? 3 : 5;
    Row r{m, plan, 0, 0, rig.bytes_read(), rig.experts_hit(), rig.flops()};
    r.ms = rig.time_ms([&](int i) { rig.run_mxfp4(plan, i); }, regions);
    r.bf_ms = rig.time_ms([&](int i) { rig.run_bf16(i); }, regions);
    if (probe && names[plan.gate_up].rfind("gv_", 0) == 0) {
      // gate_up alone: its weights (experts hit x (codes + scales) of 2I x H) + x.
      r.gu_bytes = r.hit * (2.0 * a.inter * a.hidden / 2 + 2.0 * a.inter * a.hidden / 32) + 2.0 * m * a.hidden;
      for (auto [mode, dst] : {std::pair{kc::MoeProbe::kGateUp, &r.gu_ms}, {kc::MoeProbe::kGateUpLoadsOnly, &r.loads_ms},
                               {kc::MoeProbe::kGateUpMathOnly, &r.math_ms}}) {
        kc::MoeMxfp4Plan pp = plan;
        pp.probe = mode;
        *dst = rig.time_ms([&](int i) { rig.run_mxfp4(pp, i); }, regions);
      }
    }
    std::printf("m=%lld %s/%s %.1f us\n", static_cast<long long>(m), names[plan.gate_up].c_str(),
                names[plan.down].c_str(), r.ms * 1e3);
    std::fflush(stdout);
    rows.push_back(r);
  }
  const kc::Ceilings c = kc::measure_ceilings(stream);  // shared with bench-model and bench_cuda_kernels
  const double copy_gbs = c.copy_gbs, gemm_tflops = c.gemm_tflops;
  std::ostringstream md;
  md << "## MXFP4 MoE experts: E " << a.experts << ", H " << a.hidden << ", I " << a.inter << ", top " << a.top_k << " on "
     << gpu_name() << "\n\n"
     << "command: `" << a.command << "`  \n"
     << "ceilings measured in this run (after the kernels): device copy " << static_cast<int>(copy_gbs)
     << " GB/s, cuBLASLt bf16 GEMM 8192^3 " << static_cast<int>(gemm_tflops)
     << " TFLOP/s; plan: " << (table_path.empty() ? "heuristic" : table_path) << "\n\n"
     << "| M | gate_up | down | mxfp4 us | experts hit | MB read | TB/s | % copy BW | TFLOP/s | % bf16 GEMM | bf16 us | speedup |\n"
     << "|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  char line[512];
  for (const Row& r : rows) {
    const double tbs = r.bytes / (r.ms * 1e-3) / 1e12, tf = r.flops / (r.ms * 1e-3) / 1e12;
    std::snprintf(line, sizeof line, "| %lld | %s | %s | %.1f | %.1f | %.1f | %.2f | %.0f%% | %.1f | %.0f%% | %.1f | %.2fx |\n",
                  static_cast<long long>(r.m), names[r.plan.gate_up].c_str(), names[r.plan.down].c_str(), r.ms * 1e3,
                  r.hit, r.bytes / 1e6, tbs, 100.0 * tbs * 1e3 / copy_gbs, tf, 100.0 * tf / gemm_tflops, r.bf_ms * 1e3,
                  r.bf_ms / r.ms);
    md << line;
  }
  md << "\nbytes read = experts hit (mean over the routing sets) x (packed codes + E8M0 scales) + x + out (read and "
        "write); FLOPs = 6 H I M top_k. bf16 = moe_experts_bf16 (WMMA grouped GEMM / GEMV) on bf16 weights.\n";
  if (probe) {
    md << "\n### Limit probe: the gate_up GEMM alone (design 5), whole, weight stream only, math only\n\n"
       << "| M | gate_up | gate_up MB | whole us | % copy BW | loads only us | % copy BW | math only us | whole / max(loads, math) |\n"
       << "|---|---|---|---|---|---|---|---|---|\n";
    for (const Row& r : rows) {
      if (r.gu_ms <= 0) continue;
      auto pct = [&](double ms) { return 100.0 * r.gu_bytes / (ms * 1e-3) / 1e9 / copy_gbs; };
      std::snprintf(line, sizeof line, "| %lld | %s | %.1f | %.1f | %.0f%% | %.1f | %.0f%% | %.1f | %.2f |\n",
                    static_cast<long long>(r.m), names[r.plan.gate_up].c_str(), r.gu_bytes / 1e6, r.gu_ms * 1e3,
                    pct(r.gu_ms), r.loads_ms * 1e3, pct(r.loads_ms), r.math_ms * 1e3,
                    r.gu_ms / std::max(r.loads_ms, r.math_ms));
      md << line;
    }
    md << "\nloads only: the same grid and register ring, codes/scales/x XOR-folded instead of dequantized; math "
          "only: the same dequant + MMAs on codes made in registers (no weight loads). Includes the permute kernel "
          "for M > 1.\n";
  }
  std::printf("\n%s", md.str().c_str());
  if (!md_path.empty()) {
    std::ofstream f(md_path);
    f << md.str();
    if (!f) {
      std::fprintf(stderr, "error: cannot write %s\n", md_path.c_str());
      return 1;
    }
  }
  return 0;
}
#endif  // MXSERVE_HAVE_CUDA

std::string command_line(const char* name, int argc, char** argv) {
  std::string c = std::string("mxserve ") + name;
  for (int i = 1; i < argc; ++i) c += std::string(" ") + argv[i];
  return c;
}

}  // namespace

int cmd_tune_moe(int argc, char** argv) {
  auto args = Args::parse(argc, argv, {"--experts", "--hidden", "--inter", "--top-k", "--dtype", "--m", "--out"}, {});
  if (!args.is_ok()) {
    std::fprintf(stderr, "error: %s\n", args.status().to_string().c_str());
    return 2;
  }
  MoeArgs a;
  if (int rc = parse_moe_args(*args, &a)) return rc;
  a.command = command_line("tune-moe", argc, argv);
  const std::string dtype = args->get_or("--dtype", "mxfp4");
  if (dtype != "mxfp4") {
    std::fprintf(stderr, "error: --dtype %s: only mxfp4 has tunable kernels\n", dtype.c_str());
    return 2;
  }
  auto out = args->get("--out");
  if (!out.is_ok()) {
    std::fprintf(stderr, "error: --out FILE is required\n");
    return 2;
  }
#ifdef MXSERVE_HAVE_CUDA
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) {
    std::fprintf(stderr, "error: tune-moe needs a CUDA device: %s\n", be.status().to_string().c_str());
    return 2;
  }
  return tune(**be, a, *out);
#else
  std::fprintf(stderr, "error: tune-moe needs the CUDA backend; this mxserve was built without CUDA\n");
  return 2;
#endif
}

int cmd_bench_kernels(int argc, char** argv) {
  auto args =
      Args::parse(argc, argv, {"--experts", "--hidden", "--inter", "--top-k", "--m", "--md", "--table"}, {"--probe"});
  if (!args.is_ok()) {
    std::fprintf(stderr, "error: %s\n", args.status().to_string().c_str());
    return 2;
  }
  if (args->positional().size() != 1 || args->positional()[0] != "moe") {
    std::fprintf(stderr, "usage: mxserve bench-kernels moe --experts E --hidden H --inter I --top-k K [--m LIST] "
                         "[--table FILE] [--md FILE] [--probe]\n");
    return 2;
  }
  MoeArgs a;
  if (int rc = parse_moe_args(*args, &a)) return rc;
  a.command = command_line("bench-kernels", argc, argv);
#ifdef MXSERVE_HAVE_CUDA
  auto be = backend::make_backend("cuda");
  if (!be.is_ok()) {
    std::fprintf(stderr, "error: bench-kernels needs a CUDA device: %s\n", be.status().to_string().c_str());
    return 2;
  }
  return bench(**be, a, args->get_or("--md", ""), args->get_or("--table", ""), args->has("--probe"));
#else
  std::fprintf(stderr, "error: bench-kernels needs the CUDA backend; this mxserve was built without CUDA\n");
  return 2;
#endif
}

}  // namespace mxserve::cli
