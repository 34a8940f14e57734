// FP8 E4M3 KV cache on CUDA against the CPU reference backend on the same FP8 bytes (label gpu; skips
// without a CUDA device):
//   kv_write     CUDA codes and scales == CPU codes and scales, byte for byte (one quantizer source,
//                kernels/kv_fp8.h), on bf16-representable inputs spanning 2^-20 .. 2^12 per head
//   kv_copy      codes (1-byte rows) and scales (f32 rows of n_kv_heads) moved exactly, in pair order
//   attention    every kernel design (planner's choice, warp, shared, simt) reading the FP8 cache directly,
//                vs the CPU's f32 attention over the same codes * scales. Tolerance kTolFp8Attn = 8e-3 rel L2:
//                the bf16 attention budget (4e-3, tests/ops/test_cuda_ops.cpp) plus one bf16 rounding of each
//                dequantized K and V element in the kernels' registers (2^-9 relative, ~2^-9/sqrt(3) RMS).
//                Each tensor-core kernel runs with both FP8 tile loaders (kv_fp8_tile.cuh's cp.async pipeline,
//                the default, and the old plain loads, MXSERVE_FP8_KV_PLAIN_LOADS=1): outputs byte for byte equal.
//                wgmma_ws (Hopper, forced) runs twice: the context dequantized once into a bf16 scratch (the
//                planner's choice, kv_fp8_dequant_once.cu) and "wgmma_ws fused" (its producer warpgroup dequantizes);
//                one loader each, the same tolerance; on shapes it does not serve (tree, head_dim != 128) or off
//                sm_90 the shared kernel runs, said once.
// Cases: decode rows at contexts 1, 100, 2048, 8192; prefill chunks over a cached prefix; tree rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/backend.h"
#include "core/numeric.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"
#include "kernels/cuda/attention/kv_fp8_load_mode.h"

namespace mxserve {
namespace {

constexpr double kTolFp8Attn = 8e-3;

using gpu_oracle::expect_bytes_equal;
using gpu_oracle::rel_l2;

class CudaKvFp8 : public gpu_oracle::CudaVsCpuTest {
 protected:
  CudaKvFp8() : CudaVsCpuTest(20261202) {}

