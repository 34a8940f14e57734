// SafetensorsStreamWriter: a file written tensor by tensor reads back like one written at once, and
// any deviation from the plan (wrong name, shape, dtype, a missing or extra tensor) is reported.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "io/safetensors.h"
#include "quant/stream_writer.h"

namespace mxserve::quant {
namespace {

namespace fs = std::filesystem;

std::string tmp(const std::string& tag) {
  return (fs::temp_directory_path() / ("mxserve_sw_" + std::to_string(::getpid()) + "_" + tag)).string();
}

TEST(StreamWriter, RoundTripAndPlanViolations) {
  const std::string path = tmp("ok.safetensors");
  Tensor a = Tensor::zeros(DType::kU8, {3, 5});
  Tensor b = Tensor::zeros(DType::kF32, {2});
  a.data<uint8_t>()[7] = 42;
  b.data<float>()[1] = 1.5f;
  std::vector<PlannedTensor> plan = {{"a", DType::kU8, {3, 5}}, {"b", DType::kF32, {2}}};
  {
    auto w = SafetensorsStreamWriter::create(path, plan, {{"format", "pt"}});
    ASSERT_TRUE(w.is_ok());
    ASSERT_TRUE((*w)->append("a", a).is_ok());
    ASSERT_TRUE((*w)->append("b", b).is_ok());
    ASSERT_TRUE((*w)->finish().is_ok());
  }
  auto f = io::SafetensorsFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ((*f)->view(*(*f)->find("a")).data<uint8_t>()[7], 42);
  EXPECT_EQ((*f)->view(*(*f)->find("b")).data<float>()[1], 1.5f);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");

  auto w = SafetensorsStreamWriter::create(tmp("bad.safetensors"), plan, {});
  ASSERT_TRUE(w.is_ok());
  Status wrong = (*w)->append("b", b);  // out of order
  ASSERT_FALSE(wrong.is_ok());
  EXPECT_NE(wrong.message().find("planned 'a'"), std::string::npos) << wrong.message();
  EXPECT_FALSE((*w)->append("a", Tensor::zeros(DType::kU8, {5, 3})).is_ok());  // shape
  ASSERT_TRUE((*w)->append("a", a).is_ok());
  Status missing = (*w)->finish();
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.message().find("1 planned tensors were not written"), std::string::npos) << missing.message();
  fs::remove(path);
  fs::remove(tmp("bad.safetensors"));
}

}  // namespace
}  // namespace mxserve::quant
