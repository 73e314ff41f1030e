// Sharded, parallel checkpoints (issue 15): every rank writes only what it owns and each
// element once; a load at any layout reads exactly its part's bytes (no rank allocates the
// whole model); state saved at one layout and loaded at another is the same, bit for bit;
// --async-save trains on while the files are written, and a kill -9 before they are durable
// leaves the previous checkpoint the latest; checkpoints written before sharding still load.
// Ranks are threads of this process (comm/local_communicator.h), each with its own Trainer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/sharded_checkpoint.h"
#include "cli/process.h"
#include "comm/local_communicator.h"
#include "data/datasets/dataset.h"
#include "model/gpt_model.h"
#include "train/trainer.h"

namespace omni {
namespace {

namespace fs = std::filesystem;

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "omnitron_sharded_" + name;
  fs::remove_all(dir);
  return dir;
}

// Four layers (a pipeline of two stages holds two each), a vocabulary of 97 (128 rows at one
// rank, 256 at two tensor-parallel ranks: the second rank's rows are all padding).
Options options(int ranks, const std::vector<std::string>& extra) {
  Options o;
  std::vector<std::string> args = {
      "--mock-data", "--vocab-size",        "97", "--num-layers",
      "4",           "--hidden-size",       "32", "--num-attention-heads",
      "4",           "--seq-length",        "16", "--micro-batch-size",
      "2",           "--global-batch-size", "4",  "--train-iters",
      "3",           "--eval-iters",        "0",  "--lr",
      "1e-2",        "--log-interval",      "5",  "--no-progress"};
  args.insert(args.end(), extra.begin(), extra.end());
  parse_options(args, o);
  o.data_parallel_size = ranks / (o.tensor_model_parallel_size * o.pipeline_model_parallel_size *
                                  o.context_parallel_size);
  finalize(o);
  return o;
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// What one rank did: checkpoint bytes read while its Trainer was built (--load), written by
// its saves, its largest buffer, and the bytes its part of the model holds (parameters and
// the two AdamW states, vocabulary padding left out).
struct RankIo {
  int64_t read = 0, written = 0, largest_buffer = 0, part_bytes = 0, largest_tensor_bytes = 0;
};

// Trains (to --train-iters) at `ranks` in-process ranks with `extra`, then saves when
// `save` (to --save).
std::vector<RankIo> run_layout(int ranks, const std::vector<std::string>& extra, bool save) {
  std::vector<RankIo> io(ranks);
  run_ranks(ranks, [&](Communicator& world) {
    checkpoint_io_stats() = {};
    const Options o = options(ranks, extra);
    Trainer t(o, make_mock_data(o.model.vocab_size, uint64_t(o.seed)), 0, std::nullopt, &world);
    RankIo& r = io[world.rank()];
    r.read = checkpoint_io_stats().bytes_read;
    MetricsSink sink("", false, nullptr);
    t.run(sink);
    if (save) t.save(sink);
    r.written = checkpoint_io_stats().bytes_written;
    r.largest_buffer = checkpoint_io_stats().largest_buffer_bytes;
    for (const ParamInfo& p : t.model().params().infos()) {
      const int64_t whole = numel_of(one_rank_shape(p, o.model.padded_vocab_size()));
      ParameterSet<float>::for_each_run(p, [&](int64_t, int64_t g, int64_t n) {
        r.part_bytes += 3 * std::clamp<int64_t>(whole - g, 0, n) * int64_t(sizeof(float));
      });
      r.largest_tensor_bytes = std::max(r.largest_tensor_bytes, p.numel * int64_t(sizeof(float)));
    }
  });
  return io;
}

// The one-rank model's parameters and two AdamW states, in bytes.
int64_t whole_checkpoint_bytes() {
  GPTModel<float> one(options(1, {}).model, 1, 1);
  int64_t n = 0;
  for (const ParamInfo& p : one.params().infos()) n += p.numel;
  return 3 * n * int64_t(sizeof(float));
}

const std::vector<std::string> kTp2Pp2 = {"--tensor-model-parallel-size", "2",
                                          "--pipeline-model-parallel-size", "2"};

std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(ShardedCheckpoint, EveryRankWritesItsPartOnceAndALoadReadsExactlyItsPart) {
  const std::string dir = fresh_dir("bytes");
  const int64_t whole = whole_checkpoint_bytes();
  const std::vector<RankIo> saved = run_layout(4, with(kTp2Pp2, {"--save", dir}), false);
  int64_t written = 0;
  for (const RankIo& r : saved) written += r.written;
  EXPECT_EQ(written, whole) << "each element of the model and its states is written once";
  for (size_t i = 0; i < saved.size(); ++i) {
    std::printf("TP2xPP2 save, rank %zu: wrote %lld bytes (its part %lld, whole %lld)\n", i,
                (long long)saved[i].written, (long long)saved[i].part_bytes, (long long)whole);
    EXPECT_LE(saved[i].written, saved[i].part_bytes);
    EXPECT_GT(saved[i].written, 0);
  }
  EXPECT_TRUE(fs::exists(dir + "/iter_0000003/model_rank00003.bin"));

  // Loads at three layouts: each rank reads its part's bytes and no more; its buffers stay
  // within its largest tensor (the whole model is never allocated).
  for (const auto& layout :
       {std::pair{4, kTp2Pp2},
        std::pair{4, std::vector<std::string>{"--tensor-model-parallel-size", "4"}},
        std::pair{2, std::vector<std::string>{"--pipeline-model-parallel-size", "2"}}}) {
    const std::vector<RankIo> loaded =
        run_layout(layout.first, with(layout.second, {"--load", dir}), false);
    for (size_t i = 0; i < loaded.size(); ++i) {
      std::printf(
          "load at %d ranks (%s ...), rank %zu: read %lld bytes of %lld, largest "
          "buffer %lld\n",
          layout.first, layout.second[0].c_str(), i, (long long)loaded[i].read, (long long)whole,
          (long long)loaded[i].largest_buffer);
      EXPECT_EQ(loaded[i].read, loaded[i].part_bytes) << "rank " << i;
      EXPECT_LE(loaded[i].largest_buffer, loaded[i].largest_tensor_bytes) << "rank " << i;
      EXPECT_LT(loaded[i].largest_buffer, whole / 3) << "rank " << i;
    }
  }
  const std::vector<RankIo> one = run_layout(1, {"--load", dir}, false);
  EXPECT_EQ(one[0].read, whole);
}

// Every tensor of the checkpoint under `dir` (model and optimizer), by name.
std::vector<std::pair<std::string, std::vector<float>>> everything(const std::string& dir) {
  const CheckpointReader reader(dir);
  auto model = reader.read_whole(), optimizer = reader.read_whole("optimizer.");
  model.insert(model.end(), optimizer.begin(), optimizer.end());
  return model;
}

void expect_same_state(const std::string& a, const std::string& b) {
  const auto x = everything(a), y = everything(b);
  ASSERT_EQ(x.size(), y.size());
  ASSERT_GT(x.size(), 20u);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(x[i].first, y[i].first);
    ASSERT_EQ(x[i].second.size(), y[i].second.size()) << x[i].first;
    EXPECT_EQ(std::memcmp(x[i].second.data(), y[i].second.data(), x[i].second.size() * 4), 0)
        << x[i].first << " differs between " << a << " and " << b;
  }
  EXPECT_EQ(CheckpointReader(a).optimizer().steps, CheckpointReader(b).optimizer().steps);
  EXPECT_EQ(CheckpointReader(a).progress().consumed_samples,
            CheckpointReader(b).progress().consumed_samples);
}

// Saved at one rank, loaded at TP 2 x PP 2 and saved again, loaded at one rank and saved
// again: the state is the first save's, bit for bit (and the same through DP 2 x TP 2 with
// the distributed optimizer, whose ranks each write their shard of the states).
TEST(ShardedCheckpoint, StateSavedAtOneLayoutIsLoadedAtAnotherBitForBit) {
  const std::string one = fresh_dir("one"), tp2pp2 = fresh_dir("tp2pp2"), back = fresh_dir("back"),
                    distopt = fresh_dir("distopt");
  run_layout(1, {"--save", one}, false);
  run_layout(4, with(kTp2Pp2, {"--load", one, "--save", tp2pp2}), true);
  run_layout(1, {"--load", tp2pp2, "--save", back}, true);
  expect_same_state(one, tp2pp2);
  expect_same_state(one, back);
  run_layout(4,
             {"--tensor-model-parallel-size", "2", "--use-distributed-optimizer", "--load", tp2pp2,
              "--save", distopt},
             true);
  expect_same_state(one, distopt);
  EXPECT_TRUE(fs::exists(distopt + "/iter_0000003/optimizer_rank00001.bin"));
}

// Multi-latent attention's tensors (model/mla.h): the up-projections split by heads, the
// down-projections and latent norms replicated; saved at two tensor-parallel ranks, loaded at one.
TEST(ShardedCheckpoint, MultiLatentAttentionSavedAtTensorParallel2LoadsAtOneRank) {
  const std::vector<std::string> mla = {"--multi-latent-attention",
                                        "--q-lora-rank",
                                        "8",
                                        "--kv-lora-rank",
                                        "8",
                                        "--qk-head-dim",
                                        "4",
                                        "--qk-pos-emb-head-dim",
                                        "4",
                                        "--v-head-dim",
                                        "6",
                                        "--qk-layernorm",
                                        "--normalization",
                                        "RMSNorm",
                                        "--swiglu",
                                        "--disable-bias-linear",
                                        "--position-embedding-type",
                                        "rope"};
  const std::string tp2 = fresh_dir("mla_tp2"), one = fresh_dir("mla_one");
  run_layout(2, with(mla, {"--tensor-model-parallel-size", "2", "--save", tp2}), true);
  run_layout(1, with(mla, {"--load", tp2, "--save", one}), true);
  expect_same_state(tp2, one);
}

// omnitron convert reads a checkpoint four ranks wrote: a one-rank copy (one model.bin of
// whole tensors, the same values) and a Hugging Face directory.
TEST(ShardedCheckpoint, ConvertMakesAOneRankOrHuggingFaceCopy) {
  const std::string dir = fresh_dir("convert"), one = fresh_dir("convert_one"),
                    hf = fresh_dir("convert_hf");
  run_layout(4, with(kTp2Pp2, {"--save", dir}), false);
  auto [c1, o1] = run_omnitron("convert --load " + dir + " --save " + one + " --to omnitron");
  ASSERT_EQ(c1, 0) << o1;
  EXPECT_TRUE(fs::exists(one + "/iter_0000000/model.bin")) << o1;
  EXPECT_FALSE(fs::exists(one + "/iter_0000000/optimizer.bin"));
  EXPECT_TRUE(CheckpointReader(dir).read_whole() == CheckpointReader(one).read_whole());
  auto [c2, o2] = run_omnitron("convert --load " + dir + " --save " + hf);
  ASSERT_EQ(c2, 0) << o2;
  EXPECT_TRUE(fs::exists(hf + "/model.safetensors")) << o2;
}

// Trained at TP 2 x PP 2 for 3 steps, saved, resumed at the same layout to 5: the run that
// never stopped, bit for bit.
TEST(ShardedCheckpoint, ResumeFromAShardedCheckpointIsBitExact) {
  const std::string straight = fresh_dir("straight"), stopped = fresh_dir("stopped");
  run_layout(4, with(kTp2Pp2, {"--train-iters", "5", "--save", straight}), false);
  run_layout(4, with(kTp2Pp2, {"--train-iters", "5", "--exit-interval", "3", "--save", stopped}),
             false);
  run_layout(4, with(kTp2Pp2, {"--train-iters", "5", "--load", stopped, "--save", stopped}), false);
  expect_same_state(straight, stopped);
}

const std::string kRun =
    "train --mock-data --vocab-size 50 --num-layers 2 --hidden-size 32 --num-attention-heads 4 "
    "--seq-length 16 --micro-batch-size 2 --global-batch-size 4 --lr 1e-2 --eval-iters 0 "
    "--log-interval 1 --no-progress --max-new-tokens 0 --device cpu ";

// --async-save: the checkpoints are the synchronous saves' bytes; a save whose files are not
// yet durable (a slow disk, OMNITRON_TEST_SAVE_DELAY_MS) does not stop training, and a
// kill -9 then leaves the previous checkpoint the latest, from which the resumed run ends as
// the uninterrupted one.
TEST(ShardedCheckpoint, AsyncSaveTrainsOnAndAKillBeforeDurableKeepsThePreviousLatest) {
  const std::string sync = fresh_dir("sync"), async = fresh_dir("async"),
                    killed = fresh_dir("killed");
  const std::string run8 = kRun + "--train-iters 8 --save-interval 2 ";
  auto [c1, o1] = run_omnitron(run8 + "--save " + sync);
  ASSERT_EQ(c1, 0) << o1;
  auto [c2, o2] = run_omnitron(run8 + "--async-save --save " + async);
  ASSERT_EQ(c2, 0) << o2;
  EXPECT_NE(o2.find("checkpoint " + async + "/iter_0000008 is complete and the latest"),
            std::string::npos)
      << o2;
  for (const char* file :
       {"/iter_0000008/model.bin", "/iter_0000008/optimizer.bin", "/iter_0000004/optimizer.bin"})
    EXPECT_TRUE(read_text(sync + file) == read_text(async + file)) << file;

  // Saved at 4 (durable), then the save at 6 is slow: steps 7 and 8 run meanwhile.
  auto [c3, o3] = run_omnitron(run8 + "--exit-interval 4 --save " + killed);
  ASSERT_EQ(c3, 0) << o3;
  const std::string metrics = killed + "/metrics.jsonl";
  auto [c4, o4] = run_omnitron_env(
      "OMNITRON_TEST_SAVE_DELAY_MS=60000",
      run8 + "--async-save --load " + killed + " --save " + killed + " --metrics-file " + metrics +
          " & pid=$!; while [ \"$(grep -c lm_loss " + metrics +
          " 2>/dev/null)\" != 4 ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done; "
          "sleep 0.2; kill -9 $pid; wait $pid");
  EXPECT_EQ(c4, 128 + 9) << o4;
  EXPECT_NE(read_text(metrics).find("\"iteration\": 8"), std::string::npos)
      << "steps 7 and 8 should run while the save of 6 is pending\n"
      << read_text(metrics);
  EXPECT_EQ(read_text(killed + "/latest_checkpointed_iteration.txt"), "4");
  EXPECT_FALSE(fs::exists(killed + "/iter_0000006"));
  EXPECT_TRUE(fs::exists(killed + "/iter_0000006.tmp"));
  auto [c5, o5] = run_omnitron(run8 + "--load " + killed + " --save " + killed);
  ASSERT_EQ(c5, 0) << o5;
  for (const char* file : {"/iter_0000008/model.bin", "/iter_0000008/optimizer.bin"})
    EXPECT_TRUE(read_text(sync + file) == read_text(killed + file)) << file;
}

// A checkpoint written before sharded saves (omnitron-checkpoint 1: whole tensors and a CRC
// per file, tests/fixtures/checkpoint_v1, made by main at fc0e0b2 with `train --mock-data
// --vocab-size 50 --num-layers 1 --hidden-size 16 --num-attention-heads 4 --seq-length 16
// --micro-batch-size 2 --global-batch-size 4 --train-iters 4 --exit-interval 2 --save DIR`)
// loads at one rank, whose save writes the same bytes (whole tensors in the model's order),
// and at two tensor-parallel ranks, whose save holds the same state.
TEST(ShardedCheckpoint, AVersionOneCheckpointStillLoads) {
  const std::string fixture = std::string(OMNITRON_FIXTURE_DIR) + "/checkpoint_v1";
  const std::string load = fresh_dir("v1"), one = fresh_dir("v1_one"), tp2 = fresh_dir("v1_tp2");
  fs::create_directories(load);
  fs::copy(fixture + "/iter_0000002", load + "/iter_0000002");
  fs::copy(fixture + "/latest_checkpointed_iteration.txt", load);
  const std::vector<std::string> model = {"--vocab-size",  "50", "--num-layers",  "1",
                                          "--hidden-size", "16", "--train-iters", "2",
                                          "--load",        load};
  run_layout(1, with(model, {"--save", one}), true);
  for (const char* file : {"/model.bin", "/optimizer.bin"})
    EXPECT_TRUE(read_text(one + "/iter_0000002" + file) ==
                read_text(fixture + "/iter_0000002" + file))
        << file;
  run_layout(2, with(model, {"--tensor-model-parallel-size", "2", "--save", tp2}), true);
  expect_same_state(load, tp2);
  EXPECT_EQ(CheckpointReader(tp2).optimizer().steps, 2);
}

}  // namespace
}  // namespace omni
