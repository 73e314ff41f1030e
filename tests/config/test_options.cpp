// Megatron launch-script flags as users paste them.
#include <gtest/gtest.h>

#include <fstream>
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
  EXPECT_DOUBLE_EQ(o.lr_schedule.warmup_steps, 1000.0 * 32);  // 1% of 100000 steps of 32 samples
  EXPECT_EQ(o.grad_accumulation_steps(), 8);
}

TEST(MegatronFlags, FeaturesNotBuiltYetFailSayingSo) {
  for (const std::vector<std::string>& flag : std::vector<std::vector<std::string>>{
           {"--glu-linear-offset", "1"}, {"--sample-rate", "0.5"}}) {
    Options o;
    try {
      parse_options(flag, o);
      ADD_FAILURE() << flag[0] << " was accepted";
    } catch (const UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("not built yet"), std::string::npos) << e.what();
    }
  }
}

// A YAML file's refused value overridden later on the command line is not refused.
TEST(MegatronFlags, ALaterValueReplacesAnEarlierRefusedOne) {
  Options o;
  EXPECT_NO_THROW(parse_options({"--sample-rate", "0.5", "--sample-rate", "1"}, o));
  EXPECT_THROW(parse_options({"--dataloader-type", "single", "--dataloader-type", "external"}, o),
               UsageError);
}

