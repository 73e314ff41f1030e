#include "checkpoint/checkpoint.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "checkpoint/checkpoint_format.h"
#include "checkpoint/hf_interchange.h"
#include "checkpoint/sharded_checkpoint.h"
#include "optim/optimizer_zoo.h"

namespace omni {

namespace fs = std::filesystem;

std::string checkpoint_optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW:
      return "adamw";
    case OptimizerKind::SGD:
      return "sgd";
    default:
      return zoo_optimizer_name(k);
  }
}

std::string checkpoint_iteration_dir(const std::string& root, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return root + "/" + name;
}

std::string latest_iteration_file(const std::string& root) {
  return root + "/latest_checkpointed_iteration.txt";
}

namespace {

// A one-rank model's whole state: the parameters and, when given, the optimizer's buffers.
RankState whole_state(const ParameterSet<float>& params, const Optimizer<float>* optimizer) {
  RankState state;
  state.infos = params.infos();
  const int64_t n = params.size();
  state.buffers.push_back({"", {{0, n, params.values()}}});
  if (optimizer)
    for (const std::string& name : optimizer->state_names())
      state.buffers.push_back({"optimizer." + name + ".", {{0, n, optimizer->state_buffer(name)}}});
  return state;
}

// Writes a one-rank checkpoint; without an optimizer it holds the model alone.
std::string write_checkpoint(const std::string& root, const Options& opts,
                             const TrainingProgress& progress, const ParameterSet<float>& params,
                             const Optimizer<float>* optimizer) {
  CheckpointOptimizer header;
  if (optimizer) {
    header.name = checkpoint_optimizer_name(optimizer->kind());
    header.steps = optimizer->steps();
    for (const std::string& name : optimizer->scalar_names())
      header.scalars.emplace_back(name, optimizer->scalar(name));
  }
  const std::unique_ptr<Communicator> self = make_self_communicator();
  CheckpointWriter writer(*self);
  return writer.save(root, opts, progress, header, whole_state(params, optimizer), false);
}

}  // namespace

std::string save_checkpoint(const std::string& root, const Options& opts,
                            const TrainingProgress& progress, const ParameterSet<float>& params,
                            const Optimizer<float>& optimizer) {
  return write_checkpoint(root, opts, progress, params, opts.no_save_optim ? nullptr : &optimizer);
}

std::string save_model_checkpoint(const std::string& root, const Options& opts,
                                  const ParameterSet<float>& params) {
  return write_checkpoint(root, opts, {}, params, nullptr);
}

int64_t latest_checkpoint_iteration(const std::string& root) {
  if (is_hf_model_dir(root)) return 0;
  const std::string path = latest_iteration_file(root);
  std::ifstream in(path);
  OMNI_REQUIRE(in, "--load: cannot open '", path,
               "' (expected a checkpoint directory written by --save)");
  std::string text;
  std::getline(in, text);
  int64_t iteration = -1;
  try {
    size_t used = 0;
    iteration = std::stoll(text, &used);
    if (used != text.size()) iteration = -1;
  } catch (const std::exception&) {
  }
  OMNI_REQUIRE(iteration >= 0, "--load: '", path, "' should hold an iteration number, found '",
               text.substr(0, 40), "'");
  return iteration;
}

bool holds_checkpoint(const std::string& root) {
  if (is_hf_model_dir(root) || fs::exists(latest_iteration_file(root))) return true;
  std::error_code ec;
  if (!fs::exists(root, ec)) return false;
  OMNI_REQUIRE(fs::is_directory(root, ec), "--load: '", root,
               "' is a file, not a checkpoint directory (one written by --save, or a Hugging "
               "Face model directory)");
  // A save in progress when a job died leaves iter_NNNNNNN.tmp, and logs may share the
  // directory: neither is a checkpoint. A complete iteration directory without the file
  // that names the latest is one whose index was lost: starting afresh would discard it.
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const bool iteration_dir = e.is_directory() && name.size() == 12 &&
                               name.rfind("iter_", 0) == 0 &&
                               name.find_first_not_of("0123456789", 5) == std::string::npos;
    OMNI_REQUIRE(!iteration_dir, "--load: '", root, "' holds ", name, " but no ",
                 latest_iteration_file(root),
                 " naming the latest checkpoint (write that iteration number into it to "
                 "resume from it)");
  }
  return false;
}

std::vector<std::string> checkpoint_model_args(const std::string& root) {
  if (is_hf_model_dir(root)) return hf_model_args(root);
  const checkpoint_format::Metadata md = checkpoint_format::read_metadata(root);
  std::vector<std::string> model_args;
  for (size_t i = 0; i < md.args.size(); ++i) {
    const OptionDef* def = find_option(md.args[i]);
    OMNI_REQUIRE(def, "--load: '", md.path, "' stores an unknown option '", md.args[i], "'");
    const bool takes_value = !def->metavar.empty();
    if (def->group == "model")
      model_args.push_back(takes_value ? md.args[i] + "=" + md.args[i + 1] : md.args[i]);
    if (takes_value) ++i;
  }
  // Before erf GELU became the default (Megatron's), omnitron's GELU was always tanh and
  // checkpoints stored no "gelu" line: such a checkpoint keeps its tanh GELU.
  if (md.gelu.empty()) model_args.push_back("--openai-gelu");
  return model_args;
}

void load_checkpoint_model_options(const std::string& root, Options& opts) {
  if (is_hf_model_dir(root)) return load_hf_model_options(root, opts);
  parse_options(checkpoint_model_args(root), opts);
}

TrainingProgress load_checkpoint(const std::string& root, ParameterSet<float>& params,
                                 Optimizer<float>* optimizer) {
  if (is_hf_model_dir(root)) {
    load_hf_weights(root, params);
    return {};
  }
  const CheckpointReader reader(root);
  const bool with_optimizer =
      optimizer && reader.optimizer().name != checkpoint_format::kNoOptimizer;
  if (with_optimizer) reader.check_optimizer(checkpoint_optimizer_name(optimizer->kind()));
  reader.read(whole_state(params, with_optimizer ? optimizer : nullptr));
  if (with_optimizer) {
    for (const std::string& name : optimizer->scalar_names())
      optimizer->scalar(name) = reader.optimizer_scalar(name);
    optimizer->set_steps(reader.optimizer().steps);
  }
  return reader.progress();
}

}  // namespace omni
