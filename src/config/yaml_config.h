// Primus-style YAML configs: a file of option keys (Megatron's flag names with
// underscores, `num_layers: 24` for `--num-layers 24`), resolved into the equivalent
// command line, which the CLI parses before its own arguments so that the CLI wins.
//
// A file may inherit: `bases: [a.yaml, b.yaml]` (AMD's Primus migration guide) or
// `extends: a.yaml` / a list (Primus today), paths relative to the including file. Maps
// merge deeply (the later base and the including file win), lists are replaced. An
// experiment file names `model:` (a path, or a name from the model zoo, configs/models/
// NAME.yaml) and `overrides:`. Precedence, highest first:
//   overrides > the file's own keys > model > bases (in order, the last winning).
// Scalars may use ${VAR} and ${VAR:default}.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace omni {

// The process environment as a map (the default for the functions below).
std::map<std::string, std::string> process_environment();

// One resolved option: the YAML key, its flag, its value(s) and where it was set.
struct ConfigEntry {
  std::string key;                  // "num_layers"
  std::string flag;                 // "--num-layers"
  std::vector<std::string> values;  // one value; several for a list (options taking many)
  bool is_list = false;
  bool is_switch = false;  // values[0] is "true" or "false"
  std::string file;        // the file that set it
  int line = 0;            // 1-based
};

// Loads `path`, resolves inheritance, model and overrides, substitutes variables from
// `env`, and checks every key against option_table(). Unknown keys, malformed YAML,
// inheritance cycles and unset variables raise UsageError naming the file (and line).
// Entries come in a stable order: the first definition's position. Null values are
// dropped (they reset an inherited key to the option's default).
//
// The model zoo for `model: NAME` is looked up in $OMNITRON_MODEL_DIR (from `env`), then
// in `configs/models/` and `models/` next to the including file and each of its parent
// directories, then in ./configs/models.
std::vector<ConfigEntry> resolve_yaml_config(
    const std::string& path, const std::map<std::string, std::string>& env = process_environment());

// The resolved entries as a command line: "--num-layers", "24", "--swiglu", ... A switch
// set to false is omitted.
std::vector<std::string> config_entries_to_args(const std::vector<ConfigEntry>& entries);

// resolve_yaml_config followed by config_entries_to_args.
std::vector<std::string> yaml_to_args(
    const std::string& path, const std::map<std::string, std::string>& env = process_environment());

// For --print-config: one line per entry, "num_layers: 24  # from path/to/file.yaml:3".
std::string format_config_entries(const std::vector<ConfigEntry>& entries);

}  // namespace omni