// Megatron's cyclic sampler (set by every Primus experiment) only reorders the samples of an
// epoch: accepted, with a note saying so.
TEST(MegatronFlags, CyclicDataLoaderIsAcceptedWithANote) {
  Options o;
  parse_options({"--dataloader-type", "cyclic"}, o);
  ASSERT_EQ(o.notes.size(), 1u);
  EXPECT_NE(o.notes[0].find("another order"), std::string::npos) << o.notes[0];
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

TEST(MegatronFlags, PythonPlumbingIsAcceptedWithOneNoteLinePerReason) {
  Options o;
  const std::vector<std::string> args = {"--no-masked-softmax-fusion",
                                         "--no-gradient-accumulation-fusion",
                                         "--distributed-backend", "nccl", "--use-flash-attn"};
  parse_options(args, o);
  parse_options(args, o);         // commands re-parse under a preset or a checkpoint's options
  ASSERT_EQ(o.notes.size(), 2u);  // fusions; process-group set-up
  EXPECT_EQ(o.notes[0].find("note: --no-masked-softmax-fusion, --no-gradient-accumulation-fusion, "
                            "--use-flash-attn have no effect here: a fusion"),
            0u)
      << o.notes[0];
  EXPECT_EQ(o.notes[1].find("note: --distributed-backend has no effect here: "), 0u) << o.notes[1];
}

TEST(MegatronFlags, NoLoadRngSaysThereIsNoRngStateToSkip) {
  Options o;
  parse_options({"--no-load-rng"}, o);
  ASSERT_EQ(o.notes.size(), 1u);
  EXPECT_EQ(o.notes[0],
            "note: --no-load-rng has no effect here: a checkpoint holds no random-number state: "
            "initialisation and data order are functions of --seed and the consumed samples");
}

Options finalized(const std::vector<std::string>& args) {
  Options o;
  parse_options(args, o);
  if (!o.mock_data && o.data_path.empty() && o.data_args_path.empty()) o.mock_data = true;
  if (o.model.vocab_size == 0) o.model.vocab_size = 64;
  finalize(o);
  return o;
}

TEST(MegatronFlags, GroupQueryAttentionAloneHasOneKeyValueHeadAsInMegatron) {
  // Megatron's --num-query-groups defaults to 1: --group-query-attention alone is MQA.
  EXPECT_EQ(
      finalized({"--num-attention-heads", "8", "--hidden-size", "64", "--group-query-attention"})
          .model.query_groups(),
      1);
  // Without --group-query-attention Megatron ignores --num-query-groups.
  EXPECT_EQ(
      finalized({"--num-attention-heads", "8", "--hidden-size", "64", "--num-query-groups", "2"})
          .model.query_groups(),
      8);
  EXPECT_EQ(finalized({"--num-attention-heads", "8", "--hidden-size", "64",
                       "--group-query-attention", "--num-query-groups", "2"})
                .model.query_groups(),
            2);
}

TEST(MegatronFlags, OptimizerAdamIsAdamWithDecoupledWeightDecay) {
  EXPECT_EQ(finalized({"--optimizer", "adam"}).optim.kind, OptimizerKind::AdamW);
  EXPECT_EQ(finalized({"--optimizer", "adamw"}).optim.kind, OptimizerKind::AdamW);
  EXPECT_EQ(finalized({"--optimizer", "sgd"}).optim.kind, OptimizerKind::SGD);
  EXPECT_EQ(finalized({}).optimizer, "adam");  // Megatron's default
  Options o;
  try {
    parse_options({"--optimizer", "soap"}, o);
    ADD_FAILURE() << "soap accepted";
  } catch (const UsageError& e) {
    EXPECT_STREQ(e.what(), "--optimizer soap: not built yet: the soap optimizer");
  }
  EXPECT_EQ(finalized({"--optimizer", "muon"}).optim.kind, OptimizerKind::Muon);  // the zoo
  EXPECT_THROW(parse_options({"--optimizer", "adagrad"}, o), UsageError);
}

TEST(MegatronFlags, RetiredSpellingsAreRefusedAsMegatronRefusesThem) {
  Options o;
  try {
    parse_options({"--batch-size", "4"}, o);
    ADD_FAILURE() << "--batch-size accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("use --micro-batch-size"), std::string::npos) << e.what();
  }
}

TEST(MegatronFlags, AliasesSetWhatTheirTargetsSet) {
  const Options o = finalized(
      {"--encoder-num-layers", "3", "--encoder-seq-length", "48", "--persistent-save-interval", "5",
       "--use-rotary-position-embeddings", "--dataloader-inter-document-masking"});
  EXPECT_EQ(o.model.num_layers, 3);
  EXPECT_EQ(o.model.seq_length, 48);
  EXPECT_EQ(o.save_interval, 5);
  EXPECT_EQ(o.model.position_embedding_type, PositionEmbedding::Rope);
  EXPECT_TRUE(o.reset_attention_mask);
  // Aliases hold no value of their own: a checkpoint stores the target's flag only.
  for (const std::string& a : options_as_args(o, "model")) EXPECT_NE(a, "--encoder-num-layers");
}

TEST(MegatronFlags, VirtualStagesPerRankBecomeLayersPerVirtualStage) {
  const Options o = finalized({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                               "--num-virtual-stages-per-pipeline-rank", "2"});
  EXPECT_EQ(o.num_layers_per_virtual_pipeline_stage, 2);  // 8 layers / (2 stages x 2 chunks)
  EXPECT_EQ(finalized({"--num-layers", "8", "--pipeline-model-parallel-size", "2",
                       "--num-virtual-stages-per-pipeline-rank", "1"})
                .num_layers_per_virtual_pipeline_stage,
            0);  // one chunk: no interleaving
  EXPECT_THROW(finalized({"--num-layers", "6", "--pipeline-model-parallel-size", "2",
                          "--num-virtual-stages-per-pipeline-rank", "2"}),
               UsageError);
}

TEST(MegatronFlags, DataArgsPathReadsDataPathsValueFromAFile) {
  const std::string path = ::testing::TempDir() + "omnitron_data_args.txt";
  std::ofstream(path) << "0.3 /data/a_text_document\n  0.7 /data/b_text_document\n";
  const Options o = finalized({"--data-args-path", path});
  EXPECT_EQ(o.data_path, "0.3 /data/a_text_document 0.7 /data/b_text_document");
  EXPECT_THROW(finalized({"--data-args-path", path, "--data-path", "/data/c"}), UsageError);
  EXPECT_THROW(finalized({"--data-args-path", path + ".missing"}), UsageError);
}

TEST(MegatronFlags, LrWarmupInitIsWhereTheWarmupStarts) {
  const Options o = finalized({"--lr", "1e-3", "--lr-warmup-iters", "10", "--lr-warmup-init",
                               "1e-4", "--train-iters", "100"});
  EXPECT_DOUBLE_EQ(learning_rate(o.lr_schedule, 0), 1e-4);  // one sample per step
  EXPECT_DOUBLE_EQ(learning_rate(o.lr_schedule, 5), 1e-4 + (1e-3 - 1e-4) * 0.5);
  EXPECT_DOUBLE_EQ(learning_rate(o.lr_schedule, 10), 1e-3);
  EXPECT_THROW(finalized({"--lr", "1e-3", "--lr-warmup-init", "2e-3"}), UsageError);
}

TEST(MegatronFlags, EvaluationBatchesOtherThanTrainingOnesAreRefused) {
  EXPECT_NO_THROW(finalized({"--global-batch-size", "8", "--eval-global-batch-size", "8"}));
  try {
    finalized({"--global-batch-size", "8", "--eval-global-batch-size", "4"});
    ADD_FAILURE() << "accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not built yet"), std::string::npos) << e.what();
  }
}

TEST(MegatronFlags, NoPadVocabSizeEmbedsExactlyTheVocabulary) {
  const Options o = finalized({"--no-pad-vocab-size", "--vocab-size", "100"});
  EXPECT_EQ(o.model.padded_vocab_size(), 100);
  EXPECT_EQ(finalized({"--vocab-size", "100"}).model.padded_vocab_size(), 128);
}

TEST(MegatronFlags, StartEvalAtIterLeavesEarlyEvaluationsOutOfTheValidationSamples) {
  // Megatron: (train_iters / eval_interval + 1 - start / eval_interval) evaluations.
  const Options o = finalized({"--train-iters", "100", "--eval-interval", "10", "--eval-iters", "2",
                               "--global-batch-size", "4", "--start-eval-at-iter", "30"});
  EXPECT_EQ(o.valid_samples(), (100 / 10 + 1 - 3) * 2 * 4);
}

}  // namespace
}  // namespace omni
