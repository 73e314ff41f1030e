// Megatron-Core's indexed dataset, version 1: `{prefix}.bin` holds the raw tokens and
// `{prefix}.idx` the sequence lengths, their byte offsets in .bin and the document boundaries.
// Files written here load in Megatron and files Megatron wrote load here, byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/buffered_file.h"

namespace omni {

// The dtype codes of the .idx header.
enum class IndexedDtype : uint8_t {
  kUInt8 = 1,
  kInt8 = 2,
  kInt16 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kFloat64 = 6,
  kFloat32 = 7,
  kUInt16 = 8,
};

const char* indexed_dtype_name(IndexedDtype dtype);
int64_t indexed_dtype_size(IndexedDtype dtype);

// Megatron's preprocessor choice: uint16 when the vocabulary is under 65500, else int32.
IndexedDtype indexed_dtype_for_vocab(int64_t vocab_size);

// Megatron's IndexedDatasetBuilder, streamed: the .bin goes straight to disk and the sequence
// lengths and document boundaries to temporary files, from which finalize() assembles the
// .idx, so memory stays constant however much is written. A document is zero or more
// sequences (Megatron's model). Nothing appears under the final names until finalize()
// (.bin, then .idx, each renamed into place); an unfinalized writer removes its temporaries.
class IndexedDatasetWriter {
 public:
  // dtype must be kUInt16 or kInt32.
  IndexedDatasetWriter(const std::string& prefix, IndexedDtype dtype);
  ~IndexedDatasetWriter();
  IndexedDatasetWriter(const IndexedDatasetWriter&) = delete;
  IndexedDatasetWriter& operator=(const IndexedDatasetWriter&) = delete;

  // One document of one sequence; throws UsageError when an id does not fit the dtype.
  void add_document(std::span<const int32_t> ids);
  // The parts for callers that encode tokens themselves: raw token bytes in the writer's
  // dtype, then the length of each sequence they form, then the end of the document.
  void append_tokens(const void* bytes, size_t n);
  void add_sequence(int32_t length);
  void end_document();
  void finalize();

  int64_t documents() const { return documents_; }
  int64_t sequences() const { return sequences_; }
  int64_t tokens() const { return tokens_; }

 private:
  static void copy_into(BufferedFile& out, const std::string& path, int64_t bytes);
  std::string prefix_;
  IndexedDtype dtype_;
  std::unique_ptr<BufferedFile> bin_, lengths_, boundaries_;
  int64_t bin_bytes_ = 0, sequences_ = 0, documents_ = 0, tokens_ = 0;
};

// Read-only view of `{prefix}.bin`/`{prefix}.idx` through mmap. Construction validates the
// whole index against both file sizes, so no later read can leave the mapped files.
class IndexedDataset {
 public:
  // Throws UsageError naming the file and what was expected and found.
  explicit IndexedDataset(const std::string& prefix);
  ~IndexedDataset();
  IndexedDataset(const IndexedDataset&) = delete;
  IndexedDataset& operator=(const IndexedDataset&) = delete;

  const std::string& prefix() const { return prefix_; }
  IndexedDtype dtype() const { return dtype_; }
  int64_t num_sequences() const { return static_cast<int64_t>(lengths_.size()); }
  int64_t sequence_length(int64_t seq) const;
  std::span<const int32_t> sequence_lengths() const { return lengths_; }
  // M values: 0 ... num_sequences(), one more than the number of documents.
  std::vector<int64_t> document_boundaries() const;

  // Tokens offset..offset+count-1 of sequence seq, widened to int32.
  void read(int64_t seq, int64_t offset, int64_t count, int32_t* out) const;

 private:
  struct Mapping;
  int64_t sequence_offset(int64_t seq) const;

  std::string prefix_;
  IndexedDtype dtype_ = IndexedDtype::kInt32;
  std::unique_ptr<Mapping> idx_;
  std::unique_ptr<Mapping> bin_;
  std::vector<int32_t> lengths_;
  int64_t offsets_at_ = 0;     // byte position of the offsets array in .idx
  int64_t boundaries_at_ = 0;  // byte position of the document boundaries in .idx
  int64_t num_boundaries_ = 0;
};

}  // namespace omni
