// Pipeline layer assignment against Megatron's documented examples and rules, and the
// pipeline schedules run through a simulated pipeline: every rank executes its op list in
// order, an op waits until the message it needs has been sent, sends never wait. The
// simulation checks that every layout finishes (no deadlock), runs each forward and
// backward exactly once, and keeps the activation memory Megatron's schedules promise.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "parallel/schedules.h"

namespace omni {
// Failures print ops as in the schedule figures ("B2.1") and ranges as [begin, end).
void PrintTo(const PipelineOp& op, std::ostream* os) {
  *os << (op.pass == PipelinePass::Forward ? 'F' : 'B') << op.microbatch << '.' << op.chunk;
}
void PrintTo(const LayerRange& r, std::ostream* os) {
  *os << '[' << r.begin << ", " << r.end << ')';
}
}  // namespace omni

namespace {

using omni::LayerRange;
using omni::PipelineOp;
using omni::PipelinePass;
using omni::PipelineSplit;

constexpr PipelinePass F = PipelinePass::Forward;
constexpr PipelinePass B = PipelinePass::Backward;

// The UsageError message `f` throws; a test failure when it throws nothing.
std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const omni::UsageError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no UsageError thrown";
  return "";
}

PipelineSplit split(int num_layers, int pp, int per_chunk = 0) {
  PipelineSplit s;
  s.num_layers = num_layers;
  s.pipeline_model_parallel_size = pp;
  s.num_layers_per_virtual_pipeline_stage = per_chunk;
  return s;
}

PipelineSplit uneven(int num_layers, int pp, std::optional<int> first, std::optional<int> last) {
  PipelineSplit s = split(num_layers, pp);
  s.decoder_first_pipeline_num_layers = first;
  s.decoder_last_pipeline_num_layers = last;
  return s;
}

std::vector<std::vector<LayerRange>> all_ranks(const PipelineSplit& s) {
  std::vector<std::vector<LayerRange>> out;
  for (int r = 0; r < s.pipeline_model_parallel_size; ++r)
    out.push_back(omni::pipeline_rank_layers(s, r));
  return out;
}

TEST(PipelineLayers, EvenSplitGivesEachRankAContiguousBlock) {
  EXPECT_EQ(all_ranks(split(8, 4)),
            (std::vector<std::vector<LayerRange>>{{{0, 2}}, {{2, 4}}, {{4, 6}}, {{6, 8}}}));
  EXPECT_EQ(omni::virtual_pipeline_size(split(8, 4)), 1);
}

// Megatron's docstring for the interleaved assignment: 8 layers on 2 stages.
TEST(PipelineLayers, InterleavedMatchesMegatronExample) {
  EXPECT_EQ(omni::virtual_pipeline_size(split(8, 2, 1)), 4);
  EXPECT_EQ(all_ranks(split(8, 2, 1)),
            (std::vector<std::vector<LayerRange>>{{{0, 1}, {2, 3}, {4, 5}, {6, 7}},
                                                  {{1, 2}, {3, 4}, {5, 6}, {7, 8}}}));
  EXPECT_EQ(omni::virtual_pipeline_size(split(8, 2, 2)), 2);
  EXPECT_EQ(all_ranks(split(8, 2, 2)),
            (std::vector<std::vector<LayerRange>>{{{0, 2}, {4, 6}}, {{2, 4}, {6, 8}}}));
}

// Virtual stage s = chunk * pp + rank holds the s-th block of layers, so walking the
// virtual stages in order walks every layer once, in order.
TEST(PipelineLayers, VirtualStagesCoverTheModelInOrder) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int vp = 1; vp <= 4; ++vp) {
      if (vp > 1 && pp == 1) continue;
      for (int per_chunk = 1; per_chunk <= 3; ++per_chunk) {
        const PipelineSplit s = split(pp * vp * per_chunk, pp, per_chunk);
        ASSERT_EQ(omni::virtual_pipeline_size(s), vp);
        const auto ranks = all_ranks(s);
        int next = 0;
        for (int c = 0; c < vp; ++c)
          for (int r = 0; r < pp; ++r) {
            ASSERT_EQ(ranks[r].size(), size_t(vp));
            EXPECT_EQ(ranks[r][c], (LayerRange{next, next + per_chunk}))
                << "pp " << pp << " vp " << vp << " rank " << r << " chunk " << c;
            next += per_chunk;
          }
      }
    }
}

// Like Megatron, one chunk per rank is the plain (non-interleaved) split.
TEST(PipelineLayers, OneChunkPerRankIsThePlainSplit) {
  EXPECT_EQ(omni::virtual_pipeline_size(split(8, 4, 2)), 1);
  EXPECT_EQ(all_ranks(split(8, 4, 2)), all_ranks(split(8, 4)));
  EXPECT_EQ(all_ranks(split(4, 1, 4)), all_ranks(split(4, 1)));
}

