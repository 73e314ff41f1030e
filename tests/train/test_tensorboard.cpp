// TensorBoard event files (TFRecord framing, masked CRC-32C, Event/Summary protos) read back
// by two readers that share no code with the writer (event_file_reader.h): a hand-rolled one
// here, and a Node.js one built on SheetJS's CRC-32C and protobuf.js.
#include <gtest/gtest.h>
#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "base/crc32c.h"
#include "base/error.h"
#include "base/json.h"
#include "cli/process.h"
#include "event_file_reader.h"
#include "train/tensorboard.h"

namespace {

namespace fs = std::filesystem;

TEST(Crc32c, MatchesTheKnownAnswers) {
  EXPECT_EQ(omni::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(omni::crc32c(""), 0u);
  // RFC 3720 (iSCSI) appendix B.4: 32 bytes of zeros, of ones, and ascending 0..31.
  EXPECT_EQ(omni::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(omni::crc32c(std::string(32, '\xFF')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(char(i));
  EXPECT_EQ(omni::crc32c(ascending), 0x46DD794Eu);
}

TEST(Crc32c, AgreesWithABitwiseCrcAndContinuesAcrossCalls) {
  std::mt19937 rng(7);
  std::string bytes(1000, '\0');
  for (char& c : bytes) c = char(rng());
  EXPECT_EQ(omni::crc32c(bytes), event_file::bitwise_crc32c(bytes));
  EXPECT_EQ(omni::crc32c(bytes.substr(300), omni::crc32c(bytes.substr(0, 300))),
            omni::crc32c(bytes));
}

// A fresh directory under the test temp dir.
std::string fresh_dir(const std::string& name) {
  const fs::path dir = fs::path(::testing::TempDir()) / name;
  fs::remove_all(dir);
  return dir.string();
}

// Three scalars on two tags, closed (flushed) on return.
std::string write_sample(const std::string& dir) {
  omni::TensorBoardWriter w(dir);
  w.add_scalar("lm loss", 5.25, 1);
  w.add_scalar("lm loss", 4.125, 2);
  w.add_scalar("learning-rate", 3e-4, 2);
  w.flush();
  return w.path();
}

TEST(TensorBoard, FileIsNamedAsPyTorchSummaryWriterNamesIt) {
  const std::string dir = fresh_dir("tb_name");
  const fs::path path = write_sample(dir);
  EXPECT_EQ(path.parent_path(), fs::path(dir));
  const std::string name = path.filename().string();
  ASSERT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  const std::string seconds = name.substr(20, 10);
  EXPECT_EQ(seconds.find_first_not_of("0123456789"), std::string::npos) << name;
  const std::string pid = '.' + std::to_string(getpid());
  EXPECT_NE(name.find(pid + '.'), std::string::npos) << name;
  // A second writer in the same second gets a file of its own.
  omni::TensorBoardWriter second(dir);
  EXPECT_NE(second.path(), path.string());
}

TEST(TensorBoard, HandRolledReaderDecodesEveryRecordWithItsCrcs) {
  const auto events = event_file::read_event_file(write_sample(fresh_dir("tb_hand")));
  ASSERT_EQ(events.size(), 4u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_TRUE(events[0].scalars.empty());
  EXPECT_EQ(event_file::series(events, "lm loss"),
            (std::vector<std::pair<int64_t, float>>{{1, 5.25f}, {2, 4.125f}}));
  EXPECT_EQ(event_file::series(events, "learning-rate"),
            (std::vector<std::pair<int64_t, float>>{{2, 3e-4f}}));
  const double now = double(std::time(nullptr));
  for (const auto& e : events) EXPECT_NEAR(e.wall_time, now, 60.0);
}

TEST(TensorBoard, NodeReaderDecodesTheFileWithProtobufJsAndChecksTheCrcs) {
  const auto [code, out] = event_file::run_node_reader(write_sample(fresh_dir("tb_node")));
  ASSERT_EQ(code, 0) << out;
  std::istringstream lines(out);
  std::vector<omni::json::Value> events;
  for (std::string line; std::getline(lines, line);)
    events.push_back(omni::json::parse(line, "read_tfevents.js output"));
  ASSERT_EQ(events.size(), 4u) << out;
  EXPECT_EQ(events[0].find("file_version")->str(), "brain.Event:2");
  const auto check = [&](size_t i, int64_t step, const std::string& tag, float value) {
    SCOPED_TRACE(i);
    EXPECT_EQ(events[i].find("step")->num(), double(step));
    const auto& values = events[i].find("values")->arr();
    ASSERT_EQ(values.size(), 1u);
    EXPECT_EQ(values[0].find("tag")->str(), tag);
    EXPECT_EQ(float(values[0].find("simple_value")->num()), value);
  };
  check(1, 1, "lm loss", 5.25f);
  check(2, 2, "lm loss", 4.125f);
  check(3, 2, "learning-rate", 3e-4f);
}

// The file with one byte changed (XOR 0x20) at `offset`, written next to it.
std::string corrupted_copy(const std::string& path, size_t offset) {
  std::string bytes = event_file::read_bytes(path);
  bytes.at(offset) ^= 0x20;
  const std::string copy = path + ".corrupt";
  std::ofstream(copy, std::ios::binary) << bytes;
  return copy;
}

// Offset of record `n` (records are 8 + 4 + length + 4 bytes).
size_t record_offset(const std::string& path, int n) {
  const std::string bytes = event_file::read_bytes(path);
  size_t pos = 0;
  for (int i = 0; i < n; ++i) pos += 16 + event_file::little_endian<uint64_t>(bytes.substr(pos, 8));
  return pos;
}

void expect_both_readers_reject(const std::string& path, const std::string& why) {
  try {
    event_file::read_event_file(path);
    ADD_FAILURE() << "hand-rolled reader accepted " << path;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
  }
  const auto [code, out] = event_file::run_node_reader(path);
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find(why), std::string::npos) << out;
}

TEST(TensorBoard, ACorruptedTagByteFailsTheDataCrcInBothReaders) {
  const std::string path = write_sample(fresh_dir("tb_corrupt_data"));
  // Inside record 2's data, where its tag "lm loss" is.
  const size_t at = record_offset(path, 2) + 12 + 20;
  expect_both_readers_reject(corrupted_copy(path, at), "data CRC mismatch");
}

TEST(TensorBoard, ACorruptedLengthFailsTheLengthCrcInBothReaders) {
  const std::string path = write_sample(fresh_dir("tb_corrupt_length"));
  expect_both_readers_reject(corrupted_copy(path, record_offset(path, 1)), "length CRC mismatch");
}

TEST(TensorBoard, ACorruptedStoredCrcIsCaughtToo) {
  const std::string path = write_sample(fresh_dir("tb_corrupt_crc"));
  // The last 4 bytes of the file: record 3's data CRC.
  expect_both_readers_reject(corrupted_copy(path, fs::file_size(path) - 1), "data CRC mismatch");
}

TEST(TensorBoard, ATruncatedFileIsReportedByBothReaders) {
  const std::string path = write_sample(fresh_dir("tb_truncated"));
  const std::string copy = path + ".truncated";
  fs::copy_file(path, copy);
  fs::resize_file(copy, fs::file_size(path) - 3);
  expect_both_readers_reject(copy, "truncated");
}

TEST(TensorBoard, AnUncreatableDirectoryIsAUsageErrorNamingIt) {
  const std::string file = ::testing::TempDir() + "tb_plain_file";
  std::ofstream(file) << "x";
  try {
    omni::TensorBoardWriter w(file + "/runs");
    FAIL() << "no error";
  } catch (const omni::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--tensorboard-dir"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
  }
}

}  // namespace

namespace {

TEST(TensorBoard, TrainWithTensorboardDirWritesMegatronsScalarsBothReadersAccept) {
  const std::string dir = fresh_dir("tb_train");
  auto [code, out] = run_omnitron(
      "train --mock-data --vocab-size 40 --num-layers 1 --hidden-size 16 "
      "--num-attention-heads 2 --seq-length 8 --micro-batch-size 2 --train-iters 6 "
      "--log-interval 2 --eval-iters 1 --eval-interval 3 --no-progress --max-new-tokens 0 "
      "--log-throughput --tensorboard-dir " +
      dir);
  ASSERT_EQ(code, 0) << out;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.push_back(entry.path());
  ASSERT_EQ(files.size(), 1u);
  EXPECT_NE(out.find("tensorboard: " + files[0].string()), std::string::npos) << out;
  const auto events = event_file::read_event_file(files[0].string());
  const auto steps = [&](const std::string& tag) {
    std::vector<int64_t> s;
    for (const auto& [step, value] : event_file::series(events, tag)) s.push_back(step);
    return s;
  };
  // Logged lines at 2, 4 and 6; validation at 3 and 6; each step's scalars up to step 6.
  EXPECT_EQ(steps("iteration-time"), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(steps("throughput"), (std::vector<int64_t>{2, 4, 6}));
  EXPECT_EQ(steps("lm loss validation"), (std::vector<int64_t>{3, 6}));
  for (const char* tag : {"lm loss", "learning-rate", "grad-norm", "loss-scale", "batch-size"}) {
    SCOPED_TRACE(tag);
    ASSERT_FALSE(steps(tag).empty());
    EXPECT_EQ(steps(tag).back(), 6);
    EXPECT_EQ(steps(std::string(tag) + " vs samples").back(), 12);  // 2 samples a step
  }
  const auto [node_code, node_out] = event_file::run_node_reader(files[0].string());
  EXPECT_EQ(node_code, 0) << node_out;
  EXPECT_NE(node_out.find("\"tag\":\"lm loss validation\""), std::string::npos) << node_out;
}

}  // namespace
