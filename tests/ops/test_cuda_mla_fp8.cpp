// glm_moe_dsa's FP8 latent cache on CUDA (packed rows, kernels/mla_fp8.h) against the CPU reference on the
// same bytes (label gpu; skips without a CUDA device):
//   cache write  CUDA codes, scales and bf16 tails == CPU bytes, byte for byte: one quantizer source
//                (kernels/kv_fp8.h, exact f32 arithmetic, no fast-math) fed the same bf16-representable values,
//                so not even one e4m3 ulp may differ. Shapes: GLM-5.x latent 512 + 64 and indexer key 128,
//                the fixtures' 32 + 8 / 24 + 16 / 16 / 24, a partial last block (160), magnitudes 2^-20 .. 2^12
//                per row, an all-zero row (scale 0), slots not written left untouched.
//   attention    the op (tensor-core kernel on the GLM-5.x shape, SIMT elsewhere) and both kernels through the
//                launcher, reading the FP8 cache written by the CPU, vs the CPU's f32 attention over the same
//                dequantized rows. Tolerances: SIMT kTolBf16Out (it dequantizes to f32 like the CPU); tensor
//                cores kTolMlaMmaFp8 = the bf16-cache budget (1e-2) + one bf16 rounding of each dequantized
//                latent element in shared memory (2^-9 relative). The op (kAuto) runs the Hopper wgmma attend on
//                sm_90: kTolMlaWgmmaFp8 = the bf16 wgmma budget (1.5e-2) + the same 2^-9 rounding.
//   wgmma        the Hopper attend reading FP8 rows (mla_decode_wgmma.cu, kWgmma and kWgmmaSplitS, 8 / 16 / 32 /
//                64 heads, dense with MTP runs and top-k, forced and planned splits): byte-equal to the same
//                kernel over a bf16 cache holding the dequantized values (bf16(code x scale), the bf16 rope), within
//                kTolMlaWgmma of the mma.sync kernel's FP8 attend (the bound the bf16 wgmma cases use vs mma) and
//                kTolMlaWgmmaFp8 of the CPU reference; replayed from a CUDA graph byte-equal to eager.
//   kv_copy      packed rows (656 / 132 bytes) moved exactly as the CPU moves them (tree compaction).
//   indexer      top-k over FP8 keys == a valid top-k of the CPU's scores over the dequantized keys, on the
//                GLM shape (32 heads x 128: tensor-core score kernel) and a fixture shape (SIMT); the fused
//                paths (kFused, kFusedSplit) on the same FP8 bytes give rows identical to kMma's (the same
//                dequantized bf16 tile, the same MMAs, the same tie rule), ties and a CUDA graph replay included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <set>

#include "backend/backend.h"
#include "backend/cuda_backend.h"
#include "backend/mla_dsa_ops.h"
#include "core/numeric.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/attention/dsa_indexer_fused.h"
#include "kernels/cuda/attention/mla_dsa.h"
#include "kernels/cuda/common/cuda_check.h"
#include "kernels/mla_fp8.h"
#include "model/forward_batch.h"
#include "gpu_oracle.h"

namespace mxserve {
namespace {

using gpu_oracle::expect_bytes_equal;
using gpu_oracle::rel_l2;

constexpr double kTolBf16Out = 4e-3;
constexpr double kTolMlaMmaFp8 = 1.2e-2;
constexpr double kTolMlaWgmma = 1.5e-2;     // test_cuda_mla_dsa's wgmma bound (vs the CPU and vs the mma kernel)
constexpr double kTolMlaWgmmaFp8 = 1.7e-2;  // + one bf16 rounding of each dequantized latent element (2^-9)

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& what) {
  double mx = 0;
  const double e = rel_l2(got, ref, &mx);
  std::printf("[ err      ] %-56s rel_l2 %.3e max_abs %.3e (tol %.1e) %s\n", what.c_str(), e, mx, tol,
              e <= tol ? "PASS" : "FAIL");
  EXPECT_LE(e, tol) << what;
}

class CudaMlaFp8 : public gpu_oracle::CudaVsCpuTest {
 public:
  CudaMlaFp8() : CudaVsCpuTest(20261206) {}
  void SetUp() override {
    CudaVsCpuTest::SetUp();
    if (IsSkipped()) return;
    gops_ = backend::mla_dsa_ops(*gpu_);
    cops_ = backend::mla_dsa_ops(*cpu_);
    ASSERT_NE(gops_, nullptr);
    ASSERT_NE(cops_, nullptr);
  }
  // Rows [T, n] of bf16-representable values, each row with its own magnitude 2^e, e in [-20, 12].
  Tensor rows(int64_t T, int64_t n) { return rand_heads(T, 1, n, -20, 12); }
  // A packed FP8 cache of n_slots rows written by the CPU reference from random rows (every slot).
  Tensor cpu_packed(int64_t n_slots, int64_t n, int64_t tail) {
    const int64_t rb = kernels::mla_fp8_row_bytes(n, tail);
    Tensor c = Tensor::zeros(DType::kU8, {n_slots, rb});
    std::vector<int32_t> all(n_slots);
    std::iota(all.begin(), all.end(), 0);
    Tensor a = rand_heads(n_slots, 1, n, -3, 2), b = rand(Shape{n_slots, std::max<int64_t>(tail, 1)});
    kernels::cpu::cache_write_fp8_packed(a.data<float>(), all.data(), c.data<uint8_t>(), n_slots, n, rb, 0);
    if (tail > 0)
      kernels::cpu::cache_write_fp8_packed(b.data<float>(), all.data(), c.data<uint8_t>(), n_slots, tail, rb, n);
    return c;
  }
  // The f32 rows [n_slots, n + tail] the packed cache dequantizes to.
  static Tensor dequantized(const Tensor& packed, int64_t n, int64_t tail) {
    const int64_t n_slots = packed.dim(0), rb = packed.dim(1);
    Tensor out = Tensor::empty(DType::kF32, {n_slots, n + tail});
    for (int64_t s = 0; s < n_slots; ++s)
      kernels::cpu::dequant_fp8_packed_row(packed.data<uint8_t>() + s * rb, n, tail, out.data<float>() + s * (n + tail));
    return out;
  }

