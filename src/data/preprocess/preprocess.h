// `omnitron preprocess` and `omnitron merge-datasets` as a library: Megatron's
// tools/preprocess_data.py and tools/merge_datasets.py, streaming and multi-threaded.
//
// preprocess() reads the input on one thread in batches of lines, tokenises the batches on
// `workers` threads and appends them in input order on the calling thread. At most
// `batches_in_flight` batches exist at once (read, tokenised or waiting to be written), so
// peak memory is bounded by that times the batch size, whatever the input's size. The index
// (.idx) is also streamed, through temporary files beside the output.
//
// Output: for each json key K, `{output_prefix}_{K}_document.bin/.idx`, byte-identical to what
// Megatron's preprocess_data.py writes for the same token ids (without --split-sentences):
//  - one document per input line; a string field is one sequence, a list of strings
//    (Megatron's pre-split sentences) one sequence per non-empty sentence;
//  - tokens are uint16 when tokenizer.vocab_size() < 65500, else int32;
//  - with append_eod, the tokenizer's eod ends every non-empty document (it is added to the
//    document's last sequence);
//  - a document whose token list is empty adds no sequence and no bytes but still adds a
//    document boundary (a repeated entry in the .idx's document index), because Megatron's
//    IndexedDatasetBuilder.add_document appends `len(sequence_lengths)` unconditionally.
//    No eod is appended to an empty document (Megatron appends only when `len(doc_ids) > 0`).
//
// Input: jsonl (each line one JSON object, parsed as Python's json.loads does; blank lines are
// skipped), or plain text (each line one document, without its "\n" or a trailing "\r"), either
// optionally zstd-compressed (detected by zstd's magic number, so `.jsonl.zst` works).
//
// Errors: a line that is not a JSON object, lacks a key or holds a non-string value throws
// UsageError "FILE:LINE: ..." naming the first such line in input order (with any number of
// workers). Megatron aborts there too. Outputs are written to `*.tmp` files and only renamed
// into place after the whole input succeeded: on any error the temporary files are removed
// and existing `{prefix}_{key}_document.bin/.idx` files from an earlier run are left untouched,
// so a failed run never leaves a half-written or mismatched .bin/.idx pair.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/datasets/indexed_dataset.h"
#include "data/tokenizers/tokenizer.h"

namespace omni {

enum class PreprocessInputFormat {
  kAuto,   // jsonl when the name, less a ".zst", ends in .json, .jsonl or .ndjson, else text
  kJsonl,  // one JSON object per line
  kText,   // one document per line
};

struct PreprocessConfig {
  std::string input;                           // --input
  std::vector<std::string> json_keys{"text"};  // --json-keys; plain text uses the first for naming
  std::string output_prefix;                   // --output-prefix
  bool append_eod = false;                     // --append-eod
  int workers = 0;                             // --workers; 0: std::thread::hardware_concurrency
  PreprocessInputFormat format = PreprocessInputFormat::kAuto;
  int64_t batch_bytes = 1 << 20;  // lines are handed to workers in batches of about this size
  int batches_in_flight = 0;      // 0: 4 per worker
};

// Reported about once a second from the calling thread, and once more at the end (done).
struct PreprocessProgress {
  int64_t documents = 0;        // written so far
  int64_t bytes_read = 0;       // input text consumed (decompressed), newlines included
  int64_t file_bytes_read = 0;  // bytes of the input file consumed (compressed for .zst)
  double seconds = 0;
  bool done = false;
  double mb_per_second() const { return seconds > 0 ? bytes_read / seconds / 1e6 : 0.0; }
};
using PreprocessProgressFn = std::function<void(const PreprocessProgress&)>;

// One written dataset.
struct PreprocessOutput {
  std::string key;     // the json key
  std::string prefix;  // {output_prefix}_{key}_document
  int64_t documents = 0, sequences = 0, tokens = 0;
};

struct PreprocessStats {
  PreprocessProgress progress;  // the final figures
  IndexedDtype dtype = IndexedDtype::kUInt16;
  int workers = 0;
  std::vector<PreprocessOutput> outputs;  // in json_keys order
};

// Megatron's output name: {output_prefix}_{key}_document.
std::string preprocess_output_name(const std::string& output_prefix, const std::string& key);

// Runs the whole pipeline. tokenizer.encode must be safe to call from several threads at once
// (it is const). Throws UsageError for bad configuration, unreadable or malformed input (see
// above), a token id that does not fit the dtype, or append_eod with a tokenizer without eod.
PreprocessStats preprocess(const PreprocessConfig& config, const Tokenizer& tokenizer,
                           const PreprocessProgressFn& progress = {});

// merge-datasets' --input: a directory (every PREFIX.bin/PREFIX.idx pair in it, sorted by
// name as Megatron's merge_datasets.py sorts them; a .bin or .idx without its partner is an
// error) or a comma-separated list of prefixes, kept in the order given.
std::vector<std::string> resolve_merge_inputs(const std::string& input);

struct MergeStats {
  IndexedDtype dtype = IndexedDtype::kUInt16;
  int64_t datasets = 0, documents = 0, sequences = 0, tokens = 0;
};

// Concatenates the datasets into `{output_prefix}.bin/.idx`, as Megatron's
// IndexedDatasetBuilder.add_index does: sequences and document boundaries preserved, .bin
// bytes copied as they are. Every input must have the same dtype and a .bin whose sequences
// are stored contiguously in order (as every Megatron writer stores them). The output appears
// only when complete, as for preprocess().
MergeStats merge_indexed_datasets(const std::vector<std::string>& prefixes,
                                  const std::string& output_prefix);

}  // namespace omni
