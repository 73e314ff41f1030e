// Megatron launch-script flags as users paste them.
#include <gtest/gtest.h>

#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "config/options.h"

namespace omni {
namespace {

std::vector<std::string> split(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// From the AMD adaptation guide's Megatron command line (with real paths), less the flags
// checked separately below.
const char* kGuideLine =
    "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 "
    "--micro-batch-size 4 --global-batch-size 32 --train-iters 100000 --lr 0.0001 "
    "--min-lr 0.00001 --lr-decay-style cosine --lr-warmup-fraction 0.01 --weight-decay 0.01 "
    "--clip-grad 1.0 --data-path /data/corpus_text_document --vocab-file /data/vocab.json "
    "--merge-file /data/merges.txt --save /ckpt --load /ckpt --log-interval 10 "
    "--eval-interval 1000 --eval-iters 10 --save-interval 1000 --seed 1234";

TEST(MegatronFlags, TheGuidesCommandLineMeansWhatMegatronMeans) {
  Options o;
  parse_options(split(kGuideLine), o);
  EXPECT_EQ(o.model.num_layers, 24);
  EXPECT_EQ(o.model.seq_length, 2048);
  EXPECT_EQ(o.global_batch_size, 32);
  EXPECT_DOUBLE_EQ(o.min_lr, 0.00001);
  EXPECT_DOUBLE_EQ(o.lr_warmup_fraction, 0.01);
  EXPECT_EQ(o.data_path, "/data/corpus_text_document");
  EXPECT_EQ(o.tokenizer.vocab_file, "/data/vocab.json");
  EXPECT_EQ(o.save, "/ckpt");
  o.model.vocab_size = 50257;  // from the tokenizer, which the command opens
  finalize(o);
  EXPECT_EQ(o.lr_schedule.warmup_iters, 1000);  // 1% of 100000
  EXPECT_EQ(o.grad_accumulation_steps(), 8);
}

TEST(MegatronFlags, FeaturesNotBuiltYetFailSayingSo) {
  for (const std::vector<std::string>& flag :
       std::vector<std::vector<std::string>>{{"--num-experts", "8"},
                                             {"--expert-model-parallel-size", "2"}}) {
    Options o;
    try {
      parse_options(flag, o);
      ADD_FAILURE() << flag[0] << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not built yet"), std::string::npos) << e.what();
    }
  }
}

TEST(MegatronFlags, RecomputeFlagsMeanWhatMegatronMeans) {
  Options o;
  parse_options({"--checkpoint-activations"}, o);  // the old name of full, uniform, 1
  EXPECT_EQ(o.recompute_granularity, "full");
  EXPECT_EQ(o.recompute_method, "uniform");
  EXPECT_EQ(o.recompute_num_layers, 1);
  Options s;
  parse_options({"--recompute-activations"}, s);
  EXPECT_EQ(s.recompute_granularity, "selective");
  Options b;
  parse_options({"--recompute-granularity", "full", "--recompute-method", "block",
                 "--recompute-num-layers", "2", "--mock-data", "--vocab-size", "64"},
                b);
  finalize(b);
  EXPECT_EQ(b.recompute_num_layers, 2);
  Options u;
  parse_options({"--recompute-granularity", "full", "--recompute-num-layers", "2", "--mock-data",
                 "--vocab-size", "64"},
                u);
  EXPECT_THROW(finalize(u), UsageError);  // uniform groups of 2: not built
}

TEST(MegatronFlags, PythonPlumbingIsAcceptedWithANote) {
  Options o;
  const std::vector<std::string> args = {"--no-masked-softmax-fusion",
                                         "--no-gradient-accumulation-fusion",
                                         "--distributed-backend", "nccl", "--use-flash-attn"};
  parse_options(args, o);
  parse_options(args, o);  // commands re-parse under a preset or a checkpoint's options
  ASSERT_EQ(o.notes.size(), 4u);
  EXPECT_NE(o.notes[0].find("--no-masked-softmax-fusion"), std::string::npos);
}

}  // namespace
}  // namespace omni
