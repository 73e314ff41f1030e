#include "checkpoint/sharded_checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "base/error.h"
#include "checkpoint/checkpoint_format.h"

namespace omni {

namespace fs = std::filesystem;
using namespace checkpoint_format;

CheckpointIoStats& checkpoint_io_stats() {
  thread_local CheckpointIoStats stats;
  return stats;
}

namespace {

// Elements streamed at a time where a whole stored shard is read to check its CRC.
constexpr int64_t kReadChunk = int64_t(1) << 20;

void note_buffer(int64_t elements) {
  CheckpointIoStats& s = checkpoint_io_stats();
  s.largest_buffer_bytes = std::max(s.largest_buffer_bytes, elements * int64_t(sizeof(float)));
}

// Calls f(box_element, flat_index, n) for each run along the last dimension of the box at
// `offset` with shape `box` inside a row-major tensor of shape `full`.
template <typename F>
void box_rows(const Shape& full, const Shape& offset, const Shape& box, F&& f) {
  const size_t nd = full.size();
  if (nd == 0) return f(int64_t(0), int64_t(0), int64_t(1));
  const int64_t width = box[nd - 1];
  if (width <= 0 || numel_of(box) == 0) return;
  std::vector<int64_t> stride(nd, 1);
  for (size_t d = nd - 1; d-- > 0;) stride[d] = stride[d + 1] * full[d + 1];
  std::vector<int64_t> idx(nd - 1, 0);
  const int64_t rows = numel_of(box) / width;
  for (int64_t r = 0; r < rows; ++r) {
    int64_t flat = offset[nd - 1];
    for (size_t d = 0; d + 1 < nd; ++d) flat += (offset[d] + idx[d]) * stride[d];
    f(r * width, flat, width);
    for (size_t d = nd - 1; d-- > 0;) {
      if (++idx[d] < box[d]) break;
      idx[d] = 0;
    }
  }
}

// A box of this rank's tensor: where it sits locally and in the one-rank tensor.
struct Box {
  Shape local_offset, global_offset, shape;
};

// The boxes of `p` (one per tensor-parallel segment; the whole tensor when it is not split),
// clipped to the one-rank tensor `global` (vocabulary padding is not stored).
std::vector<Box> boxes_of(const ParamInfo& p, const Shape& global) {
  const Shape zeros(p.shape.size(), 0);
  if (p.shard_dim < 0) return {{zeros, zeros, p.shape}};
  std::vector<Box> boxes;
  for (const ShardSegment& s : p.segments) {
    Box b{zeros, zeros, p.shape};
    const int d = p.shard_dim;
    b.local_offset[d] = s.local_start, b.global_offset[d] = s.global_start;
    if (d > 0) b.global_offset[0] = p.dim0_start;
    b.shape[d] = std::clamp<int64_t>(global[d] - s.global_start, 0, s.length);
    if (b.shape[d] > 0) boxes.push_back(std::move(b));
  }
  return boxes;
}

// A piece this rank writes: elements [first, end) of `box` of tensor `p`, from `span`.
struct Piece {
  const ParamInfo* p;
  Box box;
  int64_t first, end;
  const FlatSpan* span;
};

// One file this rank writes: its pieces and their stored shards (same order).
struct FilePlan {
  std::string name;
  std::vector<Piece> pieces;
  std::vector<StoredShard> shards;
  int64_t elements = 0;
};

// Which pieces of the state this rank writes, into a model file and an optimizer file.
std::vector<FilePlan> plan_files(const RankState& state, int rank, int ranks) {
  char suffix[32] = ".bin";
  if (ranks > 1) std::snprintf(suffix, sizeof suffix, "_rank%05d.bin", rank);
  FilePlan model, optim;
  model.name = std::string("model") + suffix, optim.name = std::string("optimizer") + suffix;
  for (const StateBuffer& buffer : state.buffers) {
    if (!buffer.written) continue;
    FilePlan& file = buffer.prefix.empty() ? model : optim;
    for (const ParamInfo& p : state.infos) {
      if (state.writes && !state.writes(p)) continue;
      const Shape global = one_rank_shape(p, state.padded_vocab);
      for (const FlatSpan& span : buffer.spans) {
        const int64_t a = std::max(span.begin, p.offset) - p.offset;
        const int64_t b = std::min(span.end, p.offset + p.numel) - p.offset;
        if (a >= b) continue;
        for (const Box& box : boxes_of(p, global)) {
          // The box's elements whose local index is in [a, b): one range of the box's
          // row-major order, as both orders are row-major.
          int64_t first = -1, end = -1;
          box_rows(p.shape, box.local_offset, box.shape, [&](int64_t pos, int64_t l, int64_t n) {
            const int64_t lo = std::max(l, a), hi = std::min(l + n, b);
            if (lo >= hi) return;
            if (first < 0) first = pos + (lo - l);
            end = pos + (hi - l);
          });
          if (first < 0) continue;
          StoredShard s{buffer.prefix + p.name,
                        file.name,
                        file.elements * int64_t(sizeof(float)),
                        global,
                        box.global_offset,
                        box.shape,
                        first,
                        end,
                        std::nullopt};
          file.pieces.push_back({&p, box, first, end, &span});
          file.shards.push_back(std::move(s));
          file.elements += end - first;
        }
      }
    }
  }
  std::vector<FilePlan> files;
  for (FilePlan* f : {&model, &optim})
    if (!f->pieces.empty()) files.push_back(std::move(*f));
  return files;
}

// A tensor's part of a span, downloaded from the device once for its pieces.
struct Scratch {
  const ParamInfo* p = nullptr;
  const FlatSpan* span = nullptr;
  std::vector<float> values;
};

// Copies a piece's elements into `out` (end - first of them).
void fill_piece(const Piece& piece, const ops::Exec& exec, Scratch& scratch, float* out) {
  const ParamInfo& p = *piece.p;
  const int64_t a = std::max(piece.span->begin, p.offset),
                b = std::min(piece.span->end, p.offset + p.numel);
  if (scratch.p != &p || scratch.span != piece.span) {
    scratch.values.resize(size_t(b - a));
    note_buffer(b - a);
    ops::download(exec, scratch.values.data(), piece.span->data + (a - piece.span->begin),
                  size_t(b - a));
    scratch.p = &p, scratch.span = piece.span;
  }
  box_rows(p.shape, piece.box.local_offset, piece.box.shape,
           [&](int64_t pos, int64_t l, int64_t n) {
             const int64_t lo = std::max(pos, piece.first), hi = std::min(pos + n, piece.end);
             if (lo >= hi) return;
             std::copy_n(scratch.values.data() + (p.offset + l + (lo - pos) - a), hi - lo,
                         out + (lo - piece.first));
           });
}

// Writes `file` under `dir` (the elements of piece i from data(i)), fsyncs it and records
// each shard's CRC-32.
void write_file(const std::string& dir, FilePlan& file,
                const std::function<const float*(size_t)>& data) {
  const std::string path = dir + "/" + file.name;
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  OMNI_REQUIRE(fd >= 0, "--save: cannot create '", path, "': ", std::strerror(errno));
  auto fail = [&](const std::string& what) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    throw UsageError("--save: " + what + " '" + path + "' failed (" + why + ")");
  };
  for (size_t i = 0; i < file.pieces.size(); ++i) {
    const float* values = data(i);
    const size_t bytes = size_t(file.shards[i].end - file.shards[i].first) * sizeof(float);
    file.shards[i].crc = crc32_update(0, values, bytes);
    const char* p = reinterpret_cast<const char*>(values);
    for (size_t left = bytes; left > 0;) {
      const ssize_t n = ::write(fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) fail("writing");
      p += n, left -= size_t(n);
    }
    checkpoint_io_stats().bytes_written += int64_t(bytes);
  }
  if (::fsync(fd) != 0) fail("fsync of");
  ::close(fd);
}

// Text of every rank to rank 0 (in rank order there; empty elsewhere).
std::vector<std::string> gather_text(Communicator& world, const std::string& text) {
  constexpr int kTag = 0x5ca7;
  if (world.rank() != 0) {
    const uint64_t n = text.size();
    world.send(&n, sizeof n, 0, kTag);
    if (n > 0) world.send(text.data(), n, 0, kTag);
    return {};
  }
  std::vector<std::string> all{text};
  for (int r = 1; r < world.size(); ++r) {
    uint64_t n = 0;
    world.recv(&n, sizeof n, r, kTag);
    std::string s(n, '\0');
    if (n > 0) world.recv(s.data(), n, r, kTag);
    all.push_back(std::move(s));
  }
  return all;
}

// Runs `f` on rank 0; every rank gets its failure as a UsageError (rank 0 its own).
void on_rank0(Communicator& world, const std::function<void()>& f) {
  std::string error;
  std::exception_ptr own;
  if (world.rank() == 0) try {
      f();
    } catch (const std::exception& e) {
      own = std::current_exception();
      error = e.what();
    }
  uint64_t n = error.size();
  world.broadcast(&n, sizeof n, 0);
  error.resize(n);
  if (n > 0) world.broadcast(error.data(), n, 0);
  if (own) std::rethrow_exception(own);
  if (n > 0) throw UsageError("rank 0: " + error);
}

}  // namespace