// Megatron's --decoder-first/last-pipeline-num-layers: the edge stages take the given
// counts, the other stages share the rest equally.
TEST(PipelineLayers, UnevenFirstAndLastStages) {
  EXPECT_EQ(all_ranks(uneven(10, 4, 1, 3)),
            (std::vector<std::vector<LayerRange>>{{{0, 1}}, {{1, 4}}, {{4, 7}}, {{7, 10}}}));
  EXPECT_EQ(all_ranks(uneven(7, 3, 1, std::nullopt)),
            (std::vector<std::vector<LayerRange>>{{{0, 1}}, {{1, 4}}, {{4, 7}}}));
  EXPECT_EQ(all_ranks(uneven(7, 3, std::nullopt, 5)),
            (std::vector<std::vector<LayerRange>>{{{0, 1}}, {{1, 2}}, {{2, 7}}}));
  EXPECT_EQ(all_ranks(uneven(5, 2, 2, 3)),
            (std::vector<std::vector<LayerRange>>{{{0, 2}}, {{2, 5}}}));
}

TEST(PipelineLayers, RejectsSplitsMegatronRejects) {
  const auto err = [](const PipelineSplit& s) {
    return usage_error([&] { omni::pipeline_rank_layers(s, 0); });
  };
  EXPECT_NE(err(split(6, 4))
                .find("--num-layers 6 is not divisible by "
                      "--pipeline-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(err(split(6, 4, 1))
                .find("--num-layers 6 is not divisible by "
                      "--pipeline-model-parallel-size 4"),
            std::string::npos);
  EXPECT_NE(err(split(8, 2, 3))
                .find("--num-layers-per-virtual-pipeline-stage 3 does not "
                      "divide the 4 layers of each pipeline stage"),
            std::string::npos);
  EXPECT_NE(err(split(8, 1, 2)).find("needs --pipeline-model-parallel-size 2 or more (got 1)"),
            std::string::npos);
  EXPECT_NE(err(split(8, 2, -1)).find("--num-layers-per-virtual-pipeline-stage must be positive"),
            std::string::npos);
  EXPECT_NE(err(split(0, 2)).find("--num-layers must be positive"), std::string::npos);
  PipelineSplit interleaved_uneven = split(8, 2, 2);
  interleaved_uneven.decoder_first_pipeline_num_layers = 2;
  EXPECT_NE(err(interleaved_uneven)
                .find("--num-layers-per-virtual-pipeline-stage cannot be combined with "
                      "--decoder-first-pipeline-num-layers"),
            std::string::npos);
  EXPECT_NE(err(uneven(8, 4, 0, std::nullopt))
                .find("--decoder-first-pipeline-num-layers must be positive (got 0)"),
            std::string::npos);
  EXPECT_NE(err(uneven(4, 3, 3, 2))
                .find("--decoder-first-pipeline-num-layers 3 and "
                      "--decoder-last-pipeline-num-layers 2 hold more than --num-layers 4"),
            std::string::npos);
  EXPECT_NE(err(uneven(10, 4, 1, 2))
                .find("layers left after --decoder-first-pipeline-num-layers 1 and "
                      "--decoder-last-pipeline-num-layers 2 (--num-layers 10) are not "
                      "divisible by the 2 other stages"),
            std::string::npos);
  EXPECT_NE(err(uneven(8, 2, 3, 3)).find("leaves 2 layers for the 0 other stages"),
            std::string::npos);
  EXPECT_NE(err(uneven(8, 1, 6, std::nullopt))
                .find("--num-layers 8 with --decoder-first-pipeline-num-layers 6 leaves 2 "
                      "layers for the 0 other stages"),
            std::string::npos);
  EXPECT_NE(err(uneven(8, 3, 4, 4)).find("leaves 0 layers for the 1 other stages"),
            std::string::npos);
  EXPECT_NE(err(uneven(8, 1, 4, 4))
                .find("together need --pipeline-model-parallel-size 2 or "
                      "more (got 1)"),
            std::string::npos);
}

// An op list written as in the schedule figures: "F3" is the forward of micro-batch 3,
// "B2.1" the backward of micro-batch 2 through chunk 1 (chunk 0 when left out).
std::vector<PipelineOp> ops(const std::string& text) {
  std::vector<PipelineOp> out;
  std::istringstream in(text);
  for (std::string word; in >> word;) {
    PipelineOp op{word[0] == 'F' ? F : B, std::stoi(word.substr(1)), 0};
    if (const size_t dot = word.find('.'); dot != std::string::npos)
      op.chunk = std::stoi(word.substr(dot + 1));
    out.push_back(op);
  }
  return out;
}

// Megatron's 1F1B on the first and last of 4 stages.
TEST(PipelineSchedule, OneFOneBWarmupSteadyCooldown) {
  EXPECT_EQ(omni::pipeline_schedule(4, 0, 8, 1),
            ops("F0 F1 F2  F3 B0 F4 B1 F5 B2 F6 B3 F7 B4  B5 B6 B7"));
  EXPECT_EQ(omni::pipeline_schedule(4, 3, 3, 1), ops("F0 B0 F1 B1 F2 B2"));
  // Fewer micro-batches than warm-up slots: all forwards, then all backwards.
  EXPECT_EQ(omni::pipeline_schedule(4, 0, 2, 1), ops("F0 F1 B0 B1"));
}

TEST(PipelineSchedule, NoPipeliningAlternatesForwardAndBackward) {
  EXPECT_EQ(omni::pipeline_schedule(1, 0, 3, 1), ops("F0 B0 F1 B1 F2 B2"));
}

// Interleaved 1F1B, 2 stages x 2 chunks, 4 micro-batches, rank 0: warm-up (2-0-1)*2 + 1*2 = 4
// forwards taking micro-batches 0,1 through chunk 0, then chunk 1; backwards in the same
// micro-batch order with chunk 1 first.
TEST(PipelineSchedule, InterleavedGroupsMicrobatchesByPipelineSize) {
  EXPECT_EQ(omni::pipeline_schedule(2, 0, 4, 2), ops("F0.0 F1.0 F0.1 F1.1  "
                                                     "F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0  "
                                                     "B2.1 B3.1 B2.0 B3.0"));
  // The last rank starts its steady state after the chunk-0 forwards of the first group.
  EXPECT_EQ(omni::pipeline_schedule(2, 1, 2, 2), ops("F0.0 F1.0  F0.1 B0.1 F1.1 B1.1  B0.0 B1.0"));
}

TEST(PipelineSchedule, InterleavedRejectsBadMicrobatchCounts) {
  const std::string msg = usage_error([] { omni::pipeline_schedule(4, 0, 6, 2); });
  EXPECT_NE(msg.find("--num-layers-per-virtual-pipeline-stage"), std::string::npos) << msg;
  EXPECT_NE(msg.find("= 6) to be a multiple of --pipeline-model-parallel-size 4"),
            std::string::npos)
      << msg;
  EXPECT_NE(usage_error([] {
              omni::pipeline_schedule(1, 0, 4, 2);
            }).find("needs --pipeline-model-parallel-size 2 or more (got 1)"),
            std::string::npos);
  EXPECT_THROW(omni::pipeline_schedule(4, 4, 8, 1), omni::InternalError);
}

// What running every rank's op list on a simulated pipeline produced.
struct PipelineRun {
  bool finished = true;
  std::string problem;              // the first broken rule, empty when none
  std::vector<int> peak_in_flight;  // per rank: most (micro-batch, chunk) forwards awaiting
                                    // their backward at once (activation memory)
};

// Virtual stage s = chunk * pp + rank. F(m, s) needs F(m, s-1)'s output; B(m, s) needs
// F(m, s) and B(m, s+1)'s gradient (the last stage's backward only its forward). A rank
// blocks on its next op until those have run; sends never block. Messages between two
// ranks are also checked to arrive in the order they were sent, per direction, so the
// executor may match them by (peer, pass) alone.
PipelineRun simulate(int pp, int vp, int m, bool forward_only = false) {
  const int stages = pp * vp;
  std::vector<std::vector<PipelineOp>> ops;
  for (int r = 0; r < pp; ++r) ops.push_back(omni::pipeline_schedule(pp, r, m, vp, forward_only));
  std::vector<std::vector<int>> forwards(m, std::vector<int>(stages)), backwards = forwards;
  std::vector<size_t> next(pp);
  std::vector<int> in_flight(pp);
  PipelineRun run;
  run.peak_in_flight.assign(pp, 0);
  // (sender, receiver, pass) -> (micro-batch, receiving stage) in send and receive order.
  using Channel = std::tuple<int, int, PipelinePass>;
  std::map<Channel, std::vector<std::pair<int, int>>> sent, received;
  const auto fail = [&](const std::string& what) {
    if (run.problem.empty()) run.problem = what;
  };
  const auto ready = [&](const PipelineOp& op, int s) {
    if (op.pass == F) return s == 0 || forwards[op.microbatch][s - 1] > 0;
    return forwards[op.microbatch][s] > 0 &&
           (s == stages - 1 || backwards[op.microbatch][s + 1] > 0);
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r)
      while (next[r] < ops[r].size()) {
        const PipelineOp& op = ops[r][next[r]];
        if (op.microbatch < 0 || op.microbatch >= m || op.chunk < 0 || op.chunk >= vp) {
          fail("rank " + std::to_string(r) + " has an op out of range");
          return run;
        }
        const int s = op.chunk * pp + r;
        if (!ready(op, s)) break;
        const int from = op.pass == F ? s - 1 : s + 1, to = op.pass == F ? s + 1 : s - 1;
        if (from >= 0 && from < stages && from % pp != r)
          received[{from % pp, r, op.pass}].push_back({op.microbatch, s});
        if (to >= 0 && to < stages && to % pp != r)
          sent[{r, to % pp, op.pass}].push_back({op.microbatch, to});
        if (op.pass == F) {
          ++forwards[op.microbatch][s];
          run.peak_in_flight[r] = std::max(run.peak_in_flight[r], ++in_flight[r]);
        } else {
          ++backwards[op.microbatch][s];
          --in_flight[r];
        }
        ++next[r];
        progress = true;
      }
  }
  for (int r = 0; r < pp; ++r)
    if (next[r] < ops[r].size()) {
      run.finished = false;
      fail("deadlock: rank " + std::to_string(r) + " stuck at op " + std::to_string(next[r]));
    }
  for (int mb = 0; mb < m; ++mb)
    for (int s = 0; s < stages; ++s)
      if (forwards[mb][s] != 1 || backwards[mb][s] != (forward_only ? 0 : 1))
        fail("micro-batch " + std::to_string(mb) + " stage " + std::to_string(s) + " ran " +
             std::to_string(forwards[mb][s]) + " forwards and " + std::to_string(backwards[mb][s]) +
             " backwards");
  if (sent != received) fail("messages received out of the order they were sent");
  return run;
}