  backend::MlaDsaOps* gops_ = nullptr;
  backend::MlaDsaOps* cops_ = nullptr;
};

TEST_F(CudaMlaFp8, CacheWriteBytesEqualCpu) {
  struct Case {
    int64_t n, tail, T;
  };
  for (const Case& c : {Case{512, 64, 37}, Case{128, 0, 300}, Case{32, 8, 9}, Case{24, 16, 5}, Case{16, 0, 7},
                        Case{24, 0, 3}, Case{160, 8, 11}}) {
    SCOPED_TRACE(testing::Message() << "n " << c.n << " tail " << c.tail << " T " << c.T);
    const int64_t n_slots = c.T + 20, rb = kernels::mla_fp8_row_bytes(c.n, c.tail);
    std::vector<int32_t> slots(n_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::shuffle(slots.begin(), slots.end(), rng_);
    slots.resize(c.T);
    slots[c.T / 2] = -1;  // a padding row: written nowhere
    Tensor lat = rows(c.T, c.n), rope = rand(Shape{c.T, std::max<int64_t>(c.tail, 1)}, 40.f);
    for (int64_t d = 0; d < c.n; ++d) lat.data<float>()[d] = 0.f;  // an all-zero row: scale 0, codes 0
    Tensor init = Tensor::empty(DType::kU8, {n_slots, rb});
    std::memset(init.raw(), 0x5A, static_cast<size_t>(init.nbytes()));
    Tensor ccache = cpu_->upload(init), gcache = gpu_->upload(init);
    Tensor hs = Tensor::view_of(slots.data(), DType::kI32, {c.T});
    backend::AttentionMeta cm, gm;
    cm.slot_mapping = hs;
    gm.slot_mapping = gpu_->upload(hs);
    cops_->cache_write(lat, cm, ccache, 0);
    gops_->cache_write(gpu_bf16(lat), gm, gcache, 0);
    if (c.tail > 0) {
      cops_->cache_write(rope, cm, ccache, c.n);
      gops_->cache_write(gpu_bf16(rope), gm, gcache, c.n);
    }
    expect_bytes_equal(gpu_->to_host(gcache), ccache, "packed FP8 rows (codes, scales, bf16 tail)");
  }
}

// Tree compaction on CUDA (Backend::kv_copy, 16- / 4-byte pieces) moves the 656-byte latent and 132-byte
// indexer-key rows exactly as the CPU does (chained pairs: a row written by one pair is read by the next).
TEST_F(CudaMlaFp8, KvCopyMovesPackedRows) {
  const int64_t n_slots = 64;
  std::vector<Tensor> rows;
  for (const int64_t w : {int64_t{656}, int64_t{132}, int64_t{656}}) {
    Tensor t = Tensor::empty(DType::kU8, {n_slots, w});
    for (int64_t i = 0; i < t.numel(); ++i) t.data<uint8_t>()[i] = static_cast<uint8_t>(rng_());
    rows.push_back(t);
  }
  std::vector<Tensor> ct, gt;
  for (const Tensor& h : rows) {
    ct.push_back(cpu_->upload(h));
    gt.push_back(gpu_->upload(h));
  }
  std::vector<Tensor*> cp{&ct[0], &ct[1], &ct[2]}, gp{&gt[0], &gt[1], &gt[2]};
  std::vector<int32_t> src = {9, 3, 40, 63}, dst = {3, 7, 0, 41};
  Tensor hs = Tensor::view_of(src.data(), DType::kI32, {4}), hd = Tensor::view_of(dst.data(), DType::kI32, {4});
  cpu_->kv_copy(cpu_->upload(hs), cpu_->upload(hd), cp);
  gpu_->kv_copy(gpu_->upload(hs), gpu_->upload(hd), gp);
  for (size_t t = 0; t < rows.size(); ++t) expect_bytes_equal(host(gt[t]), ct[t], "kv_copy of packed FP8 rows");
}

struct MlaCase {
  int heads;
  int64_t top_k;
  std::vector<gpu_oracle::PagedSpan> spans;
  const char* what;
};

// What both attention checks build, in this order (the RNG draws of the per-check copies it replaced): the paged
// batch and its metadata, a packed FP8 cache written by the CPU and the f32 rows it dequantizes to, q, kv_b, a
// random ascending subset of each token's causal keys (-1 padded) when c.top_k > 0, and the CPU reference over
// the dequantized rows.
struct MlaFp8Inputs {
  int64_t T = 0, NH = 0;
  backend::AttentionMeta cmeta, gmeta;
  Tensor packed, deq, q, kv_b, topk, ctopk, gtopk, ref;
  kernels::MlaParams p;
  bool sparse = false;  // c.top_k > 0
  const Tensor* ctopk_or_null() const { return sparse ? &ctopk : nullptr; }
  const Tensor* gtopk_or_null() const { return sparse ? &gtopk : nullptr; }
  const int32_t* gtopk_ptr() const { return sparse ? gtopk.data<int32_t>() : nullptr; }
};

MlaFp8Inputs mla_fp8_inputs(CudaMlaFp8& f, const MlaCase& c, int nope, int rope, int v, int lora, int64_t bs) {
  MlaFp8Inputs in;
  int64_t n_blocks = 0;
  model::ForwardBatch batch = gpu_oracle::paged_batch(c.spans, bs, 2, f.rng_, &n_blocks);
  in.T = batch.n_tokens();
  in.NH = c.heads;
  kernels::AttentionParams shape;  // scale left at its default, as the MLA ops take theirs from MlaParams
  shape.n_heads = c.heads;
  shape.n_kv_heads = 1;
  shape.head_dim = lora + rope;
  in.cmeta = model::build_attention_meta(batch, *f.cpu_, bs, shape).value();
  in.gmeta = model::build_attention_meta(batch, *f.gpu_, bs, shape).value();
  in.packed = f.cpu_packed(n_blocks * bs, lora, rope);
  in.deq = CudaMlaFp8::dequantized(in.packed, lora, rope);
  in.q = f.rand({in.T, in.NH * (nope + rope)});
  in.kv_b = f.rand({in.NH * (nope + v), lora}, 0.2f);
  in.p = kernels::mla_params(c.heads, nope, rope, v, lora);
  if (c.top_k > 0) {
    in.topk = Tensor::empty(DType::kI32, {in.T, c.top_k});
    int64_t t = 0;
    for (const auto& s : batch.seqs)
      for (int32_t i = 0; i < s.n_tokens; ++i, ++t) {
        std::vector<int32_t> vis(s.kv_index_of(i) + 1);
        std::iota(vis.begin(), vis.end(), 0);
        std::shuffle(vis.begin(), vis.end(), f.rng_);
        if (static_cast<int64_t>(vis.size()) > c.top_k) vis.resize(c.top_k);
        std::sort(vis.begin(), vis.end());
        vis.resize(c.top_k, -1);
        std::copy(vis.begin(), vis.end(), in.topk.data<int32_t>() + t * c.top_k);
      }
    in.sparse = true;
    in.ctopk = f.cpu(in.topk);
    in.gtopk = f.gpu_->upload(in.topk);
  }
  in.ref = f.cpu_->alloc(DType::kF32, {in.T, in.NH * v});
  f.cops_->mla_attention(f.cpu(in.q), f.cpu(in.deq), f.cpu(in.kv_b), in.ctopk_or_null(), in.cmeta, in.p, in.ref);
  return in;
}

void run_mla(CudaMlaFp8& f, const MlaCase& c, int nope, int rope, int v, int lora) {
  SCOPED_TRACE(c.what);
  const int64_t bs = 16;
  const MlaFp8Inputs in = mla_fp8_inputs(f, c, nope, rope, v, lora, bs);
  // The CPU reading its own packed bytes gives the same result as over the dequantized rows.
  Tensor ref8 = f.cpu_->alloc(DType::kF32, {in.T, in.NH * v});
  f.cops_->mla_attention(f.cpu(in.q), f.cpu(in.packed), f.cpu(in.kv_b), in.ctopk_or_null(), in.cmeta, in.p, ref8);
  EXPECT_EQ(std::memcmp(ref8.raw(), in.ref.raw(), in.ref.nbytes()), 0) << "CPU FP8 read != dequantized rows";
  Tensor gq = f.gpu_bf16(in.q), gcache = f.gpu_exact(in.packed), gkv_b = f.gpu_bf16(in.kv_b);
  kernels::MlaParams pf = in.p;
  pf.fp8_cache = true;
  const bool mma = kernels::cuda::mla_attend_mma_supported(pf);
  // kAuto (the op) runs the Hopper attend where it can (FP8 rows included), else mma.sync, else SIMT.
  const bool wgmma = kernels::cuda::kMlaAutoWgmma && kernels::cuda::mla_attend_wgmma_supported(pf);
  {
    Tensor out = f.poison_bf16({in.T, in.NH * v});
    f.gops_->mla_attention(gq, gcache, gkv_b, in.gtopk_or_null(), in.gmeta, in.p, out);
    expect_close(f.host(out), in.ref, wgmma ? kTolMlaWgmmaFp8 : mma ? kTolMlaMmaFp8 : kTolBf16Out,
                 std::string(c.what) + (wgmma ? " [op: wgmma fp8]" : mma ? " [op: mma fp8]" : " [op: simt fp8]"));
  }
  const size_t ws_bytes = kernels::cuda::mla_attention_workspace_bytes(in.T, pf);
  Tensor ws = f.gpu_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
  for (const auto kernel : {kernels::cuda::MlaAttendKernel::kSimple, kernels::cuda::MlaAttendKernel::kMma}) {
    if (kernel == kernels::cuda::MlaAttendKernel::kMma && !mma) continue;
    Tensor out = f.poison_bf16({in.T, in.NH * v});
    kernels::cuda::mla_attention_bf16(gq.raw(), gcache.raw(), gkv_b.raw(), in.gtopk_ptr(),
                                      c.top_k, in.gmeta.token_seq.data<int32_t>(), in.gmeta.kv_index.data<int32_t>(),
                                      in.gmeta.block_tables.data<int32_t>(), out.raw(), pf, in.gmeta.params, ws.raw(),
                                      ws_bytes, backend::cuda_backend_stream(*f.gpu_), kernel);
    const bool simple = kernel == kernels::cuda::MlaAttendKernel::kSimple;
    expect_close(f.host(out), in.ref, simple ? kTolBf16Out : kTolMlaMmaFp8,
                 std::string(c.what) + (simple ? " [simt fp8]" : " [mma fp8]"));
  }
}

TEST_F(CudaMlaFp8, MlaAttentionReadsFp8Latent) {
  const std::vector<MlaCase> glm = {
      {64, 0, {{1, 1}}, "64 heads, ctx 1"},
      {64, 0, {{1, 31}, {1, 33}, {1, 4097}, {1, 700}}, "64 heads, decode, ragged"},
      {16, 0, {{1, 20000}, {1, 129}}, "16 heads, decode 20k"},
      {20, 0, {{1, 999}, {3, 64}}, "20 heads (partial group)"},
      {8, 2048, {{1, 6000}, {1, 1500}}, "8 heads (TP8), top-2048"},
      {32, 64, {{24, 300}}, "32 heads, prefill chunk 24, top-64"},
      {16, 0, {{140, 160}}, "16 heads, prefill 140 (1 split)"},
  };
  for (const MlaCase& c : glm) run_mla(*this, c, 192, 64, 256, 512);
  const std::vector<MlaCase> fixture = {
      {4, 0, {{1, 1}, {5, 37}, {3, 33}}, "fixture a shape, dense"},
      {4, 6, {{1, 17}, {5, 37}}, "fixture a shape, top-6"},
  };
  for (const MlaCase& c : fixture) run_mla(*this, c, 16, 8, 24, 32);
  run_mla(*this, {8, 4, {{9, 9}, {2, 40}}, "fixture b shape, top-4"}, 8, 16, 12, 24);
}

// The Hopper wgmma attend over FP8 rows (see the file comment). Skips (saying why) off sm_90.
void run_mla_wgmma(CudaMlaFp8& f, const MlaCase& c, const std::vector<int>& splits, bool graph) {
  namespace kc = kernels::cuda;
  SCOPED_TRACE(c.what);
  const int nope = 192, rope = 64, v = 256, lora = 512;
  const int64_t bs = 16;
  const MlaFp8Inputs in = mla_fp8_inputs(f, c, nope, rope, v, lora, bs);
  // The bf16 cache the FP8 kernel's shared-memory tile equals: bf16(code x scale) (RNE of the same f32), bf16 rope.
  Tensor deq16 = Tensor::empty(DType::kBF16, in.deq.shape());
  for (int64_t i = 0; i < in.deq.numel(); ++i) deq16.data<uint16_t>()[i] = f32_to_bf16(in.deq.data<float>()[i]);
  Tensor gq = f.gpu_bf16(in.q), gcache = f.gpu_exact(in.packed), gcache16 = f.gpu_exact(deq16);
  Tensor gkv_b = f.gpu_bf16(in.kv_b);
  kernels::MlaParams pf = in.p;
  pf.fp8_cache = true;
  cudaStream_t stream = backend::cuda_backend_stream(*f.gpu_);
  auto launch = [&](const kernels::MlaParams& pp, const Tensor& cache, kc::MlaAttendKernel kernel, int n_splits,
                    Tensor& out) {
    const size_t bytes = kc::mla_attention_workspace_bytes(in.T, pp, n_splits);
    Tensor w = f.gpu_->alloc(DType::kU8, {static_cast<int64_t>(bytes)});
    kc::mla_attention_bf16(gq.raw(), cache.raw(), gkv_b.raw(), in.gtopk_ptr(), c.top_k,
                           in.gmeta.token_seq.data<int32_t>(), in.gmeta.kv_index.data<int32_t>(),
                           in.gmeta.block_tables.data<int32_t>(), out.raw(), pp, in.gmeta.params, w.raw(), bytes,
                           stream, kernel, n_splits);
    Tensor h = f.host(out);  // synchronizes before w is freed
    return h;
  };
  Tensor mma_out = f.poison_bf16({in.T, in.NH * v});
  const Tensor mma_host = launch(pf, gcache, kc::MlaAttendKernel::kMma, 0, mma_out);
  expect_close(mma_host, in.ref, kTolMlaMmaFp8, std::string(c.what) + " [mma fp8]");
  const int64_t max_items = c.top_k > 0                    ? c.top_k
                            : in.gmeta.params.max_kv_len > 0 ? in.gmeta.params.max_kv_len
                                                          : int64_t{in.gmeta.params.max_blocks_per_seq} * bs;
  for (const auto variant : {kc::MlaAttendKernel::kWgmma, kc::MlaAttendKernel::kWgmmaSplitS})
    for (const int n_splits : splits) {
      const kc::MlaSplitPlan plan = kc::mla_attend_wgmma_split_plan(in.T, max_items, pf, c.top_k > 0, n_splits);
      const std::string what = std::string(c.what) +
                               (variant == kc::MlaAttendKernel::kWgmma ? " [wgmma fp8, " : " [wgmma split-S fp8, ") +
                               std::to_string(plan.n_splits) + (n_splits > 0 ? " splits, forced]" : " splits]");
      Tensor out8 = f.poison_bf16({in.T, in.NH * v}), out16 = f.poison_bf16({in.T, in.NH * v});
      const Tensor got = launch(pf, gcache, variant, n_splits, out8);
      const Tensor bf16_same_values = launch(in.p, gcache16, variant, n_splits, out16);
      expect_bytes_equal(got, bf16_same_values, (what + " == bf16 wgmma over the dequantized rows").c_str());
      expect_close(got, mma_host, kTolMlaWgmma, what + " vs mma fp8");
      expect_close(got, in.ref, kTolMlaWgmmaFp8, what);
    }
  if (!graph) return;
  if (kc::sync_after_launch()) {
    std::printf("[ skip     ] graph replay: MXSERVE_CUDA_SYNC=1 synchronizes after every launch\n");
    return;
  }
  // kAuto (the model's path) captured into a CUDA graph on a capture stream, replayed: byte-equal to eager.
  const size_t bytes = kc::mla_attention_workspace_bytes(in.T, pf);
  Tensor w = f.gpu_->alloc(DType::kU8, {static_cast<int64_t>(bytes)});
  Tensor eager = f.poison_bf16({in.T, in.NH * v}), replay = f.poison_bf16({in.T, in.NH * v});
  cudaStream_t cs = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking), cudaSuccess);
  auto run_auto = [&](Tensor& out) {
    kc::mla_attention_bf16(gq.raw(), gcache.raw(), gkv_b.raw(), in.gtopk_ptr(), c.top_k,
                           in.gmeta.token_seq.data<int32_t>(), in.gmeta.kv_index.data<int32_t>(),
                           in.gmeta.block_tables.data<int32_t>(), out.raw(), pf, in.gmeta.params, w.raw(), bytes, cs,
                           kc::MlaAttendKernel::kAuto);
  };
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run_auto(eager);  // first use outside the capture (one-time kernel attributes)
  ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
  cudaGraph_t g = nullptr;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
  run_auto(replay);
  ASSERT_EQ(cudaStreamEndCapture(cs, &g), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, cs), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(cs), cudaSuccess);
  expect_bytes_equal(f.host(replay), f.host(eager), (std::string(c.what) + " [kAuto fp8, graph replay == eager]").c_str());
  std::printf("[ graph    ] %-56s kAuto fp8 replayed from a CUDA graph\n", c.what);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(g);
  cudaStreamDestroy(cs);
}

