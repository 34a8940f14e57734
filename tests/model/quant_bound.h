// Quantization tolerances from the formats themselves, not from the implementation's own measurement.
//
// 1. Per element (analytic): for a weight x, the worst-case |dequant(quant(x)) - x| of the format, computed
//    here from the format definitions (docs/quant.md; OCP MX v1.0 E2M1 + E8M0, OCP FP8 e4m3fn) and the
//    fixture's own weights, with decoders written here (not src/quant's):
//    - MXFP4, "even" scale rule: X = 2^(floor(log2 a) - 2), a = amax of the 32-block rounded at 1.75 * 2^k;
//      E2M1 grid {0, .5, 1, 1.5, 2, 3, 4, 6} * X: spacing .5X below 2X, X below 4X, 2X up to 6X, so
//      e(x) = X/4, X/2, X there; [6, 7)X saturates to 6X: e(x) = |x| - 6X < X.
//    - FP8 block (br x bc): s = amax/448 (f32); y = x/s; e4m3 has 3 mantissa bits: for |y| in [2^k, 2^(k+1)),
//      k >= -6, e = 2^(k-4) * s; subnormals (|y| < 2^-6): e = 2^-10 * s. Plus a 2^-20 |x| allowance for the
//      f32 scale / division roundings.
// 2. On the logits (an envelope, not a proof): the fixture model with every quantized weight moved by its
//    worst-case error e(x), run by the same f32 code path: every weight shrunk toward zero by e(x), every weight
//    grown by it, and random signs; the envelope is the largest logit error of those. Real rounding errors are
//    each at most e(x) (check 1). Random signs alone were not enough: FP8 blocks whose small values round
//    together (toward zero) give errors correlated with the weights, which on glm4_moe_tiny_a exceeded the
//    random-sign envelope (0.0325 vs 0.0268); the shrink/grow draws cover that. Not covered: errors whose signs
//    conspire against the logits in some other pattern.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"

namespace mxserve::quant_bound {

// Independent decoders (the format definitions, written out).
float decode_e2m1(uint8_t nibble);
float decode_e4m3(uint8_t byte);
float decode_e8m0(uint8_t byte);

// The format's worst-case per-element error for each element of w (f32 [rows, cols], row-major).
std::vector<float> mxfp4_even_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols);
std::vector<float> fp8_block_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t br, int64_t bc);

// transformers 5.17's from_pretrained(FineGrainedFP8Config) + save_pretrained writes FP8-block(e4m3(w)): the
// weight cast to e4m3 without a scale first (tests/data/independent_ckpt/README.md). The cast is deterministic, so
// it is computed exactly (nearest_e4m3, ties to even, saturating); the block stage keeps its worst case.
float nearest_e4m3(float x);  // the e4m3fn value nearest x, found among the decoded codes (not src/quant's)
std::vector<float> e4m3_cast(const std::vector<float>& w);
// |w - e4m3(w)| + fp8_block_error_bound(e4m3(w)) per element.
std::vector<float> fp8_block_after_cast_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t br,
                                                    int64_t bc);

// The E8M0 scale byte the "even" rule gives a 32-block whose amax is `amax` (for checking a written scale).
uint8_t mxfp4_even_scale_byte(float amax);

// Any float tensor (f32 / bf16) to f32.
std::vector<float> to_f32(const Tensor& t);

// A quantized weight decoded here: mxfp4 (u8 [r, c/2] + u8/e8m0 [r, ceil(c/32)]) or fp8-block
// (F8_E4M3 [r, c] + f32 weight_scale_inv [ceil(r/br), ceil(c/bc)]).
std::vector<float> decode_mxfp4(const Tensor& packed, const Tensor& scales, int64_t rows, int64_t cols);
std::vector<float> decode_fp8_block(const Tensor& q, const Tensor& scale_inv, int64_t rows, int64_t cols, int64_t br,
                                    int64_t bc);

// Copies fixture dir `src` to `dst` (config, reference, generation config) with model weights rewritten: for
// each tensor name, `edit` returns the f32 values to store (empty: keep the tensor as it is).
Status write_edited_fixture(const std::string& src, const std::string& dst,
                            const std::function<std::vector<float>(const std::string&, const std::vector<float>&,
                                                                   int64_t rows, int64_t cols)>& edit);

struct LogitError {
  double logits_rel_l2 = 0;  // worst case over the fixture's cases
  double mtp_rel_l2 = 0;     // 0 when the model has no MTP layer loaded
};
// Runs the model in `dir` (CPU backend) over the fixture cases of `reference_dir`; `with_mtp` also compares
// the MTP logits. max_cases: the first cases only (suite time).
Result<LogitError> logit_error(const std::string& dir, const std::string& reference_dir, bool with_mtp,
                               size_t max_cases = 1000);

// Teacher-forced logits (host f32 [T, V]) of the model in `dir` on each fixture case of `reference_dir`.
Result<std::vector<Tensor>> case_logits(const std::string& dir, const std::string& reference_dir, size_t max_cases = 1000);

// The envelope of check 2: max over `draws` sign draws of the logit error of the fixture with each weight
// w for which bound(name, w, rows, cols) is non-empty moved by +-bound elementwise.
// center (optional): the value each weight is moved from instead of w itself (a known deterministic step such
// as e4m3_cast; empty result: w).
using BoundFn = std::function<std::vector<float>(const std::string&, const std::vector<float>&, int64_t, int64_t)>;
Result<LogitError> envelope(const std::string& fixture_dir, const std::string& scratch_dir, const BoundFn& bound,
                            bool with_mtp, int draws, size_t max_cases = 1000, const BoundFn& center = nullptr);

// Routed-expert Linear weights (what `mxserve quantize` converts by default).
bool is_routed_expert_weight(const std::string& name);

}  // namespace mxserve::quant_bound
