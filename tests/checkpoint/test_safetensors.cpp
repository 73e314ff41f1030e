// Safetensors reading and writing (issue 4 item 4): what we write reads back, in each
// stored dtype; every malformed header is a UsageError naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "base/error.h"
#include "checkpoint/safetensors.h"

namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "omnitron_st_" + name;
}

// A file of the raw format: 8-byte little-endian length, header text, data bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes,
               uint64_t header_len_field = UINT64_MAX) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const uint64_t len = header_len_field == UINT64_MAX ? header.size() : header_len_field;
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(len >> (8 * i)));
  out << header;
  for (size_t i = 0; i < data_bytes; ++i) out.put(static_cast<char>(i));
}

std::vector<float> read_all(const omni::SafetensorsTensor& t) {
  std::vector<float> v(size_t(t.numel()));
  omni::read_as_f32(t, v.data());
  return v;
}

TEST(Safetensors, WrittenTensorsReadBackInEachDtype) {
  const std::vector<float> a = {1.0f, -2.5f, 3.14159265f, 1e-8f, 65504.0f, -0.0f};
  const std::vector<float> b = {0.1f, 0.2f, 0.3f};
  for (omni::DType dtype : {omni::DType::F32, omni::DType::BF16, omni::DType::F16}) {
    const std::string path = temp_path(std::string("roundtrip_") + omni::dtype_name(dtype));
    omni::write_safetensors(
        path,
        {{"layer.a", {2, 3}, [&](float* dst) { std::copy(a.begin(), a.end(), dst); }},
         {"b", {3}, [&](float* dst) { std::copy(b.begin(), b.end(), dst); }},
         {"empty", {0, 4}, [](float*) {}}},
        dtype, {{"format", "pt"}});
    EXPECT_FALSE(fs::exists(path + ".tmp"));
    const omni::SafetensorsFile f(path);
    ASSERT_EQ(f.tensors().size(), 3u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    const omni::SafetensorsTensor* ta = f.find("layer.a");
    ASSERT_NE(ta, nullptr);
    EXPECT_EQ(ta->dtype, dtype);
    EXPECT_EQ(ta->shape, (omni::Shape{2, 3}));
    EXPECT_EQ(f.find("empty")->numel(), 0);
    EXPECT_EQ(f.find("missing"), nullptr);
    // The data area starts 8-byte aligned, as Hugging Face writes it.
    std::ifstream in(path, std::ios::binary);
    uint64_t header_len = 0;
    in.read(reinterpret_cast<char*>(&header_len), 8);
    EXPECT_EQ(header_len % 8, 0u);
    // Each value comes back as the stored dtype rounds it (nearest, ties to even).
    const std::vector<float> got = read_all(*ta);
    for (size_t i = 0; i < a.size(); ++i) {
      float want = a[i];
      if (dtype == omni::DType::BF16) want = omni::bf16_to_f32(omni::f32_to_bf16(a[i]));
      if (dtype == omni::DType::F16) want = omni::f16_to_f32(omni::f32_to_f16(a[i]));
      EXPECT_EQ(got[i], want) << omni::dtype_name(dtype) << " element " << i;
    }
  }
}

TEST(Safetensors, ReadsUnalignedTensors) {
  // One F16 tensor of 3 values puts the next F32 tensor at an odd-of-4 offset (6).
  const std::string path = temp_path("unaligned");
  const std::string header = R"({"h":{"dtype":"F16","shape":[3],"data_offsets":[0,6]},)"
                             R"("f":{"dtype":"F32","shape":[1],"data_offsets":[6,10]}})";
  {
    std::ofstream out(path, std::ios::binary);
    const uint64_t len = header.size() + 1;  // 1 space: the data area itself is unaligned
    out.write(reinterpret_cast<const char*>(&len), 8);
    out << header << ' ';
    const uint16_t h[3] = {omni::f32_to_f16(1.5f), omni::f32_to_f16(-2.0f),
                           omni::f32_to_f16(0.25f)};
    out.write(reinterpret_cast<const char*>(h), 6);
    const float f = 7.75f;
    out.write(reinterpret_cast<const char*>(&f), 4);
  }
  const omni::SafetensorsFile file(path);
  EXPECT_EQ(read_all(*file.find("h")), (std::vector<float>{1.5f, -2.0f, 0.25f}));
  EXPECT_EQ(read_all(*file.find("f")), (std::vector<float>{7.75f}));
}

struct Corruption {
  const char* what;
  std::string header;
  size_t data_bytes;
  std::string expected;  // in the message, besides the file name
  uint64_t header_len_field = UINT64_MAX;
};

TEST(Safetensors, MalformedHeadersAreCleanErrors) {
  const std::string ok_a = R"("a":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]})";
  const std::string ok_b = R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]})";
  const std::vector<Corruption> cases = {
      {"shorter than the length field", "", 0, "too short", 0},
      {"length past the end", "{" + ok_a + "}", 16, "runs past the end", 1000},
      {"not JSON", "[1, 2]      ", 0, "not a JSON object"},
      {"broken JSON", "{" + ok_a + ",", 16, "malformed JSON"},
      {"entry not an object", R"({"a":[1,2]})", 0, "tensor a: its entry is not a JSON object"},
      {"unknown dtype", R"({"a":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})", 16,
       "tensor a: dtype I64 cannot be read"},
      {"no dtype", R"({"a":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor a: no \"dtype\""},
      {"no shape", R"({"a":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor a: no \"shape\""},
      {"negative dimension", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "tensor a: \"shape\" holds something other than sizes"},
      {"offsets reversed", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8,
       "tensor a: \"data_offsets\" is not [begin, end]"},
      {"size disagrees with shape", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8,
       "tensor a: data_offsets [0, 8] hold 8 bytes but shape [3] of F32 needs 12"},
      {"truncated data", "{" + ok_a + "," + ok_b + "}", 20,
       "tensor b: data_offsets [16, 24] run past the data area (20 bytes)"},
      {"overlap", "{" + ok_a + R"(,"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16,
       "tensor b (bytes 8..16) overlaps tensor a"},
      {"hole", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16,
       "bytes 0..8 of the data area, before tensor a, belong to no tensor"},
      {"extra bytes", "{" + ok_a + "}", 20, "extra bytes at the end"},
      {"duplicate name", "{" + ok_a + "," + ok_a + "}", 16, "tensor a is listed twice"},
      {"metadata not strings", R"({"__metadata__":{"format":1}})", 0,
       "__metadata__ entry 'format' is not a string"},
  };
  for (const Corruption& c : cases) {
    const std::string path = temp_path("corrupt");
    write_raw(path, c.header, c.data_bytes, c.header_len_field);
    if (c.header_len_field == 0) fs::resize_file(path, 5);
    try {
      omni::SafetensorsFile f(path);
      ADD_FAILURE() << c.what << ": no error";
    } catch (const omni::UsageError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find(c.expected), std::string::npos) << c.what << ": " << msg;
    }
  }
}

TEST(Safetensors, MissingFileIsAUsageError) {
  EXPECT_THROW(omni::SafetensorsFile(temp_path("does_not_exist")), omni::UsageError);
}

}  // namespace