std::string layout(int pp, int vp, int m) {
  return "pp " + std::to_string(pp) + " vp " + std::to_string(vp) + " micro-batches " +
         std::to_string(m);
}

TEST(PipelineSchedule, OneFOneBFinishesWithMinOfStagesAheadAndMicrobatchesInFlight) {
  for (int pp = 1; pp <= 8; ++pp)
    for (int m = 1; m <= 3 * pp; ++m) {
      const PipelineRun run = simulate(pp, 1, m);
      ASSERT_TRUE(run.finished && run.problem.empty()) << layout(pp, 1, m) << ": " << run.problem;
      for (int r = 0; r < pp; ++r)
        EXPECT_EQ(run.peak_in_flight[r], std::min(pp - r, m)) << layout(pp, 1, m) << " rank " << r;
    }
}

// Interleaving holds more chunk activations: rank r keeps warm-up + 1 of them, warm-up being
// (pp - r - 1) * 2 + (vp - 1) * pp, at most all M * vp.
TEST(PipelineSchedule, InterleavedFinishesWithWarmupPlusOneChunksInFlight) {
  for (int pp = 2; pp <= 8; ++pp)
    for (int vp = 2; vp <= 4; ++vp)
      for (int m = pp; m <= 3 * pp; m += pp) {
        const PipelineRun run = simulate(pp, vp, m);
        ASSERT_TRUE(run.finished && run.problem.empty())
            << layout(pp, vp, m) << ": " << run.problem;
        for (int r = 0; r < pp; ++r) {
          const int warmup = (pp - r - 1) * 2 + (vp - 1) * pp;
          EXPECT_EQ(run.peak_in_flight[r], std::min(warmup + 1, m * vp))
              << layout(pp, vp, m) << " rank " << r;
        }
      }
}

