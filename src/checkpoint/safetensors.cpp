#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string_view>
#include <utility>

#include "base/error.h"
#include "base/json.h"

namespace omni {

namespace {

// Hugging Face's reader refuses headers above 100 MB; a larger length is a damaged file.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

struct DTypeName {
  const char* name;
  DType dtype;
};
constexpr DTypeName kDTypes[] = {
    {"F32", DType::F32}, {"F16", DType::F16}, {"BF16", DType::BF16}, {"F64", DType::F64}};

const char* safetensors_dtype_name(DType t) {
  for (const DTypeName& d : kDTypes)
    if (d.dtype == t) return d.name;
  throw InternalError("[safetensors] no name for dtype");
}

// A JSON number that is a whole, non-negative integer (safetensors sizes and offsets).
bool whole_number(const json::Value& v, int64_t* out) {
  if (!v.is_number()) return false;
  const double d = v.num();
  if (!(d >= 0) || d > 9.0e15 || std::floor(d) != d) return false;
  *out = static_cast<int64_t>(d);
  return true;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OMNI_REQUIRE(fd >= 0, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  size_ = stat_ok ? size_t(st.st_size) : 0;
  if (stat_ok && size_ >= 8) map_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  OMNI_REQUIRE(stat_ok, "cannot read '", path, "'");
  OMNI_REQUIRE(size_ >= 8, "'", path, "' is not a safetensors file: ", size_,
               " bytes, too short for the 8-byte header length");
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw UsageError("cannot map '" + path + "': " + std::strerror(errno));
  }
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = header_len << 8 | bytes[i];
    OMNI_REQUIRE(header_len <= size_ - 8 && header_len <= kMaxHeaderBytes, "'", path,
                 "': the header length (", header_len, " bytes) runs past the end of the file (",
                 size_, " bytes): truncated or not a safetensors file");
    const std::string_view text(reinterpret_cast<const char*>(bytes + 8), header_len);
    OMNI_REQUIRE(!text.empty() && text[0] == '{', "'", path,
                 "': the header is not a JSON object (a truncated or foreign file)");
    const json::Value header = json::parse(text, path + " (safetensors header)");
    OMNI_REQUIRE(header.is_object(), "'", path, "': the header is not a JSON object");
    const unsigned char* data = bytes + 8 + header_len;
    const int64_t data_size = int64_t(size_ - 8 - header_len);

    std::vector<std::pair<int64_t, int64_t>> ranges;  // (begin, end) per tensor
    for (const auto& [name, v] : header.obj()) {
      if (name == "__metadata__") {
        OMNI_REQUIRE(v.is_object(), "'", path, "': __metadata__ is not a JSON object");
        for (const auto& [k, mv] : v.obj()) {
          OMNI_REQUIRE(mv.is_string(), "'", path, "': __metadata__ entry '", k,
                       "' is not a string");
          metadata_[k] = mv.str();
        }
        continue;
      }
      auto bad = [&](const std::string& what) {
        return UsageError("'" + path + "': tensor " + name + ": " + what);
      };
      if (!v.is_object()) throw bad("its entry is not a JSON object");
      OMNI_REQUIRE(!index_.count(name), "'", path, "': tensor ", name, " is listed twice");
      SafetensorsTensor t;
      t.name = name;
      const json::Value* dtype = v.find("dtype");
      if (!dtype || !dtype->is_string()) throw bad("no \"dtype\" string");
      const auto known = std::find_if(std::begin(kDTypes), std::end(kDTypes),
                                      [&](const DTypeName& d) { return dtype->str() == d.name; });
      if (known == std::end(kDTypes))
        throw bad("dtype " + dtype->str() + " cannot be read (F32, F16, BF16 or F64)");
      t.dtype = known->dtype;
      const json::Value* shape = v.find("shape");
      if (!shape || !shape->is_array()) throw bad("no \"shape\" array");
      for (const json::Value& d : shape->arr()) {
        int64_t dim = 0;
        if (!whole_number(d, &dim)) throw bad("\"shape\" holds something other than sizes");
        t.shape.push_back(dim);
      }
      const json::Value* offsets = v.find("data_offsets");
      int64_t begin = 0, end = 0;
      if (!offsets || !offsets->is_array() || offsets->arr().size() != 2 ||
          !whole_number(offsets->arr()[0], &begin) || !whole_number(offsets->arr()[1], &end) ||
          end < begin)
        throw bad("\"data_offsets\" is not [begin, end] with begin <= end");
      const int64_t expected = t.numel() * int64_t(dtype_size(t.dtype));
      if (end - begin != expected)
        throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] hold " + std::to_string(end - begin) + " bytes but shape " +
                  shape_str(t.shape) + " of " + dtype->str() + " needs " +
                  std::to_string(expected));
      if (end > data_size)
        throw bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] run past the data area (" + std::to_string(data_size) +
                  " bytes): the file is truncated");
      t.data = data + begin;
      t.bytes = size_t(end - begin);
      index_[name] = tensors_.size();
      tensors_.push_back(std::move(t));
      ranges.emplace_back(begin, end);
    }
    // The tensors must tile the data area: sorted by offset, each begins where the last ended.
    std::vector<size_t> order(tensors_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    int64_t covered = 0;
    for (size_t k = 0; k < order.size(); ++k) {
      const auto [begin, end] = ranges[order[k]];
      const std::string& name = tensors_[order[k]].name;
      OMNI_REQUIRE(begin >= covered, "'", path, "': tensor ", name, " (bytes ", begin, "..", end,
                   ") overlaps tensor ", tensors_[order[k - 1]].name, " (ending at ", covered, ")");
      OMNI_REQUIRE(begin == covered, "'", path, "': bytes ", covered, "..", begin,
                   " of the data area, before tensor ", name, ", belong to no tensor");
      covered = end;
    }
    OMNI_REQUIRE(covered == data_size, "'", path, "': the data area holds ", data_size,
                 " bytes but its tensors end at ", covered, " (extra bytes at the end)");
    std::vector<SafetensorsTensor> sorted;
    for (size_t i : order) sorted.push_back(std::move(tensors_[i]));
    tensors_ = std::move(sorted);
    for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
  } catch (...) {
    ::munmap(map_, size_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, size_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      map_(std::exchange(other.map_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tensors_(std::move(other.tensors_)),
      index_(std::move(other.index_)),
      metadata_(std::move(other.metadata_)) {}

const SafetensorsTensor* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

void read_as_f32(const SafetensorsTensor& t, float* dst) {
  read_as_f32(t, 0, t.numel(), dst);
}

void read_as_f32(const SafetensorsTensor& t, int64_t first, int64_t count, float* dst) {
  OMNI_CHECK(first >= 0 && count >= 0 && first + count <= t.numel(), "[safetensors] elements ",
             first, "+", count, " of ", t.name, " (", t.numel(), ")");
  const size_t elem = dtype_size(t.dtype), bytes = size_t(count) * elem;
  const unsigned char* from = t.data + size_t(first) * elem;
  if (reinterpret_cast<uintptr_t>(from) % elem == 0) {
    convert(from, t.dtype, dst, DType::F32, size_t(count));
    return;
  }
  // Offsets need not be aligned to the element size; copy to aligned memory first.
  thread_local std::vector<double> aligned;
  aligned.resize((bytes + sizeof(double) - 1) / sizeof(double));
  std::memcpy(aligned.data(), from, bytes);
  convert(aligned.data(), t.dtype, dst, DType::F32, size_t(count));
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       DType dtype, const std::map<std::string, std::string>& metadata) {
  const size_t elem = dtype_size(dtype);
  std::ostringstream h;
  h << '{';
  const char* sep = "";
  if (!metadata.empty()) {
    h << "\"__metadata__\":{";
    for (const auto& [k, v] : metadata) {
      h << sep << json_string(k) << ':' << json_string(v);
      sep = ",";
    }
    h << '}';
  }
  int64_t offset = 0;
  for (const SafetensorsOutput& t : tensors) {
    int64_t numel = 1;
    h << sep << json_string(t.name) << ":{\"dtype\":\"" << safetensors_dtype_name(dtype)
      << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      numel *= t.shape[i];
      h << (i ? "," : "") << t.shape[i];
    }
    const int64_t end = offset + numel * int64_t(elem);
    h << "],\"data_offsets\":[" << offset << ',' << end << "]}";
    sep = ",";
    offset = end;
  }
  h << '}';
  std::string header = h.str();
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(tmp.c_str(), "wb"), &std::fclose);
  OMNI_REQUIRE(f, "cannot create '", tmp, "': ", std::strerror(errno));
  unsigned char len[8];
  for (int i = 0; i < 8; ++i)
    len[i] = static_cast<unsigned char>(uint64_t(header.size()) >> (8 * i));
  bool ok = std::fwrite(len, 1, 8, f.get()) == 8 &&
            std::fwrite(header.data(), 1, header.size(), f.get()) == header.size();
  std::vector<float> values;
  std::vector<unsigned char> stored;
  for (const SafetensorsOutput& t : tensors) {
    if (!ok) break;
    int64_t numel = 1;
    for (int64_t d : t.shape) numel *= d;
    values.assign(size_t(numel), 0.0f);
    t.fill(values.data());
    stored.resize(size_t(numel) * elem);
    convert(values.data(), DType::F32, stored.data(), dtype, size_t(numel));
    ok = std::fwrite(stored.data(), 1, stored.size(), f.get()) == stored.size();
  }
  ok = std::fflush(f.get()) == 0 && ok;
  ok = ::fsync(::fileno(f.get())) == 0 && ok;
  const std::string why = std::strerror(errno);
  f.reset();
  if (!ok) {
    std::remove(tmp.c_str());
    throw UsageError("writing '" + tmp + "' failed (" + why + ")");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  OMNI_REQUIRE(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

}  // namespace omni
