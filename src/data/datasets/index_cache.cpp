#include "data/datasets/index_cache.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.h"
#include "base/philox.h"
#include "data/datasets/indexed_dataset.h"

namespace omni {

namespace {

constexpr char kMagic[8] = {'O', 'M', 'N', 'I', 'G', 'I', 'D', 'X'};

// Everything the indices depend on, as text: stored in the file and compared on load.
std::string cache_key(const IndexedDataset& data, DocumentRange docs, int64_t num_samples,
                      int seq_length, uint32_t seed) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::ostringstream key;
  key << "omnitron GPTDataset indices v1|" << fs::absolute(data.prefix(), ec).string();
  for (const char* ext : {".idx", ".bin"}) {
    const fs::path p = data.prefix() + ext;
    key << "|" << fs::file_size(p, ec) << "@"
        << fs::last_write_time(p, ec).time_since_epoch().count();
  }
  key << "|docs " << docs.begin << ".." << docs.end << "|samples " << num_samples << "|seq "
      << seq_length << "|seed " << seed;
  return key.str();
}

template <typename T>
void write_array(std::ofstream& out, const std::vector<T>& v) {
  const uint64_t n = v.size();
  out.write(reinterpret_cast<const char*>(&n), sizeof n);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
}

template <typename T>
bool read_array(std::ifstream& in, std::vector<T>& v, uint64_t max_elements) {
  uint64_t n = 0;
  if (!in.read(reinterpret_cast<char*>(&n), sizeof n) || n > max_elements) return false;
  v.resize(n);
  return static_cast<bool>(
      in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T))));
}

bool load(const std::string& path, const std::string& key, GPTDatasetIndices& out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::error_code ec;
  const uint64_t file_size = std::filesystem::file_size(path, ec);
  char magic[8];
  uint64_t key_size = 0;
  if (!in.read(magic, 8) || std::string(magic, 8) != std::string(kMagic, 8) ||
      !in.read(reinterpret_cast<char*>(&key_size), sizeof key_size) || key_size != key.size())
    return false;
  std::string stored(key_size, '\0');
  uint8_t separate = 0;
  if (!in.read(stored.data(), static_cast<std::streamsize>(key_size)) || stored != key ||
      !in.read(reinterpret_cast<char*>(&out.num_epochs), sizeof out.num_epochs) ||
      !in.read(reinterpret_cast<char*>(&separate), 1))
    return false;
  out.separate_last_epoch = separate != 0;
  const uint64_t cap = file_size / 4;  // no array can hold more elements than the file bytes
  return read_array(in, out.doc_idx, cap) && read_array(in, out.sample_idx, cap) &&
         read_array(in, out.shuffle_idx, cap) && in.peek() == EOF;
}

void store(const std::string& path, const std::string& key, const GPTDatasetIndices& ix) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    const uint64_t key_size = key.size();
    const uint8_t separate = ix.separate_last_epoch ? 1 : 0;
    out.write(kMagic, 8);
    out.write(reinterpret_cast<const char*>(&key_size), sizeof key_size);
    out.write(key.data(), static_cast<std::streamsize>(key.size()));
    out.write(reinterpret_cast<const char*>(&ix.num_epochs), sizeof ix.num_epochs);
    out.write(reinterpret_cast<const char*>(&separate), 1);
    write_array(out, ix.doc_idx);
    write_array(out, ix.sample_idx);
    write_array(out, ix.shuffle_idx);
    if (!out.flush()) {
      out.close();
      std::remove(tmp.c_str());
      return;
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) std::remove(tmp.c_str());
}

}  // namespace

std::string gpt_index_cache_path(const IndexedDataset& data, DocumentRange documents,
                                 int64_t num_samples, int seq_length, uint32_t seed,
                                 const std::string& cache_dir) {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(
                    name_hash(cache_key(data, documents, num_samples, seq_length, seed))));
  const std::string prefix =
      cache_dir.empty()
          ? data.prefix()
          : (std::filesystem::path(cache_dir) / std::filesystem::path(data.prefix()).filename())
                .string();
  return prefix + "." + hex + ".gptidx";
}

GPTDatasetIndices cached_gpt_indices(const IndexedDataset& data, DocumentRange documents,
                                     int64_t num_samples, int seq_length, uint32_t seed,
                                     const std::function<GPTDatasetIndices()>& build,
                                     const std::string& cache_dir) {
  if (!cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(cache_dir, ec);
    OMNI_REQUIRE(!ec && std::filesystem::is_directory(cache_dir),
                 "--data-cache-path: cannot create "
                 "the directory '",
                 cache_dir, "'", ec ? ": " + ec.message() : std::string());
  }
  const std::string key = cache_key(data, documents, num_samples, seq_length, seed);
  const std::string path =
      gpt_index_cache_path(data, documents, num_samples, seq_length, seed, cache_dir);
  GPTDatasetIndices indices;
  if (load(path, key, indices)) return indices;
  indices = build();
  store(path, key, indices);
  return indices;
}

}  // namespace omni