Shape one_rank_shape(const ParamInfo& p, int64_t padded_vocab) {
  Shape g = p.global_shape.empty() ? p.shape : p.global_shape;
  const bool vocab = p.name == "output_layer.weight" ||
                     (p.name.size() >= 22 &&
                      p.name.compare(p.name.size() - 22, 22, "word_embeddings.weight") == 0);
  if (padded_vocab > 0 && vocab && p.shard_dim == 0) g[0] = padded_vocab;
  return g;
}

struct CheckpointWriter::Pending {
  std::string root, dir, header;
  int64_t iteration = 0;
  std::vector<FilePlan> files;
  std::vector<float> staging;  // --async-save: the copy of this rank's part
  std::thread thread;
  std::atomic<bool> done{false};
  std::exception_ptr error;
};

CheckpointWriter::CheckpointWriter(Communicator& world) : world_(world) {}

CheckpointWriter::~CheckpointWriter() {
  if (pending_ && pending_->thread.joinable()) pending_->thread.join();
}

std::string CheckpointWriter::save(const std::string& root, const Options& opts,
                                   const TrainingProgress& progress,
                                   const CheckpointOptimizer& optimizer, const RankState& state,
                                   bool async) {
  if (pending_) finish(true);  // a second save waits for the first
  auto job = std::make_unique<Pending>();
  job->root = root, job->iteration = progress.iteration;
  job->dir = checkpoint_iteration_dir(root, progress.iteration);
  const std::string tmp = job->dir + ".tmp";
  if (world_.rank() == 0) job->header = metadata_header(opts, progress, optimizer);
  on_rank0(world_, [&] {
    std::error_code ec;
    fs::create_directories(root, ec);
    OMNI_REQUIRE(!ec, "--save: cannot create directory '", root, "': ", ec.message());
    fs::remove_all(tmp, ec);  // what a crash during an earlier save left
    fs::create_directory(tmp, ec);
    OMNI_REQUIRE(!ec, "--save: cannot create directory '", tmp, "': ", ec.message());
  });
  job->files = plan_files(state, world_.rank(), world_.size());
  Pending& p = *job;
  pending_ = std::move(job);
  if (async) {
    // The copy the thread writes from, so training may change the state meanwhile.
    int64_t total = 0;
    for (const FilePlan& f : p.files) total += f.elements;
    p.staging.resize(size_t(total));
    Scratch scratch;
    float* out = p.staging.data();
    for (const FilePlan& f : p.files)
      for (const Piece& piece : f.pieces) {
        fill_piece(piece, state.exec, scratch, out);
        out += piece.end - piece.first;
      }
    p.thread = std::thread([&p, tmp] {
      try {
        // Fault injection for tests: a slow disk, so a test can kill -9 between a save's
        // start and its files being durable.
        if (const char* ms = std::getenv("OMNITRON_TEST_SAVE_DELAY_MS"))
          std::this_thread::sleep_for(std::chrono::milliseconds(std::atoll(ms)));
        const float* at = p.staging.data();
        for (FilePlan& f : p.files)
          write_file(tmp, f, [&](size_t i) {
            const float* here = at;
            at += f.pieces[i].end - f.pieces[i].first;
            return here;
          });
        std::vector<float>().swap(p.staging);
      } catch (...) {
        p.error = std::current_exception();
      }
      p.done = true;
    });
    return p.dir;
  }
  try {
    Scratch scratch;
    std::vector<float> piece_data;
    for (FilePlan& f : p.files)
      write_file(tmp, f, [&](size_t i) {
        const Piece& piece = f.pieces[i];
        piece_data.resize(size_t(piece.end - piece.first));
        fill_piece(piece, state.exec, scratch, piece_data.data());
        return piece_data.data();
      });
  } catch (...) {
    p.error = std::current_exception();
  }
  p.done = true;
  return finish(true);
}

