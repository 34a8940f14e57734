// Cascade (shared-prefix) decode attention on CUDA (kernels/cuda/attention/cascade_attention.h) against two
// oracles on the same random shared-prefix batches (tests/unit/kernels/cascade_case.h): the per-sequence CUDA
// decode kernel (paged_attention_bf16, per-warp) and the CPU cascade reference (itself equal to the per-sequence
// CPU attention: test_cascade_attention). Shapes: GLM-4.5-Air's 12 q heads per kv head x 128 and smaller ones,
// prefixes of any length (whole shared blocks only), groups of 1..64, rows in no group, bf16 and FP8 caches,
// the graph-style encoding (capacity larger than the batch, a bound from a context class), a mixed batch
// (cascade decode rows + a prefill chunk). Tolerance: bf16 noise -- the cascade path's error to the CPU oracle
// within 1.25x + 2e-3 of the per-sequence kernel's own, and rel-L2 to it below 1e-2. FP8: the cp.async tile loader
// (kv_fp8_tile.cuh, the default) gives outputs bit for bit equal to the old plain loads (kv_fp8_load_mode.h).
#include <gtest/gtest.h>
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "../unit/kernels/cascade_case.h"
#include "core/numeric.h"
#include "gpu_oracle.h"
#include "kernels/cascade_attention.h"
#include "kernels/cpu/cascade_attention.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/attention/cascade_attention.h"
#include "kernels/cuda/attention/kv_fp8_load_mode.h"
#include "kernels/cuda/cuda_kernels.h"

