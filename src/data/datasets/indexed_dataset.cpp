#include "data/datasets/indexed_dataset.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "base/error.h"

namespace omni {

static_assert(std::endian::native == std::endian::little,
              "the .bin/.idx format is little-endian and we copy it as is");

namespace {

constexpr char kMagic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
constexpr int64_t kHeaderBytes = 34;  // magic 9, version 8, dtype 1, N 8, M 8
constexpr uint64_t kVersion = 1;

template <typename T>
T load(const uint8_t* at) {
  T value;
  std::memcpy(&value, at, sizeof(T));
  return value;
}

template <typename T>
void append(std::string& bytes, T value) {
  bytes.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

bool known_dtype_code(uint8_t code) {
  return code >= 1 && code <= 8;
}

}  // namespace

const char* indexed_dtype_name(IndexedDtype dtype) {
  switch (dtype) {
    case IndexedDtype::kUInt8:
      return "uint8";
    case IndexedDtype::kInt8:
      return "int8";
    case IndexedDtype::kInt16:
      return "int16";
    case IndexedDtype::kInt32:
      return "int32";
    case IndexedDtype::kInt64:
      return "int64";
    case IndexedDtype::kFloat64:
      return "float64";
    case IndexedDtype::kFloat32:
      return "float32";
    case IndexedDtype::kUInt16:
      return "uint16";
  }
  return "unknown";
}

int64_t indexed_dtype_size(IndexedDtype dtype) {
  switch (dtype) {
    case IndexedDtype::kUInt8:
    case IndexedDtype::kInt8:
      return 1;
    case IndexedDtype::kInt16:
    case IndexedDtype::kUInt16:
      return 2;
    case IndexedDtype::kInt32:
    case IndexedDtype::kFloat32:
      return 4;
    case IndexedDtype::kInt64:
    case IndexedDtype::kFloat64:
      return 8;
  }
  throw InternalError("indexed_dtype_size: unknown dtype");
}

IndexedDtype indexed_dtype_for_vocab(int64_t vocab_size) {
  return vocab_size < 65500 ? IndexedDtype::kUInt16 : IndexedDtype::kInt32;
}

// ---------------------------------------------------------------------------------------------
// Writer


namespace {

void rename_into_place(const std::string& from, const std::string& to) {
  std::error_code error;
  std::filesystem::rename(from, to, error);
  OMNI_REQUIRE(!error, "cannot rename ", from, " to ", to, ": ", error.message());
}

}  // namespace

IndexedDatasetWriter::IndexedDatasetWriter(const std::string& prefix, IndexedDtype dtype)
    : prefix_(prefix), dtype_(dtype) {
  OMNI_REQUIRE(dtype == IndexedDtype::kUInt16 || dtype == IndexedDtype::kInt32,
               "[IndexedDatasetWriter] token dtype must be uint16 or int32, got ",
               indexed_dtype_name(dtype));
  bin_ = std::make_unique<BufferedFile>(prefix_ + ".bin.tmp", "wb");
  lengths_ = std::make_unique<BufferedFile>(prefix_ + ".lengths.tmp", "w+b");
  boundaries_ = std::make_unique<BufferedFile>(prefix_ + ".boundaries.tmp", "w+b");
}

IndexedDatasetWriter::~IndexedDatasetWriter() {
  bin_.reset();
  lengths_.reset();
  boundaries_.reset();
  std::error_code ignored;
  for (const char* suffix : {".bin.tmp", ".lengths.tmp", ".boundaries.tmp", ".idx.tmp"})
    std::filesystem::remove(prefix_ + suffix, ignored);
}

void IndexedDatasetWriter::append_tokens(const void* bytes, size_t n) {
  bin_->write(bytes, n);
  bin_bytes_ += static_cast<int64_t>(n);
}

void IndexedDatasetWriter::add_sequence(int32_t length) {
  lengths_->put(length);
  ++sequences_;
  tokens_ += length;
}

void IndexedDatasetWriter::end_document() {
  boundaries_->put(sequences_);
  ++documents_;
}

void IndexedDatasetWriter::add_document(std::span<const int32_t> ids) {
  OMNI_REQUIRE(ids.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
               "[IndexedDatasetWriter] a document of ", ids.size(),
               " tokens does not fit the int32 length field");
  std::string bytes;
  bytes.reserve(ids.size() * static_cast<size_t>(indexed_dtype_size(dtype_)));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (dtype_ == IndexedDtype::kUInt16) {
      OMNI_REQUIRE(ids[i] >= 0 && ids[i] <= 65535, "[IndexedDatasetWriter] token id ", ids[i],
                   " at position ", i, " of document ", documents_, " does not fit uint16 (",
                   prefix_, ".bin)");
      append(bytes, static_cast<uint16_t>(ids[i]));
    } else {
      append(bytes, ids[i]);
    }
  }
  append_tokens(bytes.data(), bytes.size());
  add_sequence(static_cast<int32_t>(ids.size()));
  end_document();
}

void IndexedDatasetWriter::finalize() {
  const int64_t item = indexed_dtype_size(dtype_);
  OMNI_CHECK(tokens_ * item == bin_bytes_, prefix_, ": ", tokens_, " tokens but ", bin_bytes_,
             " bytes of .bin");
  bin_->close();
  lengths_->close();
  boundaries_->close();
  {
    BufferedFile idx(prefix_ + ".idx.tmp", "wb");
    idx.write(kMagic, sizeof(kMagic));
    idx.put(kVersion);
    idx.put(static_cast<uint8_t>(dtype_));
    idx.put(static_cast<uint64_t>(sequences_));
    idx.put(static_cast<uint64_t>(documents_ + 1));
    copy_into(idx, lengths_->path(), 4 * sequences_);
    // Sequence pointers: the running byte offset of each sequence, as Megatron computes them.
    BufferedFile lengths(lengths_->path(), "rb");
    std::vector<int32_t> chunk(1 << 16);
    int64_t offset = 0;
    for (int64_t left = sequences_; left > 0;) {
      const size_t n = static_cast<size_t>(std::min<int64_t>(left, 1 << 16));
      OMNI_CHECK(lengths.read(chunk.data(), 4 * n) == 4 * n, "short read of ", lengths.path());
      for (size_t i = 0; i < n; ++i) {
        idx.put(offset);
        offset += int64_t{chunk[i]} * item;
      }
      left -= static_cast<int64_t>(n);
    }
    idx.put(int64_t{0});
    copy_into(idx, boundaries_->path(), 8 * documents_);
    idx.close();
  }
  // .bin first: the .idx, which readers open first, only ever appears beside its .bin.
  rename_into_place(prefix_ + ".bin.tmp", prefix_ + ".bin");
  rename_into_place(prefix_ + ".idx.tmp", prefix_ + ".idx");
}

void IndexedDatasetWriter::copy_into(BufferedFile& out, const std::string& path, int64_t bytes) {
  BufferedFile in(path, "rb");
  std::vector<char> buffer(1 << 20);
  while (bytes > 0) {
    const size_t want = static_cast<size_t>(std::min<int64_t>(bytes, 1 << 20));
    OMNI_CHECK(in.read(buffer.data(), want) == want, "short read of ", path);
    out.write(buffer.data(), want);
    bytes -= static_cast<int64_t>(want);
  }
}

// ---------------------------------------------------------------------------------------------
// Reader

struct IndexedDataset::Mapping {
  std::string path;
  const uint8_t* data = nullptr;
  int64_t size = 0;