std::string CheckpointWriter::finish(bool wait) {
  if (!pending_) return "";
  Pending& p = *pending_;
  if (wait && p.thread.joinable()) p.thread.join();
  double state[2] = {p.done ? 0.0 : 1.0, p.error ? 1.0 : 0.0};  // not yet durable, failed
  world_.all_reduce(state, 2, ReduceOp::Max);
  if (state[1] == 0 && state[0] > 0) return "";
  if (p.thread.joinable()) p.thread.join();
  if (state[1] > 0) {
    const std::exception_ptr error = p.error;
    const int64_t iteration = p.iteration;
    pending_.reset();
    if (error) std::rethrow_exception(error);
    throw UsageError("--save: another rank failed to write checkpoint iteration " +
                     std::to_string(iteration) + " (its message says why)");
  }
  std::string lines;
  for (const FilePlan& f : p.files) {
    for (const StoredShard& s : f.shards) lines += shard_line(s);
    lines += file_line(f.name, f.elements * int64_t(sizeof(float)));
  }
  const std::vector<std::string> all = gather_text(world_, lines);
  const std::unique_ptr<Pending> done = std::move(pending_);
  on_rank0(world_, [&] {
    std::string md = p.header;
    for (const std::string& s : all) md += s;
    md += "end\n";
    write_synced(p.dir + ".tmp/metadata.txt", {{md.data(), md.size()}});
    publish_checkpoint(p.root, p.iteration);
  });
  return p.dir;
}

