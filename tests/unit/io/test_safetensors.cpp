#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"

namespace mxserve::io {
namespace {

namespace fs = std::filesystem;

Tensor filled(DType dt, Shape shape, uint8_t byte) {
  Tensor t = Tensor::empty(dt, std::move(shape));
  std::memset(t.raw(), byte, t.nbytes());
  return t;
}

// An image with a hand-written header and `data_len` data bytes.
std::string image_with_header(const std::string& json, size_t data_len) {
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + json + std::string(data_len, '\x01');
}

Status validate(const std::string& image) {
  return SafetensorsFile::validate_image(reinterpret_cast<const uint8_t*>(image.data()), image.size(), "x.safetensors")
      .status();
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("mxserve_io_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST(Safetensors, RoundTrip) {
  NamedTensors ts = {{"a", filled(DType::kBF16, {2, 3}, 7)}, {"b.c", filled(DType::kF32, {4}, 9)},
                     {"packed", filled(DType::kFP4E2M1, {2, 4}, 0x21)}};
  const std::string img = safetensors_image(ts, {{"format", "pt"}});
  std::map<std::string, std::string> meta;
  auto infos = SafetensorsFile::validate_image(reinterpret_cast<const uint8_t*>(img.data()), img.size(), "t", &meta);
  ASSERT_TRUE(infos.is_ok()) << infos.status().to_string();
  ASSERT_EQ(infos->size(), 3u);
  EXPECT_EQ((*infos)[0].shape, (Shape{2, 3}));
  EXPECT_EQ((*infos)[2].dtype, DType::kFP4E2M1);
  EXPECT_EQ((*infos)[2].end - (*infos)[2].begin, 4u);
  EXPECT_EQ(meta.at("format"), "pt");
}

struct BadCase {
  const char* what;
  std::string header;
  size_t data_len;
  const char* must_mention;
};

TEST(Safetensors, EveryCorruptionNamesTheCulprit) {
  const std::vector<BadCase> cases = {
      {"not json", "{not json", 0, "not valid JSON"},
      {"array header", "[1,2]", 0, "start with '{'"},
      {"unknown dtype", R"({"w":{"dtype":"Q4","shape":[2],"data_offsets":[0,2]}})", 2, "'w': unknown dtype 'Q4'"},
      {"size mismatch", R"({"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,6]}})", 6, "'w': shape [2, 2] x bf16 needs 8"},
      {"out of bounds", R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})", 4, "beyond the data section"},
      {"reversed offsets", R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", 4, "end before begin"},
      {"negative dim", R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", 0, "non-negative integer"},
      {"overflow", R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,0]}})", 0, "overflows"},
      {"overlap", R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})", 6, "overlap"},
      {"odd fp4", R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2, "odd number"},
      {"missing shape", R"({"w":{"dtype":"U8","data_offsets":[0,0]}})", 0, "'shape'"},
      {"extra field", R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}})", 1, "unknown field 'x'"},
      {"bad metadata", R"({"__metadata__":{"k":1}})", 0, "__metadata__"},
  };
  for (const auto& c : cases) {
    Status s = validate(image_with_header(c.header, c.data_len));
    ASSERT_FALSE(s.is_ok()) << c.what;
    EXPECT_NE(s.message().find("x.safetensors"), std::string::npos) << c.what << ": " << s.message();
    EXPECT_NE(s.message().find(c.must_mention), std::string::npos) << c.what << ": " << s.message();
  }
}

TEST(Safetensors, TruncatedFiles) {
  EXPECT_NE(validate("abc").message().find("8-byte header length"), std::string::npos);
  std::string img = safetensors_image({{"w", filled(DType::kF32, {16}, 1)}});
  // Cut inside the header, then inside the data.
  EXPECT_NE(validate(img.substr(0, 20)).message().find("runs past the end"), std::string::npos);
  EXPECT_NE(validate(img.substr(0, img.size() - 4)).message().find("beyond the data section"), std::string::npos);
  std::string huge = img;
  huge[7] = 0x7f;  // header length ~ 2^62
  EXPECT_NE(validate(huge).message().find("100 MiB"), std::string::npos);
}

TEST_F(TempDir, ShardedCheckpointThroughIndex) {
  ASSERT_TRUE(write_safetensors((dir_ / "s1.safetensors").string(), {{"a", filled(DType::kBF16, {2}, 1)}}).is_ok());
  ASSERT_TRUE(write_safetensors((dir_ / "s2.safetensors").string(),
                                {{"b", filled(DType::kF32, {3}, 2)}, {"c", filled(DType::kU8, {5}, 3)}})
                  .is_ok());
  std::ofstream(dir_ / "model.safetensors.index.json")
      << R"({"metadata":{},"weight_map":{"a":"s1.safetensors","b":"s2.safetensors","c":"s2.safetensors"}})";
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_TRUE(ck.is_ok()) << ck.status().to_string();
  EXPECT_EQ((*ck)->names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ((*ck)->num_files(), 2u);
  Tensor c = (*ck)->view(*(*ck)->find("c"));
  EXPECT_EQ(c.data<uint8_t>()[4], 3);
}

TEST_F(TempDir, ShardedCheckpointErrors) {
  ASSERT_TRUE(write_safetensors((dir_ / "s1.safetensors").string(),
                                {{"a", filled(DType::kBF16, {2}, 1)}, {"stray", filled(DType::kU8, {1}, 1)}})
                  .is_ok());
  auto write_index = [&](const char* text) {
    std::ofstream(dir_ / "model.safetensors.index.json", std::ios::trunc) << text;
  };
  write_index(R"({"weight_map":{"a":"s1.safetensors","z":"s1.safetensors"}})");
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("'z' is mapped to s1.safetensors, which does not hold it"), std::string::npos)
      << ck.status().message();

  write_index(R"({"weight_map":{"a":"s1.safetensors"}})");
  ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("'stray' is not mapped"), std::string::npos) << ck.status().message();

  write_index(R"({"weight_map":{"a":"../etc/passwd"}})");
  ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("not a plain file name"), std::string::npos);

  write_index(R"({"weight_map":{"a":"missing.safetensors"}})");
  ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("missing.safetensors"), std::string::npos);

  write_index(R"({"weight_map":[]})");
  ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("weight_map"), std::string::npos);
}

TEST_F(TempDir, EmptyDirectoryIsAClearError) {
  auto ck = Checkpoint::open(dir_.string());
  ASSERT_FALSE(ck.is_ok());
  EXPECT_NE(ck.status().message().find("no model.safetensors"), std::string::npos);
}

}  // namespace
}  // namespace mxserve::io
