#include "data/preprocess/preprocess.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <thread>

#include "base/buffered_file.h"
#include "base/error.h"
#include "base/json.h"
#include "data/jsonl.h"

namespace omni {

namespace {

// ---------------------------------------------------------------------------------------------
// The pipeline: reader thread -> batches of lines -> worker threads -> in-order writer.

struct LineBatch {
  int64_t index = 0;
  std::string text;
  std::vector<size_t> ends;                     // line i is text[ends[i-1], ends[i])
  std::vector<int64_t> line_numbers;            // of each stored line
  int64_t bytes_read = 0, file_bytes_read = 0;  // totals after this batch
  std::exception_ptr error;                     // a read error, raised in order
};

struct EncodedKey {
  std::string bin;                     // token bytes in the output dtype
  std::vector<int32_t> lengths;        // per sequence
  std::vector<int32_t> doc_sequences;  // sequences per document
};

struct EncodedBatch {
  std::vector<EncodedKey> keys;
  int64_t documents = 0, bytes_read = 0, file_bytes_read = 0;
  std::exception_ptr error;
};

bool is_jsonl_name(std::string name) {
  if (name.ends_with(".zst")) name.resize(name.size() - 4);
  return name.ends_with(".json") || name.ends_with(".jsonl") || name.ends_with(".ndjson");
}

// Tokenises the lines of one batch; the first bad line stops it with an error naming it.
class BatchEncoder {
 public:
  BatchEncoder(const PreprocessConfig& config, bool jsonl, const Tokenizer& tokenizer,
               IndexedDtype dtype, std::optional<int32_t> eod)
      : config_(config), jsonl_(jsonl), tokenizer_(tokenizer), dtype_(dtype), eod_(eod) {}

  EncodedBatch encode(const LineBatch& batch) {
    EncodedBatch out;
    out.keys.resize(config_.json_keys.size());
    out.bytes_read = batch.bytes_read;
    out.file_bytes_read = batch.file_bytes_read;
    out.error = batch.error;
    size_t begin = 0;
    for (size_t i = 0; i < batch.ends.size(); ++i) {
      std::string_view line(batch.text.data() + begin, batch.ends[i] - begin);
      begin = batch.ends[i];
      try {
        encode_line(line, out);
      } catch (const UsageError& e) {
        out.error = std::make_exception_ptr(
            UsageError(detail::concat(config_.input, ":", batch.line_numbers[i], ": ", e.what())));
        break;
      } catch (const std::exception& e) {
        out.error = std::make_exception_ptr(InternalError(
            detail::concat(config_.input, ":", batch.line_numbers[i], ": ", e.what())));
        break;
      }
      ++out.documents;
    }
    return out;
  }

 private:
  void encode_line(std::string_view line, EncodedBatch& out) {
    if (!jsonl_) {
      if (line.ends_with('\r')) line.remove_suffix(1);
      text_.assign(line);
      encode_document(std::span<const std::string>(&text_, 1), out.keys[0]);
      return;
    }
    json::parse_text_fields(line, config_.json_keys, fields_);
    for (size_t k = 0; k < fields_.size(); ++k) {
      OMNI_REQUIRE(fields_[k].present, "no key \"", config_.json_keys[k], "\" in this JSON object");
      encode_document(fields_[k].texts, out.keys[k]);
    }
  }

  // Megatron's Encoder.encode for one key: empty sentences add nothing; eod ends a non-empty
  // document as part of its last sequence.
  void encode_document(std::span<const std::string> sentences, EncodedKey& out) {
    int32_t sequences = 0;
    for (const std::string& sentence : sentences) {
      const std::vector<int32_t> ids = tokenizer_.encode(sentence);
      if (ids.empty()) continue;
      OMNI_REQUIRE(ids.size() < size_t{INT32_MAX}, "a sentence of ", ids.size(),
                   " tokens does not fit the .idx's int32 length");
      append_ids(ids, out.bin);
      out.lengths.push_back(static_cast<int32_t>(ids.size()));
      ++sequences;
    }
    if (sequences > 0 && config_.append_eod) {
      append_ids(std::span<const int32_t>(&*eod_, 1), out.bin);
      ++out.lengths.back();
    }
    out.doc_sequences.push_back(sequences);
  }