// Reading.

struct CheckpointReader::Impl {
  Metadata md;
  std::string dir;
  std::map<std::string, std::vector<size_t>> by_name;  // shard indices of each tensor
  mutable std::map<std::string, int> fds;              // files opened (and checked) so far

  ~Impl() {
    for (const auto& [name, fd] : fds) ::close(fd);
  }

  // The open file `name`, after checking its size (and a version-1 file's CRC-32).
  int open_file(const std::string& name) const {
    auto it = fds.find(name);
    if (it != fds.end()) return it->second;
    const std::string path = dir + "/" + name;
    auto f = md.files.find(name);
    OMNI_REQUIRE(f != md.files.end(), "--load: '", md.path, "' does not list ", name);
    const int64_t bytes = f->second.bytes;
    struct stat st {};
    OMNI_REQUIRE(::stat(path.c_str(), &st) == 0, "--load: cannot read '", path,
                 "': ", std::strerror(errno));
    const int64_t size = st.st_size;
    if (size < bytes) {
      std::string first_cut;
      for (const StoredShard& s : md.shards)
        if (s.file == name && first_cut.empty() &&
            s.byte_offset + (s.end - s.first) * int64_t(sizeof(float)) > size)
          first_cut = " (tensor " + s.name + " at byte " + std::to_string(s.byte_offset) +
                      " is incomplete)";
      throw UsageError("--load: '" + path + "' is truncated: it holds " + std::to_string(size) +
                       " bytes, " + std::to_string(bytes) + " expected" + first_cut);
    }
    OMNI_REQUIRE(size == bytes, "--load: '", path, "' holds ", size, " bytes, ", bytes,
                 " expected (not the file this checkpoint wrote)");
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    OMNI_REQUIRE(fd >= 0, "--load: cannot open '", path, "': ", std::strerror(errno));
    fds[name] = fd;
    if (f->second.crc) {  // version 1: one CRC for the whole file
      std::vector<char> buf(1 << 20);
      uint32_t crc = 0;
      for (int64_t at = 0; at < size;) {
        const size_t n = size_t(std::min<int64_t>(int64_t(buf.size()), size - at));
        pread_exact(fd, buf.data(), n, at, path, "");
        crc = crc32_update(crc, buf.data(), n);
        at += int64_t(n);
      }
      OMNI_REQUIRE(crc == *f->second.crc, "--load: '", path, "' is corrupted: its CRC-32 is ",
                   std::hex, crc, " but the checkpoint recorded ", *f->second.crc);
    }
    return fd;
  }

