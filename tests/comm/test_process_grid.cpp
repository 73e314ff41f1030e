// Process groups against lists derived by hand from Megatron's rank order (tp-cp-ep-dp-pp,
// leftmost fastest; tp-cp-ep-pp-dp with --use-tp-pp-dp-mapping), and the grid's
// communicators against those lists.
#include <gtest/gtest.h>

#include <vector>

#include "base/error.h"
#include "comm/local_communicator.h"
#include "comm/process_grid.h"

namespace {

using omni::ParallelLayout;
using omni::rank_groups;
using Groups = std::vector<std::vector<int>>;

TEST(ProcessGroups, World16Tp2Pp2AsInMegatronsDocstring) {
  const ParallelLayout l{.tp = 2, .pp = 2};
  EXPECT_EQ(rank_groups(16, l, "tp"),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(rank_groups(16, l, "dp"),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(rank_groups(16, l, "pp"),
            (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(rank_groups(16, l, "dp-cp"), rank_groups(16, l, "dp"));
  EXPECT_EQ(rank_groups(16, l, "tp-pp"),
            (Groups{{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
}

TEST(ProcessGroups, ContextParallelSitsBetweenTensorAndDataParallel) {
  // rank = tp + 2 cp + 4 dp
  const ParallelLayout l{.tp = 2, .cp = 2};
  EXPECT_EQ(rank_groups(8, l, "tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(rank_groups(8, l, "cp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(8, l, "dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(rank_groups(8, l, "dp-cp"), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(rank_groups(8, l, "pp"), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
}

TEST(ProcessGroups, TpPpDpMappingPutsPipelineBeforeData) {
  // rank = tp + 2 pp + 4 dp
  const ParallelLayout l{.tp = 2, .pp = 2, .tp_pp_dp_mapping = true};
  EXPECT_EQ(rank_groups(8, l, "tp"), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(rank_groups(8, l, "pp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(rank_groups(8, l, "dp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  // The default order on the same layout: rank = tp + 2 dp + 4 pp.
  const ParallelLayout d{.tp = 2, .pp = 2};
  EXPECT_EQ(rank_groups(8, d, "pp"), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(rank_groups(8, d, "dp"), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
}

TEST(ProcessGroups, ExpertParallelMustDivideDataParallel) {
  EXPECT_EQ(omni::data_parallel_size(8, {.tp = 2, .ep = 2}), 4);
  EXPECT_THROW(omni::data_parallel_size(8, {.tp = 2, .ep = 3}), omni::UsageError);
}

TEST(ProcessGroups, AWorldTheLayoutDoesNotDivideNamesTheFlags) {
  try {
    omni::data_parallel_size(6, {.tp = 4});
    FAIL();
  } catch (const omni::UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("world of 6 ranks"), std::string::npos) << msg;
    EXPECT_NE(msg.find("--tensor-model-parallel-size (4)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("= 4"), std::string::npos) << msg;
  }
  EXPECT_THROW(omni::data_parallel_size(4, {.pp = 0}), omni::UsageError);
}

// The world ranks of a communicator, in its rank order.
std::vector<int> members(omni::Communicator& c, int world_rank) {
  std::vector<double> all(c.size());
  const double me = world_rank;
  c.all_gather(all.data(), &me, 1);
  return std::vector<int>(all.begin(), all.end());
}

std::vector<int> group_of(const Groups& groups, int rank) {
  for (const auto& g : groups)
    for (int r : g)
      if (r == rank) return g;
  return {};
}

TEST(ProcessGrid, CommunicatorsMatchTheGroupLists) {
  for (const ParallelLayout l : {ParallelLayout{.tp = 2, .cp = 2}, ParallelLayout{.tp = 2, .pp = 2},
                                 ParallelLayout{.tp = 2, .pp = 2, .tp_pp_dp_mapping = true}}) {
    omni::run_ranks(8, [&](omni::Communicator& world) {
      const int me = world.rank();
      omni::ProcessGrid grid(world, l);
      EXPECT_EQ(members(grid.tp(), me), group_of(rank_groups(8, l, "tp"), me));
      EXPECT_EQ(members(grid.cp(), me), group_of(rank_groups(8, l, "cp"), me));
      EXPECT_EQ(members(grid.dp(), me), group_of(rank_groups(8, l, "dp"), me));
      EXPECT_EQ(members(grid.pp(), me), group_of(rank_groups(8, l, "pp"), me));
      EXPECT_EQ(members(grid.dp_cp(), me), group_of(rank_groups(8, l, "dp-cp"), me));
      EXPECT_EQ(members(grid.model_parallel(), me), group_of(rank_groups(8, l, "tp-pp"), me));
      EXPECT_EQ(grid.dp_size(), 8 / (l.tp * l.cp * l.pp));
      EXPECT_EQ(grid.tp_rank(), me % 2);
    });
  }
}

TEST(ProcessGrid, CoordinatesAndStages) {
  // TP 2, PP 2 on 8 ranks: rank = tp + 2 dp + 4 pp.
  omni::run_ranks(8, [](omni::Communicator& world) {
    omni::ProcessGrid grid(world, {.tp = 2, .pp = 2});
    const int r = world.rank();
    EXPECT_EQ(grid.tp_rank(), r % 2);
    EXPECT_EQ(grid.dp_rank(), (r / 2) % 2);
    EXPECT_EQ(grid.pp_rank(), r / 4);
    EXPECT_EQ(grid.cp_rank(), 0);
    EXPECT_EQ(grid.is_first_stage(), r < 4);
    EXPECT_EQ(grid.is_last_stage(), r >= 4);
    EXPECT_EQ(grid.tp_size(), 2);
    EXPECT_EQ(grid.pp_size(), 2);
    EXPECT_EQ(grid.dp_size(), 2);
  });
}

TEST(ProcessGrid, EmbeddingGroupJoinsThePipelineEnds) {
  // TP 2, PP 4 on 8 ranks: pipelines [0,2,4,6] and [1,3,5,7].
  omni::run_ranks(8, [](omni::Communicator& world) {
    omni::ProcessGrid grid(world, {.tp = 2, .pp = 4});
    const int r = world.rank();
    const std::vector<int> got = members(grid.embedding(), r);
    if (r == 0 || r == 6)
      EXPECT_EQ(got, (std::vector<int>{0, 6}));
    else if (r == 1 || r == 7)
      EXPECT_EQ(got, (std::vector<int>{1, 7}));
    else
      EXPECT_EQ(got, std::vector<int>{r});
  });
  omni::run_ranks(2, [](omni::Communicator& world) {
    omni::ProcessGrid grid(world, {});
    EXPECT_EQ(members(grid.embedding(), world.rank()), std::vector<int>{world.rank()});
    EXPECT_EQ(grid.dp_size(), 2);
  });
}

}  // namespace

// The expert grid with its own tensor-parallel size against Megatron-Core's RankGenerator
// (fixtures/expert_grid_groups.py writes the lists; checked there against parallel_state.py),
// and the grid's expert communicators against those lists.
struct ExpertGridCase {
  int world, tp, cp, ep, pp, etp;
  bool mapping;
  std::vector<Groups> groups;  // tp (of size etp), ep, edp, pp, tp-ep-pp, tp-ep
};
const std::vector<ExpertGridCase>& expert_grid_cases() {
  static const std::vector<ExpertGridCase> cases = {
#include "fixtures/expert_grid_groups.inc"
  };
  return cases;
}
ParallelLayout layout_of(const ExpertGridCase& c) {
  return {
      .tp = c.tp, .cp = c.cp, .ep = c.ep, .pp = c.pp, .etp = c.etp, .tp_pp_dp_mapping = c.mapping};
}

TEST(ProcessGroups, ExpertGridOfItsOwnTensorParallelSizeAsMegatrons) {
  const char* kinds[] = {"tp", "ep", "edp", "pp", "tp-ep-pp", "tp-ep"};
  for (const ExpertGridCase& c : expert_grid_cases())
    for (int k = 0; k < 6; ++k)
      EXPECT_EQ(omni::expert_rank_groups(c.world, layout_of(c), kinds[k]), c.groups[k])
          << "world " << c.world << " tp " << c.tp << " cp " << c.cp << " ep " << c.ep << " pp "
          << c.pp << " etp " << c.etp << (c.mapping ? " mapped" : "") << ": " << kinds[k];
}

TEST(ProcessGrid, ExpertCommunicatorsMatchTheGroupLists) {
  for (const ExpertGridCase& c : expert_grid_cases()) {
    const ParallelLayout l = layout_of(c);
    omni::run_ranks(c.world, [&](omni::Communicator& world) {
      const int me = world.rank();
      omni::ProcessGrid grid(world, l);
      EXPECT_EQ(members(grid.expert_tp(), me), group_of(c.groups[0], me));
      EXPECT_EQ(members(grid.ep(), me), group_of(c.groups[1], me));
      EXPECT_EQ(members(grid.expert_dp(), me), group_of(c.groups[2], me));
      EXPECT_EQ(members(grid.expert_model_parallel(), me), group_of(c.groups[4], me));
      EXPECT_EQ(members(grid.tp_cp(), me), group_of(rank_groups(c.world, l, "tp-cp"), me));
      EXPECT_EQ(grid.own_expert_tp(), c.etp != c.tp);
      // The allgather dispatcher's group under ETP > TP (made only then).
      if (c.etp > c.tp)
        EXPECT_EQ(members(*grid.expert_tp_ep(), me), group_of(c.groups[5], me));
      else
        EXPECT_EQ(grid.expert_tp_ep(), nullptr);
    });
  }
}

TEST(ProcessGroups, TheExpertGridMustFitTheWorldAndKeepThePipelines) {
  // etp ep pp = 6 does not divide 8 (tp cp pp = 2 does).
  try {
    omni::data_parallel_size(8, {.tp = 2, .ep = 3, .etp = 1});
    FAIL();
  } catch (const omni::UsageError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("--expert-tensor-parallel-size (1) x --expert-model-parallel-size (3)"),
              std::string::npos)
        << msg;
  }
  // TP 2, ETP 1 fits 2 ranks with EP 2 (Megatron's most used case), which tp ep pp would not.
  EXPECT_EQ(omni::data_parallel_size(2, {.tp = 2, .ep = 2, .etp = 1}), 1);
  EXPECT_THROW(omni::data_parallel_size(4, {.tp = 2, .etp = -1}), omni::UsageError);
  // --use-tp-pp-dp-mapping with PP 2 and etp ep (2) != tp cp (4): other pipeline groups.
  omni::run_ranks(8, [](omni::Communicator& world) {
    EXPECT_THROW(
        omni::ProcessGrid(world, {.tp = 4, .ep = 2, .pp = 2, .etp = 1, .tp_pp_dp_mapping = true}),
        omni::UsageError);
  });
}
