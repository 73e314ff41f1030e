// `omnitron plan`: will a run fit, and how fast will it go? The model and layout come from the
// same options `omnitron train` takes (--model, --config, Megatron flags); the machine from
// plan's table (train/plan.h).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "backend/device.h"
#include "base/error.h"
#include "cli/commands.h"
#include "comm/process_grid.h"
#include "train/plan.h"
#include "train/run_options.h"

namespace omni::cli {

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib(double bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", bytes / kGiB);
  return text;
}

struct PlanFlags {
  std::string machine;  // empty: this machine's GPU when the table has it, else cpu
  int gpus = 0;         // 0: TP x CP x PP (one data-parallel replica)
  int ranks_per_node = 0;
  double efficiency = 0;
  bool search = false, explain = false, scatter_gather = false;
  int top = 10;
};

int positive(const std::string& flag, const std::string& value) {
  char* end = nullptr;
  const long v = std::strtol(value.c_str(), &end, 10);
  OMNI_REQUIRE(!value.empty() && *end == '\0' && v > 0 && v < (1L << 30), flag, " '", value,
               "': expected a positive whole number");
  return int(v);
}

// Takes plan's own flags out of `args`; a first word without dashes is the model's name.
PlanFlags take_plan_flags(std::vector<std::string>& args) {
  PlanFlags f;
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    std::optional<std::string> inline_value;  // --flag=value
    for (const char* flag :
         {"--machine=", "--gpus=", "--gpus-per-node=", "--top=", "--compute-efficiency="})
      if (a.rfind(flag, 0) == 0) {
        inline_value = a.substr(std::string(flag).size());
        a = std::string(flag).substr(0, std::string(flag).size() - 1);
      }
    auto value = [&](const char* flag) {
      if (inline_value) return *inline_value;
      OMNI_REQUIRE(i + 1 < args.size(), flag, " needs a value");
      return args[++i];
    };
    if (a == "--machine") {
      f.machine = value("--machine");
    } else if (a == "--gpus") {
      f.gpus = positive(a, value("--gpus"));
    } else if (a == "--gpus-per-node") {
      f.ranks_per_node = positive(a, value("--gpus-per-node"));
    } else if (a == "--top") {
      f.top = positive(a, value("--top"));
    } else if (a == "--compute-efficiency") {
      const std::string v = value("--compute-efficiency");
      char* end = nullptr;
      f.efficiency = std::strtod(v.c_str(), &end);
      OMNI_REQUIRE(!v.empty() && *end == '\0' && f.efficiency > 0 && f.efficiency <= 1,
                   "--compute-efficiency '", v, "': expected a fraction of peak in (0, 1]");
    } else if (a == "--search") {
      f.search = true;
    } else if (a == "--explain") {
      f.explain = true;
    } else if (a == "--scatter-gather-p2p") {
      f.scatter_gather = true;
    } else if (i == 0 && !a.empty() && a[0] != '-') {
      rest.insert(rest.end(), {"--model", a});
    } else {
      rest.push_back(a);
    }
  }
  args = std::move(rest);
  return f;
}

// This machine's GPU when plan's table has it, else the CPU.
std::string detected_machine() {
  if (gpu_device_count() > 0) {
    const std::string name = gpu_device_info(0).name;
    for (const std::string& known : plan_device_names()) {
      std::string upper = name;
      for (char& ch : upper) ch = char(std::toupper(static_cast<unsigned char>(ch)));
      if (known != "cpu" && upper.find(known) != std::string::npos) return known;
    }
  }
  return "cpu";
}

void print_figures(const char* title, const std::vector<PlanFigure>& figures, double unit,
                   const char* unit_name, bool explain) {
  if (figures.back().value < unit && unit == kGiB) unit = 1 << 20, unit_name = "MiB";
  std::printf("%s%*s%s\n", title, int(28 - std::string(title).size()), "", unit_name);
  for (const PlanFigure& f : figures) {
    const bool total = &f == &figures.back();
    std::printf("  %-14s %10.2f  %s\n", f.name.c_str(), f.value / unit, f.why.c_str());
    if (explain && !total) std::printf("  %-14s %10s  = %s\n", "", "", f.formula.c_str());
  }
}

