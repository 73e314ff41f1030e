#include "checkpoint/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <vector>

#include "base/error.h"
#include "checkpoint/hf_interchange.h"
#include "optim/optimizer_zoo.h"

namespace omni {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMagic = "omnitron-checkpoint 1";
constexpr const char* kModelFile = "model.bin";
constexpr const char* kOptimizerFile = "optimizer.bin";
constexpr const char* kNoOptimizer = "none";  // a model-only checkpoint

// CRC-32 (IEEE 802.3, as zlib computes it) of the data files, so a flipped byte is a clean
// error rather than a silently different model.
uint32_t crc32_update(uint32_t crc, const void* data, size_t size) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  for (size_t i = 0; i < size; ++i) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return ~crc;
}

// One stored tensor: where its bytes are and where the shard sits in the whole tensor.
struct TensorEntry {
  std::string file;
  int64_t byte_offset = 0;
  Shape global, offset, shape;
};

std::string join_dims(const Shape& s) {
  if (s.empty()) return "-";
  std::ostringstream out;
  for (size_t i = 0; i < s.size(); ++i) out << (i ? "," : "") << s[i];
  return out.str();
}

Shape split_dims(const std::string& text) {
  Shape s;
  if (text == "-") return s;
  std::istringstream in(text);
  for (std::string d; std::getline(in, d, ',');) s.push_back(std::stoll(d));
  return s;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Arguments are stored one per line; a newline or backslash inside one is escaped.
std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 1 < s.size()) {
      out += s[i + 1] == 'n' ? '\n' : s[i + 1];
      ++i;
    } else {
      out += s[i];
    }
  }
  return out;
}

// The resolved options as a command line, every group but the flags that are not built.
std::vector<std::string> resolved_args(const Options& opts) {
  std::vector<std::string> groups;
  for (const OptionDef& d : option_table())
    if (d.group != "not built yet" &&
        std::find(groups.begin(), groups.end(), d.group) == groups.end())
      groups.push_back(d.group);
  std::vector<std::string> args;
  for (const std::string& g : groups) {
    std::vector<std::string> a = options_as_args(opts, g);
    args.insert(args.end(), a.begin(), a.end());
  }
  return args;
}

// Writes `data` to `path` and fsyncs it, so a rename afterwards publishes complete bytes.
void write_synced(const std::string& path,
                  const std::vector<std::pair<const void*, size_t>>& data) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OMNI_REQUIRE(fd >= 0, "--save: cannot create '", path, "': ", std::strerror(errno));
  for (const auto& [ptr, size] : data) {
    const char* p = static_cast<const char*>(ptr);
    size_t left = size;
    while (left > 0) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = std::strerror(errno);
        ::close(fd);
        throw UsageError("--save: writing '" + path + "' failed (" + why + ")");
      }
      p += n;
      left -= size_t(n);
    }
  }
  const bool synced = ::fsync(fd) == 0;
  const std::string why = std::strerror(errno);
  ::close(fd);
  OMNI_REQUIRE(synced, "--save: fsync of '", path, "' failed (", why, ")");
}

// Makes a rename or file creation inside `dir` durable.
void sync_directory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

void rename_or_throw(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::rename(from, to, ec);
  OMNI_REQUIRE(!ec, "--save: cannot rename '", from.string(), "' to '", to.string(),
               "': ", ec.message());
}

// What metadata.txt holds.
struct Metadata {
  std::string path;
  TrainingProgress progress;
  std::string optimizer;
  int64_t optimizer_steps = 0;
  std::map<std::string, double> optimizer_scalars;  // "optimizer_scalar NAME VALUE" lines
  std::vector<std::string> args;
  // The GELU form ("erf" or "tanh"); empty in checkpoints from before erf GELU, which were tanh.
  std::string gelu;
  std::map<std::string, TensorEntry> tensors;
  std::map<std::string, std::pair<int64_t, uint32_t>> files;  // name -> (bytes, CRC-32)
};