  void append_ids(std::span<const int32_t> ids, std::string& bin) const {
    const size_t at = bin.size();
    if (dtype_ == IndexedDtype::kUInt16) {
      bin.resize(at + 2 * ids.size());
      char* dst = bin.data() + at;
      for (size_t i = 0; i < ids.size(); ++i) {
        OMNI_REQUIRE(ids[i] >= 0 && ids[i] <= 65535, "token id ", ids[i],
                     " does not fit uint16 (the tokenizer's vocab_size is ",
                     tokenizer_.vocab_size(), ")");
        const auto value = static_cast<uint16_t>(ids[i]);
        std::memcpy(dst + 2 * i, &value, 2);
      }
    } else {
      for (int32_t id : ids) OMNI_REQUIRE(id >= 0, "negative token id ", id);
      bin.append(reinterpret_cast<const char*>(ids.data()), 4 * ids.size());
    }
  }

  const PreprocessConfig& config_;
  bool jsonl_;
  const Tokenizer& tokenizer_;
  IndexedDtype dtype_;
  std::optional<int32_t> eod_;
  std::vector<json::TextField> fields_;
  std::string text_;
};

// Shared state of the three stages. The `in_flight` count bounds batches that exist anywhere
// (queued, being tokenised, or tokenised and waiting for their turn to be written).
class Pipeline {
 public:
  Pipeline(const PreprocessConfig& config, bool jsonl, int capacity)
      : config_(config), jsonl_(jsonl), capacity_(capacity) {}
  ~Pipeline() { stop_and_join(); }

  void run_reader() {
    try {
      LineReader reader(config_.input);
      std::string_view line;
      int64_t index = 0;
      bool more = true;
      while (more) {
        LineBatch batch;
        batch.index = index;
        while (static_cast<int64_t>(batch.text.size()) < config_.batch_bytes &&
               (more = reader.next(line))) {
          if (jsonl_ && line.find_first_not_of(" \t\r") == std::string_view::npos) continue;
          batch.text.append(line);
          batch.ends.push_back(batch.text.size());
          batch.line_numbers.push_back(reader.line_number());
        }
        batch.bytes_read = reader.bytes_read();
        batch.file_bytes_read = reader.file().file_bytes_read();
        if (batch.ends.empty() && !more) break;
        if (!push(std::move(batch))) return;
        ++index;
      }
      finish_reading(nullptr);
    } catch (...) {
      finish_reading(std::current_exception());
    }
  }

  void run_worker(BatchEncoder& encoder) {
    for (;;) {
      LineBatch batch;
      {
        std::unique_lock lock(mutex_);
        work_ready_.wait(lock, [&] { return stop_ || !todo_.empty() || reading_done_; });
        if (stop_ || todo_.empty()) return;
        batch = std::move(todo_.front());
        todo_.pop_front();
      }
      EncodedBatch encoded = encoder.encode(batch);
      {
        std::lock_guard lock(mutex_);
        done_.emplace(batch.index, std::move(encoded));
      }
      result_ready_.notify_all();
    }
  }

  // The next batch in input order; false when the input is exhausted.
  bool pop_result(int64_t index, EncodedBatch& out) {
    std::unique_lock lock(mutex_);
    result_ready_.wait(lock,
                       [&] { return done_.count(index) || (reading_done_ && pushed_ == index); });
    if (auto it = done_.find(index); it != done_.end()) {
      out = std::move(it->second);
      done_.erase(it);
      return true;
    }
    if (reader_error_) std::rethrow_exception(reader_error_);
    return false;
  }

  void release_one() {
    {
      std::lock_guard lock(mutex_);
      --in_flight_;
    }
    space_ready_.notify_one();
  }

  void add_thread(std::thread t) { threads_.push_back(std::move(t)); }