TEST_F(CudaMlaFp8, MlaAttentionWgmmaReadsFp8Latent) {
  kernels::MlaParams probe = kernels::glm_mla_params(64);
  probe.fp8_cache = true;
  const char* why = nullptr;
  if (!kernels::cuda::mla_attend_wgmma_supported(probe, &why)) GTEST_SKIP() << "wgmma not runnable: " << why;
  const std::vector<MlaCase> cases = {
      {64, 0, {{1, 1}}, "64 heads, ctx 1"},
      {64, 0, {{1, 63}, {1, 64}, {1, 65}, {1, 17}, {1, 4097}, {1, 1000}}, "64 heads, decode, tile/block edges"},
      {32, 0, {{1, 999}, {2, 130}, {1, 64}}, "32 heads, decode + MTP 2"},
      {16, 0, {{4, 300}, {1, 77}, {3, 129}, {1, 2000}}, "16 heads, MTP runs"},
      {8, 0, {{1, 3001}, {8, 511}, {1, 65}, {3, 40}, {1, 1}, {2, 700}}, "8 heads, decode + MTP runs"},
      {16, 0, {{70, 200}}, "16 heads, prefill chunk 70"},
      {64, 2048, {{1, 5000}, {1, 1500}, {2, 2100}}, "64 heads, top-2048"},
      {32, 256, {{1, 3000}, {1, 200}}, "32 heads, top-256"},
      {16, 2048, {{1, 6000}, {1, 1500}}, "16 heads, top-2048"},
      {8, 96, {{1, 5000}, {1, 50}, {1, 96}, {1, 97}}, "8 heads, top-96 </>= ctx"},
  };
  for (const MlaCase& c : cases) run_mla_wgmma(*this, c, {1, 3, 0}, /*graph=*/true);
}

