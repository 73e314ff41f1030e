#include "config/yaml_config.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include "base/error.h"
#include "config/megatron_dests.h"
#include "config/options.h"
#include "config/primus_experiment.h"
#include "config/primus_keys.h"
#include "config/yaml_tree.h"

extern char** environ;

namespace omni {

namespace {

using yaml::Node;
using yaml::where;

std::string key_of_flag(const std::string& flag) {
  std::string k = flag.substr(2);
  std::replace(k.begin(), k.end(), '-', '_');
  return k;
}

std::string flag_of_key(const std::string& key) {
  std::string flag = "--" + key;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

// YAML 1.1's booleans (what Primus's PyYAML reads), and 1/0.
std::optional<bool> as_bool(const std::string& s) {
  std::string v = s;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "true" || v == "yes" || v == "on" || v == "1") return true;
  if (v == "false" || v == "no" || v == "off" || v == "0") return false;
  return std::nullopt;
}

// "1e-05" and "1.0e-5" are the same number; "True" and "true" the same switch.
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  if (!a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0') return x == y;
  const auto p = as_bool(a), q = as_bool(b);
  return p && q && *p == *q;
}

// What a key means on the command line: its flag, how the value becomes arguments, and the
// default that a value may equal (Megatron's, or Primus's for its own keys).
struct KeyMeaning {
  std::string flag;
  DestAction action = DestAction::Value;
  const char* default_value = nullptr;  // null: none (Python's None)
  bool pinned_only = false;             // a name of the Megatron Primus pins, not current
};

std::optional<KeyMeaning> meaning_of(const std::string& key) {
  if (const MegatronDest* d = find_megatron_dest(key))
    return KeyMeaning{d->flag, d->action, d->megatron_default,
                      d->version == MegatronVersion::Primus};
  const std::string flag = flag_of_key(key);
  if (const OptionDef* def = find_option(flag))
    return KeyMeaning{flag, def->metavar.empty() ? DestAction::StoreTrue : DestAction::Value,
                      primus_key_default(key), false};
  return std::nullopt;
}

std::string value_text(const Node& value) {
  if (value.kind != Node::Kind::Sequence) return value.scalar;
  std::string text = "[";
  for (size_t i = 0; i < value.items.size(); ++i) text += (i ? ", " : "") + value.items[i].scalar;
  return text + "]";
}

// The entry for one key of the flattened config, or nothing when the key asks for nothing.
std::optional<ConfigEntry> entry_for(const std::string& key, const Node& value) {
  if (value.is_null()) return std::nullopt;
  if (value.kind == Node::Kind::Sequence && value.items.empty()) return std::nullopt;
  const std::optional<KeyMeaning> m = meaning_of(key);
  if (!m)
    throw UsageError(where(value) + ": unknown key '" + key + "'; did you mean " +
                     key_of_flag(closest_option(flag_of_key(key)).flag) + "?");
  const std::string at = where(value) + ": " + key;
  if (value.kind == Node::Kind::Map)
    throw UsageError(at + " holds a map; option values are single values or lists");
  ConfigEntry e{key, value_text(value), {}, value.file, value.line};

  std::vector<std::string> values;  // a value flag's words
  if (m->action == DestAction::Value) {
    if (value.kind == Node::Kind::Sequence) {
      for (const Node& item : value.items) {
        if (item.kind != Node::Kind::Scalar)
          throw UsageError(at + ": list items must be single values");
        values.push_back(item.scalar);
      }
    } else {
      values = {value.scalar};
    }
    e.args = {m->flag};
    e.args.insert(e.args.end(), values.begin(), values.end());
  } else {
    const auto b = value.kind == Node::Kind::Scalar ? as_bool(value.scalar) : std::nullopt;
    if (!b) throw UsageError(at + " is a switch: write true or false (got '" + e.text + "')");
    values = {*b ? "true" : "false"};
    if (m->action == DestAction::Both)
      e.args = {*b ? m->flag : "--no-" + m->flag.substr(2)};
    else if (*b == (m->action == DestAction::StoreTrue))
      e.args = {m->flag};
    else
      return std::nullopt;  // the switch's off state: nothing to pass
  }

  std::string joined;
  for (const std::string& v : values) joined += (joined.empty() ? "" : " ") + v;
  const bool is_default = m->default_value && same_value(joined, m->default_value);
  const OptionDef* def = find_option(e.args[0]);
  if (!def && is_default) return std::nullopt;
  if (!def && m->pinned_only)
    throw UsageError(at + ": " + m->flag +
                     " is a flag of the Megatron that Primus pins, which "
                     "current Megatron dropped; omnitron does not build it");
  if (!def) return e;  // the option table judges it ("unknown option")
  // A value of Megatron's (or Primus's) default asks for nothing, so a flag omnitron only
  // notes or refuses is not mentioned; a built flag always takes it (defaults may differ).
  if (def->support != Support::Built && is_default) return std::nullopt;
  if (m->action == DestAction::Value && values.size() != 1 && !def->many)
    throw UsageError(at + " takes one value (" + def->metavar + "), not a list");
  return e;
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
  const Node resolved = is_primus_experiment(path, env) ? load_primus_experiment(path, env)
                                                        : yaml::Resolver(env).load(path);
  std::vector<ConfigEntry> entries;
  for (const auto& [key, value] : resolved.entries)
    if (std::optional<ConfigEntry> e = entry_for(key, value)) entries.push_back(std::move(*e));
  return entries;
}

std::vector<std::string> config_entries_to_args(const std::vector<ConfigEntry>& entries) {
  std::vector<std::string> args;
  for (const ConfigEntry& e : entries) args.insert(args.end(), e.args.begin(), e.args.end());
  return args;
}

std::vector<std::string> yaml_to_args(const std::string& path,
                                      const std::map<std::string, std::string>& env) {
  return config_entries_to_args(resolve_yaml_config(path, env));
}

std::string format_config_entries(const std::vector<ConfigEntry>& entries) {
  std::string out;
  for (const ConfigEntry& e : entries) {
    out += e.key + ": " + e.text + "  # ";
    if (e.args.at(0) != flag_of_key(e.key)) out += e.args[0] + "  from ";
    out += where(e.file, e.line) + "\n";
  }
  return out;
}

}  // namespace omni