  void stop_and_join() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    space_ready_.notify_all();
    work_ready_.notify_all();
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }

 private:
  bool push(LineBatch batch) {
    {
      std::unique_lock lock(mutex_);
      space_ready_.wait(lock, [&] { return stop_ || in_flight_ < capacity_; });
      if (stop_) return false;
      ++in_flight_;
      ++pushed_;
      todo_.push_back(std::move(batch));
    }
    work_ready_.notify_one();
    return true;
  }

  // A read error is raised once every batch read before it has been written.
  void finish_reading(std::exception_ptr error) {
    {
      std::lock_guard lock(mutex_);
      reading_done_ = true;
      reader_error_ = error;
    }
    work_ready_.notify_all();
    result_ready_.notify_all();
  }

  const PreprocessConfig& config_;
  bool jsonl_;
  int capacity_;
  std::mutex mutex_;
  std::condition_variable space_ready_, work_ready_, result_ready_;
  std::deque<LineBatch> todo_;
  std::map<int64_t, EncodedBatch> done_;
  int in_flight_ = 0;
  bool stop_ = false, reading_done_ = false;
  int64_t pushed_ = 0;  // batches handed to the workers
  std::exception_ptr reader_error_;
  std::vector<std::thread> threads_;
};

}  // namespace

std::string preprocess_output_name(const std::string& output_prefix, const std::string& key) {
  return output_prefix + "_" + key + "_document";
}

PreprocessStats preprocess(const PreprocessConfig& config, const Tokenizer& tokenizer,
                           const PreprocessProgressFn& progress) {
  OMNI_REQUIRE(!config.input.empty(), "preprocess needs --input FILE");
  OMNI_REQUIRE(!config.output_prefix.empty(), "preprocess needs --output-prefix PREFIX");
  OMNI_REQUIRE(!config.json_keys.empty(), "--json-keys needs at least one key");
  for (const std::string& key : config.json_keys)
    OMNI_REQUIRE(!key.empty(), "--json-keys: empty key name");
  OMNI_REQUIRE(config.workers >= 0, "--workers must be 0 (all cores) or positive (got ",
               config.workers, ")");
  OMNI_REQUIRE(config.batch_bytes > 0 && config.batches_in_flight >= 0,
               "[preprocess] batch_bytes must be positive and batches_in_flight 0 or positive");
  OMNI_REQUIRE(std::filesystem::is_regular_file(config.input), "--input ", config.input,
               ": no such file");
  const bool jsonl = config.format == PreprocessInputFormat::kJsonl ||
                     (config.format == PreprocessInputFormat::kAuto && is_jsonl_name(config.input));
  OMNI_REQUIRE(jsonl || config.json_keys.size() == 1, "--input ", config.input,
               " is plain text (one document per line), which has no keys: give one "
               "--json-keys name for the output, not ",
               config.json_keys.size());
  const std::optional<int32_t> eod = tokenizer.eod();
  OMNI_REQUIRE(!config.append_eod || eod.has_value(), "--append-eod: ", tokenizer.describe(),
               " has no end-of-document token");

  PreprocessStats stats;
  stats.dtype = indexed_dtype_for_vocab(tokenizer.vocab_size());
  stats.workers = config.workers > 0
                      ? config.workers
                      : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int capacity = config.batches_in_flight > 0 ? config.batches_in_flight : 4 * stats.workers;

  std::vector<std::unique_ptr<IndexedDatasetWriter>> writers;
  for (const std::string& key : config.json_keys) {
    const std::string prefix = preprocess_output_name(config.output_prefix, key);
    writers.push_back(std::make_unique<IndexedDatasetWriter>(prefix, stats.dtype));
    stats.outputs.push_back({key, prefix, 0, 0, 0});
  }

  // Declared before the pipeline, whose destructor joins the threads that use them.
  std::vector<std::unique_ptr<BatchEncoder>> encoders;
  for (int w = 0; w < stats.workers; ++w)
    encoders.push_back(std::make_unique<BatchEncoder>(config, jsonl, tokenizer, stats.dtype, eod));
  Pipeline pipeline(config, jsonl, capacity);
  for (int w = 0; w < stats.workers; ++w) {
    pipeline.add_thread(std::thread([&pipeline, &encoder = *encoders[static_cast<size_t>(w)]] {
      pipeline.run_worker(encoder);
    }));
  }
  pipeline.add_thread(std::thread([&pipeline] { pipeline.run_reader(); }));

  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  auto last_report = start;
  PreprocessProgress& p = stats.progress;
  EncodedBatch batch;
  for (int64_t index = 0; pipeline.pop_result(index, batch); ++index) {
    for (size_t k = 0; k < writers.size(); ++k) {
      IndexedDatasetWriter& writer = *writers[k];
      const EncodedKey& key = batch.keys[k];
      writer.append_tokens(key.bin.data(), key.bin.size());
      size_t next_length = 0;
      for (int32_t sequences : key.doc_sequences) {
        for (int32_t s = 0; s < sequences; ++s) writer.add_sequence(key.lengths[next_length++]);
        writer.end_document();
      }
    }
    p.documents += batch.documents;
    if (batch.error) std::rethrow_exception(batch.error);  // writers remove their temp files
    pipeline.release_one();
    p.bytes_read = batch.bytes_read;
    p.file_bytes_read = batch.file_bytes_read;
    const auto now = Clock::now();
    if (progress && now - last_report >= std::chrono::seconds(1)) {
      last_report = now;
      p.seconds = std::chrono::duration<double>(now - start).count();
      progress(p);
    }
  }
  pipeline.stop_and_join();
  for (size_t k = 0; k < writers.size(); ++k) {
    writers[k]->finalize();
    stats.outputs[k].documents = writers[k]->documents();
    stats.outputs[k].sequences = writers[k]->sequences();
    stats.outputs[k].tokens = writers[k]->tokens();
  }
  p.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  p.done = true;
  if (progress) progress(p);
  return stats;
}

