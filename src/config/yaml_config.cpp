#include "config/yaml_config.h"

#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>

#include "base/error.h"
#include "config/options.h"

extern char** environ;

namespace omni {

namespace fs = std::filesystem;

namespace {

// A YAML value, remembering where it was written so that errors and --print-config can
// name the file and line.
struct Node {
  enum class Kind { Null, Scalar, Sequence, Map };
  Kind kind = Kind::Null;
  std::string scalar;
  bool plain = true;  // an unquoted scalar (only those can be null or booleans)
  std::vector<Node> items;
  std::vector<std::pair<std::string, Node>> entries;  // a map, in file order
  std::string file;
  int line = 0;

  Node* find(const std::string& key) {
    for (auto& [k, v] : entries)
      if (k == key) return &v;
    return nullptr;
  }
};

std::string where(const std::string& file, int line) {
  return line > 0 ? file + ":" + std::to_string(line) : file;
}

bool is_null_scalar(const Node& n) {
  return n.kind == Node::Kind::Null ||
         (n.kind == Node::Kind::Scalar && n.plain &&
          (n.scalar.empty() || n.scalar == "~" || n.scalar == "null" || n.scalar == "Null" ||
           n.scalar == "NULL"));
}

// ---------------------------------------------------------------------------------------------
// Reading a file with libyaml's document loader (which also resolves anchors and aliases).

struct YamlDocument {
  yaml_parser_t parser;
  yaml_document_t doc;
  bool loaded = false;
  YamlDocument() { yaml_parser_initialize(&parser); }
  ~YamlDocument() {
    if (loaded) yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
  }
  YamlDocument(const YamlDocument&) = delete;
  YamlDocument& operator=(const YamlDocument&) = delete;
};

Node convert(yaml_document_t* doc, yaml_node_t* y, const std::string& file, int depth) {
  if (depth > 64) throw UsageError(file + ": YAML nested too deeply (a recursive alias?)");
  Node n;
  n.file = file;
  n.line = int(y->start_mark.line) + 1;
  switch (y->type) {
    case YAML_SCALAR_NODE:
      n.kind = Node::Kind::Scalar;
      n.scalar.assign(reinterpret_cast<const char*>(y->data.scalar.value), y->data.scalar.length);
      n.plain = y->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
      if (is_null_scalar(n)) n.kind = Node::Kind::Null;
      break;
    case YAML_SEQUENCE_NODE:
      n.kind = Node::Kind::Sequence;
      for (yaml_node_item_t* it = y->data.sequence.items.start; it < y->data.sequence.items.top;
           ++it)
        n.items.push_back(convert(doc, yaml_document_get_node(doc, *it), file, depth + 1));
      break;
    case YAML_MAPPING_NODE:
      n.kind = Node::Kind::Map;
      for (yaml_node_pair_t* p = y->data.mapping.pairs.start; p < y->data.mapping.pairs.top; ++p) {
        yaml_node_t* key = yaml_document_get_node(doc, p->key);
        const int key_line = int(key->start_mark.line) + 1;
        if (key->type != YAML_SCALAR_NODE)
          throw UsageError(where(file, key_line) + ": map keys must be plain names");
        std::string k(reinterpret_cast<const char*>(key->data.scalar.value),
                      key->data.scalar.length);
        if (n.find(k)) throw UsageError(where(file, key_line) + ": duplicate key '" + k + "'");
        Node value = convert(doc, yaml_document_get_node(doc, p->value), file, depth + 1);
        value.line = key_line;  // report a key's value where the key is written
        n.entries.emplace_back(std::move(k), std::move(value));
      }
      break;
    default:
      break;
  }
  return n;
}

Node parse_yaml_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw UsageError("cannot read config file " + path.string());
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string text = buffer.str();

