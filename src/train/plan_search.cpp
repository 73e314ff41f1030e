// `omnitron plan --search`: every layout of the GPUs that the model can take, fastest first.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "base/error.h"
#include "train/plan.h"

namespace omni {

namespace {

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i)
    if (n % i == 0) d.push_back(i);
  return d;
}

// Each of the CP attention kinds with each recompute setting the search tries.
std::vector<std::pair<std::string, const char*>> with_recompute(
    const std::vector<std::string>& cp_comms) {
  std::vector<std::pair<std::string, const char*>> v;
  for (const std::string& c : cp_comms)
    for (const char* r : {"", "full"}) v.emplace_back(c, r);
  return v;
}

}  // namespace

PlanSearch search_plans(const TransformerConfig& c, const PlanLayout& base,
                        const PlanDevice& device, int top, bool keep_ep, bool keep_etp,
                        bool keep_cp_comm) {
  PlanSearch out;
  // Expert parallelism: base.ep when the user gave it (or the model has no experts), else every
  // divisor of the experts count that the layout's ranks can take (ETP = TP: a divisor of DP,
  // the expert-parallel group carved out of the data-parallel ranks; ETP < TP: of
  // gpus / (ETP x PP), the group taking tensor-parallel ranks too).
  const bool vary_ep = !keep_ep && c.num_moe_experts > 0;
  out.searched_ep = vary_ep;
  // Expert tensor parallelism: base.etp when the user gave it, else TP's, 1 (Megatron's most
  // used MoE layout, whole experts on each rank) under TP > 1, and twice TP where that fits a
  // node (the experts' rows gathered over two dense tensor-parallel groups' ranks): the sizes
  // training builds (expert_tensor_parallel_built), with SP as the search sets it under TP > 1.
  const bool vary_etp = !keep_etp && c.num_moe_experts > 0;
  auto etps = [&](int tp) {
    if (!vary_etp) return std::vector<int>{base.etp};
    std::vector<int> e = {0};
    if (tp > 1) e.push_back(1);
    if (2 * tp <= device.ranks_per_node) e.push_back(2 * tp);
    return e;
  };
  // Context parallelism's attention: the ring and, where the heads split over TP x CP (make_plan
  // refuses the rest), Ulysses; base.cp_comm_type alone when the user gave it.
  auto cp_comms = [&](int cp) {
    if (keep_cp_comm || cp == 1) return std::vector<std::string>{base.cp_comm_type};
    return std::vector<std::string>{"p2p", "a2a"};
  };
  const int gpus = base.gpus;
  double least = -1;
  for (int tp : divisors(gpus)) {
    // Tensor parallelism stays within a node, and must split the heads and the MLP.
    if (tp > device.ranks_per_node || c.query_groups() % tp || c.ffn_size() % tp) continue;
    // MoE models too: their experts' and shared expert's widths split over TP with SP (as
    // Megatron requires for MoE under TP); make_plan refuses what the MoE layer cannot split.
    for (int cp : divisors(gpus / tp)) {
      if (cp > 8 || (cp > 1 && c.seq_length % (2 * cp))) continue;
      for (int pp : divisors(gpus / (tp * cp))) {
        if (pp > c.num_layers) continue;
        // Layers that do not divide among the stages (DeepSeek-V3's 61) split unevenly, as
        // --decoder-first/last-pipeline-num-layers do: the middle stages the most layers that
        // leave at least one to each edge stage, the rest shared by the first and last.
        int first = 0, last = 0;
        if (c.num_layers % pp) {
          const int middle = pp > 2 ? (c.num_layers - 2) / (pp - 2) : 0;
          const int rest = c.num_layers - (pp - 2) * middle;
          first = rest - rest / 2, last = rest / 2;
          if (pp > 2 && first > middle + 1) continue;  // edge stages far above the rest
        }
        const int dp = gpus / (tp * cp * pp);
        for (int mb : {1, 2, 4, 8}) {
          if (base.global_batch % (mb * dp)) continue;
          const int m = base.global_batch / (mb * dp);
          for (int vp : {1, 2, 4}) {
            if (vp > 1 && (pp == 1 || c.num_layers % (pp * vp) || m % pp)) continue;
            for (int etp : etps(tp)) {
              const int experts_tp = etp > 0 ? etp : tp;
              out.searched_etp = out.searched_etp || (vary_etp && experts_tp != tp);
              for (int ep : vary_ep ? divisors(c.num_moe_experts) : std::vector<int>{base.ep}) {
                // Training's world rule (data_parallel_size): with ETP = TP, TP x CP x EP x PP
                // divides the GPUs (EP divides DP); else the experts' grid ETP x EP x PP does.
                if (experts_tp != tp && gpus % (experts_tp * pp)) continue;
                if (vary_ep && (experts_tp == tp ? dp : gpus / (experts_tp * pp)) % ep) continue;
                for (const auto& [cp_comm, recompute] : with_recompute(cp_comms(cp))) {
                  PlanLayout l = base;
                  l.cp_comm_type = cp_comm;
                  l.tp = tp, l.cp = cp, l.pp = pp, l.dp = dp, l.vp = vp, l.micro_batch = mb;
                  l.ep = ep, l.etp = etp;
                  l.sequence_parallel = tp > 1;
                  l.distributed_optimizer =
                      dp * cp > 1 || (c.num_moe_experts > 0 && l.expert_dp() > 1);
                  l.recompute = recompute, l.recompute_method = "uniform";
                  l.recompute_num_layers = *recompute ? 1 : 0;
                  l.first_stage_layers = first, l.last_stage_layers = last;
                  Plan p;
                  try {
                    p = make_plan(c, l, device);
                  } catch (const UsageError&) {
                    continue;  // a layout the model cannot take
                  }
                  ++out.tried;
                  out.searched_cp_comm = out.searched_cp_comm || l.ulysses();
                  if (least < 0 || p.memory_bytes() < least)
                    least = p.memory_bytes(), out.smallest = p;
                  if (!p.fits()) {
                    ++out.too_big;
                    continue;
                  }
                  out.fitting.push_back(std::move(p));
                }
              }
            }
          }
        }
      }
    }
  }
  std::stable_sort(out.fitting.begin(), out.fitting.end(), [](const Plan& a, const Plan& b) {
    return a.step_seconds() < b.step_seconds();
  });
  if (int(out.fitting.size()) > top) out.fitting.resize(top);
  return out;
}

}  // namespace omni
