// The step log (runtime/step_log.h): the line format round-trips (NaN prediction <-> null, the graph flag, exact
// features), a bad line is named by file:line and key, evaluate_step_log recovers known coefficients from
// synthetic steps and separates graph from eager decode steps when they cost differently, and the engine writes
// one record per step with the shape, time, chunk counts, graph flag and prediction that step had.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "fake_model.h"
#include "forwarding_executor.h"
#include "runtime/engine.h"
#include "runtime/step_log.h"

namespace mxserve::runtime {
namespace {

namespace fs = std::filesystem;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

double cost_of(const StepShape& s, const StepCostCoefficients& c) {
  return c.base + c.per_prefill_token * s.prefill_tokens + c.per_prefill_pair * s.prefill_pairs +
         c.per_decode_row * s.decode_rows + c.per_decode_kv_token * s.decode_kv_tokens;
}

std::string temp_path(const std::string& stem) {
  return (fs::temp_directory_path() / ("mxserve_" + stem + "_" + std::to_string(::getpid()) + ".jsonl")).string();
}

Result<std::vector<StepLogRecord>> parse_text(const std::string& text) {
  std::istringstream in(text);
  return parse_step_log(in, "steps.jsonl");
}

void expect_same_record(const StepLogRecord& got, const StepLogRecord& want, const std::string& what) {
  EXPECT_NEAR(got.t, want.t, 1e-8 * std::fabs(want.t)) << what;
  EXPECT_NEAR(got.seconds, want.seconds, 1e-8 * want.seconds) << what;
  EXPECT_EQ(got.shape.prefill_tokens, want.shape.prefill_tokens) << what;
  EXPECT_EQ(got.shape.prefill_pairs, want.shape.prefill_pairs) << what;
  EXPECT_EQ(got.shape.decode_rows, want.shape.decode_rows) << what;
  EXPECT_EQ(got.shape.decode_kv_tokens, want.shape.decode_kv_tokens) << what;
  EXPECT_EQ(got.prefill_chunks, want.prefill_chunks) << what;
  EXPECT_EQ(got.decode_seqs, want.decode_seqs) << what;
  EXPECT_EQ(got.graph, want.graph) << what;
  if (std::isnan(want.predicted))
    EXPECT_TRUE(std::isnan(got.predicted)) << what << ": a NaN prediction comes back NaN, got " << got.predicted;
  else
    EXPECT_NEAR(got.predicted, want.predicted, 1e-8 * want.predicted) << what;
}

TEST(StepLog, LineFormatIsTheDocumentedOne) {
  StepLogRecord r;
  r.t = 1.5;
  r.seconds = 0.025;
  r.shape.add_chunk(12000, 8192, 0);  // a prefill chunk
  r.shape.add_chunk(19999, 1, 0);     // a decode
  r.prefill_chunks = 1;
  r.decode_seqs = 1;
  r.graph = true;
  r.predicted = 0.024;
  EXPECT_EQ(format_step_log_line(r),
            "{\"t\":1.5,\"s\":0.025,\"pt\":8192,\"pp\":131862528,\"dr\":1,\"dkv\":20000,\"pc\":1,\"ds\":1,\"g\":1,"
            "\"pred\":0.024}");
  r.predicted = kNaN;
  r.graph = false;
  const std::string line = format_step_log_line(r);
  EXPECT_NE(line.find("\"g\":0,\"pred\":null}"), std::string::npos) << line;
}

TEST(StepLog, RoundTripsWithAndWithoutPrediction) {
  std::vector<StepLogRecord> want(3);
  want[0].t = 0;
  want[0].seconds = 0.0312345678;
  for (int i = 0; i < 13; ++i) want[0].shape.add_chunk(10000 + 777 * i, 1, 0);
  want[0].decode_seqs = 13;
  want[0].graph = true;  // no prediction yet: NaN
  want[1].t = 12.345678901;
  want[1].seconds = 1.23456789;
  want[1].shape.add_chunk(123456, 8192, 0);
  want[1].shape.add_chunk(20000, 4, 3);  // a verify chunk: 1 real token + 3 drafts, a decode
  want[1].prefill_chunks = 1;
  want[1].decode_seqs = 1;
  want[1].predicted = 1.1111111;
  want[2].t = 3600.25;
  want[2].seconds = 4.5e-4;
  want[2].shape.prefill_pairs = 98765432109876.0;  // beyond 9 digits: the features are written exactly
  want[2].shape.prefill_tokens = 3;
  want[2].prefill_chunks = 2;
  want[2].predicted = 5e-4;
  std::string text;
  for (const auto& r : want) text += format_step_log_line(r) + "\n\n";  // blank lines are skipped
  auto got = parse_text(text);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) expect_same_record((*got)[i], want[i], "record " + std::to_string(i));
}

TEST(StepLog, BadLinesNameFileLineAndKey) {
  StepLogRecord r;
  r.seconds = 0.02;
  const std::string good = format_step_log_line(r);
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    auto got = parse_text(text);
    ASSERT_FALSE(got.is_ok()) << "accepted: " << text;
    EXPECT_EQ(got.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(got.status().message().find(needle), std::string::npos)
        << "wanted '" << needle << "' in: " << got.status().message();
  };
  expect_error(good + "\n{\"t\":0,\"s\":\n", "steps.jsonl:2: not a JSON line");
  std::string no_dr = good;
  no_dr.replace(no_dr.find("\"dr\":0,"), 7, "");
  expect_error(good + "\n\n" + no_dr + "\n", "steps.jsonl:3: field 'dr': expected a number, found nothing");
  std::string bad_g = good;
  bad_g.replace(bad_g.find("\"g\":0"), 5, "\"g\":2");
  expect_error(bad_g, "steps.jsonl:1: field 'g': expected 0 or 1, found 2");
  std::string no_pred = good.substr(0, good.find(",\"pred\"")) + "}";
  expect_error(no_pred, "steps.jsonl:1: field 'pred': expected a number or null");
  std::string text_s = good;
  text_s.replace(text_s.find("\"s\":0.02"), 8, "\"s\":\"0.02\"");
  expect_error(text_s, "steps.jsonl:1: field 's': expected a number, found \"0.02\"");
  expect_error("[1,2]\n", "steps.jsonl:1: expected a JSON object");
}

TEST(StepLog, WriterCreatesFlushesAndNamesABadPath) {
  auto bad = StepLogWriter::open("/nonexistent-dir/steps.jsonl");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("/nonexistent-dir/steps.jsonl: cannot create the step log: No such file"),
            std::string::npos)
      << bad.status().message();