  YamlDocument y;
  yaml_parser_set_input_string(&y.parser, reinterpret_cast<const unsigned char*>(text.data()),
                               text.size());
  if (!yaml_parser_load(&y.parser, &y.doc)) {
    const yaml_mark_t& m = y.parser.problem_mark;
    std::string msg = path.string() + ":" + std::to_string(m.line + 1) + ":" +
                      std::to_string(m.column + 1) +
                      ": malformed YAML: " + (y.parser.problem ? y.parser.problem : "parse error");
    if (y.parser.context) msg += std::string(" (") + y.parser.context + ")";
    throw UsageError(msg);
  }
  y.loaded = true;
  yaml_node_t* root = yaml_document_get_root_node(&y.doc);
  Node n;
  n.file = path.string();
  if (root) n = convert(&y.doc, root, path.string(), 0);
  if (n.kind == Node::Kind::Null) n.kind = Node::Kind::Map;  // an empty file
  if (n.kind != Node::Kind::Map)
    throw UsageError(path.string() + ": the top level of a config must be a map of keys");
  return n;
}

// ---------------------------------------------------------------------------------------------
// ${VAR} and ${VAR:default}

std::string substitute(const std::string& text, const Node& at,
                       const std::map<std::string, std::string>& env) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find("${", pos);
    if (open == std::string::npos) break;
    const size_t close = text.find('}', open + 2);
    if (close == std::string::npos)
      throw UsageError(where(at.file, at.line) + ": unterminated ${ in '" + text + "'");
    out += text.substr(pos, open - pos);
    const std::string inner = text.substr(open + 2, close - open - 2);
    const size_t colon = inner.find(':');
    const std::string name = inner.substr(0, colon);
    const bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                       });
    if (!valid)
      throw UsageError(where(at.file, at.line) + ": '${" + inner +
                       "}' is not a variable reference (${NAME} or ${NAME:default})");
    if (auto it = env.find(name); it != env.end()) {
      out += it->second;
    } else if (colon != std::string::npos) {
      out += inner.substr(colon + 1);
    } else {
      throw UsageError(where(at.file, at.line) + ": environment variable " + name +
                       " is not set (write ${" + name + ":default} to give a default)");
    }
    pos = close + 1;
  }
  return out + text.substr(pos);
}

