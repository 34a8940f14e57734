// Format error bounds, independent decoders and the logit envelope (quant_bound.h has the derivation).
#include "quant_bound.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/causal_lm.h"
#include "runtime/sequence_runner.h"

namespace mxserve::quant_bound {

namespace fs = std::filesystem;

float decode_e2m1(uint8_t n) {
  static const float kMagnitude[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
  return (n & 0x8 ? -1.f : 1.f) * kMagnitude[n & 0x7];
}

float decode_e4m3(uint8_t b) {
  const int exp = (b >> 3) & 0xF, man = b & 0x7;
  const float sign = b & 0x80 ? -1.f : 1.f;
  if (exp == 0xF && man == 0x7) return std::nanf("");
  if (exp == 0) return sign * std::ldexp(static_cast<float>(man) / 8.f, -6);
  return sign * std::ldexp(1.f + static_cast<float>(man) / 8.f, exp - 7);
}

float decode_e8m0(uint8_t b) { return b == 0xFF ? std::nanf("") : std::ldexp(1.f, static_cast<int>(b) - 127); }

uint8_t mxfp4_even_scale_byte(float amax) {
  uint32_t bits;
  std::memcpy(&bits, &amax, 4);
  const uint32_t a = (bits + 0x200000u) & 0x7F800000u;  // amax rounded at 1.75 * 2^k (Quark "even")
  const int e = static_cast<int>(a >> 23);                 // biased exponent of a; 255: rounded to +Inf
  if (e == 255) return 254;                                // log2 = +inf, clamped to 2^127
  return static_cast<uint8_t>(std::clamp(e - 2, 0, 254));  // X = 2^(floor(log2 a) - 2)
}

std::vector<float> mxfp4_even_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols) {
  std::vector<float> e(w.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      const int64_t c1 = std::min(cols, c0 + 32);
      float amax = 0;
      for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float X = decode_e8m0(mxfp4_even_scale_byte(amax));
      for (int64_t c = c0; c < c1; ++c) {
        const float t = std::fabs(w[r * cols + c]) / X;
        const float half_step = t < 2 ? 0.25f : t < 4 ? 0.5f : 1.f;
        e[r * cols + c] = (t <= 6 ? half_step : t - 6) * X;
      }
    }
  return e;
}

std::vector<float> fp8_block_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t br,
                                         int64_t bc) {
  std::vector<float> e(w.size());
  for (int64_t r0 = 0; r0 < rows; r0 += br)
    for (int64_t c0 = 0; c0 < cols; c0 += bc) {
      const int64_t r1 = std::min(rows, r0 + br), c1 = std::min(cols, c0 + bc);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const float s = amax > 0 ? amax / 448.f : 1.f;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const float x = std::fabs(w[r * cols + c]), y = x / s;
          const float unit = y < std::ldexp(1.f, -6) ? std::ldexp(1.f, -10) : std::ldexp(1.f, std::ilogb(y) - 4);
          e[r * cols + c] = unit * s + x * std::ldexp(1.f, -20);
        }
    }
  return e;
}

float nearest_e4m3(float x) {
  if (std::isnan(x)) return x;
  float best = 0;
  int best_code = 0;
  for (int code = 0; code < 256; ++code) {
    const float v = decode_e4m3(static_cast<uint8_t>(code));
    if (std::isnan(v)) continue;
    const float d = std::fabs(v - x), bd = std::fabs(best - x);
    if (d < bd || (d == bd && (code & 1) == 0 && (best_code & 1) == 1)) best = v, best_code = code;
  }
  return best;  // beyond +-448 the nearest is +-448: saturation
}

std::vector<float> e4m3_cast(const std::vector<float>& w) {
  std::vector<float> c(w.size());
  for (size_t i = 0; i < w.size(); ++i) c[i] = nearest_e4m3(w[i]);
  return c;
}