namespace mxserve::kernels {
namespace {

namespace kc = kernels::cuda;
using cascade_test::Case;
using cascade_test::CaseSpec;

#define CUDA_OK(x) ASSERT_EQ((x), cudaSuccess) << #x

template <typename T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(count) { cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  explicit Dev(const std::vector<T>& h) : Dev(h.size()) { cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice); }
  ~Dev() { cudaFree(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return h;
  }
};

int n_sms() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

std::vector<uint16_t> to_bf16(std::vector<float>& x) {  // rounds x in place to its bf16 values
  std::vector<uint16_t> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    out[i] = f32_to_bf16(x[i]);
    x[i] = bf16_to_f32(out[i]);
  }
  return out;
}

struct Result3 {
  gpu_oracle::Err cascade_vs_cpu, perseq_vs_cpu, cascade_vs_perseq;
  std::vector<uint16_t> cascade_out, perseq_out;  // the bf16 outputs (bit comparisons)
};

// graph_style: the encoding a CUDA graph replays (capacity for 2x the rows, the prefix bound of a context class).
// prefill_rows > 0: a prefill chunk of that many rows follows the decode rows (the mixed-batch path).
// no_groups: an empty encoding (a graph replayed without shared prefixes): every row in the suffix pass.
Result3 run_case(const CaseSpec& spec, bool fp8, bool graph_style, uint32_t seed, int32_t prefill_rows = 0,
                 bool no_groups = false) {
  std::mt19937 rng(seed);
  Case c = cascade_test::make_case(spec, rng);
  AttentionParams p = c.p;
  const int32_t n_dec = p.n_tokens;
  std::vector<int32_t> token_seq = c.token_seq, kv_index = c.kv_index, tables = c.tables;
  int64_t n_slots = c.n_slots;
  if (prefill_rows > 0) {  // one more sequence: rows kv 0..prefill_rows-1 on fresh blocks
    const int32_t nb = (prefill_rows + p.block_size - 1) / p.block_size;
    const int32_t mb = std::max(p.max_blocks_per_seq, nb);
    std::vector<int32_t> t2(static_cast<size_t>(n_dec + 1) * mb, 0);
    for (int32_t r = 0; r < n_dec; ++r)
      std::copy(tables.begin() + static_cast<int64_t>(r) * p.max_blocks_per_seq,
                tables.begin() + static_cast<int64_t>(r + 1) * p.max_blocks_per_seq, t2.begin() + static_cast<int64_t>(r) * mb);
    for (int32_t b = 0; b < nb; ++b) t2[static_cast<int64_t>(n_dec) * mb + b] = static_cast<int32_t>(n_slots / p.block_size) + b;
    n_slots += static_cast<int64_t>(nb) * p.block_size;
    tables = t2;
    p.max_blocks_per_seq = mb;
    for (int32_t i = 0; i < prefill_rows; ++i) {
      token_seq.push_back(n_dec);
      kv_index.push_back(i);
    }
    p.n_tokens = n_dec + prefill_rows;
    p.n_seqs = n_dec + 1;
    p.max_kv_len = std::max(p.max_kv_len, prefill_rows);
  }
  const int64_t T = p.n_tokens, width = static_cast<int64_t>(p.n_kv_heads) * p.head_dim;
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> q(T * p.n_heads * p.head_dim), k(n_slots * width), v(n_slots * width);
  for (float& x : q) x = nd(rng);
  for (float& x : k) x = nd(rng);
  for (float& x : v) x = nd(rng);
  const std::vector<uint16_t> qb = to_bf16(q), kb = to_bf16(k), vb = to_bf16(v);
  std::vector<uint8_t> k8, v8;
  std::vector<float> ks, vs;
  if (fp8) {
    k8.resize(k.size());
    v8.resize(v.size());
    ks.resize(n_slots * p.n_kv_heads);
    vs.resize(n_slots * p.n_kv_heads);
    std::vector<int32_t> slots(n_slots);
    for (int64_t i = 0; i < n_slots; ++i) slots[i] = static_cast<int32_t>(i);
    cpu::kv_write_fp8(k.data(), v.data(), slots.data(), k8.data(), v8.data(), ks.data(), vs.data(), n_slots,
                      p.n_kv_heads, p.head_dim);
  }
  // Groups among the decode rows (default options: >= 2 members, >= 4 shared blocks; tests pass min 1 / 1).
  CascadeGroupOptions opt;
  opt.min_members = 1;
  opt.min_shared_blocks = 1;
  CascadeLayout layout = find_cascade_groups(c.table_ptrs(), c.n_blocks(), c.kv_index, p.block_size, opt);
  if (no_groups) {
    layout.groups.clear();
    layout.members.clear();
  }
  CascadeShape shape;
  shape.group_size = p.n_heads / p.n_kv_heads;
  shape.cap_rows = graph_style ? 2 * n_dec : n_dec;
  shape.cap_work = cascade_work_capacity(shape.cap_rows, shape.group_size, 1);
  shape.max_prefix_keys = graph_style ? 2 * c.p.max_kv_len : c.p.max_kv_len;
  std::vector<int32_t> buf(shape.n_ints());
  EXPECT_TRUE(encode_cascade(layout, p.block_size, shape, buf.data()));

  // CPU oracle: the cascade reference on the decode rows, the per-sequence reference on the prefill rows.
  const int64_t out_n = T * p.n_heads * p.head_dim;
  std::vector<float> ref(out_n);
  AttentionParams cp = p;
  if (fp8) {
    cp.k_scales = ks.data();
    cp.v_scales = vs.data();
  }
  AttentionParams cdec = cp;
  cdec.n_tokens = n_dec;
  cpu::cascade_attention_f32(q.data(), fp8 ? static_cast<const void*>(k8.data()) : k.data(),
                             fp8 ? static_cast<const void*>(v8.data()) : v.data(), token_seq.data(), kv_index.data(),
                             tables.data(), buf.data(), shape, ref.data(), cdec);
  if (prefill_rows > 0) {
    AttentionParams cpre = cp;
    cpre.n_tokens = prefill_rows;
    const int64_t off = static_cast<int64_t>(n_dec);
    cpu::paged_attention_f32(q.data() + off * p.n_heads * p.head_dim, fp8 ? static_cast<const void*>(k8.data()) : k.data(),
                             fp8 ? static_cast<const void*>(v8.data()) : v.data(), token_seq.data() + off,
                             kv_index.data() + off, tables.data(), ref.data() + off * p.n_heads * p.head_dim, cpre);
  }

  // Device.
  Dev<uint16_t> dq(qb), dk(kb), dv(vb), dout(out_n), dout2(out_n);
  Dev<uint8_t> dk8(k8), dv8(v8);
  Dev<float> dks(ks), dvs(vs);
  Dev<int32_t> dseq(token_seq), dkvi(kv_index), dtab(tables), dbuf(buf);
  cudaMemset(dout.p, 0xff, out_n * 2);  // NaN-poisoned: an unwritten element fails
  cudaMemset(dout2.p, 0xff, out_n * 2);
  AttentionParams gp = p;
  if (fp8) {
    gp.k_scales = dks.p;
    gp.v_scales = dvs.p;
  }
  gp.n_leading_decode_rows = n_dec;
  const void* kcache = fp8 ? static_cast<const void*>(dk8.p) : dk.p;
  const void* vcache = fp8 ? static_cast<const void*>(dv8.p) : dv.p;
  const kc::CascadeBatchPlan plan = kc::plan_cascade_batch(gp, shape, n_sms());
  Dev<uint8_t> ws(plan.workspace_bytes);
  kc::cascade_attention_batch(dq.p, kcache, vcache, dseq.p, dkvi.p, dtab.p, dbuf.p, dout.p, shape, plan, ws.p, nullptr);
  // The per-sequence path (the backend's plan today).
  const kc::AttentionBatchPlan base = kc::plan_paged_attention_batch(gp, n_sms());
  Dev<uint8_t> ws2(base.workspace_bytes);
  kc::paged_attention_batch(dq.p, kcache, vcache, dseq.p, dkvi.p, dtab.p, dout2.p, base, ws2.p, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const std::vector<uint16_t> got = dout.host(), per = dout2.host();
  std::vector<double> g(out_n), s(out_n), r(ref.begin(), ref.end());
  for (int64_t i = 0; i < out_n; ++i) {
    g[i] = bf16_to_f32(got[i]);
    s[i] = bf16_to_f32(per[i]);
  }
  return {gpu_oracle::compare(g, r, true), gpu_oracle::compare(s, r, true), gpu_oracle::compare(g, s, true), got, per};
}

void check(const Result3& e, const std::string& what) {
  gpu_oracle::expect_within(e.cascade_vs_cpu, 1.25 * e.perseq_vs_cpu.rel_l2 + 2e-3, what + " cascade vs CPU");
  gpu_oracle::expect_within(e.cascade_vs_perseq, 1e-2, what + " cascade vs per-sequence kernel");
}

TEST(CudaCascadeAttention, GlmAirGeometryBf16AndFp8) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  for (bool fp8 : {false, true})
    for (bool graph : {false, true}) {
      CaseSpec s;
      s.n_kv_heads = 8;
      s.group = 12;
      s.head_dim = 128;
      s.block_size = 16;
      s.group_sizes = {4, 4, 3, 1};
      s.n_lone = 4;
      s.min_prefix = 300;
      s.max_prefix = 1200;
      s.max_suffix = 500;
      check(run_case(s, fp8, graph, 11 + fp8 + 2 * graph),
            std::string("air ") + (fp8 ? "fp8" : "bf16") + (graph ? " graph-style" : ""));
    }
}

TEST(CudaCascadeAttention, GroupsOfOneToSixtyFour) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 40;
  for (int32_t size : {1, 2, 13, 64})
    for (bool fp8 : {false, true}) {
      CaseSpec s;
      s.n_kv_heads = 2;
      s.group = 12;
      s.head_dim = 128;
      s.group_sizes = {size};
      s.n_lone = 2;
      s.max_suffix = 100;
      check(run_case(s, fp8, false, seed++), "group of " + std::to_string(size) + (fp8 ? " fp8" : " bf16"));
    }
}