Metadata read_metadata(const std::string& root) {
  const int64_t iteration = latest_checkpoint_iteration(root);
  const std::string dir = checkpoint_iteration_dir(root, iteration);
  Metadata md;
  md.path = dir + "/metadata.txt";
  std::ifstream in(md.path);
  OMNI_REQUIRE(in, "--load: cannot open '", md.path, "' (", latest_iteration_file(root),
               " names iteration ", iteration, ", so this checkpoint should exist)");
  std::string line;
  std::getline(in, line);
  OMNI_REQUIRE(line == kMagic, "--load: '", md.path, "' is not an omnitron checkpoint (expected '",
               kMagic, "' first, found '", line.substr(0, 40), "')");
  bool ended = false;
  md.progress.iteration = -1;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    std::string key;
    ls >> key;
    if (key == "end") {
      ended = true;
      break;
    }
    if (key == "iteration") {
      ls >> md.progress.iteration;
    } else if (key == "consumed_samples") {
      ls >> md.progress.consumed_samples;
    } else if (key == "lr_schedule_iteration") {
      ls >> md.progress.lr_schedule_iteration;
    } else if (key == "lr_schedule_samples") {
      ls >> md.progress.lr_schedule_samples;
    } else if (key == "loss_scaler") {
      GradScalerState st;
      ls >> st.scale >> st.growth_tracker >> st.hysteresis_tracker;
      md.progress.loss_scaler = st;
    } else if (key == "optimizer") {
      ls >> md.optimizer >> md.optimizer_steps;
    } else if (key == "optimizer_scalar") {
      std::string name, value;
      ls >> name >> value;
      md.optimizer_scalars[name] = std::strtod(value.c_str(), nullptr);  // hexadecimal: exact
    } else if (key == "args") {
      size_t n = 0;
      ls >> n;
      for (size_t i = 0; i < n && std::getline(in, line); ++i) md.args.push_back(unescape(line));
      OMNI_REQUIRE(md.args.size() == n, "--load: '", md.path, "' is truncated in its options (", n,
                   " expected, ", md.args.size(), " found)");
    } else if (key == "gelu") {
      ls >> md.gelu;
    } else if (key == "file") {
      std::string name, kb, kc;
      int64_t bytes = -1;
      uint32_t crc = 0;
      ls >> name >> kb >> bytes >> kc >> std::hex >> crc;
      OMNI_REQUIRE(ls && kb == "bytes" && kc == "crc32", "--load: '", md.path,
                   "' has a malformed file line: '", line, "'");
      md.files[name] = {bytes, crc};
    } else if (key == "tensor") {
      std::string name, dtype, kg, ko, ks, g, o, s;
      TensorEntry t;
      ls >> name >> t.file >> t.byte_offset >> dtype >> kg >> g >> ko >> o >> ks >> s;
      OMNI_REQUIRE(ls && dtype == "float32" && kg == "global" && ko == "offset" && ks == "shape",
                   "--load: '", md.path, "' has a malformed tensor line: '", line, "'");
      t.global = split_dims(g);
      t.offset = split_dims(o);
      t.shape = split_dims(s);
      md.tensors[name] = t;
    }
  }
  OMNI_REQUIRE(ended, "--load: '", md.path, "' is truncated (no 'end' line)");
  OMNI_REQUIRE(md.progress.iteration == iteration, "--load: '", md.path, "' holds iteration ",
               md.progress.iteration, " but ", latest_iteration_file(root), " names ", iteration);
  return md;
}

// Checks that a data file is complete and undamaged before any tensor is taken from it.
void verify_file(const Metadata& md, const std::string& dir, const std::string& file) {
  const std::string path = dir + "/" + file;
  auto it = md.files.find(file);
  OMNI_REQUIRE(it != md.files.end(), "--load: '", md.path, "' does not list ", file);
  const auto [bytes, crc] = it->second;
  std::error_code ec;
  const int64_t size = int64_t(fs::file_size(path, ec));
  OMNI_REQUIRE(!ec, "--load: cannot read '", path, "': ", ec.message());
  if (size < bytes) {
    std::string first_cut;
    for (const auto& [name, t] : md.tensors)
      if (t.file == file && t.byte_offset + numel_of(t.shape) * int64_t(sizeof(float)) > size &&
          first_cut.empty())
        first_cut =
            " (tensor " + name + " at byte " + std::to_string(t.byte_offset) + " is incomplete)";
    throw UsageError("--load: '" + path + "' is truncated: it holds " + std::to_string(size) +
                     " bytes, " + std::to_string(bytes) + " expected" + first_cut);
  }
  OMNI_REQUIRE(size == bytes, "--load: '", path, "' holds ", size, " bytes, ", bytes,
               " expected (not the file this checkpoint wrote)");
  std::ifstream in(path, std::ios::binary);
  std::vector<char> buf(1 << 20);
  uint32_t actual = 0;
  while (in) {
    in.read(buf.data(), std::streamsize(buf.size()));
    actual = crc32_update(actual, buf.data(), size_t(in.gcount()));
  }
  OMNI_REQUIRE(actual == crc, "--load: '", path, "' is corrupted: its CRC-32 is ", std::hex, actual,
               " but the checkpoint recorded ", crc);
}