  static void pread_exact(int fd, void* dst, size_t bytes, int64_t offset, const std::string& path,
                          const std::string& tensor) {
    char* p = static_cast<char*>(dst);
    checkpoint_io_stats().bytes_read += int64_t(bytes);
    while (bytes > 0) {
      const ssize_t n = ::pread(fd, p, bytes, off_t(offset));
      if (n < 0 && errno == EINTR) continue;
      OMNI_REQUIRE(n > 0, "--load: reading ", tensor.empty() ? "" : "tensor " + tensor + " from ",
                   "'", path, "' failed at byte ", offset);
      p += n, bytes -= size_t(n), offset += n;
    }
  }

  // Reads elements [a, b) of this rank's tensor `p` (stored as `name`, one-rank shape
  // `global`) into out[0, b - a); vocabulary padding reads as zero.
  void read_part(const std::string& name, const ParamInfo& p, const Shape& global, int64_t a,
                 int64_t b, float* out) const;
};

void CheckpointReader::Impl::read_part(const std::string& name, const ParamInfo& p,
                                       const Shape& global, int64_t a, int64_t b,
                                       float* out) const {
  auto it = by_name.find(name);
  OMNI_REQUIRE(it != by_name.end(), "--load: '", md.path, "' has no tensor ", name,
               " (expected shape [", join_dims(global), "]; was it saved from another model?)");
  // Every stored run of the tensor, in the one-rank tensor's row-major order.
  struct Run {
    int64_t flat, n;
    size_t shard;
    int64_t at;  // its first element's position among the shard's stored elements
  };
  std::vector<Run> runs;
  for (size_t i : it->second) {
    const StoredShard& s = md.shards[i];
    OMNI_REQUIRE(s.global == global, "--load: tensor ", name, " in '", md.path, "' has shape [",
                 join_dims(s.global), "] but the model expects [", join_dims(global),
                 "] (a checkpoint of another model shape)");
    box_rows(s.global, s.offset, s.shape, [&](int64_t pos, int64_t flat, int64_t n) {
      const int64_t lo = std::max(pos, s.first), hi = std::min(pos + n, s.end);
      if (lo < hi) runs.push_back({flat + (lo - pos), hi - lo, i, lo - s.first});
    });
  }
  std::sort(runs.begin(), runs.end(), [](const Run& x, const Run& y) { return x.flat < y.flat; });
  // What this rank needs, matched to the stored runs.
  struct Copy {
    size_t shard;
    int64_t at, n, dst;
  };
  std::vector<Copy> copies;
  const int64_t numel = numel_of(global);
  std::fill(out, out + (b - a), 0.0f);
  ParameterSet<float>::for_each_run(p, [&](int64_t l, int64_t g, int64_t n) {
    const int64_t lo = std::max(l, a), hi = std::min(l + n, b);
    if (lo >= hi) return;
    const int64_t first = g + (lo - l), want = std::clamp<int64_t>(numel - first, 0, hi - lo);
    const int64_t last = first + want;
    auto r = std::upper_bound(runs.begin(), runs.end(), first,
                              [](int64_t v, const Run& x) { return v < x.flat; });
    if (r != runs.begin()) --r;
    int64_t covered = 0;
    for (; r != runs.end() && r->flat < last; ++r) {
      const int64_t s = std::max(first, r->flat), e = std::min(last, r->flat + r->n);
      if (s >= e) continue;
      copies.push_back({r->shard, r->at + (s - r->flat), e - s, lo - a + (s - first)});
      covered += e - s;
    }
    OMNI_REQUIRE(covered == want, "--load: '", md.path, "' holds ", covered, " of the ", want,
                 " elements of tensor ", name, " from element ", first,
                 " (a rank's shard is missing)");
  });
  std::sort(copies.begin(), copies.end(), [](const Copy& x, const Copy& y) {
    return x.shard != y.shard ? x.shard < y.shard : x.at < y.at;
  });
  std::vector<float> chunk;
  for (size_t c = 0; c < copies.size();) {
    size_t e = c;
    int64_t total = 0;
    for (; e < copies.size() && copies[e].shard == copies[c].shard; ++e) total += copies[e].n;
    const StoredShard& s = md.shards[copies[c].shard];
    const int fd = open_file(s.file);
    const std::string path = dir + "/" + s.file;
    const int64_t stored = s.end - s.first;
    if (total == stored && s.crc) {
      // The whole shard: streamed through a chunk, its CRC-32 checked.
      uint32_t crc = 0;
      size_t k = c;
      for (int64_t at = 0; at < stored; at += kReadChunk) {
        const int64_t n = std::min(kReadChunk, stored - at);
        chunk.resize(size_t(n));
        note_buffer(n);
        pread_exact(fd, chunk.data(), size_t(n) * sizeof(float),
                    s.byte_offset + at * int64_t(sizeof(float)), path, name);
        crc = crc32_update(crc, chunk.data(), size_t(n) * sizeof(float));
        for (; k < e && copies[k].at < at + n; ++k) {
          const Copy& cp = copies[k];
          const int64_t from = std::max(cp.at, at), to = std::min(cp.at + cp.n, at + n);
          std::copy_n(chunk.data() + (from - at), to - from, out + cp.dst + (from - cp.at));
          if (cp.at + cp.n > at + n) break;  // continues in the next chunk
        }
      }
      OMNI_REQUIRE(crc == *s.crc, "--load: '", path, "' is corrupted: tensor ", s.name, " at byte ",
                   s.byte_offset, " has CRC-32 ", std::hex, crc, " but the checkpoint recorded ",
                   *s.crc);
    } else {
      for (size_t k = c; k < e; ++k)
        pread_exact(fd, out + copies[k].dst, size_t(copies[k].n) * sizeof(float),
                    s.byte_offset + copies[k].at * int64_t(sizeof(float)), path, name);
    }
    c = e;
  }
}