TEST(CudaCascadeAttention, SmallHeadsBlockSizesAndPartialBlocks) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  struct Geo {
    int32_t kv, g, d, bs;
  };
  uint32_t seed = 70;
  for (const Geo& geo : {Geo{2, 4, 32, 16}, Geo{1, 16, 64, 32}, Geo{4, 2, 16, 8}, Geo{1, 1, 128, 64}}) {
    CaseSpec s;
    s.n_kv_heads = geo.kv;
    s.group = geo.g;
    s.head_dim = geo.d;
    s.block_size = geo.bs;
    s.group_sizes = {1, 1, 5, 2};
    s.n_lone = 3;
    s.min_prefix = geo.bs + 1;  // partial shared blocks belong to the suffix
    s.max_prefix = 400;
    check(run_case(s, true, true, seed++), "geo fp8 hd " + std::to_string(geo.d));
    check(run_case(s, false, false, seed++), "geo bf16 hd " + std::to_string(geo.d));
  }
}

// Without groups the cascade path (a graph replayed with no shared prefix) computes bit for bit what the
// per-sequence decode kernel does: the same splits, tiles and epilogue arithmetic (graphs == eager).
TEST(CudaCascadeAttention, WithoutGroupsBitIdenticalToThePerSequenceKernel) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  uint32_t seed = 120;
  for (int32_t max_len : {100, 3000})  // one split and several
    for (bool fp8 : {false, true}) {
      CaseSpec s;
      s.n_kv_heads = 8;
      s.group = 12;
      s.head_dim = 128;
      s.n_lone = 16;
      s.min_suffix = 1;
      s.max_prefix = max_len;
      const Result3 e = run_case(s, fp8, true, seed++, 0, /*no_groups=*/true);
      EXPECT_EQ(e.cascade_vs_perseq.max_abs, 0.0) << "context up to " << max_len << (fp8 ? " fp8" : " bf16");
    }
}