  explicit Mapping(std::string file) : path(std::move(file)) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OMNI_REQUIRE(fd >= 0, "[IndexedDataset] cannot open ", path, ": ", std::strerror(errno));
    struct stat info {};
    if (::fstat(fd, &info) != 0) {
      const int saved = errno;
      ::close(fd);
      throw UsageError(
          detail::concat("[IndexedDataset] cannot stat ", path, ": ", std::strerror(saved)));
    }
    size = static_cast<int64_t>(info.st_size);
    if (size > 0) {
      void* mapped = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
      const int saved = errno;
      ::close(fd);
      OMNI_REQUIRE(mapped != MAP_FAILED, "[IndexedDataset] cannot mmap ", path, ": ",
                   std::strerror(saved));
      data = static_cast<const uint8_t*>(mapped);
    } else {
      ::close(fd);
    }
  }
  ~Mapping() {
    if (data != nullptr) ::munmap(const_cast<uint8_t*>(data), static_cast<size_t>(size));
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
};

IndexedDataset::IndexedDataset(const std::string& prefix) : prefix_(prefix) {
  idx_ = std::make_unique<Mapping>(prefix + ".idx");
  const std::string& idx_path = idx_->path;
  const uint8_t* idx = idx_->data;
  const int64_t idx_size = idx_->size;

  OMNI_REQUIRE(idx_size >= kHeaderBytes, "[IndexedDataset] ", idx_path, " is truncated: the ",
               "header needs ", kHeaderBytes, " bytes, the file has ", idx_size);
  OMNI_REQUIRE(std::memcmp(idx, kMagic, sizeof(kMagic)) == 0, "[IndexedDataset] ", idx_path,
               " is not a Megatron index: expected magic \"MMIDIDX\\0\\0\"");
  const auto version = load<uint64_t>(idx + 9);
  OMNI_REQUIRE(version == kVersion, "[IndexedDataset] ", idx_path, ": expected version ", kVersion,
               ", found ", version);
  const auto code = load<uint8_t>(idx + 17);
  OMNI_REQUIRE(known_dtype_code(code), "[IndexedDataset] ", idx_path,
               ": expected a dtype code 1..8, found ", static_cast<int>(code));
  dtype_ = static_cast<IndexedDtype>(code);
  OMNI_REQUIRE(dtype_ != IndexedDtype::kFloat32 && dtype_ != IndexedDtype::kFloat64,
               "[IndexedDataset] ", idx_path, ": dtype ", indexed_dtype_name(dtype_),
               " does not hold token ids (expected an integer dtype)");

  const auto n = load<uint64_t>(idx + 18);
  const auto m = load<uint64_t>(idx + 26);
  const auto body = static_cast<uint64_t>(idx_size - kHeaderBytes);
  // Bound the counts by the file before multiplying, so a corrupted count cannot overflow.
  const bool counts_fit = n <= body / 12 && m <= body / 8;
  const uint64_t expected = counts_fit ? kHeaderBytes + 12 * n + 8 * m : 0;
  OMNI_REQUIRE(!(counts_fit && static_cast<uint64_t>(idx_size) == expected + n && n > 0),
               "[IndexedDataset] ", idx_path, " has a sequence-mode array (a multimodal ",
               "index); only text indices are supported");
  OMNI_REQUIRE(counts_fit && static_cast<uint64_t>(idx_size) == expected, "[IndexedDataset] ",
               idx_path, ": N = ", n, " sequences and M = ", m, " document boundaries need ",
               counts_fit ? std::to_string(expected) : std::string("more than the file's"),
               " bytes, the file has ", idx_size);
  OMNI_REQUIRE(m >= 1, "[IndexedDataset] ", idx_path,
               ": expected at least one document boundary, found M = 0");

  offsets_at_ = kHeaderBytes + 4 * static_cast<int64_t>(n);
  boundaries_at_ = offsets_at_ + 8 * static_cast<int64_t>(n);
  num_boundaries_ = static_cast<int64_t>(m);

  bin_ = std::make_unique<Mapping>(prefix + ".bin");
  const int64_t bin_size = bin_->size;
  const int64_t item = indexed_dtype_size(dtype_);
  lengths_.resize(n);
  for (uint64_t i = 0; i < n; ++i) {
    const auto length = load<int32_t>(idx + kHeaderBytes + 4 * i);
    const auto offset = load<int64_t>(idx + offsets_at_ + 8 * i);
    OMNI_REQUIRE(length >= 0, "[IndexedDataset] ", idx_path, ": sequence ", i,
                 " has negative length ", length);
    const int64_t bytes = int64_t{length} * item;
    OMNI_REQUIRE(offset >= 0 && offset <= bin_size && bytes <= bin_size - offset,
                 "[IndexedDataset] ", idx_path, ": sequence ", i, " spans bytes ", offset, "..",
                 offset, "+", bytes, " but ", bin_->path, " has ", bin_size, " bytes");
    lengths_[i] = length;
  }
  int64_t previous = 0;
  for (int64_t i = 0; i < num_boundaries_; ++i) {
    const auto boundary = load<int64_t>(idx + boundaries_at_ + 8 * i);
    const bool first_ok = i > 0 || boundary == 0;
    const bool last_ok = i + 1 < num_boundaries_ || boundary == static_cast<int64_t>(n);
    OMNI_REQUIRE(first_ok && last_ok && boundary >= previous && boundary <= static_cast<int64_t>(n),
                 "[IndexedDataset] ", idx_path, ": document boundary ", i, " is ", boundary,
                 "; expected non-decreasing values from 0 to N = ", n);
    previous = boundary;
  }
}

IndexedDataset::~IndexedDataset() = default;

int64_t IndexedDataset::sequence_length(int64_t seq) const {
  OMNI_CHECK(seq >= 0 && seq < num_sequences(), "sequence ", seq, " of ", num_sequences());
  return lengths_[static_cast<size_t>(seq)];
}

int64_t IndexedDataset::sequence_offset(int64_t seq) const {
  return load<int64_t>(idx_->data + offsets_at_ + 8 * seq);
}

std::vector<int64_t> IndexedDataset::document_boundaries() const {
  std::vector<int64_t> boundaries(static_cast<size_t>(num_boundaries_));
  for (int64_t i = 0; i < num_boundaries_; ++i)
    boundaries[static_cast<size_t>(i)] = load<int64_t>(idx_->data + boundaries_at_ + 8 * i);
  return boundaries;
}

void IndexedDataset::read(int64_t seq, int64_t offset, int64_t count, int32_t* out) const {
  const int64_t length = sequence_length(seq);
  OMNI_CHECK(offset >= 0 && count >= 0 && offset <= length && count <= length - offset, "tokens ",
             offset, "..", offset, "+", count, " of sequence ", seq, " with ", length, " tokens");
  const int64_t item = indexed_dtype_size(dtype_);
  const uint8_t* at = bin_->data + sequence_offset(seq) + offset * item;
  for (int64_t i = 0; i < count; ++i, at += item) {
    switch (dtype_) {
      case IndexedDtype::kUInt8:
        out[i] = load<uint8_t>(at);
        break;
      case IndexedDtype::kInt8:
        out[i] = load<int8_t>(at);
        break;
      case IndexedDtype::kInt16:
        out[i] = load<int16_t>(at);
        break;
      case IndexedDtype::kUInt16:
        out[i] = load<uint16_t>(at);
        break;
      case IndexedDtype::kInt32:
        out[i] = load<int32_t>(at);
        break;
      case IndexedDtype::kInt64: {
        const auto value = load<int64_t>(at);
        OMNI_REQUIRE(value >= std::numeric_limits<int32_t>::min() &&
                         value <= std::numeric_limits<int32_t>::max(),
                     "[IndexedDataset] ", bin_->path, ": token ", value, " of sequence ", seq,
                     " does not fit int32");
        out[i] = static_cast<int32_t>(value);
        break;
      }
      case IndexedDtype::kFloat32:
      case IndexedDtype::kFloat64:
        throw InternalError("float token dtype passed validation");
    }
  }
}

}  // namespace omni
