// The checkpoint directory's metadata.txt and the durable-file steps every writer shares
// (checkpoint.h describes the layout; internal to src/checkpoint/).
//
// Two versions are read. "omnitron-checkpoint 1" (before sharded saves) stored whole tensors,
// one `tensor` line each, and a CRC-32 per data file. "omnitron-checkpoint 2" stores each
// rank's part of a tensor as one or more `shard` lines:
//   shard NAME FILE BYTE_OFFSET float32 global G offset O shape S elements LO HI crc32 X
// the box of the one-rank tensor (global shape G) at offset O with shape S, of whose elements
// (row-major within the box) LO..HI are stored at BYTE_OFFSET of FILE, with their CRC-32.
// Version 1's tensor lines read as shards that are whole tensors without a CRC of their own.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "tensor/tensor.h"

namespace omni::checkpoint_format {

constexpr const char* kMagicWhole = "omnitron-checkpoint 1";
constexpr const char* kMagicSharded = "omnitron-checkpoint 2";
constexpr const char* kNoOptimizer = "none";  // a model-only checkpoint

// CRC-32 (IEEE 802.3, as zlib computes it).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

std::string join_dims(const Shape& s);
int64_t numel_of(const Shape& s);

// Writes `data` to `path` and fsyncs it, so a rename afterwards publishes complete bytes.
void write_synced(const std::string& path, const std::vector<std::pair<const void*, size_t>>& data);
// Makes a rename or file creation inside `dir` durable.
void sync_directory(const std::string& dir);
// Renames ROOT/iter_N.tmp to ROOT/iter_N (replacing an earlier save of N), then writes
// latest_checkpointed_iteration.txt (temporary + rename), each step made durable.
void publish_checkpoint(const std::string& root, int64_t iteration);

// One stored piece of a tensor.
struct StoredShard {
  std::string name, file;
  int64_t byte_offset = 0;
  Shape global, offset, shape;  // the one-rank tensor's shape, and the box within it
  int64_t first = 0, end = 0;   // elements [first, end) of the box, row-major
  std::optional<uint32_t> crc;  // of those bytes (version 2)
};

struct StoredFile {
  int64_t bytes = 0;
  std::optional<uint32_t> crc;  // of the whole file (version 1)
};

// What metadata.txt holds.
struct Metadata {
  std::string path;
  int version = 2;
  TrainingProgress progress;
  CheckpointOptimizer optimizer;
  std::vector<std::string> args;
  // The GELU form ("erf" or "tanh"); empty in checkpoints from before erf GELU, which were tanh.
  std::string gelu;
  std::vector<StoredShard> shards;
  std::map<std::string, StoredFile> files;
};

// Reads ROOT's latest checkpoint's metadata (UsageError naming the file when it is missing,
// truncated or malformed).
Metadata read_metadata(const std::string& root);

// The lines before the shards: magic, progress, optimizer, GELU form and the resolved options.
std::string metadata_header(const Options& opts, const TrainingProgress& progress,
                            const CheckpointOptimizer& optimizer);
// A shard line, and a data file's line (version 2).
std::string shard_line(const StoredShard& s);
std::string file_line(const std::string& name, int64_t bytes);

}  // namespace omni::checkpoint_format
