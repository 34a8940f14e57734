// Cascade (shared-prefix) decode attention vs the per-sequence decode kernel at GLM-4.5-Air's attention shape
// (96 q heads, 8 kv heads x 128, block 16), the seed workload's decode step: batch 16 at 20k context, 12k of it
// a prefix shared in groups of 4 (and other group sizes / prefix lengths), bf16 and FP8 caches. Prints us per
// call (median of timed regions), the K/V bytes each path must read (per-sequence: every row's whole context;
// cascade: each group's prefix once + every suffix), GB/s on those bytes and the fraction of the measured
// device-to-device copy bandwidth ("roofline"), and a rel-L2 check cascade vs per-sequence (oracle:
// tests/ops/test_cuda_cascade_attention). Usage: bench_cascade_attention [--batch 16] [--context 20000]
// [--prefix 12000] [--group 4] [--sweep] [--fp8-loads async|plain|both]. FP8 rows name their tile loader: fp8 (the
// cp.async pipeline, kv_fp8_tile.cuh) or fp8-plain (the old plain loads; also MXSERVE_FP8_KV_PLAIN_LOADS=1);
// --fp8-loads both times the two in one run (the before / after of the loader).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_device.h"
#include "kernels/cascade_attention.h"
#include "kernels/cuda/attention/cascade_attention.h"
#include "kernels/cuda/attention/kv_fp8_load_mode.h"
#include "kernels/cuda/ceilings.h"
#include "kernels/cuda/cuda_kernels.h"

namespace kc = mxserve::kernels::cuda;
using mxserve::kernels::AttentionParams;