  const std::string path = temp_path("step_log_writer");
  std::vector<StepLogRecord> want(5);
  for (size_t i = 0; i < want.size(); ++i) {
    want[i].t = 0.1 * static_cast<double>(i);
    want[i].seconds = 0.01 + 0.001 * static_cast<double>(i);
  }
  {
    auto w = StepLogWriter::open(path);
    ASSERT_TRUE(w.is_ok()) << w.status().to_string();
    EXPECT_EQ((*w)->path(), path);
    for (size_t i = 0; i < 2; ++i) (*w)->write(want[i]);
    (*w)->flush();
    auto early = read_step_log(path);
    ASSERT_TRUE(early.is_ok()) << early.status().to_string();
    EXPECT_EQ(early->size(), 2u) << "flush() writes what is buffered";
    for (size_t i = 2; i < want.size(); ++i) (*w)->write(want[i]);
  }  // the destructor writes the rest
  auto got = read_step_log(path);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  ASSERT_EQ(got->size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) expect_same_record((*got)[i], want[i], "record " + std::to_string(i));
  fs::remove(path);
  auto missing = read_step_log(path);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find(path + ": cannot open the step log"), std::string::npos);
}

// The seed regime (docs/scheduling.md "Not done"): decode-only steps of 8-16 rows at 10k-20k context, a third of
// them graph replays, one step in eight with an 8k prefill chunk at 0-16k cached tokens, 2% noise. `graph_saving`
// is taken off every graph-replayed decode step's time.
std::vector<StepLogRecord> synthetic_log(const StepCostCoefficients& truth, double graph_saving, int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> noise(-0.02, 0.02);
  std::vector<StepLogRecord> log;
  double t = 0;
  for (int i = 0; i < n; ++i) {
    StepLogRecord r;
    r.decode_seqs = 8 + static_cast<int32_t>(rng() % 9);
    for (int d = 0; d < r.decode_seqs; ++d) r.shape.add_chunk(10000 + rng() % 10000, 1, 0);
    if (i % 8 == 0) {
      r.shape.add_chunk(static_cast<int64_t>(rng() % 16384), 8192, 0);
      r.prefill_chunks = 1;
    } else {
      r.graph = rng() % 3 == 0;
    }
    r.seconds = (cost_of(r.shape, truth) - (r.graph ? graph_saving : 0)) * (1 + noise(rng));
    r.t = t;
    t += r.seconds;
    log.push_back(r);
  }
  return log;
}