// ---------------------------------------------------------------------------------------------
// Merge

std::vector<std::string> resolve_merge_inputs(const std::string& input) {
  namespace fs = std::filesystem;
  OMNI_REQUIRE(!input.empty(), "merge-datasets needs --input DIR or --input PREFIX,PREFIX,...");
  std::vector<std::string> prefixes;
  if (fs::is_directory(input)) {
    // Megatron's merge_datasets.py: every file's stem must have both a .bin and an .idx.
    std::vector<std::string> stems;
    for (const fs::directory_entry& entry : fs::directory_iterator(input)) {
      if (!entry.is_regular_file()) continue;
      const std::string ext = entry.path().extension().string();
      if (ext != ".bin" && ext != ".idx") continue;
      const fs::path stem = entry.path().parent_path() / entry.path().stem();
      const std::string partner = stem.string() + (ext == ".bin" ? ".idx" : ".bin");
      OMNI_REQUIRE(fs::is_regular_file(partner), "--input ", input, ": ", entry.path().string(),
                   " has no ", partner);
      stems.push_back(stem.string());
    }
    std::sort(stems.begin(), stems.end());
    stems.erase(std::unique(stems.begin(), stems.end()), stems.end());
    prefixes = std::move(stems);
    OMNI_REQUIRE(!prefixes.empty(), "--input ", input, ": no .bin/.idx datasets in this directory");
  } else {
    size_t begin = 0;
    for (;;) {
      const size_t comma = input.find(',', begin);
      std::string prefix = input.substr(begin, comma - begin);
      OMNI_REQUIRE(!prefix.empty(), "--input ", input, ": empty prefix in the list");
      prefixes.push_back(std::move(prefix));
      if (comma == std::string::npos) break;
      begin = comma + 1;
    }
  }
  return prefixes;
}

