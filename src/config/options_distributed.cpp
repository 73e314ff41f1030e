// Megatron's distributed group: the parallel layout, and the device it runs on.
#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>

#include "config/option_rows.h"

namespace omni::option_rows {

void add_distributed_options(std::vector<OptionDef>& t) {
  const std::string W = "weights and device";
  t.push_back(text("--device", "auto|cpu|cuda|hip", W, "where to train (auto: a GPU when present)",
                   [](Options& o) -> std::string& { return o.device; }));
  t.push_back(OptionDef{
      "--attention-backend", "auto|flash|fused|unfused|local", W,
      "attention implementation: flash (omnitron's kernel), fused (cuDNN, NVIDIA), unfused "
      "(the softmax reference; local is the same), auto (fused where cuDNN takes the shape, "
      "else flash); the CPU has one",
      [](Options& o, const std::string& v) {
        if (v != "auto" && v != "flash" && v != "fused" && v != "unfused" && v != "local")
          throw UsageError("--attention-backend: '" + v +
                           "' is not one of auto, flash, fused, unfused, local");
        o.attention_backend = v;
      },
      [](const Options& o) { return o.attention_backend; }});

  const std::string PAR = "parallelism";
  t.push_back(number<int>("--tensor-model-parallel-size", "N", PAR,
                          "ranks that split each layer's matmuls (Megatron's TP)",
                          [](Options& o) -> int& { return o.tensor_model_parallel_size; }));
  t.push_back(number<int>("--pipeline-model-parallel-size", "N", PAR,
                          "pipeline stages, each holding a slice of the layers",
                          [](Options& o) -> int& { return o.pipeline_model_parallel_size; }));
  t.push_back(
      number<int>("--num-virtual-stages-per-pipeline-rank", "N", PAR,
                  "interleaved schedule: N chunks of layers per stage",
                  [](Options& o) -> int& { return o.num_virtual_stages_per_pipeline_rank; }));
  t.push_back(
      number<int>("--num-layers-per-virtual-pipeline-stage", "N", PAR,
                  "interleaved schedule: each stage holds chunks of N layers",
                  [](Options& o) -> int& { return o.num_layers_per_virtual_pipeline_stage; }));
  t.push_back(number<int>("--decoder-first-pipeline-num-layers", "N", PAR,
                          "layers of the first pipeline stage (uneven split)",
                          [](Options& o) -> int& { return o.decoder_first_pipeline_num_layers; }));
  t.push_back(number<int>("--decoder-last-pipeline-num-layers", "N", PAR,
                          "layers of the last pipeline stage (uneven split)",
                          [](Options& o) -> int& { return o.decoder_last_pipeline_num_layers; }));
  t.push_back(number<int>("--context-parallel-size", "N", PAR,
                          "ranks that split each sequence (causal, load-balanced chunks)",
                          [](Options& o) -> int& { return o.context_parallel_size; }));
  OptionDef cp_comm{
      "--cp-comm-type",
      "p2p|a2a|allgather...",
      PAR,
      "how context-parallel ranks attend: p2p (the ring of keys and values; allgather has "
      "the same result) or a2a (DeepSpeed-Ulysses: all-to-all trading the sequence split for "
      "a split of the heads); one value, or one per layer, all the same",
      [](Options& o, const std::string& v) {
        std::istringstream words(v);
        std::string w, first;
        while (words >> w) {
          OMNI_REQUIRE(w == "p2p" || w == "a2a" || w == "allgather" || w == "a2a+p2p",
                       "--cp-comm-type: '", w, "' is not one of p2p, a2a, allgather, a2a+p2p");
          OMNI_REQUIRE(w != "a2a+p2p",
                       "--cp-comm-type a2a+p2p (Ulysses inside rings, with "
                       "--hierarchical-context-parallel-sizes) is not built; use a2a or p2p");
          if (first.empty()) first = w;
          OMNI_REQUIRE(w == first, "--cp-comm-type ", v,
                       ": one kind for every layer is built (got ", first, " and ", w, ")");
        }
        OMNI_REQUIRE(!first.empty(), "--cp-comm-type needs a value: p2p, a2a or allgather");
        o.cp_comm_type = first == "a2a" ? "a2a" : "p2p";
      },
      [](const Options& o) { return o.cp_comm_type; }};
  cp_comm.many = true;
  t.push_back(cp_comm);
  t.push_back(OptionDef{
      "--ds-sequence-parallel-size",
      "N",
      PAR,
      "Megatron-DeepSpeed's Ulysses degree: --context-parallel-size N with --cp-comm-type a2a",
      [](Options& o, const std::string& v) {
        o.context_parallel_size = parse_number<int>("--ds-sequence-parallel-size", v);
        o.cp_comm_type = "a2a";
      },
      {}});
  t.push_back(toggle("--sequence-parallel", PAR,
                     "shard norm regions along the sequence across tensor-parallel ranks",
                     [](Options& o) -> bool& { return o.sequence_parallel; }));
  t.push_back(toggle("--use-distributed-optimizer", PAR,
                     "shard optimizer states and master weights across data-parallel ranks",
                     [](Options& o) -> bool& { return o.use_distributed_optimizer; }));
  // ZeRO (DeepSpeed's zero_optimization.stage; Megatron-DeepSpeed's --zero-stage): 1 is the
  // distributed optimizer; 2 also keeps only the rank's shard of the gradients, 3 also of the
  // parameters (parallel/zero_sharding.h).
  t.push_back(OptionDef{"--zero-stage", "0|1|2|3", PAR,
                        "ZeRO sharding over the data-parallel ranks: 1 optimizer states "
                        "(--use-distributed-optimizer), 2 also gradients, 3 also parameters",
                        [](Options& o, const std::string& v) {
                          if (v != "0" && v != "1" && v != "2" && v != "3")
                            throw UsageError("--zero-stage: '" + v + "' is not one of 0, 1, 2, 3");
                          o.zero_stage = v[0] - '0';
                          if (o.zero_stage > 0) o.use_distributed_optimizer = true;
                        },
                        [](const Options& o) { return std::to_string(o.zero_stage); }});
  // Torch FSDP2 (resharding after forward, its default) and Megatron-FSDP (its default
  // optim_grads_params strategy) shard states, gradients and parameters: ZeRO stage 3 where
  // it is built for the other settings, else the distributed optimizer (finalize_zero).
  for (const char* flag : {"--use-torch-fsdp2", "--use-megatron-fsdp"}) {
    const std::string f = flag;
    t.push_back(OptionDef{f, "", PAR,
                          "fully sharded data parallelism: --zero-stage 3 (where stage 3 is "
                          "not built for the other settings, stage 1, with a note)",
                          [f](Options& o, const std::string&) {
                            o.fsdp_flag = f;
                            o.use_distributed_optimizer = true;
                          },
                          nullptr});
  }
  t.push_back(OptionDef{
      "--data-parallel-sharding-strategy", "no_shard|optim|optim_grads|optim_grads_params", PAR,
      "with --use-megatron-fsdp, what is sharded: the ZeRO stage 0 (trained as 1: the same "
      "results), 1, 2 or 3 (Megatron's default)",
      [](Options& o, const std::string& v) {
        const char* names[] = {"no_shard", "optim", "optim_grads", "optim_grads_params"};
        const auto at = std::find(std::begin(names), std::end(names), v);
        if (at == std::end(names))
          throw UsageError("--data-parallel-sharding-strategy: '" + v +
                           "' is not one of no_shard, optim, optim_grads, optim_grads_params");
        o.fsdp_sharding_stage = int(at - std::begin(names));
      },
      nullptr});
  t.push_back(toggle("--use-tp-pp-dp-mapping", PAR,
                     "rank order tp-cp-ep-pp-dp (default tp-cp-ep-dp-pp)",
                     [](Options& o) -> bool& { return o.use_tp_pp_dp_mapping; }));
  t.push_back(
      number<double>("--ddp-bucket-size", "N", PAR,
                     "gradient elements per data-parallel all-reduce bucket (0: an eighth of the "
                     "gradients, within [1M, max(40M, 1M x data-parallel size)])",
                     [](Options& o) -> double& { return o.ddp_bucket_size; }));
  t.push_back(toggle("--overlap-grad-reduce", PAR,
                     "start each gradient bucket's data-parallel reduction as soon as the "
                     "backward pass has finished its gradients (default: all after the backward)",
                     [](Options& o) -> bool& { return o.overlap_grad_reduce; }));
  t.push_back(toggle("--overlap-param-gather", PAR,
                     "accepted as Megatron's (needs --use-distributed-optimizer and "
                     "--overlap-grad-reduce); the updated parameters are gathered right after "
                     "the optimizer step, not during the next forward: the same values",
                     [](Options& o) -> bool& { return o.overlap_param_gather; }));
  t.push_back(number<double>("--distributed-timeout-minutes", "N", PAR,
                             "a rank that waits longer than N minutes in one collective ends "
                             "the job, naming the rank and the call (0: wait forever)",
                             [](Options& o) -> double& { return o.distributed_timeout_minutes; }));
  t.push_back(number<double>("--hang-report-seconds", "N", PAR,
                             "a first hang report (the job goes on) when a rank waits N seconds "
                             "in one collective: each rank's call, group and step phase, and "
                             "which ranks are behind (0: only at the timeout)",
                             [](Options& o) -> double& { return o.hang_report_seconds; }));
}

// ZeRO stages 2 and 3 train one pipeline stage (MoE included: the experts sharded over
// their expert-data-parallel group); the FSDP flags ask for stage 3 and settle for stage 1
// where it is not built.
void finalize_zero(Options& o) {
  std::string with;  // the setting stages 2 and 3 do not combine with yet
  if (o.pipeline_model_parallel_size > 1)
    with = "--pipeline-model-parallel-size " + std::to_string(o.pipeline_model_parallel_size);
  if (!o.fsdp_flag.empty() && o.zero_stage == 0) {
    const int stage = o.fsdp_flag == "--use-megatron-fsdp" ? std::max(1, o.fsdp_sharding_stage) : 3;
    if (with.empty() || stage == 1) {
      o.zero_stage = stage;
    } else {
      o.zero_stage = 1;
      const std::string note = "note: " + o.fsdp_flag + " with " + with +
                               " trains with the distributed optimizer (ZeRO stage 1): stage " +
                               std::to_string(stage) +
                               " is not built with it; "
                               "the same results, parameters and gradients held whole";
      add_note_once(o.notes, note);
    }
  }
  if (o.zero_stage >= 2 && !with.empty())
    throw NotBuiltError("--zero-stage " + std::to_string(o.zero_stage) + " with " + with,
                        "ZeRO stages 2 and 3 with pipeline parallelism (DeepSpeed, too, "
                        "combines only stage 1 with it)");
}

}  // namespace omni::option_rows
