#include "config/primus_experiment.h"

#include <algorithm>
#include <filesystem>

#include "base/error.h"

namespace omni {

namespace fs = std::filesystem;
using yaml::Node;
using yaml::where;

namespace {

const Node& require(const Node& map, const std::string& key, const std::string& what) {
  const Node* n = map.find(key);
  if (!n || n->is_null())
    throw UsageError(where(map.file, map.line) + ": " + what + " needs '" + key + "'");
  return *n;
}

std::string scalar(const Node& n, const std::string& key) {
  if (n.kind != Node::Kind::Scalar)
    throw UsageError(where(n) + ": " + key + " must be a single value");
  return n.scalar;
}

// The folder holding Primus's configs/ (the `primus` package of a Primus checkout): from
// $PRIMUS_PATH (Primus's launch scripts set it to the checkout), else the first
// primus/configs above the experiment or above the working directory.
fs::path find_primus_home(const fs::path& experiment, const std::string& framework,
                          const std::string& module_config,
                          const std::map<std::string, std::string>& env) {
  const fs::path wanted = fs::path("configs") / "modules" / framework / module_config;
  std::vector<fs::path> roots;
  if (auto it = env.find("PRIMUS_PATH"); it != env.end() && !it->second.empty())
    roots.emplace_back(it->second);
  for (fs::path start : {fs::absolute(experiment).parent_path(), fs::current_path()})
    for (fs::path d = start; !d.empty(); d = d.parent_path()) {
      roots.push_back(d);
      if (d == d.parent_path()) break;
    }
  for (const fs::path& r : roots)
    if (fs::is_regular_file(r / "primus" / wanted)) return r / "primus";
  throw UsageError(experiment.string() + ": Primus's module config primus/" + wanted.string() +
                   " not found above " + fs::absolute(experiment).parent_path().string() +
                   " or the working directory; run from a Primus checkout or set PRIMUS_PATH");
}

// A key of the run folder's, set where the experiment names its workspace.
Node derived(const std::string& value, const Node& at) {
  Node n = at;
  n.kind = Node::Kind::Scalar;
  n.scalar = value;
  n.plain = false;
  n.items.clear();
  n.entries.clear();
  return n;
}

void set(Node& map, const std::string& key, const Node& value) {
  if (Node* n = map.find(key))
    *n = value;
  else
    map.entries.emplace_back(key, value);
}

bool is_true(const Node* n) {
  if (!n || n->kind != Node::Kind::Scalar) return false;
  std::string v = n->scalar;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  return v == "true" || v == "yes" || v == "on" || v == "1";
}

}  // namespace

bool is_primus_experiment(const std::string& path, const std::map<std::string, std::string>&) {
  return fs::is_regular_file(path) && yaml::parse_file(path).find("modules") != nullptr;
}

Node load_primus_experiment(const std::string& path,
                            const std::map<std::string, std::string>& env) {
  Node exp = yaml::parse_file(path);
  yaml::substitute_variables(exp, env);
  for (const auto& [key, value] : exp.entries)
    if (key != "work_group" && key != "user_name" && key != "exp_name" && key != "workspace" &&
        key != "modules" && key != "platform")
      throw UsageError(where(value) + ": '" + key +
                       "' is not a key of a Primus experiment (work_group, user_name, exp_name, "
                       "workspace, modules, platform)");
  const std::string what = "a Primus experiment";
  const Node& workspace = require(exp, "workspace", what);
  const fs::path run_dir = (fs::path(scalar(workspace, "workspace")) /
                            scalar(require(exp, "work_group", what), "work_group") /
                            scalar(require(exp, "user_name", what), "user_name") /
                            scalar(require(exp, "exp_name", what), "exp_name"))
                               .lexically_normal();

  const Node& modules = require(exp, "modules", what);
  if (modules.kind != Node::Kind::Map)
    throw UsageError(where(modules) + ": modules must be a map of modules (pre_trainer: ...)");
  for (const auto& [name, module] : modules.entries)
    if (name != "pre_trainer")
      throw UsageError(where(module) + ": module '" + name +
                       "': omnitron runs Primus's pre_trainer module only");
  const Node& module = require(modules, "pre_trainer", "modules");
  if (module.kind != Node::Kind::Map)
    throw UsageError(where(module) + ": pre_trainer must be a map (framework, config, model)");
  for (const auto& [key, value] : module.entries)
    if (key != "framework" && key != "config" && key != "model" && key != "overrides")
      throw UsageError(where(value) + ": '" + key +
                       "' is not a key of a Primus module (framework, config, model, overrides)");
  const std::string framework = scalar(require(module, "framework", "pre_trainer"), "framework");
  if (framework != "megatron" && framework != "light-megatron")
    throw UsageError(where(*module.find("framework")) + ": framework '" + framework +
                     "': omnitron runs Primus's Megatron configs (framework: megatron)");
  const Node& config_ref = require(module, "config", "pre_trainer");
  const Node& model_ref = require(module, "model", "pre_trainer");
  const std::string config_name = scalar(config_ref, "config");
  const std::string model_name = scalar(model_ref, "model");
  const fs::path home = find_primus_home(path, framework, config_name, env);

  yaml::Resolver resolver(env);
  Node merged =
      resolver.load(home / "configs" / "modules" / framework / config_name, where(config_ref));
  const Node model =
      resolver.load(home / "configs" / "models" / "megatron" / model_name, where(model_ref));
  for (const auto& [key, value] : model.entries) {
    if (const Node* both = merged.find(key))
      throw UsageError(where(value) + ": '" + key +
                       "' of the model is also set by the module "
                       "config (" +
                       where(*both) + "); Primus refuses a key in both");
    merged.entries.emplace_back(key, value);
  }
  if (const Node* overrides = module.find("overrides"); overrides && !overrides->is_null()) {
    if (overrides->kind != Node::Kind::Map)
      throw UsageError(where(*overrides) + ": overrides must be a map of keys");
    for (const auto& [key, value] : overrides->entries) {
      Node* target = merged.find(key);
      if (!target)
        throw UsageError(where(value) + ": override '" + key + "' is neither a key of " +
                         config_name + " nor of " + model_name +
                         " (Primus overrides only keys those files have)");
      yaml::merge_over(*target, value);
    }
  }

  // What Primus's trainer derives from the run folder (update_primus_config): checkpoints
  // always go to RUN/checkpoints, TensorBoard to RUN/tensorboard unless disabled (a profile
  // turns it back on), Weights & Biases only when enabled, and mock data drops data paths.
  set(merged, "save", derived((run_dir / "checkpoints").string(), workspace));
  const Node disable_tensorboard = yaml::take(merged, "disable_tensorboard");
  const bool tensorboard = !is_true(&disable_tensorboard) || is_true(merged.find("profile"));
  set(merged, "tensorboard_dir",
      tensorboard ? derived((run_dir / "tensorboard").string(), workspace) : Node{});
  if (is_true(merged.find("disable_wandb")))
    for (const char* key : {"wandb_project", "wandb_exp_name", "wandb_save_dir", "wandb_entity"})
      if (Node* n = merged.find(key)) *n = Node{};
  // Primus hands Megatron its null num_query_groups as None, which Megatron's
  // TransformerConfig reads as one group per head (the command line's default is 1).
  const Node* heads = merged.find("num_attention_heads");
  if (Node* groups = merged.find("num_query_groups"); groups && groups->is_null() && heads &&
                                                      !heads->is_null() &&
                                                      is_true(merged.find("group_query_attention")))
    *groups = derived(heads->scalar, *heads);
  if (is_true(merged.find("mock_data")))
    for (const char* key : {"data_path", "train_data_path", "valid_data_path", "test_data_path"})
      if (Node* n = merged.find(key)) *n = Node{};
  return merged;
}

}  // namespace omni
