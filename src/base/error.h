// Errors are exceptions with context (DESIGN.md invariant 7): library code throws,
// only src/cli/ turns an exception into a one-line message and an exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace omni {

// A problem with what the user asked for: a flag, a config value, an input file.
// The CLI prints its message alone (no file/line), since it already names the culprit.
class UsageError : public std::runtime_error {
 public:
  explicit UsageError(const std::string& what) : std::runtime_error(what) {}
};

// A broken internal expectation (shape mismatch, impossible state): a bug or misuse of the API.
class InternalError : public std::logic_error {
 public:
  explicit InternalError(const std::string& what) : std::logic_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}
[[noreturn]] void throw_check_failure(const char* cond, const char* file, int line,
                                      const std::string& msg);
}  // namespace detail

}  // namespace omni

// OMNI_CHECK(cond, "message ", value, ...) throws InternalError naming the condition,
// file and line. Use it for invariants; use OMNI_REQUIRE for user input.
#define OMNI_CHECK(cond, ...)                                                                     \
  do {                                                                                            \
    if (!(cond))                                                                                  \
      ::omni::detail::throw_check_failure(#cond, __FILE__, __LINE__,                              \
                                          ::omni::detail::concat("" __VA_OPT__(, ) __VA_ARGS__)); \
  } while (0)

// OMNI_REQUIRE(cond, "--flag must be ...") throws UsageError with just the message.
#define OMNI_REQUIRE(cond, ...)                                                 \
  do {                                                                          \
    if (!(cond)) throw ::omni::UsageError(::omni::detail::concat(__VA_ARGS__)); \
  } while (0)