TEST(StepLog, EvaluationRecoversKnownCoefficients) {
  const StepCostCoefficients truth{24.8e-3, 68.2e-6, 4.79e-9, 340e-6, 39e-9};  // session 13's H200 fit
  const auto log = synthetic_log(truth, /*graph_saving=*/0, 800, 7);
  const StepLogReport rep = evaluate_step_log(log);
  EXPECT_EQ(rep.records, 800);
  const StepCostCoefficients& b = rep.batch;
  EXPECT_NEAR(b.base, truth.base, 0.10 * truth.base);
  EXPECT_NEAR(b.per_prefill_token, truth.per_prefill_token, 0.10 * truth.per_prefill_token);
  EXPECT_NEAR(b.per_prefill_pair, truth.per_prefill_pair, 0.10 * truth.per_prefill_pair);
  // Rows and KV tokens grow together (8-16 rows x 10k-20k each): their split is looser; the decode part of a
  // typical step, which the scheduler uses, is not.
  StepShape decodes;
  for (int d = 0; d < 12; ++d) decodes.add_chunk(15000, 1, 0);
  const double decode_part = cost_of(decodes, truth) - truth.base;
  EXPECT_NEAR(cost_of(decodes, b) - b.base, decode_part, 0.10 * decode_part);
  EXPECT_NEAR(b.per_decode_row, truth.per_decode_row, 0.5 * truth.per_decode_row);
  EXPECT_NEAR(b.per_decode_kv_token, truth.per_decode_kv_token, 0.25 * truth.per_decode_kv_token);

  EXPECT_EQ(rep.batch_decode_eager.n + rep.batch_decode_graph.n + rep.batch_with_prefill.n, 800);
  EXPECT_EQ(rep.batch_with_prefill.n, 100);
  for (const StepLogClassError* e : {&rep.batch_decode_eager, &rep.batch_decode_graph, &rep.batch_with_prefill}) {
    EXPECT_GT(e->n, 0);
    EXPECT_LT(e->mean_rel_error, 0.05);
    EXPECT_LT(e->median_rel_error, 0.05);
    EXPECT_GT(e->mean_rel_error, 0.001) << "2% noise cannot be fitted away";
  }
  // Online: predicted before each step once ready (16 steps, 4 with prefill: from step 25 on).
  const int64_t online_n = rep.online_decode_eager.n + rep.online_decode_graph.n + rep.online_with_prefill.n;
  EXPECT_EQ(online_n, 800 - 25);
  for (const StepLogClassError* e : {&rep.online_decode_eager, &rep.online_decode_graph, &rep.online_with_prefill})
    EXPECT_LT(e->median_rel_error, 0.05);
  EXPECT_NEAR(rep.online.base, truth.base, 0.25 * truth.base);
}

TEST(StepLog, EvaluationSeparatesGraphFromEagerDecodeSteps) {
  const StepCostCoefficients truth{24.8e-3, 68.2e-6, 4.79e-9, 340e-6, 39e-9};
  // A graph replay saves 12 ms of a ~40 ms decode step; the model has no feature for it.
  const StepLogReport rep = evaluate_step_log(synthetic_log(truth, /*graph_saving=*/12e-3, 800, 9));
  ASSERT_GT(rep.batch_decode_graph.n, 100);
  ASSERT_GT(rep.batch_decode_eager.n, 200);
  // The fit lands between the two kinds (about 11% over the eager steps, 34% under the graph ones here); the
  // prefill steps, whose cost the features express, stay within the noise.
  EXPECT_GT(rep.batch_decode_graph.mean_rel_error, 0.25) << "the graph steps' saving shows as their class's error";
  EXPECT_GT(rep.batch_decode_graph.mean_rel_error, 2 * rep.batch_decode_eager.mean_rel_error);
  EXPECT_GT(rep.online_decode_graph.mean_rel_error, 2 * rep.online_decode_eager.mean_rel_error);
  EXPECT_LT(rep.batch_with_prefill.mean_rel_error, 0.05);
}

TEST(StepLog, EmptyLogEvaluatesToThePrior) {
  const StepLogReport rep = evaluate_step_log({});
  EXPECT_EQ(rep.records, 0);
  EXPECT_EQ(rep.batch.base, StepCostOptions{}.prior.base);
  EXPECT_EQ(rep.batch_decode_eager.n, 0);
}

constexpr StepCostCoefficients kEngineTruth{2e-3, 6e-6, 2e-10, 1e-4, 4e-8};

struct Forwards {  // what LoggedCostModel saw, per forward in order (outlives the engine that owns the model)
  std::vector<StepShape> shapes;
  std::vector<int32_t> decode_seqs, prefill_chunks;
  std::vector<bool> graph;
};

