// The row makers of the option table and the groups it is built from (internal to
// src/config/): each options_<group>.cpp appends the rows of one of Megatron's argument
// groups, and option_table() concatenates them into the one table.
#pragma once

#include <charconv>
#include <initializer_list>
#include <string>
#include <type_traits>
#include <vector>

#include "base/error.h"
#include "config/options.h"

namespace omni::option_rows {

template <typename T>
T parse_number(const std::string& flag, const std::string& text) {
  T value{};
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, value);
  if (ec != std::errc() || ptr != end) {
    throw UsageError(flag + " expects " + (std::is_integral_v<T> ? "an integer" : "a number") +
                     ", got '" + text + "'");
  }
  return value;
}

// Shortest text that parses back to the same value.
template <typename T>
std::string format_number(T v) {
  char buf[64];
  auto [ptr, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, ptr);
}

template <typename T, typename Access>
OptionDef number(std::string flag, std::string metavar, std::string group, std::string help,
                 Access access) {
  return OptionDef{
      flag,
      std::move(metavar),
      std::move(group),
      std::move(help),
      [flag, access](Options& o, const std::string& v) { access(o) = parse_number<T>(flag, v); },
      [access](const Options& o) { return format_number(access(const_cast<Options&>(o))); }};
}

template <typename Access>
OptionDef text(std::string flag, std::string metavar, std::string group, std::string help,
               Access access) {
  return OptionDef{flag,
                   std::move(metavar),
                   std::move(group),
                   std::move(help),
                   [access](Options& o, const std::string& v) { access(o) = v; },
                   [access](const Options& o) { return access(const_cast<Options&>(o)); }};
}

// A switch: present means `value`.
template <typename Access>
OptionDef toggle(std::string flag, std::string group, std::string help, Access access,
                 bool value = true) {
  return OptionDef{flag,
                   "",
                   std::move(group),
                   std::move(help),
                   [access, value](Options& o, const std::string&) { access(o) = value; },
                   [access, value](const Options& o) {
                     return access(const_cast<Options&>(o)) == value ? "true" : "";
                   }};
}

// Another spelling of `target`, a row already in `t` (Megatron's older or encoder-side
// names): it sets what `target` sets.
void add_alias(std::vector<OptionDef>& t, const std::string& flag, const std::string& target);

// A refused feature's flag: anything but `off` (the value that means the feature is off;
// empty: every value, and every use of a switch) raises NotBuiltError naming `feature`.
OptionDef not_built(std::string flag, std::string metavar, std::string off, std::string feature);

// A flag that only tunes Megatron's machinery: accepted, with a note saying `why`.
OptionDef plumbing(std::string flag, std::string metavar, std::string why);

// Megatron's flags as data: the flag and its metavar ("" for a switch; ending in "..." for a
// list of values, read up to the next --flag).
struct ListedFlag {
  const char* flag;
  const char* metavar;
};
// Appends `note` unless it is there already (finalize runs again over a checkpoint's options).
void add_note_once(std::vector<std::string>& notes, const std::string& note);
// Noted, each with the same reason.
void add_noted(std::vector<OptionDef>& t, const std::string& why,
               std::initializer_list<ListedFlag> flags);
// Noted because they tune `feature`, which only `switch_flag` turns on and which is refused.
void add_tuning(std::vector<OptionDef>& t, const std::string& feature,
                const std::string& switch_flag, std::initializer_list<ListedFlag> flags);
// Refused for every value.
void add_refused(std::vector<OptionDef>& t, const std::string& feature,
                 std::initializer_list<ListedFlag> flags);

// finalize()'s checks and derived values for the length of training, the batch ramp and
// the learning-rate schedule (finalize_schedules.cpp).
void finalize_schedules(Options& o);
// The optimizer zoo's rows and checks (options_optimizer_zoo.cpp).
void add_optimizer_zoo_options(std::vector<OptionDef>& t);
void finalize_optimizer_zoo(Options& o);

// The groups, in the order --help lists them.
void add_model_options(std::vector<OptionDef>& t);
void add_moe_options(std::vector<OptionDef>& t);  // options_moe.cpp
void add_mla_options(std::vector<OptionDef>& t);  // options_mla.cpp
void finalize_mla(Options& o);  // options_mla.cpp: the layouts MLA refuses
// With --num-experts: refuses what the MoE layers do not build (options_moe.cpp).
void finalize_moe(Options& o);
// --zero-stage 2 and 3: the settings they do not combine with yet (options_distributed.cpp).
void finalize_zero(Options& o);
void add_training_options(std::vector<OptionDef>& t);
void add_learning_rate_options(std::vector<OptionDef>& t);
void add_data_options(std::vector<OptionDef>& t);
void add_logging_options(std::vector<OptionDef>& t);
void add_command_options(std::vector<OptionDef>& t);
void add_evaluation_options(std::vector<OptionDef>& t);  // options_evaluation.cpp
void add_checkpointing_options(std::vector<OptionDef>& t);
void add_distributed_options(std::vector<OptionDef>& t);
void add_mixed_precision_options(std::vector<OptionDef>& t);
void add_noted_options(std::vector<OptionDef>& t);    // options_noted.cpp
void add_refused_options(std::vector<OptionDef>& t);  // options_refused.cpp
void add_primus_options(std::vector<OptionDef>& t);   // options_primus.cpp: Primus's keys

// finalize()'s checks of the logging, profiling and communication rows (options_logging.cpp):
// --profile's range, --logging-level (MEGATRON_LOGGING_LEVEL when unset),
// --distributed-timeout-minutes, and --overlap-param-gather's requirements.
void finalize_logging_and_profiling(Options& o);

}  // namespace omni::option_rows