// Indexer over FP8 keys: the CUDA top-k must be a valid top-k of the CPU's scores over the same dequantized
// keys (a near-tie within kScoreSlack of the row's score scale may go either way between summation orders).
TEST_F(CudaMlaFp8, IndexerReadsFp8Keys) {
  struct Case {
    int heads, dim, top_k;
    std::vector<gpu_oracle::PagedSpan> spans;
    const char* what;
  };
  constexpr double kScoreSlack = 1e-5;
  for (const Case& c : {Case{32, 128, 2048, {{1, 20000}, {1, 3000}, {4, 2100}}, "GLM shape (mma), top-2048"},
                        Case{32, 128, 64, {{1, 500}, {16, 200}}, "GLM shape (mma), top-64"},
                        Case{4, 16, 6, {{1, 17}, {5, 37}}, "fixture a (simt), top-6"},
                        Case{2, 24, 4, {{9, 9}, {2, 40}}, "fixture b (simt), top-4"}}) {
    SCOPED_TRACE(c.what);
    const int64_t bs = 16;
    int64_t n_blocks = 0;
    model::ForwardBatch batch = gpu_oracle::paged_batch(c.spans, bs, 2, rng_, &n_blocks);
    const int64_t T = batch.n_tokens();
    kernels::AttentionParams shape;
    shape.n_heads = c.heads;
    shape.n_kv_heads = 1;
    shape.head_dim = c.dim;
    auto cmeta = model::build_attention_meta(batch, *cpu_, bs, shape).value();
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape).value();
    Tensor packed = cpu_packed(n_blocks * bs, c.dim, 0), deq = dequantized(packed, c.dim, 0);
    Tensor q = rand({T, c.heads * c.dim}), w = rand({T, c.heads});
    kernels::IndexerParams p{c.heads, c.dim, c.top_k, 1.f / std::sqrt(float(c.dim)), 1.f / std::sqrt(float(c.heads))};
    Tensor ctopk = cpu_->alloc(DType::kI32, {T, c.top_k}), ctopk8 = cpu_->alloc(DType::kI32, {T, c.top_k});
    cops_->indexer_topk(cpu(q), cpu(w), cpu(deq), cmeta, p, ctopk);
    cops_->indexer_topk(cpu(q), cpu(w), cpu(packed), cmeta, p, ctopk8);
    EXPECT_EQ(std::memcmp(ctopk.raw(), ctopk8.raw(), ctopk.nbytes()), 0) << "CPU FP8 read != dequantized keys";
    Tensor gtopk = gpu_->alloc(DType::kI32, {T, c.top_k});
    gops_->indexer_topk(gpu_bf16(q), gpu_bf16(w), gpu_exact(packed), gmeta, p, gtopk);
    Tensor got = host(gtopk);
    // Exact scores (fp64) over the dequantized keys, and each score's error bound from the GPU's one bf16
    // rounding of each dequantized key element (2^-9 relative): e_j = sum_h |w_h| ws ss 2^-9 sum_d |q_hd k_jd|.
    int64_t t = 0, mismatched = 0;
    for (const auto& s : batch.seqs) {
      std::vector<int64_t> slot(s.kv_len);
      for (int64_t j = 0; j < s.kv_len; ++j) slot[j] = int64_t{s.block_table[j / bs]} * bs + j % bs;
      for (int32_t i = 0; i < s.n_tokens; ++i, ++t) {
        const int64_t n = s.kv_index_of(i) + 1;
        std::vector<double> score(n), bound(n);
        double scale = 0, bound_max = 0;
        for (int64_t j = 0; j < n; ++j) {
          double sc = 0, e = 0;
          for (int h = 0; h < c.heads; ++h) {
            double dot = 0, abs_dot = 0;
            for (int d = 0; d < c.dim; ++d) {
              const double x = double(q.data<float>()[(t * c.heads + h) * c.dim + d]) * deq.data<float>()[slot[j] * c.dim + d];
              dot += x;
              abs_dot += std::fabs(x);
            }
            const double wh = double(w.data<float>()[t * c.heads + h]) * p.weight_scale;
            sc += wh * std::max(dot * p.score_scale, 0.0);
            e += std::fabs(wh) * p.score_scale * abs_dot * std::ldexp(1.0, -9);
          }
          score[j] = sc;
          bound[j] = e;
          scale = std::max(scale, std::fabs(sc));
          bound_max = std::max(bound_max, e);
        }
        std::vector<double> sorted = score;
        std::sort(sorted.rbegin(), sorted.rend());
        const int64_t k = std::min<int64_t>(c.top_k, n);
        const double kth = sorted[k - 1];
        const int32_t* row = got.data<int32_t>() + t * c.top_k;
        std::set<int32_t> seen;
        for (int64_t x = 0; x < c.top_k; ++x) {
          if (x >= k) {
            EXPECT_EQ(row[x], -1);
            continue;
          }
          ASSERT_TRUE(row[x] >= 0 && row[x] < n) << "token " << t << " entry " << x << " = " << row[x];
          seen.insert(row[x]);
          if (score[row[x]] + bound[row[x]] < kth - bound_max - kScoreSlack * scale) ++mismatched;
        }
        EXPECT_EQ(static_cast<int64_t>(seen.size()), k) << "token " << t << ": duplicate entries";
      }
    }
    std::printf("[ indexer  ] %-40s entries below the k-th score (beyond slack): %lld\n", c.what,
                static_cast<long long>(mismatched));
    EXPECT_EQ(mismatched, 0);
  }
}