std::vector<float> fp8_block_after_cast_error_bound(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t br,
                                                    int64_t bc) {
  const std::vector<float> c = e4m3_cast(w);
  std::vector<float> e = fp8_block_error_bound(c, rows, cols, br, bc);
  for (size_t i = 0; i < e.size(); ++i) e[i] += std::fabs(w[i] - c[i]);
  return e;
}

std::vector<float> to_f32(const Tensor& t) {
  std::vector<float> out(t.numel());
  if (t.dtype() == DType::kF32) {
    std::memcpy(out.data(), t.raw(), out.size() * 4);
  } else if (t.dtype() == DType::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(t.raw());
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
      std::memcpy(&out[i], &bits, 4);
    }
  } else {
    out.clear();
  }
  return out;
}

std::vector<float> decode_mxfp4(const Tensor& packed, const Tensor& scales, int64_t rows, int64_t cols) {
  std::vector<float> out(rows * cols);
  const uint8_t* q = static_cast<const uint8_t*>(packed.raw());
  const uint8_t* s = static_cast<const uint8_t*>(scales.raw());
  const int64_t scale_cols = (cols + 31) / 32;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t byte = q[r * (cols / 2) + c / 2];
      const uint8_t nibble = c % 2 == 0 ? byte & 0xF : byte >> 4;  // element 2i in the low nibble
      out[r * cols + c] = decode_e2m1(nibble) * decode_e8m0(s[r * scale_cols + c / 32]);
    }
  return out;
}

std::vector<float> decode_fp8_block(const Tensor& q, const Tensor& scale_inv, int64_t rows, int64_t cols, int64_t br,
                                    int64_t bc) {
  std::vector<float> out(rows * cols);
  const uint8_t* p = static_cast<const uint8_t*>(q.raw());
  const std::vector<float> s = to_f32(scale_inv);
  const int64_t scale_cols = (cols + bc - 1) / bc;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = decode_e4m3(p[r * cols + c]) * s[(r / br) * scale_cols + c / bc];
  return out;
}

Status write_edited_fixture(const std::string& src, const std::string& dst,
                            const std::function<std::vector<float>(const std::string&, const std::vector<float>&,
                                                                   int64_t, int64_t)>& edit) {
  std::error_code ec;
  fs::remove_all(dst, ec);
  fs::create_directories(dst);
  for (const char* f : {"config.json", "generation_config.json", "reference.safetensors"})
    if (fs::exists(fs::path(src) / f)) fs::copy_file(fs::path(src) / f, fs::path(dst) / f);
  MX_ASSIGN_OR_RETURN(auto ckpt, io::Checkpoint::open(src));
  io::NamedTensors out;
  for (const auto& name : ckpt->names()) {
    const io::CheckpointTensor* t = ckpt->find(name);
    Tensor view = ckpt->view(*t);
    std::vector<float> edited;
    if (view.ndim() == 2 && (view.dtype() == DType::kBF16 || view.dtype() == DType::kF32))
      edited = edit(name, to_f32(view), view.dim(0), view.dim(1));
    if (edited.empty()) {
      Tensor copy = Tensor::empty(view.dtype(), view.shape());
      std::memcpy(copy.raw(), view.raw(), view.nbytes());
      out.push_back({name, copy});
    } else {
      Tensor f = Tensor::empty(DType::kF32, view.shape());
      std::memcpy(f.raw(), edited.data(), edited.size() * 4);
      out.push_back({name, f});
    }
  }
  return io::write_safetensors((fs::path(dst) / "model.safetensors").string(), out);
}

