// YAML configs, as omnitron's own configs and AMD Primus's files write them, resolved into
// the equivalent command line, which the CLI parses before its own arguments so that the CLI
// wins.
//
// A key is a Megatron flag with underscores (`num_layers: 24` is `--num-layers 24`) or one
// of Megatron's internal argument names, as Primus writes them (`add_bias_linear: false` is
// `--disable-bias-linear`; config/megatron_dests.h), or one of Primus's own keys
// (`disable_last_saving`; config/options_primus.cpp). A null value says nothing and is
// dropped before keys are judged; so is an empty list, and a value equal to Megatron's
// default for a flag that omnitron only notes or refuses (Primus's files spell out every
// default). `1`/`0` are switches' true/false.
//
// Inheritance (`bases:`, `includes:`, `extends:`, `model:`, `overrides:`) and ${VAR}
// substitution are described in config/yaml_tree.h; a Primus experiment (a file with
// `modules: pre_trainer: ...`) in config/primus_experiment.h.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace omni {

// The process environment as a map (the default for the functions below).
std::map<std::string, std::string> process_environment();

// One resolved key: what it means on the command line and where it was set.
struct ConfigEntry {
  std::string key;                // "add_bias_linear"
  std::string text;               // the value as the YAML gives it: "false", "[0.5, a, 0.5, b]"
  std::vector<std::string> args;  // "--disable-bias-linear"; "--num-layers", "24"
  std::string file;               // the file that set it
  int line = 0;                   // 1-based
};

// Loads `path`, resolves inheritance (or a Primus experiment's layout), substitutes
// variables from `env`, and checks every key against option_table(). Unknown keys,
// malformed YAML, inheritance cycles and unset variables raise UsageError naming the file
// (and line). Entries come in a stable order: the first definition's position. Keys that
// ask for nothing (false switches, Megatron's defaults of noted flags) have no entry.
//
// The model zoo for `model: NAME` is looked up in $OMNITRON_MODEL_DIR (from `env`), then
// in `configs/models/` and `models/` next to the including file and each of its parent
// directories, then in ./configs/models, then beside the executable (yaml_tree.h's
// find_zoo_model).
std::vector<ConfigEntry> resolve_yaml_config(
    const std::string& path, const std::map<std::string, std::string>& env = process_environment());

// The resolved entries as a command line: "--num-layers", "24", "--swiglu", ...
std::vector<std::string> config_entries_to_args(const std::vector<ConfigEntry>& entries);

// resolve_yaml_config followed by config_entries_to_args.
std::vector<std::string> yaml_to_args(
    const std::string& path, const std::map<std::string, std::string>& env = process_environment());

// For --print-config: one line per entry,
// "add_bias_linear: false  # --disable-bias-linear  from path/to/file.yaml:3".
std::string format_config_entries(const std::vector<ConfigEntry>& entries);

}  // namespace omni