// The figures for the 4-stage, 2-chunk, 8-micro-batch layout, in chunk activations (each
// half a stage's layers): 11, 9, 7, 5 -- i.e. 5.5, 4.5, 3.5, 2.5 stages' worth against
// 1F1B's 4, 3, 2, 1.
TEST(PipelineSchedule, InterleavedActivationPeaksForFourStagesTwoChunks) {
  EXPECT_EQ(simulate(4, 2, 8).peak_in_flight, (std::vector<int>{11, 9, 7, 5}));
  EXPECT_EQ(simulate(4, 1, 8).peak_in_flight, (std::vector<int>{4, 3, 2, 1}));
}

// Evaluation runs the same forwards alone; they too reach every stage without a deadlock.
TEST(PipelineSchedule, ForwardOnlyRunsEachForwardOnce) {
  EXPECT_EQ(omni::pipeline_schedule(2, 1, 2, 2, true), ops("F0.0 F1.0 F0.1 F1.1"));
  EXPECT_EQ(omni::pipeline_schedule(4, 0, 3, 1, true), ops("F0 F1 F2"));
  for (int pp = 1; pp <= 8; ++pp)
    for (int vp = 1; vp <= (pp == 1 ? 1 : 4); ++vp)
      for (int m = vp == 1 ? 1 : pp; m <= 3 * pp; m += vp == 1 ? 1 : pp) {
        const PipelineRun run = simulate(pp, vp, m, true);
        EXPECT_TRUE(run.finished && run.problem.empty())
            << layout(pp, vp, m) << ": " << run.problem;
      }
}

}  // namespace
