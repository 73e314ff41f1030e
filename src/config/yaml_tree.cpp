#include "config/yaml_tree.h"

#include <yaml.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace omni::yaml {

namespace fs = std::filesystem;

Node* Node::find(const std::string& key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

const Node* Node::find(const std::string& key) const {
  return const_cast<Node*>(this)->find(key);
}

std::string where(const std::string& file, int line) {
  return line > 0 ? file + ":" + std::to_string(line) : file;
}

namespace {

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

}  // namespace

Node parse_file(const fs::path& path) {
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

namespace {

std::string substitute(const std::string& text, const std::string& at,
                       const std::map<std::string, std::string>& env) {
  std::string out;
  size_t pos = 0;
  while (true) {
    const size_t open = text.find("${", pos);
    if (open == std::string::npos) break;
    const size_t close = text.find('}', open + 2);
    if (close == std::string::npos) throw UsageError(at + ": unterminated ${ in '" + text + "'");
    out += text.substr(pos, open - pos);
    const std::string inner = text.substr(open + 2, close - open - 2);
    const size_t colon = inner.find(':');
    const std::string name = inner.substr(0, colon);
    const bool valid = !name.empty() && !std::isdigit(static_cast<unsigned char>(name[0])) &&
                       std::all_of(name.begin(), name.end(), [](char c) {
                         return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
                       });
    if (!valid)
      throw UsageError(at + ": '${" + inner +
                       "}' is not a variable reference (${NAME} or ${NAME:default})");
    if (auto it = env.find(name); it != env.end()) {
      out += it->second;
    } else if (colon != std::string::npos) {
      out += inner.substr(colon + 1);
    } else {
      throw UsageError(at + ": environment variable " + name + " is not set (write ${" + name +
                       ":default} to give a default)");
    }
    pos = close + 1;
  }
  return out + text.substr(pos);
}

}  // namespace

void substitute_variables(Node& n, const std::map<std::string, std::string>& env) {
  switch (n.kind) {
    case Node::Kind::Scalar:
      if (n.scalar.find("${") != std::string::npos) {
        n.scalar = substitute(n.scalar, where(n), env);
        // What the variable gave is a value of its own: "" stays a string (Primus's ${X:}),
        // "null" is null (Primus sets it to None), "true"/"1" read as usual.
        n.plain = !n.scalar.empty();
        if (n.scalar == "null") n.kind = Node::Kind::Null;
      }
      break;
    case Node::Kind::Sequence:
      for (Node& item : n.items) substitute_variables(item, env);
      break;
    case Node::Kind::Map:
      for (auto& [k, v] : n.entries) {
        if (k.find("${") != std::string::npos) {
          std::string key = substitute(k, where(v), env);
          for (const auto& [other, unused] : n.entries)
            if (other == key && &other != &k)
              throw UsageError(where(v) + ": key '" + k + "' becomes '" + key +
                               "', a key the map already has");
          k = std::move(key);
        }
        substitute_variables(v, env);
      }
      break;
    case Node::Kind::Null:
      break;
  }
}

// ---------------------------------------------------------------------------------------------
// Inheritance

void merge_over(Node& dst, const Node& src) {
  if (dst.kind != Node::Kind::Map || src.kind != Node::Kind::Map) {
    dst = src;
    return;
  }
  for (const auto& [k, v] : src.entries) {
    if (Node* existing = dst.find(k))
      merge_over(*existing, v);
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

namespace {

std::vector<Node> as_path_list(const Node& n, const std::string& key) {
  if (n.kind == Node::Kind::Null) return {};
  if (n.kind == Node::Kind::Scalar) return {n};
  if (n.kind == Node::Kind::Sequence) {
    for (const Node& item : n.items)
      if (item.kind != Node::Kind::Scalar)
        throw UsageError(where(item) + ": " + key + " lists file paths");
    return n.items;
  }
  throw UsageError(where(n) + ": " + key + " must be a file path or a list of them");
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
  try {
    return find_zoo_model(name, including_dir, env);
  } catch (const UsageError& e) {
    throw UsageError(where(ref) + ": " + e.what());
  }
}

}  // namespace

fs::path find_zoo_model(const std::string& name, const fs::path& including_dir,
                        const std::map<std::string, std::string>& env) {
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
  // Beside the executable: a build directory inside the source tree (build/omnitron), or an
  // installed prefix (bin/omnitron, share/omnitron/configs/models).
  std::error_code ec;
  const fs::path exe_dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
  if (!ec) {
    dirs.push_back(exe_dir.parent_path() / "configs" / "models");
    dirs.push_back(exe_dir.parent_path() / "share" / "omnitron" / "configs" / "models");
  }
  dirs.push_back(including_dir);
  for (const fs::path& d : dirs)
    if (fs::is_regular_file(d / file)) return (d / file).lexically_normal();
  throw UsageError("model '" + name + "' not found: no " + file +
                   " in $OMNITRON_MODEL_DIR, in a configs/models or models folder in " +
                   fs::absolute(including_dir).string() +
                   " or above it, in ./configs/models, or beside the omnitron executable (" +
                   (ec ? std::string("unknown") : exe_dir.parent_path().string()) +
                   "/configs/models, or share/omnitron/configs/models when installed)");
}

Node Resolver::load(const fs::path& path, const std::string& included_from) {
  const fs::path p = fs::absolute(path).lexically_normal();
  if (!fs::is_regular_file(p))
    throw UsageError("config file not found: " + p.string() +
                     (included_from.empty() ? "" : " (included from " + included_from + ")"));
  const fs::path canonical = fs::canonical(p);
  if (std::find(chain_.begin(), chain_.end(), canonical) != chain_.end()) throw_cycle(canonical);
  chain_.push_back(canonical);

  Node own = parse_file(p);
  substitute_variables(own, env_);
  Node result;
  result.kind = Node::Kind::Map;
  result.file = p.string();
  auto load_list = [&](const char* key, bool first_wins) {
    std::vector<Node> files = as_path_list(take(own, key), key);
    if (first_wins) std::reverse(files.begin(), files.end());
    for (const Node& f : files) {
      const fs::path fp =
          fs::path(f.scalar).is_absolute() ? fs::path(f.scalar) : p.parent_path() / f.scalar;
      merge_over(result, load(fp, where(f)));
    }
  };
  load_list("extends", false);
  load_list("bases", true);
  load_list("includes", true);
  if (Node model = take(own, "model"); model.kind != Node::Kind::Null) {
    if (model.kind != Node::Kind::Scalar)
      throw UsageError(where(model) +
                       ": model must be a model name (configs/models/NAME.yaml) or a path");
    merge_over(result, load(find_model(model, env_), where(model)));
  }
  Node overrides = take(own, "overrides");
  merge_over(result, own);
  if (overrides.kind == Node::Kind::Map)
    merge_over(result, overrides);
  else if (overrides.kind != Node::Kind::Null)
    throw UsageError(where(overrides) + ": overrides must be a map of keys");

  chain_.pop_back();
  return result;
}

void Resolver::throw_cycle(const fs::path& again) const {
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

}  // namespace omni::yaml