void substitute_all(Node& n, const std::map<std::string, std::string>& env) {
  switch (n.kind) {
    case Node::Kind::Scalar:
      if (n.scalar.find("${") != std::string::npos) {
        n.scalar = substitute(n.scalar, n, env);
        if (is_null_scalar(n)) n.kind = Node::Kind::Null;
      }
      break;
    case Node::Kind::Sequence:
      for (Node& item : n.items) substitute_all(item, env);
      break;
    case Node::Kind::Map:
      for (auto& [k, v] : n.entries) substitute_all(v, env);
      break;
    case Node::Kind::Null:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Inheritance

// Maps merge key by key (recursively); anything else, lists included, is replaced.
void merge_into(Node& dst, const Node& src) {
  if (dst.kind != Node::Kind::Map || src.kind != Node::Kind::Map) {
    dst = src;
    return;
  }
  for (const auto& [k, v] : src.entries) {
    if (Node* existing = dst.find(k))
      merge_into(*existing, v);
    else
      dst.entries.emplace_back(k, v);
  }
}

Node take(Node& map, const std::string& key) {
  auto it = std::find_if(map.entries.begin(), map.entries.end(),
                         [&](const auto& e) { return e.first == key; });
  if (it == map.entries.end()) return Node{};
  Node n = std::move(it->second);
  map.entries.erase(it);
  return n;
}

std::vector<Node> as_path_list(const Node& n, const std::string& key) {
  if (n.kind == Node::Kind::Null) return {};
  if (n.kind == Node::Kind::Scalar) return {n};
  if (n.kind == Node::Kind::Sequence) {
    for (const Node& item : n.items)
      if (item.kind != Node::Kind::Scalar)
        throw UsageError(where(item.file, item.line) + ": " + key + " lists file paths");
    return n.items;
  }
  throw UsageError(where(n.file, n.line) + ": " + key + " must be a file path or a list of them");
}

bool has_yaml_extension(const std::string& name) {
  const std::string ext = fs::path(name).extension().string();
  return ext == ".yaml" || ext == ".yml";
}

fs::path find_model(const Node& ref, const std::map<std::string, std::string>& env) {
  const fs::path including_dir = fs::path(ref.file).parent_path();
  const std::string& name = ref.scalar;
  if (name.find('/') != std::string::npos || name.rfind('.', 0) == 0)
    return (fs::path(name).is_absolute() ? fs::path(name) : including_dir / name)
        .lexically_normal();
  const std::string file = has_yaml_extension(name) ? name : name + ".yaml";
  std::vector<fs::path> dirs;
  if (auto it = env.find("OMNITRON_MODEL_DIR"); it != env.end() && !it->second.empty())
    dirs.emplace_back(it->second);
  for (fs::path d = fs::absolute(including_dir); !d.empty(); d = d.parent_path()) {
    dirs.push_back(d / "configs" / "models");
    dirs.push_back(d / "models");
    if (d == d.parent_path()) break;
  }
  dirs.push_back(fs::current_path() / "configs" / "models");
  dirs.push_back(including_dir);
  for (const fs::path& d : dirs)
    if (fs::is_regular_file(d / file)) return (d / file).lexically_normal();
  throw UsageError(where(ref.file, ref.line) + ": model '" + name + "' not found: no " + file +
                   " in $OMNITRON_MODEL_DIR, in a configs/models or models folder beside " +
                   including_dir.string() + " or above it, or in ./configs/models");
}

class Resolver {
 public:
  explicit Resolver(const std::map<std::string, std::string>& env) : env_(env) {}

  // The fully resolved, flat map of `path`: bases < model < own keys < overrides.
  Node load(const fs::path& path, const std::string& included_from) {
    const fs::path p = fs::absolute(path).lexically_normal();
    if (!fs::is_regular_file(p))
      throw UsageError("config file not found: " + p.string() +
                       (included_from.empty() ? "" : " (included from " + included_from + ")"));
    const fs::path canonical = fs::canonical(p);
    if (std::find(chain_.begin(), chain_.end(), canonical) != chain_.end()) throw_cycle(canonical);
    chain_.push_back(canonical);

    Node own = parse_yaml_file(p);
    substitute_all(own, env_);
    Node result;
    result.kind = Node::Kind::Map;
    result.file = p.string();
    for (const char* key : {"bases", "extends"}) {
      for (const Node& base : as_path_list(take(own, key), key)) {
        const fs::path bp = fs::path(base.scalar).is_absolute() ? fs::path(base.scalar)
                                                                : p.parent_path() / base.scalar;
        merge_into(result, load(bp, where(base.file, base.line)));
      }
    }
    if (Node model = take(own, "model"); model.kind != Node::Kind::Null) {
      if (model.kind != Node::Kind::Scalar)
        throw UsageError(where(model.file, model.line) +
                         ": model must be a model name (configs/models/NAME.yaml) or a path");
      merge_into(result, load(find_model(model, env_), where(model.file, model.line)));
    }
    Node overrides = take(own, "overrides");
    merge_into(result, own);
    if (overrides.kind == Node::Kind::Map)
      merge_into(result, overrides);
    else if (overrides.kind != Node::Kind::Null)
      throw UsageError(where(overrides.file, overrides.line) + ": overrides must be a map of keys");

    chain_.pop_back();
    return result;
  }

 private:
  [[noreturn]] void throw_cycle(const fs::path& again) {
    const fs::path root = chain_.front().parent_path();
    auto show = [&](const fs::path& f) {
      const fs::path rel = f.lexically_relative(root);
      return rel.empty() ? f.string() : rel.string();
    };
    std::string msg = "config inheritance cycle: ";
    auto first = std::find(chain_.begin(), chain_.end(), again);
    for (auto it = first; it != chain_.end(); ++it) msg += show(*it) + " -> ";
    msg += show(again) + " (in " + root.string() + ")";
    throw UsageError(msg);
  }

  const std::map<std::string, std::string>& env_;
  std::vector<fs::path> chain_;
};

// ---------------------------------------------------------------------------------------------
// Keys to options

std::string key_of_flag(const std::string& flag) {
  std::string k = flag.substr(2);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

const OptionDef& option_for_key(const std::string& key, const Node& at) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  if (const OptionDef* d = find_option(flag)) return *d;
  throw UsageError(where(at.file, at.line) + ": unknown key '" + key + "'; did you mean " +
                   key_of_flag(closest_option(flag).flag) + "?");
}

std::optional<bool> as_bool(const std::string& s) {
  std::string v = s;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "true" || v == "yes" || v == "on") return true;
  if (v == "false" || v == "no" || v == "off") return false;
  return std::nullopt;
}

}  // namespace

