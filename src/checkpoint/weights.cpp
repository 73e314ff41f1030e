#include "checkpoint/weights.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"

namespace omni {

namespace {
constexpr const char* kMagic = "omnitron-weights 1";
std::string weights_file(const std::string& dir) {
  return dir + "/model.omw";
}
}  // namespace

void save_weights(const std::string& dir, const Options& opts, const ParameterSet<float>& params) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  OMNI_REQUIRE(!ec, "--save: cannot create directory '", dir, "': ", ec.message());
  const std::string path = weights_file(dir), tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    OMNI_REQUIRE(out, "--save: cannot write '", tmp, "'");
    out << kMagic << "\nargs";
    for (const std::string& a : options_as_args(opts, "model")) out << ' ' << a;
    out << "\nvalues " << params.size() << "\n";
    for (const ParamInfo& p : params.infos()) {
      out << "tensor " << p.name << ' ' << p.offset;
      for (int64_t d : p.shape) out << ' ' << d;
      out << "\n";
    }
    out << "data\n";
    out.write(reinterpret_cast<const char*>(params.values()), params.size() * sizeof(float));
    out.flush();
    OMNI_REQUIRE(out, "--save: writing '", tmp, "' failed (disk full?)");
  }
  fs::rename(tmp, path, ec);
  OMNI_REQUIRE(!ec, "--save: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::vector<float> load_weights(const std::string& dir, Options& opts) {
  const std::string path = weights_file(dir);
  std::ifstream in(path, std::ios::binary);
  OMNI_REQUIRE(in, "--load: cannot open '", path, "' (expected the weights written by --save)");
  std::string line;
  std::getline(in, line);
  OMNI_REQUIRE(line == kMagic, "--load: '", path, "' is not an omnitron weights file (expected '",
               kMagic, "' first, found '", line.substr(0, 40), "')");
  std::getline(in, line);
  OMNI_REQUIRE(line.rfind("args", 0) == 0, "--load: '", path, "' has no model options line");
  std::istringstream args_in(line.substr(4));
  std::vector<std::string> args;
  for (std::string a; args_in >> a;) args.push_back(a);
  parse_options(args, opts);
  int64_t count = -1;
  while (std::getline(in, line) && line != "data") {
    if (line.rfind("values ", 0) == 0) count = std::stoll(line.substr(7));
  }
  OMNI_REQUIRE(count >= 0 && line == "data", "--load: '", path, "' has a malformed header");
  std::vector<float> values(count);
  in.read(reinterpret_cast<char*>(values.data()), count * sizeof(float));
  OMNI_REQUIRE(in.gcount() == static_cast<std::streamsize>(count * sizeof(float)), "--load: '",
               path, "' is truncated: expected ", count, " float32 values");
  return values;
}

void assign_weights(ParameterSet<float>& params, const std::vector<float>& values,
                    const std::string& dir) {
  OMNI_REQUIRE(static_cast<int64_t>(values.size()) == params.size(), "--load: '", weights_file(dir),
               "' holds ", values.size(), " values but the model needs ", params.size());
  std::memcpy(params.values(), values.data(), values.size() * sizeof(float));
}

}  // namespace omni
