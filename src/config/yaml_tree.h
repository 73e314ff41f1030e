// YAML files as trees of nodes that remember their file and line, and the inheritance rules
// that flatten a config file into one map (internal to src/config/: yaml_config.cpp and
// primus_experiment.cpp build on it).
//
// Inheritance, as Primus and omnitron's own configs write it, paths relative to the file:
//   bases: [a.yaml, b.yaml]     Primus: the file's own keys win, then the FIRST base listed
//   includes: [a.yaml, b.yaml]  Primus: the same precedence as bases
//   extends: a.yaml or a list   later Primus: deep merge, the LATER preset winning
//   model: NAME or path         an omnitron experiment's model (configs/models/NAME.yaml)
//   overrides: {key: value}     win over everything else in the file
// Precedence, lowest first: extends < bases < includes < model < own keys < overrides.
// Maps merge key by key (recursively); lists and scalars are replaced whole.
//
// ${VAR} and ${VAR:default} are substituted in values and in keys (before inheritance, as
// Primus does); ${VAR:} is the empty string, and a substitution that yields "null" is null.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

namespace omni::yaml {

struct Node {
  enum class Kind { Null, Scalar, Sequence, Map };
  Kind kind = Kind::Null;
  std::string scalar;
  bool plain = true;  // an unquoted scalar (only those can be booleans)
  std::vector<Node> items;
  std::vector<std::pair<std::string, Node>> entries;  // a map, in file order
  std::string file;
  int line = 0;  // 1-based; for a map's value, the line of its key

  Node* find(const std::string& key);
  const Node* find(const std::string& key) const;
  bool is_null() const { return kind == Kind::Null; }
};

// "file:line" (or "file" without a line).
std::string where(const std::string& file, int line);
inline std::string where(const Node& n) {
  return where(n.file, n.line);
}

// Reads one file (anchors and aliases resolved). Its top level must be a map; an empty file
// is an empty map. Malformed YAML raises UsageError naming file, line and column.
Node parse_file(const std::filesystem::path& path);

// Substitutes ${VAR} and ${VAR:default} in every scalar and key of `n`.
void substitute_variables(Node& n, const std::map<std::string, std::string>& env);

// Merges `src` over `dst` (src wins), maps key by key.
void merge_over(Node& dst, const Node& src);

// Removes `key` from a map and returns its value (Null when absent).
Node take(Node& map, const std::string& key);

// The model zoo's NAME.yaml (`model: NAME`, or --model NAME): in $OMNITRON_MODEL_DIR, then
// in configs/models/ and models/ in `including_dir` and each of its parents, then in
// ./configs/models, then beside the executable (the source tree's configs/models above a
// build directory, an installed prefix's share/omnitron/configs/models). Throws UsageError
// listing where it looked.
std::filesystem::path find_zoo_model(const std::string& name,
                                     const std::filesystem::path& including_dir,
                                     const std::map<std::string, std::string>& env);

// Loads files with their inheritance resolved into one flat map (see the top of this file).
// Cycles and missing files raise UsageError naming the chain or the including file.
class Resolver {
 public:
  explicit Resolver(const std::map<std::string, std::string>& env) : env_(env) {}
  Node load(const std::filesystem::path& path, const std::string& included_from = "");

 private:
  [[noreturn]] void throw_cycle(const std::filesystem::path& again) const;
  const std::map<std::string, std::string>& env_;
  std::vector<std::filesystem::path> chain_;
};

}  // namespace omni::yaml
