#include "comm/process_grid.h"

#include <sstream>

#include "base/error.h"

namespace omni {

namespace {

struct Dim {
  const char* name;
  int size;
};

// The dense layers' dimensions, leftmost varying fastest.
std::vector<Dim> ordered_dims(int world_size, const ParallelLayout& l) {
  const int dp = data_parallel_size(world_size, l);
  if (l.tp_pp_dp_mapping) return {{"tp", l.tp}, {"cp", l.cp}, {"pp", l.pp}, {"dp", dp}};
  return {{"tp", l.tp}, {"cp", l.cp}, {"dp", dp}, {"pp", l.pp}};
}

// The expert layers' dimensions (Megatron's expert RankGenerator: expert tensor parallel =
// etp, no cp, expert data parallel = world / (etp ep pp)).
std::vector<Dim> expert_dims(int world_size, const ParallelLayout& l) {
  data_parallel_size(world_size, l);  // the checks
  const int etp = l.expert_tp(), edp = world_size / (etp * l.ep * l.pp);
  if (l.tp_pp_dp_mapping) return {{"tp", etp}, {"ep", l.ep}, {"pp", l.pp}, {"edp", edp}};
  return {{"tp", etp}, {"ep", l.ep}, {"edp", edp}, {"pp", l.pp}};
}

std::vector<std::vector<int>> groups_of(int world_size, const std::vector<Dim>& order,
                                        const std::string& dims);

}  // namespace

int data_parallel_size(int world_size, const ParallelLayout& l) {
  const std::pair<const char*, int> flags[] = {{"--tensor-model-parallel-size", l.tp},
                                               {"--context-parallel-size", l.cp},
                                               {"--expert-model-parallel-size", l.ep},
                                               {"--pipeline-model-parallel-size", l.pp}};
  for (const auto& [flag, size] : flags)
    OMNI_REQUIRE(size >= 1, flag, " must be at least 1 (got ", size, ")");
  const int etp = l.expert_tp();
  OMNI_REQUIRE(l.etp >= 0, "--expert-tensor-parallel-size must be at least 1 (got ", l.etp, ")");
  if (etp != l.tp) {  // Megatron's two grids: each must divide the world
    const int dense = l.tp * l.cp * l.pp, expert = etp * l.ep * l.pp;
    OMNI_REQUIRE(world_size % dense == 0, "the world of ", world_size,
                 " ranks is not divisible by --tensor-model-parallel-size (", l.tp,
                 ") x --context-parallel-size (", l.cp, ") x --pipeline-model-parallel-size (",
                 l.pp, ") = ", dense);
    OMNI_REQUIRE(world_size % expert == 0, "the world of ", world_size,
                 " ranks is not divisible by --expert-tensor-parallel-size (", etp,
                 ") x --expert-model-parallel-size (", l.ep, ") x --pipeline-model-parallel-size (",
                 l.pp, ") = ", expert,
                 "; the experts' data parallelism takes the ranks that remain");
    return world_size / dense;
  }
  const int model = l.tp * l.cp * l.ep * l.pp;
  OMNI_REQUIRE(world_size % model == 0, "the world of ", world_size,
               " ranks is not divisible by --tensor-model-parallel-size (", l.tp,
               ") x --context-parallel-size (", l.cp, ") x --expert-model-parallel-size (", l.ep,
               ") x --pipeline-model-parallel-size (", l.pp, ") = ", model,
               "; data parallelism takes the ranks that remain, so the product must divide the "
               "number of ranks");
  return world_size / (l.tp * l.cp * l.pp);
}

std::vector<std::vector<int>> rank_groups(int world_size, const ParallelLayout& layout,
                                          const std::string& dims) {
  return groups_of(world_size, ordered_dims(world_size, layout), dims);
}

std::vector<std::vector<int>> expert_rank_groups(int world_size, const ParallelLayout& layout,
                                                 const std::string& dims) {
  return groups_of(world_size, expert_dims(world_size, layout), dims);
}

namespace {
std::vector<std::vector<int>> groups_of(int world_size, const std::vector<Dim>& order,
                                        const std::string& dims) {
  std::vector<bool> in_group(order.size(), false);
  std::stringstream tokens(dims);
  for (std::string token; std::getline(tokens, token, '-');) {
    size_t d = 0;
    while (d < order.size() && token != order[d].name) ++d;
    OMNI_CHECK(d < order.size() && !in_group[d], "[process grid] bad group kind '", dims,
               "' (dimensions of the grid joined by '-', each once)");
    in_group[d] = true;
  }
  // A rank's coordinates in mixed radix; the group index counts over the dimensions outside
  // the group and the position over those inside, leftmost fastest in both.
  int group_size = 1;
  for (size_t d = 0; d < order.size(); ++d)
    if (in_group[d]) group_size *= order[d].size;
  std::vector<std::vector<int>> groups(world_size / group_size, std::vector<int>(group_size));
  for (int rank = 0; rank < world_size; ++rank) {
    int rest = rank, group = 0, position = 0, group_stride = 1, position_stride = 1;
    for (size_t d = 0; d < order.size(); ++d) {
      const int coord = rest % order[d].size;
      rest /= order[d].size;
      if (in_group[d]) {
        position += coord * position_stride;
        position_stride *= order[d].size;
      } else {
        group += coord * group_stride;
        group_stride *= order[d].size;
      }
    }
    groups[group][position] = rank;
  }
  return groups;
}
}  // namespace

ProcessGrid::ProcessGrid(Communicator& world, const ParallelLayout& layout)
    : world_(&world), layout_(layout) {
  const int n = world.size(), me = world.rank();
  auto split = [&](const char* dims, const char* name, bool expert = false) {
    const auto groups = expert ? expert_rank_groups(n, layout, dims) : rank_groups(n, layout, dims);
    for (size_t g = 0; g < groups.size(); ++g)
      for (size_t i = 0; i < groups[g].size(); ++i)
        if (groups[g][i] == me) return world.split(static_cast<int>(g), static_cast<int>(i), name);
    throw InternalError("[process grid] rank " + std::to_string(me) + " is in no group");
  };
  tp_ = split("tp", "tp");
  cp_ = split("cp", "cp");
  dp_ = split("dp", "dp");
  pp_ = split("pp", "pp");
  dp_cp_ = split("dp-cp", "dp_cp");
  mp_ = split("tp-pp", "mp");
  tp_cp_ = split("tp-cp", "tp_cp");
  // Megatron's assertion: the expert grid keeps the dense pipeline stages.
  OMNI_REQUIRE(expert_rank_groups(n, layout, "pp") == rank_groups(n, layout, "pp"),
               "--expert-tensor-parallel-size (", layout.expert_tp(),
               ") x --expert-model-parallel-size (", layout.ep,
               ") gives the experts other pipeline groups than the dense layers' "
               "(--use-tp-pp-dp-mapping with pipeline parallelism needs their product to be "
               "--tensor-model-parallel-size x --context-parallel-size, ",
               layout.tp * layout.cp, ")");
  ep_ = split("ep", "ep", true);
  expert_dp_ = split("edp", "expert_dp", true);
  expert_tp_ = split("tp", "expert_tp", true);
  if (layout.expert_tp() > layout.tp) expert_tp_ep_ = split("tp-ep", "expert_tp_ep", true);
  expert_mp_ = split("tp-ep-pp", "expert_mp", true);
  // Embedding groups: the ends of each pipeline; every other rank is alone.
  const auto pipelines = rank_groups(n, layout, "pp");
  int color = static_cast<int>(pipelines.size()) + me;
  for (size_t g = 0; g < pipelines.size(); ++g)
    if (pipelines[g].front() == me || pipelines[g].back() == me) color = static_cast<int>(g);
  embedding_ = world.split(color, me, "embedding");
}

}  // namespace omni
