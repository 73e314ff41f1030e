#include "base/error.h"

namespace omni::detail {

void throw_check_failure(const char* cond, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << msg << (msg.empty() ? "" : " ") << "(check '" << cond << "' failed at " << file << ":"
     << line << ")";
  throw InternalError(os.str());
}

}  // namespace omni::detail
