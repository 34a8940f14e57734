#include "runtime/graph_sampler.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/check.h"
#include "core/logging.h"

namespace mxserve::runtime {
namespace {

kernels::SampleRowParams skipped_slot() {
  kernels::SampleRowParams p;
  p.logit_row = -1;  // both kernels return at once (backend/device_sampling.h)
  return p;
}

}  // namespace

Result<bool> graph_sampling_from_env() {
  const char* v = std::getenv("MXSERVE_GRAPH_SAMPLING");
  if (v == nullptr) return true;
  const std::string s(v);
  if (s.empty() || s == "1" || s == "on" || s == "true") return true;
  if (s == "0" || s == "off" || s == "false") return false;
  return invalid_argument("MXSERVE_GRAPH_SAMPLING='" + s + "': expected 1 / on (sampling inside the decode graphs, "
                          "the default) or 0 / off (sampling after the replay)");
}

GraphSamplerCaps GraphSamplerCaps::for_rows(int64_t max_rows) {
  GraphSamplerCaps c;
  c.penalties = std::max<int64_t>(int64_t{1} << 16, 8192 * max_rows);
  c.biases = std::max<int64_t>(4096, 512 * max_rows);
  c.processed_rows = std::min<int64_t>(max_rows, kGraphSampleProcessedRows);
  return c;
}

GraphTailLayout GraphTailLayout::of(int64_t C, int32_t max_top) {
  GraphTailLayout l;
  l.argmax = 0;
  l.results = C;
  l.top_ids = 5 * C;
  l.top_logprobs = 5 * C + C * max_top;
  l.end = 5 * C + 2 * C * max_top;
  return l;
}

std::string stage_graph_sample_slots(const kernels::SampleRowsInput* in, int64_t T, int64_t C,
                                     const GraphSamplerCaps& caps, std::vector<kernels::SampleRowParams>* slots,
                                     std::vector<int32_t>* slot_of) {
  slots->assign(static_cast<size_t>(C), skipped_slot());
  slot_of->clear();
  if (in == nullptr || in->rows.empty()) return "";
  auto no = [&](std::string why) {
    slots->assign(static_cast<size_t>(C), skipped_slot());
    slot_of->clear();
    return why;
  };
  const int64_t n = static_cast<int64_t>(in->rows.size());
  if (T > C || n > C)
    return no("a step of " + std::to_string(T) + " rows, " + std::to_string(n) + " sampled, for a bucket of " +
              std::to_string(C));
  if (static_cast<int64_t>(in->penalties.size()) > caps.penalties)
    return no(std::to_string(in->penalties.size()) + " penalty tokens in one step (the graphs' buffer holds " +
              std::to_string(caps.penalties) + ")");
  if (static_cast<int64_t>(in->biases.size()) > caps.biases)
    return no(std::to_string(in->biases.size()) + " logit_bias entries in one step (the graphs' buffer holds " +
              std::to_string(caps.biases) + ")");
  int64_t processed = 0;
  for (const kernels::SampleRowParams& r : in->rows) {
    if (r.logit_row < 0 || r.logit_row >= T)
      return no("a sampled row at logit row " + std::to_string(r.logit_row) + " outside the step's " +
                std::to_string(T) + " rows");
    if (r.n_top > caps.max_top)
      return no("top logprobs " + std::to_string(r.n_top) + " asked (the graphs return up to " +
                std::to_string(caps.max_top) + ")");
    if (r.bias_count < 0 || r.bias_begin < 0 || int64_t{r.bias_begin} + r.bias_count > int64_t(in->biases.size()) ||
        r.penalty_count < 0 || r.penalty_begin < 0 ||
        int64_t{r.penalty_begin} + r.penalty_count > int64_t(in->penalties.size()))
      return no("a row's bias / penalty range outside the step's entries (logit row " + std::to_string(r.logit_row) +
                ")");
    processed += r.bias_count > 0 || r.penalty_count > 0;
  }
  if (processed > caps.processed_rows)
    return no(std::to_string(processed) + " rows with logit_bias / penalties in one step (the graphs process up to " +
              std::to_string(caps.processed_rows) + ")");
  slot_of->assign(static_cast<size_t>(n), -1);
  int32_t next = 0;
  for (int pass = 0; pass < 2; ++pass)  // rows with processing first: they need a scratch row
    for (int64_t i = 0; i < n; ++i) {
      const kernels::SampleRowParams& r = in->rows[static_cast<size_t>(i)];
      if ((r.bias_count > 0 || r.penalty_count > 0) != (pass == 0)) continue;
      (*slots)[static_cast<size_t>(next)] = r;
      (*slot_of)[static_cast<size_t>(i)] = next++;
    }
  return "";
}

std::vector<kernels::SampledRow> unpack_graph_samples(const int32_t* host, int64_t C, int32_t max_top,
                                                      const kernels::SampleRowsInput& in,
                                                      const std::vector<int32_t>& slot_of, int64_t vocab) {
  const GraphTailLayout l = GraphTailLayout::of(C, max_top);
  MX_CHECK_EQ(slot_of.size(), in.rows.size());
  std::vector<kernels::SampledRow> out(in.rows.size());
  for (size_t i = 0; i < in.rows.size(); ++i) {
    const int64_t slot = slot_of[i];
    MX_CHECK_MSG(slot >= 0 && slot < C, "graph sampler: row " << i << " at slot " << slot << " of " << C);
    backend::DeviceSampleSlot res;
    std::memcpy(&res, host + l.results + 4 * slot, sizeof(res));
    kernels::SampledRow& o = out[i];
    o.token = res.token;
    o.logprob = res.logprob;
    o.error = res.error;
    o.error_token = res.error_token;
    const int64_t n_top = o.error == kernels::kSampleOk
                              ? std::min<int64_t>(std::min<int64_t>(in.rows[i].n_top, vocab), max_top)
                              : 0;
    for (int64_t j = 0; j < n_top; ++j) {
      float lp;
      std::memcpy(&lp, host + l.top_logprobs + slot * max_top + j, sizeof(lp));
      o.top.emplace_back(host[l.top_ids + slot * max_top + j], lp);
    }
  }
  return out;
}

GraphSampler::GraphSampler(backend::Backend& be, int64_t max_rows, int64_t vocab)
    : be_(be), max_rows_(max_rows), vocab_(vocab), caps_(GraphSamplerCaps::for_rows(max_rows)) {}

Status GraphSampler::allocate() {
  if (max_rows_ <= 0 || vocab_ <= 0)
    return invalid_argument("graph sampler: " + std::to_string(max_rows_) + " rows x vocabulary " +
                            std::to_string(vocab_));
  const int64_t param_bytes = max_rows_ * static_cast<int64_t>(sizeof(kernels::SampleRowParams));
  params_ = be_.alloc(DType::kU8, {param_bytes});
  penalties_ = be_.alloc(DType::kU8, {caps_.penalties * static_cast<int64_t>(sizeof(kernels::SamplePenaltyToken))});
  biases_ = be_.alloc(DType::kU8, {caps_.biases * static_cast<int64_t>(sizeof(kernels::SampleBias))});
  scratch_ = be_.alloc(DType::kF32, {std::min<int64_t>(max_rows_, caps_.processed_rows), vocab_});
  out_ = be_.alloc(DType::kI32, {GraphTailLayout::of(max_rows_, caps_.max_top).end});
  slots_.assign(static_cast<size_t>(max_rows_), skipped_slot());
  be_.write_from_host(params_, 0, Tensor::view_of(slots_.data(), DType::kU8, {param_bytes}));
  real_end_ = 0;
  const double mb = static_cast<double>(params_.nbytes() + penalties_.nbytes() + biases_.nbytes() +
                                        scratch_.nbytes() + out_.nbytes()) /
                    (1 << 20);
  MX_LOG(kInfo) << "CUDA graphs: sampling inside the decode graphs (argmax + device sampler at the end of each "
                   "decode bucket; "
                << mb << " MiB of static buffers, most of it the processed-row scratch " << scratch_.describe()
                << "; up to " << scratch_.dim(0) << " rows with " << caps_.penalties << " penalty / "
                << caps_.biases << " logit_bias entries and " << caps_.max_top
                << " top logprobs a step, beyond them a step samples after the replay); MXSERVE_GRAPH_SAMPLING=0 "
                   "turns it off";
  return Status::ok();
}

GraphSampler::Tail GraphSampler::tail(const Tensor& logits, int64_t C) const {
  MX_CHECK_MSG(C > 0 && C <= max_rows_ && logits.ndim() == 2 && logits.dim(0) == C,
               "graph sampler: tail of " << C << " slots over logits " << logits.describe());
  const GraphTailLayout l = GraphTailLayout::of(C, caps_.max_top);
  Tail t;
  t.be = &be_;
  t.logits = logits;
  t.argmax = out_.slice_rows(l.argmax, l.argmax + C);
  t.sample.logits = logits;
  t.sample.params = params_;
  t.sample.penalties = penalties_;
  t.sample.biases = biases_;
  t.sample.scratch = scratch_;
  t.sample.results = out_.slice_rows(l.results, l.results + 4 * C);
  t.sample.top_ids = out_.slice_rows(l.top_ids, l.top_ids + C * caps_.max_top);
  // The top logprobs are f32 bits in the i32 buffer (the tail object keeps out_ alive through top_ids).
  t.sample.top_logprobs = Tensor::view_of(out_.data<int32_t>() + l.top_logprobs, DType::kF32,
                                          {C * caps_.max_top}, out_.device());
  t.sample.n_sample = static_cast<int32_t>(C);
  t.sample.max_top = caps_.max_top;
  return t;
}

Status GraphSampler::Tail::enqueue() const {
  Tensor ids = argmax;
  be->argmax_rows(logits, ids);
  return backend::enqueue_device_sampling(*be, sample);
}

bool GraphSampler::stage(const kernels::SampleRowsInput* in, int64_t T, int64_t C) {
  MX_CHECK_MSG(C > 0 && C <= max_rows_, "graph sampler: " << C << " slots of " << max_rows_);
  const std::string why = stage_graph_sample_slots(in, T, C, caps_, &slots_, &slot_of_);
  const bool rows = in != nullptr && !in->rows.empty();
  if (!why.empty()) {
    const std::string kind = why.substr(0, why.find_first_of("0123456789"));
    if (said_.insert(kind).second) {
      MX_LOG(kInfo) << "CUDA graphs: a decode step's sampling runs after the replay (one more upload, two more "
                       "launches and a separate synchronization) because of "
                    << why << "; said once for this kind of step";
    }
  }
  const bool sampled = rows && why.empty();
  if (!sampled && real_end_ == 0) return false;  // every slot is skipped on the device already
  const int64_t bytes = C * static_cast<int64_t>(sizeof(kernels::SampleRowParams));
  be_.write_from_host(params_, 0, Tensor::view_of(slots_.data(), DType::kU8, {bytes}));
  if (sampled) {
    if (!in->penalties.empty()) {
      const int64_t n = static_cast<int64_t>(in->penalties.size() * sizeof(kernels::SamplePenaltyToken));
      be_.write_from_host(penalties_, 0,
                          Tensor::view_of(const_cast<kernels::SamplePenaltyToken*>(in->penalties.data()),
                                          DType::kU8, {n}));
    }
    if (!in->biases.empty()) {
      const int64_t n = static_cast<int64_t>(in->biases.size() * sizeof(kernels::SampleBias));
      be_.write_from_host(biases_, 0,
                          Tensor::view_of(const_cast<kernels::SampleBias*>(in->biases.data()), DType::kU8, {n}));
    }
  }
  // Slots past C keep what they held; [0, C) now holds real rows only where sampled.
  if (real_end_ <= C) {
    real_end_ = 0;
    for (int64_t s = sampled ? C - 1 : -1; s >= 0; --s) {
      if (slots_[static_cast<size_t>(s)].logit_row >= 0) {
        real_end_ = s + 1;
        break;
      }
    }
  }
  return sampled;
}

void GraphSampler::read(const kernels::SampleRowsInput* in, int64_t T, int64_t C, bool sampled,
                        GraphSampleOutput* out) {
  const GraphTailLayout l = GraphTailLayout::of(C, caps_.max_top);
  bool tops = false;
  if (sampled)
    for (const auto& r : in->rows) tops |= r.n_top > 0;
  const int64_t n = !sampled ? T : tops ? l.end : l.top_ids;
  const Tensor host = be_.to_host(out_.slice_rows(0, n));  // waits for the replay
  const int32_t* h = host.data<int32_t>();
  out->tail = true;
  out->argmax.assign(h + l.argmax, h + l.argmax + T);
  out->sampled = sampled;
  out->rows.clear();
  if (sampled) {
    out->rows = unpack_graph_samples(h, C, caps_.max_top, *in, slot_of_, vocab_);
    ++sampled_replays_;
  }
}

}  // namespace mxserve::runtime
