// Golden fixtures: every committed fixture passes verify_fixture on the CPU backend, and the checker
// fails when the model or the reference is perturbed (a test that cannot fail is a defect).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <algorithm>
#include <filesystem>
#include <functional>

#include "backend/backend.h"
#include "cli/fixture.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace mxserve {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> fixture_dirs() {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(fs::path(MXSERVE_SOURCE_DIR) / "tests/fixtures"))
    if (fs::exists(e.path() / "reference.safetensors")) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// Copies a fixture, letting `edit` rewrite named tensors of one of its files.
fs::path mutated_copy(const fs::path& src, const std::string& file,
                      const std::function<void(const std::string&, Tensor&)>& edit) {
  const fs::path dst = fs::temp_directory_path() / ("mxserve_fx_" + std::to_string(::getpid()) + "_" +
                                                    src.filename().string() + "_" + file);
  fs::remove_all(dst);
  fs::create_directories(dst);
  for (const auto& e : fs::directory_iterator(src)) fs::copy_file(e.path(), dst / e.path().filename());
  auto f = io::SafetensorsFile::open((src / file).string());
  EXPECT_TRUE(f.is_ok());
  io::NamedTensors out;
  for (const auto& info : (*f)->tensors()) {
    Tensor view = (*f)->view(info);
    Tensor copy = Tensor::empty(info.dtype, info.shape);
    std::memcpy(copy.raw(), view.raw(), view.nbytes());
    edit(info.name, copy);
    out.emplace_back(info.name, copy);
  }
  EXPECT_TRUE(io::write_safetensors((dst / file).string(), out).is_ok());
  return dst;
}

int failures(const fs::path& dir) {
  auto be = backend::make_cpu_backend();
  auto report = cli::verify_fixture(dir.string(), *be, cli::FixtureOptions{});
  EXPECT_TRUE(report.is_ok()) << report.status().to_string();
  return report.is_ok() ? report->failures : -1;
}

TEST(Fixtures, AtLeastTwoCommitted) { EXPECT_GE(fixture_dirs().size(), 2u); }

TEST(Fixtures, EveryFixturePassesOnCpu) {
  for (const auto& dir : fixture_dirs()) EXPECT_EQ(failures(dir), 0) << dir;
}

TEST(Fixtures, PerturbedReferenceLogitsFail) {
  const fs::path src = fixture_dirs().front();
  const fs::path dst = mutated_copy(src, "reference.safetensors", [](const std::string& name, Tensor& t) {
    if (name == "case.2.logits")
      for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] *= 1.001f;  // rel error 1e-3 > 1e-4
  });
  EXPECT_GT(failures(dst), 0);
  fs::remove_all(dst);
}

TEST(Fixtures, PerturbedRouterBiasFails) {
  // A wrong correction bias only changes which experts are selected: the checker must notice.
  for (const auto& src : fixture_dirs()) {
    const fs::path dst = mutated_copy(src, "model.safetensors", [](const std::string& name, Tensor& t) {
      if (name.find("e_score_correction_bias") != std::string::npos && t.dtype() == DType::kF32)
        for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = -t.data<float>()[i];
    });
    EXPECT_GT(failures(dst), 0) << src;
    fs::remove_all(dst);
  }
}

TEST(Fixtures, PerturbedMtpWeightFails) {
  for (const auto& src : fixture_dirs()) {
    const fs::path dst = mutated_copy(src, "model.safetensors", [](const std::string& name, Tensor& t) {
      if (name.find(".hnorm.weight") != std::string::npos)  // only the MTP layer has hnorm
        std::memset(t.raw(), 0, t.nbytes() / 2);
    });
    EXPECT_GT(failures(dst), 0) << src;
    fs::remove_all(dst);
  }
}

}  // namespace
}  // namespace mxserve