void print_plan(const Plan& p, bool explain) {
  const TransformerConfig& m = p.model;
  const double n = double(m.num_parameters());
  std::printf(
      "model:   %.3g %s parameters | %d layers, hidden %d, ffn %d, heads %d/%d, seq %d, "
      "vocabulary %d\n",
      n >= 1e9 ? n / 1e9 : n / 1e6, n >= 1e9 ? "B" : "M", m.num_layers, m.hidden_size, m.ffn_size(),
      m.num_attention_heads, m.query_groups(), m.seq_length, m.padded_vocab_size());
  const bool big = p.device.bf16_tflops >= 1;
  std::printf(
      "machine: %d x %s (%s), %d per node: %.4g %s bf16, %.4g fp32, %.1f GiB, "
      "links %.0f GB/s in a node, %.1f GB/s between nodes\n",
      p.layout.gpus, p.device.name.c_str(), p.device.description.c_str(), p.device.ranks_per_node,
      p.device.bf16_tflops * (big ? 1 : 1000), big ? "TFLOP/s" : "GFLOP/s",
      p.device.fp32_tflops * (big ? 1 : 1000), p.device.memory_gib, p.device.intra_gbps,
      p.device.inter_gbps);
  std::printf("         figures: %s\n", p.device.source.c_str());
  std::printf("layout:  %s\n\n", p.layout.describe().c_str());
  const std::string title = "memory per rank (stage " + std::to_string(p.stage) + ")";
  print_figures(title.c_str(), p.memory, kGiB, "GiB", explain);
  PlanLayout selective = p.layout;
  if (selective.recompute.empty()) selective.recompute = "selective";
  const double kept = korthikanti_layer_bytes(m, p.layout);
  const double unit = kept >= kGiB ? kGiB : double(1 << 20);
  const double without = korthikanti_layer_bytes(m, selective);
  char also[96] = "";
  if (without != kept)
    std::snprintf(also, sizeof also, ", %.3f without the attention scores", without / unit);
  std::printf(
      "  (for comparison, Megatron-LM keeps %.3f %s of activations per layer and "
      "micro-batch%s: Korthikanti et al. 2022, Table 2)\n\n",
      kept / unit, unit == kGiB ? "GiB" : "MiB", also);
  print_figures("step time (predicted)", p.time, 1e-3, "ms", explain);
}

}  // namespace