// The fused indexer paths read the packed FP8 keys (dsa_indexer_fused.cu Fp8KeyLoad) into the same bf16 tile as
// the kMma path (mla_fp8_key_chunk), so on the same bytes every row must equal kMma's exactly: random keys at
// 20k keys (batch 1 and 16), rows <= top_k (skipped), all keys equal (every score tied: the lowest KV indices
// win), and the split select replayed from a CUDA graph.
TEST_F(CudaMlaFp8, IndexerFusedFp8EqualsMma) {
  namespace kc = kernels::cuda;
  struct Case {
    int heads, dim, top_k;
    std::vector<gpu_oracle::PagedSpan> spans;
    bool equal_keys;
    const char* what;
  };
  std::vector<gpu_oracle::PagedSpan> b16;
  for (int i = 0; i < 16; ++i) b16.push_back({1, 20000 + 37 * i});
  const std::vector<Case> cases = {
      {32, 128, 2048, {{1, 20480}}, false, "B1 20k keys"},
      {32, 128, 2048, b16, false, "B16 20k keys"},
      {32, 128, 2048, {{1, 2000}, {1, 2048}, {1, 2049}, {3, 2100}}, false, "rows around top_k (skipped <= 2048)"},
      {32, 128, 2048, {{1, 9000}, {1, 3000}}, true, "all keys equal: ties to the lower index"},
      // 16 heads: 64 heads x 128 needs more than the mma reference's 48 KiB of shared memory.
      {16, 128, 512, {{1, 5000}, {1, 300}}, false, "16 heads, top-512"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const int64_t bs = 64;
    int64_t n_blocks = 0;
    model::ForwardBatch batch = gpu_oracle::paged_batch(c.spans, bs, 2, rng_, &n_blocks);
    const int64_t T = batch.n_tokens(), K = c.top_k;
    kernels::AttentionParams shape;
    shape.n_heads = c.heads;
    shape.n_kv_heads = 1;
    shape.head_dim = c.dim;
    auto gmeta = model::build_attention_meta(batch, *gpu_, bs, shape).value();
    Tensor packed = cpu_packed(n_blocks * bs, c.dim, 0);
    if (c.equal_keys)
      for (int64_t sl = 1; sl < packed.dim(0); ++sl)
        std::memcpy(packed.data<uint8_t>() + sl * packed.dim(1), packed.data<uint8_t>(), packed.dim(1));
    Tensor q = rand({T, c.heads * c.dim}), w = rand({T, c.heads});
    kernels::IndexerParams p{c.heads, c.dim, c.top_k, 1.f / std::sqrt(float(c.dim)), 1.f / std::sqrt(float(c.heads))};
    p.fp8_keys = true;
    ASSERT_TRUE(kc::dsa_indexer_mma_supported(p));
    Tensor gq = gpu_bf16(q), gw = gpu_bf16(w), gkeys = gpu_exact(packed);
    const int64_t max_ctx = gmeta.params.max_kv_len > 0
                                ? gmeta.params.max_kv_len
                                : static_cast<int64_t>(gmeta.params.max_blocks_per_seq) * gmeta.params.block_size;
    const size_t ws_bytes = kc::dsa_indexer_workspace_bytes(T, max_ctx);
    Tensor ws = gpu_->alloc(DType::kU8, {static_cast<int64_t>(ws_bytes)});
    Tensor sentinel = Tensor::empty(DType::kI32, {T, K});
    std::fill(sentinel.data<int32_t>(), sentinel.data<int32_t>() + T * K, -7);
    Tensor out_mma = gpu_->upload(sentinel), out_fused = gpu_->upload(sentinel), out_split = gpu_->upload(sentinel);
    gpu_->synchronize();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cudaStream_t stream = nullptr;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    auto run = [&](kc::IndexerScoreKernel k, Tensor& out) {
      kc::dsa_indexer_topk(gq.raw(), gw.raw(), gkeys.raw(), gmeta.token_seq.data<int32_t>(),
                           gmeta.kv_index.data<int32_t>(), gmeta.block_tables.data<int32_t>(), out.data<int32_t>(), p,
                           gmeta.params, max_ctx, ws.raw(), ws_bytes, stream, k);
    };
    run(kc::IndexerScoreKernel::kMma, out_mma);
    run(kc::IndexerScoreKernel::kFused, out_fused);
    Tensor out_ring = gpu_->upload(sentinel);
    kc::dsa_indexer_fused_force_stages(4);  // the 4-deep ring of raw FP8 stages
    run(kc::IndexerScoreKernel::kFused, out_ring);
    kc::dsa_indexer_fused_force_stages(0);
    run(kc::IndexerScoreKernel::kFusedSplit, out_split);  // eager first use (one-time attributes), then a graph
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    bool graphed = false;
    if (!kc::sync_after_launch()) {
      ASSERT_EQ(cudaMemcpy(out_split.raw(), sentinel.raw(), sentinel.nbytes(), cudaMemcpyHostToDevice), cudaSuccess);
      cudaGraph_t graph = nullptr;
      cudaGraphExec_t exec = nullptr;
      ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
      run(kc::IndexerScoreKernel::kFusedSplit, out_split);
      ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
      ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      graphed = true;
    }
    cudaStreamDestroy(stream);
    Tensor h_mma = host(out_mma), h_fused = host(out_fused), h_split = host(out_split), h_ring = host(out_ring);
    int fused_differ = 0, split_differ = 0, tie_rows_wrong = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t* m = h_mma.data<int32_t>() + t * K;
      fused_differ += std::memcmp(h_fused.data<int32_t>() + t * K, m, 4 * K) != 0 ? 1 : 0;
      fused_differ += std::memcmp(h_ring.data<int32_t>() + t * K, m, 4 * K) != 0 ? 1 : 0;
      split_differ += std::memcmp(h_split.data<int32_t>() + t * K, m, 4 * K) != 0 ? 1 : 0;
      if (c.equal_keys) {  // every score equal: KV indices 0.. min(K, ctx) - 1, then -1
        const int64_t ctx = static_cast<int64_t>(batch.positions[t]) + 1;
        for (int64_t i = 0; i < K; ++i)
          if (m[i] != (i < ctx ? static_cast<int32_t>(i) : -1)) {
            ++tie_rows_wrong;
            break;
          }
      }
    }
    const bool pass = fused_differ == 0 && split_differ == 0 && tie_rows_wrong == 0;
    std::printf("[ indexer  ] FP8 fused %-40s %lld rows: %d kFused (2- and 4-stage) / %d kFusedSplit%s rows differ "
                "from kMma, %d tie "
                "rows wrong: %s\n",
                c.what, static_cast<long long>(T), fused_differ, split_differ, graphed ? " (graph)" : "",
                tie_rows_wrong, pass ? "PASS" : "FAIL");
    EXPECT_EQ(fused_differ, 0);
    EXPECT_EQ(split_differ, 0);
    EXPECT_EQ(tie_rows_wrong, 0);
  }
}

}  // namespace
}  // namespace mxserve
