// --overlap-grad-reduce on two data-parallel ranks, seen in --profile's trace: with it, the
// gradient buckets' collectives start during the last micro-batch's backward pass; without it
// (Megatron's default), all of them start after the backward pass. The losses are the same.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>

#include <ctime>
#include <filesystem>
#include <string>
#include <vector>

#include "base/json.h"
#include "mpirun.h"

namespace {

namespace fs = std::filesystem;

struct Span {
  std::string name;
  double begin, end;
  int iteration;
};

std::vector<Span> read_spans(const std::string& path) {
  const omni::json::Value doc = omni::json::parse(read_text(path), path);
  std::vector<Span> out;
  for (const omni::json::Value& e : doc.find("traceEvents")->arr())
    if (e.find("ph")->str() == "X")
      out.push_back({e.find("name")->str(), e.find("ts")->num(),
                     e.find("ts")->num() + e.find("dur")->num(),
                     int(e.find("args")->find("iteration")->num())});
  return out;
}

// Where each bucket's collective started: "backward" (inside a backward-compute span) or
// "after" (inside all-grads-sync).
std::vector<std::string> bucket_starts(const std::vector<Span>& spans) {
  std::vector<std::string> where;
  for (const Span& b : spans) {
    if (b.name != "grad-bucket-start") continue;
    std::string in = "elsewhere";
    for (const Span& s : spans)
      if (s.iteration == b.iteration && s.begin <= b.begin && b.end <= s.end) {
        if (s.name == "backward-compute") in = "backward";
        if (s.name == "all-grads-sync") in = "after";
      }
    where.push_back(in);
  }
  return where;
}

std::string losses(const std::string& output) {
  std::string out;
  for (size_t at = output.find("lm loss: "); at != std::string::npos;
       at = output.find("lm loss: ", at + 1))
    out += output.substr(at, 21) + "\n";
  return out;
}

MpiRun train(const std::string& dir, const std::string& extra) {
  fs::remove_all(dir);
  return mpirun(2, std::string(OMNITRON_BINARY) +
                       " train --mock-data --vocab-size 64 --num-layers 2 --hidden-size 16 "
                       "--num-attention-heads 2 --seq-length 8 --micro-batch-size 1 "
                       "--global-batch-size 4 --train-iters 3 --eval-iters 0 --log-interval 1 "
                       "--max-new-tokens 0 --ddp-bucket-size 600 --profile "
                       "--profile-step-start 1 --profile-step-end 2 --tensorboard-dir " +
                       dir + "/tb " + extra);
}

TEST(OverlapGradReduce, StartsBucketsDuringTheBackwardPassWithTheSameLosses) {
  const std::string base = ::testing::TempDir();
  const MpiRun plain = train(base + "overlap_off", "");
  ASSERT_EQ(plain.exit_code, 0) << plain.output;
  const MpiRun overlap = train(base + "overlap_on", "--overlap-grad-reduce");
  ASSERT_EQ(overlap.exit_code, 0) << overlap.output;
  EXPECT_EQ(losses(plain.output), losses(overlap.output));
  EXPECT_FALSE(losses(plain.output).empty()) << plain.output;
  for (int rank : {0, 1}) {
    SCOPED_TRACE(rank);
    const std::string file = "/torch_profile/rank-" + std::to_string(rank) + ".json";
    const std::vector<std::string> off = bucket_starts(read_spans(base + "overlap_off" + file));
    const std::vector<std::string> on = bucket_starts(read_spans(base + "overlap_on" + file));
    ASSERT_GE(off.size(), 2u) << "--ddp-bucket-size 600 makes several buckets";
    EXPECT_EQ(off, std::vector<std::string>(off.size(), "after"));
    // The tied embedding's bucket closes at the layers' start with it (its rows go sparse).
    ASSERT_EQ(on.size(), off.size() + 1);
    // The embedding's bucket, then the last layers', before the backward ends.
    EXPECT_EQ(on[0], "backward");
    EXPECT_EQ(on[1], "backward");
  }
}

TEST(ProfileRanks, OnlyTheListedRanksWriteTracesAndTheirClocksLineUp) {
  const std::string dir = ::testing::TempDir() + "profile_ranks";
  const MpiRun r = train(dir, "--profile-ranks 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("profile: iterations 2-2 of rank 1 as Chrome traces in"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir + "/torch_profile/rank-0.json"));
  const std::vector<Span> spans = read_spans(dir + "/torch_profile/rank-1.json");
  ASSERT_FALSE(spans.empty());
  // Unix time in microseconds: within a day of now.
  const double now_us = 1e6 * double(std::time(nullptr));
  EXPECT_NEAR(spans.front().begin, now_us, 86400e6);
}

}  // namespace

#endif  // OMNITRON_MPI_CHECK