int plan(const std::vector<std::string>& raw_args) {
  if (wants_help(raw_args)) {
    std::string devices;
    for (const std::string& d : plan_device_names()) devices += (devices.empty() ? "" : ", ") + d;
    std::printf(
        "usage: omnitron plan [MODEL] [--model NAME|FILE.yaml] [--config FILE.yaml] "
        "[--machine NAME] [--gpus N] [--gpus-per-node N] [--search [--top K]] [--explain] "
        "[--compute-efficiency F] [--scatter-gather-p2p] [train's options]\n"
        "Predicts each rank's memory and the step time of a training run, each figure with "
        "where it comes from (--explain: its formula). The layout is train's flags "
        "(--tensor-model-parallel-size, --pipeline-model-parallel-size, "
        "--num-layers-per-virtual-pipeline-stage, --context-parallel-size, "
        "--micro-batch-size, --global-batch-size, --sequence-parallel, "
        "--use-distributed-optimizer, --recompute-granularity, --bf16/--fp16); data parallelism "
        "takes the rest of --gpus.\n"
        "--search lists the fastest layouts of --gpus N that fit (MoE models: expert "
        "parallelism too, unless --expert-model-parallel-size is given, and expert tensor "
        "parallelism TP, 1 under TP > 1 and 2 TP within a node, unless "
        "--expert-tensor-parallel-size is given).\n"
        "--compute-efficiency F: one fraction of peak for all the compute (no per-size curve, "
        "no memory traffic). --scatter-gather-p2p: the pipeline's sends split over the TP "
        "ranks' links (Megatron 2021). --attention-backend local|unfused: attention that "
        "materialises its score matrix (Megatron 2021), counted as memory traffic.\n"
        "--machine: %s (default: this machine's GPU if listed, else cpu, measured now).\n"
        "docs/plan.md explains the model.\n",
        devices.c_str());
    return 0;
  }
  std::vector<std::string> args = raw_args;
  PlanFlags flags = take_plan_flags(args);
  const std::optional<std::vector<std::string>> resolved = with_config(args, 1);
  if (!resolved) return 0;  // --print-config
  Options o;
  parse_options(*resolved, o);
  // The tokenizer only sizes the vocabulary: --vocab-size spares reading its files.
  if (o.model.vocab_size == 0) {
    try {
      open_tokenizer(o);
    } catch (const UsageError& e) {
      throw UsageError(std::string(e.what()) +
                       "; plan needs only the vocabulary's size: --vocab-size N gives it");
    }
  }
  o.tokenizer.type.clear();  // read or not, finalize() needs no tokenizer
  OMNI_REQUIRE(o.model.vocab_size > 0,
               "the model names no vocabulary size: give --vocab-size N (Llama 3: 128256, "
               "GPT-2: 50257) or --tokenizer-type with its files");
  const int model_ranks =
      o.tensor_model_parallel_size * o.context_parallel_size * o.pipeline_model_parallel_size;
  if (flags.search) {
    OMNI_REQUIRE(flags.gpus > 0, "--search needs --gpus N (the GPUs to lay the model out on)");
    OMNI_REQUIRE(o.global_batch_size > 0,
                 "--search needs --global-batch-size N (the layouts must keep it)");
  }
  const int gpus = flags.gpus > 0 ? flags.gpus : std::max(model_ranks, 1);
  // train's checks on the options, with the layout's data parallelism (the search's layouts
  // are checked one by one instead).
  try {
    o.data_parallel_size =
        flags.search
            ? 1
            : data_parallel_size(gpus, ParallelLayout{.tp = o.tensor_model_parallel_size,
                                                      .cp = o.context_parallel_size,
                                                      .pp = o.pipeline_model_parallel_size});
  } catch (const UsageError&) {
    throw UsageError(
        "--gpus " + std::to_string(gpus) + " is not divisible by the layout's " +
        "--tensor-model-parallel-size (" + std::to_string(o.tensor_model_parallel_size) +
        ") x --context-parallel-size (" + std::to_string(o.context_parallel_size) +
        ") x --pipeline-model-parallel-size (" + std::to_string(o.pipeline_model_parallel_size) +
        ") = " + std::to_string(model_ranks) + "; data parallelism takes the GPUs that remain");
  }
  if (!o.mock_data && o.data_path.empty() && o.train_text.empty() && o.data_file_list.empty() &&
      !o.per_split_data())
    o.mock_data = true;  // plan reads no data; the vocabulary is the model's
  finalize(o);
  const std::string machine = flags.machine.empty() ? detected_machine() : flags.machine;
  PlanDevice device = plan_device(machine, gpus);
  if (flags.ranks_per_node > 0) device.ranks_per_node = flags.ranks_per_node;
  if (flags.efficiency > 0) {  // one fraction of peak for all the compute, as on the CPU
    device.compute_efficiency = flags.efficiency;
    device.bf16_compute_efficiency = 0;
    device.gemm_efficiency.clear();
  }

  // --search lays out the GPUs itself: the base layout keeps only the batch and precision.
  PlanLayout layout = plan_layout(o, flags.search ? model_ranks : gpus);
  layout.scatter_gather_p2p = flags.scatter_gather;
  if (flags.search) {
    layout.gpus = gpus;
    // A given --expert-model-parallel-size (flag or config) stays; else the search varies EP.
    bool given_ep = false, given_etp = false, given_cp_comm = false;
    for (const std::string& a : *resolved) {
      given_ep = given_ep || a.rfind("--expert-model-parallel-size", 0) == 0;
      given_etp = given_etp || a.rfind("--expert-tensor-parallel-size", 0) == 0;
      given_cp_comm = given_cp_comm || a.rfind("--cp-comm-type", 0) == 0 ||
                      a.rfind("--ds-sequence-parallel-size", 0) == 0;
    }
    const PlanSearch found = search_plans(o.model, layout, device, flags.top, given_ep, given_etp,
                                             given_cp_comm);
    const Plan& least = found.smallest;
    OMNI_REQUIRE(found.tried > 0, "no layout of ", gpus, " GPUs can take this model (",
                 "heads, MLP width and layers must divide among the ranks)");
    if (found.fitting.empty())
      throw UsageError("no layout of " + std::to_string(gpus) + " x " + device.name +
                       " fits: the smallest (" + least.layout.describe() + ") needs " +
                       gib(least.memory_bytes()) + " per rank of " + gib(device.memory_gib * kGiB) +
                       "; add GPUs" +
                       (given_ep && o.model.num_moe_experts > 0
                            ? " or leave --expert-model-parallel-size to the search"
                            : ""));
    const std::string ep_note =
        found.searched_ep ? ", expert parallelism over the divisors of " +
                                std::to_string(o.model.num_moe_experts) + " experts"
        : o.model.num_moe_experts > 0 ? ", EP " + std::to_string(layout.ep) + " as given"
                                      : "";
    const std::string etp_note = found.searched_etp ? ", expert tensor parallelism TP, 1 and 2 TP"
                                 : given_etp && o.model.num_moe_experts > 0
                                     ? ", ETP " + std::to_string(layout.expert_tp()) + " as given"
                                     : "";
    const std::string cp_note =
        found.searched_cp_comm ? ", CP by ring and by Ulysses (a2a)"
        : given_cp_comm        ? ", --cp-comm-type " + layout.cp_comm_type + " as given"
                               : "";
    std::printf("%d layouts of %d x %s tried%s%s%s, %d do not fit in %.1f GiB; the fastest %zu:\n",
                found.tried, gpus, device.name.c_str(), cp_note.c_str(), ep_note.c_str(),
                etp_note.c_str(),
                found.too_big, device.memory_gib, found.fitting.size());
    // MoE models: EP in a column of its own (describe() names it only above 1), and ETP
    // beside it when a listed layout's differs from its TP.
    const bool moe = o.model.num_moe_experts > 0;
    bool etp_column = false;
    for (const Plan& p : found.fitting)
      etp_column = etp_column || (moe && p.layout.expert_tp() != p.layout.tp);
    std::printf("  %10s %12s %9s %6s %9s %s%s %s\n", "step ms", "tokens/s", "TFLOP/s", "MFU",
                "GiB/rank", moe ? "   EP" : "", etp_column ? "  ETP" : "", "layout");
    for (const Plan& p : found.fitting) {
      const double peak = (layout.precision == "fp32" ? device.fp32_tflops : device.bf16_tflops);
      char ep[32] = "";
      if (moe) std::snprintf(ep, sizeof ep, "%5d", p.layout.ep);
      if (etp_column)
        std::snprintf(ep + std::strlen(ep), sizeof ep - std::strlen(ep), "%5d",
                      p.layout.expert_tp());
      std::printf("  %10.1f %12.0f %9.1f %5.1f%% %9.2f %s %s\n", p.step_seconds() * 1e3,
                  p.tokens_per_second(), p.model_tflops_per_rank(),
                  100.0 * p.model_tflops_per_rank() / peak, p.memory_bytes() / kGiB, ep,
                  p.layout.describe().c_str());
    }
    std::printf("(omnitron plan with a layout's flags explains each of its figures)\n");
    return 0;
  }
  const Plan p = make_plan(o.model, layout, device);
  print_plan(p, flags.explain);
  if (!p.fits())
    throw UsageError(
        "does not fit: a rank of pipeline stage " + std::to_string(p.stage) + " needs " +
        gib(p.memory_bytes()) + " of " + device.name + "'s " + gib(device.memory_gib * kGiB) +
        "; more model parallelism, --recompute-granularity full or --search " + "--gpus N may");
  return 0;
}

}  // namespace omni::cli