std::map<std::string, std::string> process_environment() {
  std::map<std::string, std::string> env;
  for (char** e = environ; e && *e; ++e) {
    const std::string kv = *e;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos) env.emplace(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return env;
}

std::vector<ConfigEntry> resolve_yaml_config(const std::string& path,
                                             const std::map<std::string, std::string>& env) {
  Resolver resolver(env);
  const Node resolved = resolver.load(path, "");
  std::vector<ConfigEntry> entries;
  for (const auto& [key, value] : resolved.entries) {
    const OptionDef& def = option_for_key(key, value);
    if (value.kind == Node::Kind::Null) continue;
    ConfigEntry e{key_of_flag(def.flag), def.flag,   {},        false,
                  def.metavar.empty(),   value.file, value.line};
    const std::string at = where(value.file, value.line) + ": " + e.key;
    if (value.kind == Node::Kind::Map)
      throw UsageError(at + " holds a map; option values are single values or lists");
    if (e.is_switch) {
      const auto b = value.kind == Node::Kind::Scalar ? as_bool(value.scalar) : std::nullopt;
      if (!b)
        throw UsageError(at + " is a switch: write true or false (got '" + value.scalar + "')");
      e.values = {*b ? "true" : "false"};
    } else if (value.kind == Node::Kind::Sequence) {
      if (!def.many && value.items.size() != 1)
        throw UsageError(at + " takes one value (" + def.metavar + "), not a list");
      for (const Node& item : value.items) {
        if (item.kind != Node::Kind::Scalar)
          throw UsageError(at + ": list items must be single values");
        e.values.push_back(item.scalar);
      }
      e.is_list = true;
    } else {
      e.values = {value.scalar};
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

std::vector<std::string> config_entries_to_args(const std::vector<ConfigEntry>& entries) {
  std::vector<std::string> args;
  for (const ConfigEntry& e : entries) {
    if (e.is_switch) {
      if (e.values.at(0) == "true") args.push_back(e.flag);
      continue;
    }
    args.push_back(e.flag);
    args.insert(args.end(), e.values.begin(), e.values.end());
  }
  return args;
}

std::vector<std::string> yaml_to_args(const std::string& path,
                                      const std::map<std::string, std::string>& env) {
  return config_entries_to_args(resolve_yaml_config(path, env));
}

std::string format_config_entries(const std::vector<ConfigEntry>& entries) {
  std::string out;
  for (const ConfigEntry& e : entries) {
    std::string value;
    if (e.is_list) {
      value = "[";
      for (size_t i = 0; i < e.values.size(); ++i) value += (i ? ", " : "") + e.values[i];
      value += "]";
    } else {
      value = e.values.at(0);
    }
    out += e.key + ": " + value + "  # " + where(e.file, e.line) + "\n";
  }
  return out;
}

}  // namespace omni