Result<LogitError> logit_error(const std::string& dir, const std::string& reference_dir, bool with_mtp,
                               size_t max_cases) {
  LogitError err;
  auto be = backend::make_cpu_backend();
  model::LoadOptions lo;
  lo.load_mtp = with_mtp;
  MX_ASSIGN_OR_RETURN(auto model, model::load_causal_lm(dir, *be, lo));
  const int64_t V = model->config().vocab_size;
  MX_ASSIGN_OR_RETURN(auto cases, cli::read_fixture_cases(reference_dir, V));
  runtime::SequenceRunner runner(*model, *be, 64, 16);
  for (size_t ci = 0; ci < std::min(max_cases, cases.size()); ++ci) {
    const cli::FixtureCase& c = cases[ci];
    const int64_t T = static_cast<int64_t>(c.input_ids.size());
    runtime::SequenceState s;
    MX_ASSIGN_OR_RETURN(auto step, runner.extend({&s}, {c.input_ids}, true, with_mtp));
    runner.release(s);
    err.logits_rel_l2 =
        std::max(err.logits_rel_l2, cli::compare(step.logits.data<float>(), c.logits.data<float>(), T * V).rel_l2);
    if (with_mtp && c.has_mtp && T >= 2) {
      runtime::SequenceState ms;
      MX_ASSIGN_OR_RETURN(Tensor mtp, runner.mtp(ms, std::vector<int32_t>(c.input_ids.begin() + 1, c.input_ids.end()),
                                                 step.hidden.slice_rows(0, T - 1)));
      runner.release(ms);
      err.mtp_rel_l2 =
          std::max(err.mtp_rel_l2, cli::compare(mtp.data<float>(), c.mtp_logits.data<float>(), (T - 1) * V).rel_l2);
    }
  }
  return err;
}

Result<std::vector<Tensor>> case_logits(const std::string& dir, const std::string& reference_dir, size_t max_cases) {
  auto be = backend::make_cpu_backend();
  MX_ASSIGN_OR_RETURN(auto model, model::load_causal_lm(dir, *be, model::LoadOptions{}));
  MX_ASSIGN_OR_RETURN(auto cases, cli::read_fixture_cases(reference_dir, model->config().vocab_size));
  runtime::SequenceRunner runner(*model, *be, 64, 16);
  std::vector<Tensor> out;
  for (size_t ci = 0; ci < std::min(max_cases, cases.size()); ++ci) {
    runtime::SequenceState s;
    MX_ASSIGN_OR_RETURN(auto step, runner.extend({&s}, {cases[ci].input_ids}, true, false));
    runner.release(s);
    out.push_back(step.logits);
  }
  return out;
}

Result<LogitError> envelope(const std::string& fixture_dir, const std::string& scratch_dir, const BoundFn& bound,
                            bool with_mtp, int draws, size_t max_cases, const BoundFn& center) {
  LogitError worst;
  for (int d = 0; d < draws; ++d) {
    std::mt19937 rng(1000 + d);
    const std::string dir = scratch_dir + "_envelope" + std::to_string(d);
    MX_RETURN_IF_ERROR(write_edited_fixture(
        fixture_dir, dir, [&](const std::string& name, const std::vector<float>& w, int64_t rows, int64_t cols) {
          // Draw 0 shrinks every weight toward zero by its bound, draw 1 grows it (errors correlated with the
          // weights, as when a block's small values round to zero together), later draws pick random signs.
          std::vector<float> e = bound(name, w, rows, cols);
          std::vector<float> from = center && !e.empty() ? center(name, w, rows, cols) : std::vector<float>{};
          if (from.empty()) from = w;
          for (size_t i = 0; i < e.size(); ++i) {
            const bool toward_zero = d == 0 ? true : d == 1 ? false : (rng() & 1);
            e[i] = from[i] + ((from[i] >= 0) == toward_zero ? -e[i] : e[i]);
          }
          return e;
        }));
    MX_ASSIGN_OR_RETURN(LogitError m, logit_error(dir, fixture_dir, with_mtp, max_cases));
    worst.logits_rel_l2 = std::max(worst.logits_rel_l2, m.logits_rel_l2);
    worst.mtp_rel_l2 = std::max(worst.mtp_rel_l2, m.mtp_rel_l2);
    std::error_code ec;
    fs::remove_all(dir, ec);
  }
  return worst;
}

bool is_routed_expert_weight(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos && name.size() > 7 &&
         name.compare(name.size() - 7, 7, ".weight") == 0;
}

}  // namespace mxserve::quant_bound