  // An FP8 cache on both backends with the same bytes: written by the CPU reference, uploaded exactly.
  struct Fp8Cache {
    Tensor ck, cv, cks, cvs;  // CPU
    Tensor gk, gv, gks, gvs;  // CUDA
  };
  Fp8Cache make_cache(int64_t n_slots, int kvh, int hd) {
    Fp8Cache c;
    c.ck = Tensor::empty(DType::kFP8E4M3, {n_slots, kvh * hd});
    c.cv = Tensor::empty(DType::kFP8E4M3, {n_slots, kvh * hd});
    c.cks = Tensor::empty(DType::kF32, {n_slots, kvh});
    c.cvs = Tensor::empty(DType::kF32, {n_slots, kvh});
    Tensor k = rand_heads(n_slots, kvh, hd, -1, 0), v = rand_heads(n_slots, kvh, hd, -3, 1);
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    backend::AttentionMeta m;
    m.slot_mapping = Tensor::view_of(all.data(), DType::kI32, {n_slots});
    m.params.n_kv_heads = kvh;
    m.params.head_dim = hd;
    m.params.k_scales = c.cks.data<float>();
    m.params.v_scales = c.cvs.data<float>();
    cpu_->kv_write(k, v, m, c.ck, c.cv);
    c.gk = gpu_->upload(c.ck);
    c.gv = gpu_->upload(c.cv);
    c.gks = gpu_->upload(c.cks);
    c.gvs = gpu_->upload(c.cvs);
    return c;
  }
};

TEST_F(CudaKvFp8, KvWriteBytesEqualCpu) {
  struct Case {
    int kvh, hd;
    int64_t T;
  };
  for (const Case& c : {Case{2, 32, 11}, Case{8, 128, 300}, Case{1, 16, 5}, Case{4, 256, 7}}) {
    SCOPED_TRACE(testing::Message() << "kv heads " << c.kvh << " head_dim " << c.hd << " T " << c.T);
    const int64_t n_slots = c.T + 40, width = c.kvh * c.hd;
    std::vector<int32_t> slots(n_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(c.T);
    Tensor k = rand_heads(c.T, c.kvh, c.hd, -20, 12), v = rand_heads(c.T, c.kvh, c.hd, -20, 12);
    for (int64_t d = 0; d < c.hd; ++d) k.data<float>()[d] = 0.f;  // an all-zero head: scale 0, codes 0
    Tensor ck = Tensor::zeros(DType::kFP8E4M3, {n_slots, width}), cv = Tensor::zeros(DType::kFP8E4M3, {n_slots, width});
    Tensor cks = Tensor::zeros(DType::kF32, {n_slots, c.kvh}), cvs = Tensor::zeros(DType::kF32, {n_slots, c.kvh});
    Tensor gk = gpu_->upload(ck), gv = gpu_->upload(cv), gks = gpu_->upload(cks), gvs = gpu_->upload(cvs);
    Tensor hs = Tensor::view_of(slots.data(), DType::kI32, {c.T});
    backend::AttentionMeta cm, gm;
    cm.slot_mapping = hs;
    gm.slot_mapping = gpu_->upload(hs);
    cm.params.n_kv_heads = gm.params.n_kv_heads = c.kvh;
    cm.params.head_dim = gm.params.head_dim = c.hd;
    cm.params.k_scales = cks.data<float>();
    cm.params.v_scales = cvs.data<float>();
    gm.params.k_scales = gks.data<float>();
    gm.params.v_scales = gvs.data<float>();
    cpu_->kv_write(k, v, cm, ck, cv);
    gpu_->kv_write(gpu_bf16(k), gpu_bf16(v), gm, gk, gv);
    expect_bytes_equal(gpu_->to_host(gk), ck, "K codes");
    expect_bytes_equal(gpu_->to_host(gv), cv, "V codes");
    expect_bytes_equal(gpu_->to_host(gks), cks, "K scales");
    expect_bytes_equal(gpu_->to_host(gvs), cvs, "V scales");
  }
}

TEST_F(CudaKvFp8, KvCopyMovesCodesAndScalesInOrder) {
  const int64_t n_slots = 64;
  Fp8Cache c = make_cache(n_slots, 2, 64);
  std::vector<int32_t> src = {33, 20, 47, 5, 63}, dst = {20, 18, 17, 5, 1};  // pair 1 reads what pair 0 wrote
  const int64_t P = static_cast<int64_t>(src.size());
  Tensor hs = Tensor::view_of(src.data(), DType::kI32, {P}), hd = Tensor::view_of(dst.data(), DType::kI32, {P});
  cpu_->kv_copy(hs, hd, {&c.ck, &c.cv, &c.cks, &c.cvs});
  gpu_->kv_copy(gpu_->upload(hs), gpu_->upload(hd), {&c.gk, &c.gv, &c.gks, &c.gvs});
  expect_bytes_equal(gpu_->to_host(c.gk), c.ck, "K codes");
  expect_bytes_equal(gpu_->to_host(c.gv), c.cv, "V codes");
  expect_bytes_equal(gpu_->to_host(c.gks), c.cks, "K scales");
  expect_bytes_equal(gpu_->to_host(c.gvs), c.cvs, "V scales");
  EXPECT_EQ(c.cks.data<float>()[18 * 2], c.cks.data<float>()[20 * 2]);  // the chain happened on the reference
}

struct Seq {
  int32_t n_tokens, kv_len;
  int32_t tree_nodes = 0;  // > 0: a chain-free speculative tree of this many rows after kv_len - 1 - nodes
};

struct Case {
  int nh, kvh, hd;
  std::vector<Seq> seqs;
  const char* what;
};

TEST_F(CudaKvFp8, PagedAttentionReadsFp8Directly) {
  const std::vector<Case> cases = {
      {96, 8, 128, {{1, 1}}, "decode, context 1"},
      {96, 8, 128, {{1, 100}, {1, 2048}}, "decode, contexts 100 and 2048"},
      {96, 8, 128, {{1, 8192}}, "decode, context 8192 (context splits)"},
      {96, 8, 128, {{1, 8192}, {1, 100}, {1, 1}, {1, 2048}}, "decode batch, mixed contexts"},
      {96, 8, 128, {{64, 700}, {1, 300}}, "prefill chunk over a cached prefix + a decode"},
      {96, 8, 128, {{256, 2304}}, "prefill chunk of 256 over 2048 cached"},
      {96, 8, 128, {{300, 1300}, {129, 129}, {1, 40}}, "prefill chunks over odd prefixes (wgmma_ws: ragged runs)"},
      {8, 2, 128, {{1, 4096}, {9, 9}}, "group 4, long decode + a short prefill"},
      {8, 1, 16, {{9, 9}, {1, 40}}, "head_dim 16, one kv head"},
      {32, 1, 64, {{5, 5}, {1, 600}}, "group 32: CUDA-core kernel"},
      {16, 1, 256, {{3, 40}, {1, 300}}, "head_dim 256: CUDA-core kernel"},
      {96, 8, 128, {{0, 1500, 12}, {1, 700}}, "tree rows over 1500 cached + a decode"},
      {8, 2, 128, {{0, 300, 40}}, "40-node tree"},
  };
  const int64_t bs = 16;
  std::mt19937 trng(9);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    model::ForwardBatch batch;
    int64_t blocks_needed = 0;
    for (const Seq& s : c.seqs) blocks_needed += (s.kv_len + s.tree_nodes + bs - 1) / bs + 1;
    const int64_t n_blocks = blocks_needed + 3;
    std::vector<int32_t> perm(n_blocks);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng_);
    int64_t next_block = 0;
    for (const Seq& s : c.seqs) {
      model::SequenceSpan span;
      span.token_begin = batch.n_tokens();
      if (s.tree_nodes == 0) {
        span.n_tokens = s.n_tokens;
        span.kv_len = s.kv_len;
        for (int32_t i = 0; i < s.n_tokens; ++i) batch.positions.push_back(s.kv_len - s.n_tokens + i);
      } else {
        // A root row at kv_len - 1, then nodes at kv_len + i with random earlier parents (tree_base = kv_len).
        span.tree_base = s.kv_len;
        std::vector<uint64_t> anc(s.tree_nodes);
        span.kv_indices.push_back(s.kv_len - 1);
        span.tree_mask.push_back(0);
        batch.positions.push_back(s.kv_len - 1);
        for (int32_t i = 0; i < s.tree_nodes; ++i) {
          std::uniform_int_distribution<int32_t> pick(-1, i - 1);
          const int32_t parent = i == 0 ? -1 : pick(trng);
          anc[i] = (parent < 0 ? 0 : anc[parent]) | (uint64_t{1} << i);
          span.kv_indices.push_back(s.kv_len + i);
          span.tree_mask.push_back(anc[i]);
          batch.positions.push_back(s.kv_len + 1);
        }
        span.n_tokens = s.tree_nodes + 1;
        span.kv_len = s.kv_len + s.tree_nodes;
        span.kv_indices.clear();  // contiguous rows: the default layout
      }
      for (int64_t b = 0; b < (span.kv_len + bs - 1) / bs; ++b) span.block_table.push_back(perm[next_block++]);
      for (int32_t i = 0; i < span.n_tokens; ++i) batch.token_ids.push_back(0);
      batch.seqs.push_back(span);
    }
    ASSERT_TRUE(batch.validate(1, n_blocks, bs).is_ok()) << batch.validate(1, n_blocks, bs).to_string();
    const int64_t T = batch.n_tokens();
    const kernels::AttentionParams shape = gpu_oracle::attention_shape(c.nh, c.kvh, c.hd);
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, shape).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape).value();
    Fp8Cache kv = make_cache(n_blocks * bs, c.kvh, c.hd);
    cmeta.params.k_scales = kv.cks.data<float>();
    cmeta.params.v_scales = kv.cvs.data<float>();
    gmeta.params.k_scales = kv.gks.data<float>();
    gmeta.params.v_scales = kv.gvs.data<float>();
    Tensor q = rand_heads(T, c.nh, c.hd, -1, 0);
    Tensor ref = cpu_->alloc(DType::kF32, {T, c.nh * c.hd});
    cpu_->attention(q, kv.ck, kv.cv, cmeta, ref);
    Tensor gq = gpu_bf16(q);
    for (const char* kernel : {"", "warp", "shared", "simt", "wgmma_ws", "wgmma_ws fused"}) {
      SCOPED_TRACE(kernel);
      backend::KernelOptions forced;
      const bool fused = std::strcmp(kernel, "wgmma_ws fused") == 0;
      forced.attention_kernel = fused ? "wgmma_ws" : kernel;
      if (fused) forced.attention_fp8_prefill = "fused";
      ASSERT_TRUE(gpu_->set_kernel_options(forced).is_ok());
      Tensor outs[2];
      for (int plain = 0; plain < 2; ++plain) {  // the cp.async FP8 loader (default), then the old plain loads
        kernels::cuda::set_fp8_kv_plain_loads(plain == 1);
        Tensor out = poison_bf16({T, c.nh * c.hd});
        gpu_->attention(gq, kv.gk, kv.gv, gmeta, out);
        outs[plain] = gpu_->to_host(out);
      }
      kernels::cuda::set_fp8_kv_plain_loads(false);
      ASSERT_TRUE(gpu_->set_kernel_options({}).is_ok());
      const double e = rel_l2(outs[0], ref);
      std::printf("[ err      ] fp8 %-48s %-6s rel_l2 %.3e (tol %.0e)\n", c.what, kernel, e, kTolFp8Attn);
      EXPECT_LE(e, kTolFp8Attn);
      expect_bytes_equal(outs[0], outs[1], "FP8 cp.async tile loader vs the plain loads");
    }
  }
}

}  // namespace
}  // namespace mxserve