CheckpointReader::CheckpointReader(const std::string& root) : impl_(std::make_unique<Impl>()) {
  impl_->md = read_metadata(root);
  impl_->dir = checkpoint_iteration_dir(root, impl_->md.progress.iteration);
  for (size_t i = 0; i < impl_->md.shards.size(); ++i)
    impl_->by_name[impl_->md.shards[i].name].push_back(i);
}

CheckpointReader::~CheckpointReader() = default;

const TrainingProgress& CheckpointReader::progress() const {
  return impl_->md.progress;
}

const CheckpointOptimizer& CheckpointReader::optimizer() const {
  return impl_->md.optimizer;
}

void CheckpointReader::check_optimizer(const std::string& name) const {
  const Metadata& md = impl_->md;
  OMNI_REQUIRE(md.optimizer.name == name, "--load: '", md.path, "' holds the state of optimizer ",
               md.optimizer.name, " but --optimizer is ", name,
               " (add --no-load-optim to start it afresh)");
  // Zoo states whose MoE experts' layout changed when each expert became a tensor of its own.
  const bool expert_layout = name == "adam8bit" || name == "muon" || name.starts_with("galore");
  // galoreadamw8bit's (and its per-layer variant's) 8-bit blocks restarted at each expert later.
  const bool blocks = name.starts_with("galoreadamw8bit");
  if (!expert_layout || (md.optimizer.experts_separate && (!blocks || md.optimizer.expert_blocks)))
    return;
  const auto at = std::find(md.args.begin(), md.args.end(), "--num-experts");
  const bool moe = at != md.args.end() && at + 1 != md.args.end() && std::atoi(at[1].c_str()) > 0;
  OMNI_REQUIRE(!moe || md.optimizer.experts_separate, "--load: '", md.path, "' holds ", name,
               " state from before omnitron stepped each MoE expert as a tensor of its own, in "
               "another layout (add --no-load-optim to start it afresh)");
  OMNI_REQUIRE(!moe, "--load: '", md.path, "' holds ", name,
               " state from before omnitron restarted its 8-bit blocks at each MoE expert, in "
               "another layout (add --no-load-optim to start it afresh)");
}