// Reads the tensor `name` (numel values, whole and unsharded) into `dst`.
void read_tensor(const Metadata& md, const std::string& dir, const std::string& name,
                 const Shape& expected, float* dst) {
  auto it = md.tensors.find(name);
  OMNI_REQUIRE(it != md.tensors.end(), "--load: '", md.path, "' has no tensor ", name,
               " (expected shape [", join_dims(expected), "]; was it saved from another model?)");
  const TensorEntry& t = it->second;
  OMNI_REQUIRE(t.global == expected, "--load: tensor ", name, " in '", md.path, "' has shape [",
               join_dims(t.global), "] but the model expects [", join_dims(expected),
               "] (a checkpoint of another model shape)");
  OMNI_REQUIRE(t.shape == t.global && t.offset == Shape(t.global.size(), 0), "--load: tensor ",
               name, " in '", md.path, "' is a shard (offset [", join_dims(t.offset), "], shape [",
               join_dims(t.shape), "] of [", join_dims(t.global),
               "]): this omnitron writes and reads whole tensors only");
  const std::string path = dir + "/" + t.file;
  const int64_t bytes = numel_of(t.shape) * int64_t(sizeof(float));
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  OMNI_REQUIRE(!ec, "--load: cannot read '", path, "': ", ec.message());
  OMNI_REQUIRE(int64_t(size) >= t.byte_offset + bytes, "--load: '", path, "' is truncated: tensor ",
               name, " needs bytes ", t.byte_offset, "..", t.byte_offset + bytes,
               " but the file holds ", size);
  std::ifstream in(path, std::ios::binary);
  in.seekg(t.byte_offset);
  in.read(reinterpret_cast<char*>(dst), bytes);
  OMNI_REQUIRE(in.gcount() == bytes, "--load: reading tensor ", name, " from '", path, "' failed");
}

const char* optimizer_name(OptimizerKind k) {
  switch (k) {
    case OptimizerKind::AdamW:
      return "adamw";
    case OptimizerKind::SGD:
      return "sgd";
    default:
      return zoo_optimizer_name(k);
  }
}

}  // namespace

std::string checkpoint_iteration_dir(const std::string& root, int64_t iteration) {
  char name[32];
  std::snprintf(name, sizeof name, "iter_%07lld", static_cast<long long>(iteration));
  return root + "/" + name;
}

std::string latest_iteration_file(const std::string& root) {
  return root + "/latest_checkpointed_iteration.txt";
}