TEST(CudaCascadeAttention, MixedBatchDecodeRowsThenPrefillChunk) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  CaseSpec s;
  s.n_kv_heads = 8;
  s.group = 12;
  s.head_dim = 128;
  s.group_sizes = {4, 2};
  s.n_lone = 2;
  for (bool fp8 : {false, true}) check(run_case(s, fp8, false, 90 + fp8, 200), std::string("mixed ") + (fp8 ? "fp8" : "bf16"));
}

// The FP8 cp.async tile loader (kv_fp8_tile.cuh) computes bit for bit what the old plain loads did, in both cascade
// passes, the per-warp decode kernel and (the prefill rows of a mixed batch) the block-shared kernel.
TEST(CudaCascadeAttention, Fp8CpAsyncLoaderBitIdenticalToPlainLoads) {
  MXSERVE_SKIP_WITHOUT_CUDA();
  struct Geo {
    int32_t kv, g, d, bs;
  };
  uint32_t seed = 200;
  for (const Geo& geo : {Geo{8, 12, 128, 16}, Geo{2, 4, 32, 16}, Geo{1, 16, 64, 32}, Geo{4, 2, 16, 8}})
    for (int32_t prefill : {0, 150}) {
      CaseSpec s;
      s.n_kv_heads = geo.kv;
      s.group = geo.g;
      s.head_dim = geo.d;
      s.block_size = geo.bs;
      s.group_sizes = {4, 3, 1};
      s.n_lone = 2;
      s.min_prefix = geo.bs + 1;
      s.max_prefix = 700;
      s.max_suffix = 300;
      Result3 r[2];
      for (int plain = 0; plain < 2; ++plain) {
        kc::set_fp8_kv_plain_loads(plain == 1);
        r[plain] = run_case(s, true, prefill == 0, seed, prefill);
      }
      kc::set_fp8_kv_plain_loads(false);
      const std::string what = "hd " + std::to_string(geo.d) + " prefill rows " + std::to_string(prefill);
      check(r[0], "fp8 cp.async loader " + what);
      EXPECT_TRUE(r[0].cascade_out == r[1].cascade_out) << what << ": cascade output differs from the plain loads";
      EXPECT_TRUE(r[0].perseq_out == r[1].perseq_out) << what << ": per-sequence output differs from the plain loads";
      ++seed;
    }
}

}  // namespace
}  // namespace mxserve::kernels