// FakeModel whose forward advances a fake clock by a scripted cost, records each batch, and counts a "graph
// replay" for every batch of decodes only (as decode graphs serve them).
class LoggedCostModel final : public ForwardingExecutor {
 public:
  static constexpr int64_t kVocab = 97;
  LoggedCostModel(int64_t n_blocks, int64_t block_size, double* clock, Forwards* seen)
      : ForwardingExecutor(std::make_unique<testing::FakeModel>(n_blocks, block_size, kVocab)),
        clock_(clock), seen_(seen) {}
  Result<ExecOutput> execute(const model::ForwardBatch& batch) override {
    StepShape s;
    int32_t decodes = 0;
    for (const auto& span : batch.seqs) {
      s.add_chunk(span.kv_len - span.n_tokens, span.n_tokens, 0);
      decodes += span.n_tokens == 1;
    }
    const bool all_decodes = decodes == static_cast<int32_t>(batch.seqs.size());
    seen_->shapes.push_back(s);
    seen_->decode_seqs.push_back(decodes);
    seen_->prefill_chunks.push_back(static_cast<int32_t>(batch.seqs.size()) - decodes);
    seen_->graph.push_back(all_decodes);
    replays_ += all_decodes;
    *clock_ += cost_of(s, kEngineTruth);
    return inner_->execute(batch);
  }
  int64_t graph_replays() const override { return replays_; }

 private:
  double* clock_;
  Forwards* seen_;
  int64_t replays_ = 0;
};

TEST(StepLog, EngineWritesOneRecordPerStep) {
  const std::string path = temp_path("step_log_engine");
  double clock = 0;
  EngineConfig cfg;
  cfg.scheduler.block_size = 16;
  cfg.scheduler.max_num_batched_tokens = 64;
  cfg.scheduler.chunked_prefill_size = 48;  // prompts take several chunks, next to the others' decodes
  cfg.scheduler.enable_prefix_cache = false;
  cfg.n_blocks = 256;
  cfg.max_model_len = 1024;
  auto writer = StepLogWriter::open(path);
  ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
  cfg.step_log = std::move(*writer);
  Forwards seen;
  auto exec = std::make_unique<LoggedCostModel>(cfg.n_blocks, 16, &clock, &seen);
  int64_t steps = 0;
  {
    Engine engine(cfg, std::move(exec));
    engine.set_step_clock([&clock] { return clock; });
    std::mt19937 rng(3);
    for (int i = 0; i < 6; ++i) {
      RequestSpec spec;
      for (int k = 0; k < 30 + 40 * i; ++k) spec.prompt.push_back(1 + static_cast<int32_t>(rng() % 90));
      spec.sampling.temperature = 0.f;
      spec.sampling.max_tokens = 12;
      spec.sampling.ignore_eos = true;
      ASSERT_TRUE(engine.submit(spec, [](const TokenEvent&) {}).is_ok());
      for (int k = 0; k < 3; ++k) steps += engine.step() ? 1 : 0;
    }
    for (int guard = 0; !engine.idle() && guard < 1000; ++guard) steps += engine.step() ? 1 : 0;
    ASSERT_TRUE(engine.idle());
  }
  cfg.step_log.reset();  // the last owner: its destructor writes the buffer out
  auto got = read_step_log(path);
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  fs::remove(path);
  ASSERT_EQ(static_cast<int64_t>(got->size()), steps);
  ASSERT_EQ(seen.shapes.size(), got->size());

  StepCostModel replay;  // the engine's model, fed as the engine feeds it: the predictions must be its own
  double t = 0;
  int64_t with_prefill = 0, graph_steps = 0, predicted = 0;
  for (size_t i = 0; i < got->size(); ++i) {
    const StepLogRecord& r = (*got)[i];
    StepLogRecord want;
    want.t = t;
    want.seconds = cost_of(seen.shapes[i], kEngineTruth);
    want.shape = seen.shapes[i];
    want.graph = seen.graph[i];
    want.predicted = replay.ready() ? replay.predict(want.shape) : kNaN;
    want.decode_seqs = seen.decode_seqs[i];
    want.prefill_chunks = seen.prefill_chunks[i];
    expect_same_record(r, want, "step " + std::to_string(i));
    EXPECT_EQ(r.prefill_chunks > 0, r.shape.prefill_tokens > 0) << "step " << i;
    replay.observe(want.shape, want.seconds);
    t += want.seconds;
    with_prefill += r.prefill_chunks > 0;
    graph_steps += r.graph;
    predicted += !std::isnan(r.predicted);
  }
  EXPECT_GE(with_prefill, 6);
  EXPECT_GT(graph_steps, 0);
  EXPECT_GT(predicted, 0) << "the model became ready within the run, and its predictions were logged";
}

}  // namespace
}  // namespace mxserve::runtime