namespace {

// Writes a checkpoint; without an optimizer it holds the model alone ("optimizer none").
std::string write_checkpoint(const std::string& root, const Options& opts,
                             const TrainingProgress& progress, const ParameterSet<float>& params,
                             const Optimizer<float>* optimizer) {
  std::error_code ec;
  fs::create_directories(root, ec);
  OMNI_REQUIRE(!ec, "--save: cannot create directory '", root, "': ", ec.message());
  const std::string final_dir = checkpoint_iteration_dir(root, progress.iteration);
  const std::string tmp_dir = final_dir + ".tmp";
  fs::remove_all(tmp_dir, ec);  // what a crash during an earlier save left
  fs::create_directory(tmp_dir, ec);
  OMNI_REQUIRE(!ec, "--save: cannot create directory '", tmp_dir, "': ", ec.message());

  std::ostringstream md;
  md << kMagic << "\n"
     << "iteration " << progress.iteration << "\n"
     << "consumed_samples " << progress.consumed_samples << "\n"
     << "lr_schedule_iteration "
     << (progress.lr_schedule_iteration >= 0 ? progress.lr_schedule_iteration : progress.iteration)
     << "\n";
  if (progress.lr_schedule_samples >= 0)
    md << "lr_schedule_samples " << progress.lr_schedule_samples << "\n";
  md << "optimizer " << (optimizer ? optimizer_name(optimizer->kind()) : kNoOptimizer) << ' '
     << (optimizer ? optimizer->steps() : 0) << "\n"
     << "rng none\n";
  for (const std::string& name :
       optimizer ? optimizer->scalar_names() : std::vector<std::string>{}) {
    char value[64];
    std::snprintf(value, sizeof value, "%a", optimizer->scalar(name));
    md << "optimizer_scalar " << name << ' ' << value << "\n";
  }
  if (progress.loss_scaler) {
    const GradScalerState& st = *progress.loss_scaler;
    md << "loss_scaler " << std::setprecision(9) << st.scale << ' ' << st.growth_tracker << ' '
       << st.hysteresis_tracker << "\n";
  }
  md << "gelu " << (opts.model.openai_gelu ? "tanh" : "erf") << "\n";
  const std::vector<std::string> args = resolved_args(opts);
  md << "args " << args.size() << "\n";
  for (const std::string& a : args) md << escape(a) << "\n";

  // Whole tensors at one rank: offset 0, shard shape = global shape.
  auto entry = [&md](const std::string& name, const char* file, int64_t byte_offset,
                     const Shape& shape) {
    md << "tensor " << name << ' ' << file << ' ' << byte_offset << " float32 global "
       << join_dims(shape) << " offset " << join_dims(Shape(shape.size(), 0)) << " shape "
       << join_dims(shape) << "\n";
  };
  std::vector<std::pair<const void*, size_t>> model_chunks, optim_chunks;
  int64_t model_bytes = 0, optim_bytes = 0;
  for (const ParamInfo& p : params.infos()) {
    entry(p.name, kModelFile, model_bytes, p.shape);
    model_chunks.emplace_back(params.values() + p.offset, p.numel * sizeof(float));
    model_bytes += p.numel * int64_t(sizeof(float));
  }
  for (const std::string& state :
       optimizer ? optimizer->state_names() : std::vector<std::string>{}) {
    const float* buffer = optimizer->state_buffer(state);
    for (const ParamInfo& p : params.infos()) {
      entry("optimizer." + state + "." + p.name, kOptimizerFile, optim_bytes, p.shape);
      optim_chunks.emplace_back(buffer + p.offset, p.numel * sizeof(float));
      optim_bytes += p.numel * int64_t(sizeof(float));
    }
  }
  auto file_line = [&md](const char* name, int64_t bytes,
                         const std::vector<std::pair<const void*, size_t>>& chunks) {
    uint32_t crc = 0;
    for (const auto& [ptr, size] : chunks) crc = crc32_update(crc, ptr, size);
    md << "file " << name << " bytes " << bytes << " crc32 " << std::hex << crc << std::dec << "\n";
  };
  file_line(kModelFile, model_bytes, model_chunks);
  if (optimizer) file_line(kOptimizerFile, optim_bytes, optim_chunks);
  md << "end\n";
  const std::string md_text = md.str();

  write_synced(tmp_dir + "/" + kModelFile, model_chunks);
  if (optimizer) write_synced(tmp_dir + "/" + kOptimizerFile, optim_chunks);
  write_synced(tmp_dir + "/metadata.txt", {{md_text.data(), md_text.size()}});
  sync_directory(tmp_dir);

  // Saving an iteration again (a resumed run that stops where it started) replaces it.
  const std::string old_dir = final_dir + ".old";
  const bool replacing = fs::exists(final_dir);
  if (replacing) {
    fs::remove_all(old_dir, ec);
    rename_or_throw(final_dir, old_dir);
  }
  rename_or_throw(tmp_dir, final_dir);
  sync_directory(root);
  if (replacing) fs::remove_all(old_dir, ec);

  const std::string latest = latest_iteration_file(root), latest_tmp = latest + ".tmp";
  const std::string text = std::to_string(progress.iteration);
  write_synced(latest_tmp, {{text.data(), text.size()}});
  rename_or_throw(latest_tmp, latest);
  sync_directory(root);
  return final_dir;
}

}  // namespace

std::string save_checkpoint(const std::string& root, const Options& opts,
                            const TrainingProgress& progress, const ParameterSet<float>& params,
                            const Optimizer<float>& optimizer) {
  return write_checkpoint(root, opts, progress, params, opts.no_save_optim ? nullptr : &optimizer);
}

std::string save_model_checkpoint(const std::string& root, const Options& opts,
                                  const ParameterSet<float>& params) {
  return write_checkpoint(root, opts, {}, params, nullptr);
}