double CheckpointReader::optimizer_scalar(const std::string& name) const {
  const Metadata& md = impl_->md;
  for (const auto& [n, v] : md.optimizer.scalars)
    if (n == name) return v;
  throw UsageError("--load: '" + md.path + "' has no optimizer_scalar " + name + " for optimizer " +
                   md.optimizer.name);
}

void CheckpointReader::read(const RankState& state) const {
  std::vector<float> part;
  for (const StateBuffer& buffer : state.buffers)
    for (const ParamInfo& p : state.infos) {
      const Shape global = one_rank_shape(p, state.padded_vocab);
      for (const FlatSpan& span : buffer.spans) {
        const int64_t a = std::max(span.begin, p.offset),
                      b = std::min(span.end, p.offset + p.numel);
        if (a >= b) continue;
        part.resize(size_t(b - a));
        note_buffer(b - a);
        impl_->read_part(buffer.prefix + p.name, p, global, a - p.offset, b - p.offset,
                         part.data());
        ops::upload(state.exec, span.data + (a - span.begin), part.data(), size_t(b - a));
      }
    }
}

std::vector<std::pair<std::string, std::vector<float>>> CheckpointReader::read_whole(
    const std::string& prefix) const {
  std::vector<std::pair<std::string, std::vector<float>>> tensors;
  for (const auto& [name, shards] : impl_->by_name) {
    if (name.rfind(prefix, 0) != 0 || (prefix.empty() && name.rfind("optimizer.", 0) == 0))
      continue;
    ParamInfo p(name, impl_->md.shards[shards.front()].global);
    p.numel = numel_of(p.shape);
    std::vector<float> values(size_t(p.numel));
    impl_->read_part(name, p, p.shape, 0, p.numel, values.data());
    tensors.emplace_back(name, std::move(values));
  }
  return tensors;
}

}  // namespace omni