namespace {

struct Shape {
  int batch = 16, context = 20000, prefix = 12000, group = 4;
};

void run(const Shape& s, bool fp8, int n_sms, double copy_gbs, cudaStream_t stream) {
  constexpr int kHeads = 96, kKv = 8, kHd = 128, kBs = 16;
  std::mt19937 rng(7);
  const int prefix_blocks = s.prefix / kBs;  // whole shared blocks (a partial one is private)
  const int own_blocks = (s.context + kBs - 1) / kBs - prefix_blocks;
  const int n_groups = (s.batch + s.group - 1) / s.group;
  const int64_t total_blocks = static_cast<int64_t>(n_groups) * prefix_blocks + static_cast<int64_t>(s.batch) * own_blocks;
  std::vector<int32_t> ids(total_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int max_blocks = prefix_blocks + own_blocks;
  std::vector<int32_t> tables(static_cast<size_t>(s.batch) * max_blocks), seq(s.batch), kvi(s.batch);
  int64_t next = 0;
  std::vector<std::vector<int32_t>> shared(n_groups);
  for (auto& g : shared)
    for (int b = 0; b < prefix_blocks; ++b) g.push_back(ids[next++]);
  for (int r = 0; r < s.batch; ++r) {
    for (int b = 0; b < prefix_blocks; ++b) tables[static_cast<size_t>(r) * max_blocks + b] = shared[r / s.group][b];
    for (int b = prefix_blocks; b < max_blocks; ++b) tables[static_cast<size_t>(r) * max_blocks + b] = ids[next++];
    seq[r] = r;
    kvi[r] = s.context - 1;
  }
  const int64_t n_slots = total_blocks * kBs, width = kKv * kHd;
  const size_t elem = fp8 ? 1 : 2;
  std::vector<uint8_t> cache(n_slots * width * elem);
  for (auto& b : cache) b = static_cast<uint8_t>(rng() & 0x3b);  // finite bf16 / e4m3 bit patterns, small values
  std::vector<float> scales(n_slots * kKv, 0.01f);
  std::vector<uint16_t> q(static_cast<size_t>(s.batch) * kHeads * kHd);
  for (auto& x : q) x = static_cast<uint16_t>(0x3c00 + (rng() & 0xff));
  uint8_t* kd = bench::dev_upload(cache);
  uint8_t* vd = bench::dev_upload(cache);
  float* ks = bench::dev_upload(scales);
  float* vs = bench::dev_upload(scales);
  uint16_t* qd = bench::dev_upload(q);
  int32_t* td = bench::dev_upload(tables);
  int32_t* sd = bench::dev_upload(seq);
  int32_t* id = bench::dev_upload(kvi);
  uint16_t* out_a = bench::dev_alloc<uint16_t>(q.size());
  uint16_t* out_b = bench::dev_alloc<uint16_t>(q.size());

  AttentionParams p;
  p.n_tokens = s.batch;
  p.n_seqs = s.batch;
  p.n_heads = kHeads;
  p.n_kv_heads = kKv;
  p.head_dim = kHd;
  p.block_size = kBs;
  p.max_blocks_per_seq = max_blocks;
  p.max_kv_len = s.context;
  p.scale = 0.088f;
  p.n_leading_decode_rows = s.batch;
  if (fp8) {
    p.k_scales = ks;
    p.v_scales = vs;
  }
  // Groups as the batch builder finds them.
  std::vector<const int32_t*> tp;
  std::vector<int32_t> nb(s.batch, max_blocks);
  for (int r = 0; r < s.batch; ++r) tp.push_back(tables.data() + static_cast<size_t>(r) * max_blocks);
  const auto layout = mxserve::kernels::find_cascade_groups(tp, nb, kvi, kBs);
  mxserve::kernels::CascadeShape shape;
  shape.cap_rows = s.batch;
  shape.group_size = kHeads / kKv;
  shape.cap_work = mxserve::kernels::cascade_work_capacity(s.batch, shape.group_size, 2);
  shape.max_prefix_keys = s.context;
  int32_t max_suffix = 0, work = 0;
  for (const auto& g : layout.groups) work += (g.n_members * shape.group_size + 63) / 64;
  for (int r = 0; r < s.batch; ++r) max_suffix = std::max(max_suffix, s.context - (s.prefix / kBs) * kBs);
  shape.max_prefix_keys = prefix_blocks * kBs;
  shape.max_suffix_keys = max_suffix;
  shape.n_work_hint = work;
  std::vector<int32_t> buf(shape.n_ints());
  if (!mxserve::kernels::encode_cascade(layout, kBs, shape, buf.data())) {
    std::printf("encode failed\n");
    return;
  }
  int32_t* bd = bench::dev_upload(buf);

  const kc::AttentionBatchPlan base = kc::plan_paged_attention_batch(p, n_sms);
  void* ws_a = bench::dev_alloc<uint8_t>(base.workspace_bytes);
  const kc::CascadeBatchPlan cas = kc::plan_cascade_batch(p, shape, n_sms);
  void* ws_b = bench::dev_alloc<uint8_t>(cas.workspace_bytes);
  auto per_seq = [&](int) { kc::paged_attention_batch(qd, kd, vd, sd, id, td, out_a, base, ws_a, stream); };
  auto cascade = [&](int) {
    kc::cascade_attention_batch(qd, kd, vd, sd, id, td, bd, out_b, shape, cas, ws_b, stream);
  };
  const double ms_a = kc::time_on_stream(stream, per_seq, 20);
  const double ms_b = kc::time_on_stream(stream, cascade, 20);
  MX_CUDA_CHECK(cudaStreamSynchronize(stream));
  std::vector<uint16_t> ha(q.size()), hb(q.size());
  MX_CUDA_CHECK(cudaMemcpy(ha.data(), out_a, ha.size() * 2, cudaMemcpyDeviceToHost));
  MX_CUDA_CHECK(cudaMemcpy(hb.data(), out_b, hb.size() * 2, cudaMemcpyDeviceToHost));
  const double bytes_per_key = 2.0 * width * elem + (fp8 ? 2.0 * kKv * 4 : 0.0);
  int64_t grouped_rows = 0, cascade_keys = 0;
  for (const auto& g : layout.groups) {
    grouped_rows += g.n_members;
    cascade_keys += static_cast<int64_t>(g.shared_blocks) * kBs;  // once per group
    cascade_keys += static_cast<int64_t>(g.n_members) * (s.context - g.shared_blocks * kBs);
  }
  cascade_keys += static_cast<int64_t>(s.batch - grouped_rows) * s.context;
  const double bytes_a = bytes_per_key * s.batch * s.context, bytes_b = bytes_per_key * cascade_keys;
  std::printf("%-9s batch %3d ctx %6d prefix %6d group %2d | groups %2zu | per-seq %8.1f us (splits %d) | cascade %8.1f "
              "us (prefix splits %d, suffix splits %d) | speedup %.2fx | must-read %.1f MB: %.0f GB/s = %.1f%% of "
              "copy bw (per-seq on its own %.1f MB: %.1f%%) | rel-L2 %.2e\n",
              fp8 ? (kc::fp8_kv_plain_loads() ? "fp8-plain" : "fp8") : "bf16", s.batch, s.context, s.prefix, s.group, layout.groups.size(), ms_a * 1e3,
              base.parts[0].launch.n_splits, ms_b * 1e3, cas.cascade.prefix_splits, cas.cascade.suffix_splits,
              ms_a / ms_b, bytes_b / 1e6, bytes_b / (ms_b * 1e-3) / 1e9, 100.0 * bytes_b / (ms_b * 1e-3) / 1e9 / copy_gbs,
              bytes_a / 1e6, 100.0 * bytes_a / (ms_a * 1e-3) / 1e9 / copy_gbs,
              bench::rel_l2_bf16(hb.data(), ha.data(), ha.size()));
  // NOTE: the device buffers are leaked on purpose (one short process; bench_device.h).
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  bool sweep = false;
  std::string fp8_loads;  // empty: the process default (MXSERVE_FP8_KV_PLAIN_LOADS)
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (a == "--batch") s.batch = next();
    else if (a == "--context") s.context = next();
    else if (a == "--prefix") s.prefix = next();
    else if (a == "--group") s.group = next();
    else if (a == "--sweep") sweep = true;
    else if (a == "--fp8-loads" && i + 1 < argc) fp8_loads = argv[++i];
    else {
      std::fprintf(stderr, "bench_cascade_attention: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (!fp8_loads.empty() && fp8_loads != "async" && fp8_loads != "plain" && fp8_loads != "both") {
    std::fprintf(stderr, "bench_cascade_attention: --fp8-loads %s: expected async, plain or both\n", fp8_loads.c_str());
    return 2;
  }
  if (s.batch < 1 || s.group < 1 || s.prefix < 0 || s.prefix >= s.context) {
    std::fprintf(stderr, "bench_cascade_attention: need batch >= 1, group >= 1, 0 <= prefix < context\n");
    return 2;
  }
  cudaStream_t stream;
  MX_CUDA_CHECK(cudaStreamCreate(&stream));
  int dev = 0, sms = 0;
  MX_CUDA_CHECK(cudaGetDevice(&dev));
  MX_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  const kc::Ceilings c = kc::measure_ceilings(stream, 1ll << 30, 1024);
  std::printf("device-to-device copy %.0f GB/s (the roofline below), %d SMs\n", c.copy_gbs, sms);
  std::vector<Shape> shapes = {s};
  if (sweep)
    for (int g : {2, 8, 16}) shapes.push_back({s.batch, s.context, s.prefix, g});
  if (sweep) shapes.push_back({64, s.context, s.prefix, 4});
  std::vector<int> plain_modes = {kc::fp8_kv_plain_loads() ? 1 : 0};  // 1: the plain loads
  if (fp8_loads == "async") plain_modes = {0};
  if (fp8_loads == "plain") plain_modes = {1};
  if (fp8_loads == "both") plain_modes = {1, 0};
  for (const Shape& x : shapes) {
    run(x, false, sms, c.copy_gbs, stream);
    for (int plain : plain_modes) {
      kc::set_fp8_kv_plain_loads(plain == 1);
      run(x, true, sms, c.copy_gbs, stream);
    }
  }
  return 0;
}