MergeStats merge_indexed_datasets(const std::vector<std::string>& prefixes,
                                  const std::string& output_prefix) {
  OMNI_REQUIRE(!prefixes.empty(), "merge-datasets: no input datasets");
  OMNI_REQUIRE(!output_prefix.empty(), "merge-datasets needs --output-prefix PREFIX");
  MergeStats stats;
  std::unique_ptr<IndexedDatasetWriter> writer;
  std::vector<char> buffer(4 << 20);
  for (const std::string& prefix : prefixes) {
    OMNI_REQUIRE(prefix != output_prefix, "merge-datasets: --output-prefix ", output_prefix,
                 " is also an input");
    const IndexedDataset dataset(prefix);  // validates the .idx against both files
    if (!writer) {
      stats.dtype = dataset.dtype();
      writer = std::make_unique<IndexedDatasetWriter>(output_prefix, stats.dtype);
    }
    OMNI_REQUIRE(dataset.dtype() == stats.dtype, "merge-datasets: ", prefix, " holds ",
                 indexed_dtype_name(dataset.dtype()), " tokens but ", prefixes.front(), " holds ",
                 indexed_dtype_name(stats.dtype), "; all inputs need the same dtype");
    const int64_t item = indexed_dtype_size(stats.dtype);
    const int64_t n = dataset.num_sequences();
    // The .bin is copied whole (as Megatron's add_index copies it), which is right only when
    // its sequences lie back to back in order: check the sequence pointers say so.
    int64_t expected_offset = 0;
    {
      BufferedFile idx(prefix + ".idx", "rb");
      std::vector<int64_t> offsets(1 << 16);
      std::vector<char> skip(static_cast<size_t>(34 + 4 * n));
      OMNI_CHECK(idx.read(skip.data(), skip.size()) == skip.size(), "short read of ", prefix,
                 ".idx");
      const std::span<const int32_t> lengths = dataset.sequence_lengths();
      for (int64_t done = 0; done < n;) {
        const size_t count = static_cast<size_t>(std::min<int64_t>(n - done, 1 << 16));
        OMNI_CHECK(idx.read(offsets.data(), 8 * count) == 8 * count, "short read of ", prefix,
                   ".idx");
        for (size_t i = 0; i < count; ++i) {
          OMNI_REQUIRE(offsets[i] == expected_offset, "merge-datasets: ", prefix, ".idx: sequence ",
                       done + static_cast<int64_t>(i), " starts at byte ", offsets[i],
                       " of the .bin, expected ", expected_offset,
                       " (sequences not stored back to back cannot be merged)");
          expected_offset += int64_t{lengths[static_cast<size_t>(done) + i]} * item;
        }
        done += static_cast<int64_t>(count);
      }
    }
    OMNI_REQUIRE(
        std::filesystem::file_size(prefix + ".bin") == static_cast<uintmax_t>(expected_offset),
        "merge-datasets: ", prefix, ".bin has ", std::filesystem::file_size(prefix + ".bin"),
        " bytes but its .idx describes ", expected_offset);
    BufferedFile bin(prefix + ".bin", "rb");
    for (int64_t left = expected_offset; left > 0;) {
      const size_t want = static_cast<size_t>(std::min<int64_t>(left, int64_t(buffer.size())));
      OMNI_REQUIRE(bin.read(buffer.data(), want) == want, "merge-datasets: short read of ", prefix,
                   ".bin");
      writer->append_tokens(buffer.data(), want);
      left -= static_cast<int64_t>(want);
    }
    // Document boundaries shift by the sequences before this dataset; its leading 0 is dropped.
    // (The reader checked they run from 0 to N without decreasing.)
    const std::vector<int64_t> boundaries = dataset.document_boundaries();
    const std::span<const int32_t> lengths = dataset.sequence_lengths();
    int64_t s = 0;
    for (size_t d = 1; d < boundaries.size(); ++d) {
      for (; s < boundaries[d]; ++s) writer->add_sequence(lengths[static_cast<size_t>(s)]);
      writer->end_document();
    }
    ++stats.datasets;
  }
  stats.documents = writer->documents();
  stats.sequences = writer->sequences();
  stats.tokens = writer->tokens();
  writer->finalize();
  return stats;
}

}  // namespace omni
