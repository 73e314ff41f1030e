#include "config/option_rows.h"

#include <algorithm>
#include <cstdlib>

namespace omni::option_rows {

namespace {

// "1" and "1.0" are the same number to a numeric flag.
bool same_value(const std::string& a, const std::string& b) {
  if (a == b) return true;
  char *end_a = nullptr, *end_b = nullptr;
  const double x = std::strtod(a.c_str(), &end_a), y = std::strtod(b.c_str(), &end_b);
  return !a.empty() && !b.empty() && *end_a == '\0' && *end_b == '\0' && x == y;
}

// Commands parse some arguments twice (a preset, then a checkpoint's options under the
// command line), and Primus files pass whole families of flags: one line per reason,
// naming each flag once ("note: --a, --b have no effect here: why").
void add_note(std::vector<std::string>& notes, const std::string& flag, const std::string& why) {
  const std::string tail = " no effect here: " + why;
  for (std::string& n : notes) {
    if (n.size() < tail.size() || n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    const size_t end = n.size() - tail.size();  // "note: FLAGS has" or "note: FLAGS have"
    const size_t verb = n.compare(end - 4, 4, " has") == 0 ? end - 4 : end - 5;
    const std::string flags = n.substr(6, verb - 6);  // after "note: "
    if ((", " + flags + ", ").find(", " + flag + ", ") != std::string::npos) return;
    n = "note: " + flags + ", " + flag + " have" + tail;
    return;
  }
  notes.push_back("note: " + flag + " has" + tail);
}

// A metavar ending in "..." is a list of values, read up to the next --flag.
bool takes_list(const std::string& metavar) {
  return metavar.size() > 3 && metavar.compare(metavar.size() - 3, 3, "...") == 0;
}

}  // namespace

void add_note_once(std::vector<std::string>& notes, const std::string& note) {
  if (std::find(notes.begin(), notes.end(), note) == notes.end()) notes.push_back(note);
}

void add_alias(std::vector<OptionDef>& t, const std::string& flag, const std::string& target) {
  auto to = std::find_if(t.begin(), t.end(), [&](const OptionDef& d) { return d.flag == target; });
  OMNI_CHECK(to != t.end(), "[options] alias ", flag, " of a flag not yet in the table: ", target);
  t.push_back(
      OptionDef{flag, to->metavar, to->group, "the same as " + target, to->set, nullptr, to->many});
}

OptionDef not_built(std::string flag, std::string metavar, std::string off, std::string feature) {
  std::string help = feature + (off.empty() ? "" : " (" + off + " works)");
  OptionDef d{flag,
              metavar,
              "not built yet",
              std::move(help),
              [flag, off, feature, metavar](Options&, const std::string& v) {
                if (off.empty() || !same_value(v, off))
                  throw NotBuiltError(metavar.empty() ? flag : flag + " " + v, feature);
              },
              nullptr};
  d.many = takes_list(metavar);
  d.support = Support::NotBuilt;
  return d;
}

OptionDef plumbing(std::string flag, std::string metavar, std::string why) {
  OptionDef d{flag,
              metavar,
              "accepted, no effect",
              why,
              [flag, why](Options& o, const std::string&) { add_note(o.notes, flag, why); },
              nullptr};
  d.many = takes_list(metavar);
  d.support = Support::Noted;
  return d;
}

void add_noted(std::vector<OptionDef>& t, const std::string& why,
               std::initializer_list<ListedFlag> flags) {
  for (const ListedFlag& f : flags) t.push_back(plumbing(f.flag, f.metavar, why));
}

void add_tuning(std::vector<OptionDef>& t, const std::string& feature,
                const std::string& switch_flag, std::initializer_list<ListedFlag> flags) {
  add_noted(t, "it tunes " + feature + ", which " + switch_flag + " turns on (not built yet)",
            flags);
}

void add_refused(std::vector<OptionDef>& t, const std::string& feature,
                 std::initializer_list<ListedFlag> flags) {
  for (const ListedFlag& f : flags) t.push_back(not_built(f.flag, f.metavar, "", feature));
}

}  // namespace omni::option_rows