int64_t latest_checkpoint_iteration(const std::string& root) {
  if (is_hf_model_dir(root)) return 0;
  const std::string path = latest_iteration_file(root);
  std::ifstream in(path);
  OMNI_REQUIRE(in, "--load: cannot open '", path,
               "' (expected a checkpoint directory written by --save)");
  std::string text;
  std::getline(in, text);
  int64_t iteration = -1;
  try {
    size_t used = 0;
    iteration = std::stoll(text, &used);
    if (used != text.size()) iteration = -1;
  } catch (const std::exception&) {
  }
  OMNI_REQUIRE(iteration >= 0, "--load: '", path, "' should hold an iteration number, found '",
               text.substr(0, 40), "'");
  return iteration;
}

bool holds_checkpoint(const std::string& root) {
  if (is_hf_model_dir(root) || fs::exists(latest_iteration_file(root))) return true;
  std::error_code ec;
  if (!fs::exists(root, ec)) return false;
  OMNI_REQUIRE(fs::is_directory(root, ec), "--load: '", root,
               "' is a file, not a checkpoint directory (one written by --save, or a Hugging "
               "Face model directory)");
  // A save in progress when a job died leaves iter_NNNNNNN.tmp, and logs may share the
  // directory: neither is a checkpoint. A complete iteration directory without the file
  // that names the latest is one whose index was lost: starting afresh would discard it.
  for (const fs::directory_entry& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const bool iteration_dir = e.is_directory() && name.size() == 12 &&
                               name.rfind("iter_", 0) == 0 &&
                               name.find_first_not_of("0123456789", 5) == std::string::npos;
    OMNI_REQUIRE(!iteration_dir, "--load: '", root, "' holds ", name, " but no ",
                 latest_iteration_file(root),
                 " naming the latest checkpoint (write that iteration number into it to "
                 "resume from it)");
  }
  return false;
}

std::vector<std::string> checkpoint_model_args(const std::string& root) {
  if (is_hf_model_dir(root)) return hf_model_args(root);
  const Metadata md = read_metadata(root);
  std::vector<std::string> model_args;
  for (size_t i = 0; i < md.args.size(); ++i) {
    const OptionDef* def = find_option(md.args[i]);
    OMNI_REQUIRE(def, "--load: '", md.path, "' stores an unknown option '", md.args[i], "'");
    const bool takes_value = !def->metavar.empty();
    if (def->group == "model")
      model_args.push_back(takes_value ? md.args[i] + "=" + md.args[i + 1] : md.args[i]);
    if (takes_value) ++i;
  }
  // Before erf GELU became the default (Megatron's), omnitron's GELU was always tanh and
  // checkpoints stored no "gelu" line: such a checkpoint keeps its tanh GELU.
  if (md.gelu.empty()) model_args.push_back("--openai-gelu");
  return model_args;
}

void load_checkpoint_model_options(const std::string& root, Options& opts) {
  if (is_hf_model_dir(root)) return load_hf_model_options(root, opts);
  parse_options(checkpoint_model_args(root), opts);
}

TrainingProgress load_checkpoint(const std::string& root, ParameterSet<float>& params,
                                 Optimizer<float>* optimizer) {
  if (is_hf_model_dir(root)) {
    load_hf_weights(root, params);
    return {};
  }
  const Metadata md = read_metadata(root);
  const std::string dir = checkpoint_iteration_dir(root, md.progress.iteration);
  verify_file(md, dir, kModelFile);
  for (const ParamInfo& p : params.infos())
    read_tensor(md, dir, p.name, p.shape, params.values() + p.offset);
  if (optimizer && md.optimizer != kNoOptimizer) {
    OMNI_REQUIRE(md.optimizer == optimizer_name(optimizer->kind()), "--load: '", md.path,
                 "' holds the state of optimizer ", md.optimizer, " but --optimizer is ",
                 optimizer_name(optimizer->kind()), " (add --no-load-optim to start it afresh)");
    verify_file(md, dir, kOptimizerFile);
    for (const std::string& state : optimizer->state_names()) {
      float* buffer = optimizer->state_buffer(state);
      for (const ParamInfo& p : params.infos())
        read_tensor(md, dir, "optimizer." + state + "." + p.name, p.shape, buffer + p.offset);
    }
    for (const std::string& name : optimizer->scalar_names()) {
      auto it = md.optimizer_scalars.find(name);
      OMNI_REQUIRE(it != md.optimizer_scalars.end(), "--load: '", md.path,
                   "' has no optimizer_scalar ", name, " for optimizer ", md.optimizer);
      optimizer->scalar(name) = it->second;
    }
    optimizer->set_steps(md.optimizer_steps);
  }
  return md.progress;
}

}  // namespace omni
