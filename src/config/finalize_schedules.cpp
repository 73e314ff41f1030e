// finalize()'s part for the length of training, the batch ramp and the learning-rate
// schedule, with Megatron's rules: iteration-based (--train-iters, --lr-*-iters) or
// sample-based (--train-samples, --lr-*-samples, --rampup-batch-size), never a mix, and the
// schedule counted in samples either way (optim/lr_schedule.h).
#include "config/option_rows.h"

namespace omni::option_rows {

namespace {

void finalize_batch_schedule(Options& o) {
  BatchSchedule& b = o.batch_schedule;
  b = BatchSchedule{.global_batch_size = o.global_batch_size};
  if (o.rampup_start == 0 && o.rampup_increment == 0 && o.rampup_samples == 0) return;
  OMNI_REQUIRE(o.train_samples_total > 0,
               "--rampup-batch-size needs sample-based training (--train-samples), as in "
               "Megatron: expected no batch-size rampup for iteration-based training");
  OMNI_REQUIRE(o.rampup_start > 0 && o.rampup_increment > 0 && o.rampup_samples >= 0,
               "--rampup-batch-size ", o.rampup_start, " ", o.rampup_increment, " ",
               o.rampup_samples, ": START and INCR must be positive and SAMPLES at least 0");
  const int diff = o.global_batch_size - o.rampup_start;
  OMNI_REQUIRE(diff > 0 && diff % o.rampup_increment == 0, "--rampup-batch-size START (",
               o.rampup_start, ") must be below --global-batch-size (", o.global_batch_size,
               ") by a multiple of INCR (", o.rampup_increment, ")");
  const int per_step = o.micro_batch_size * o.data_parallel_size;
  for (int batch = o.rampup_start; batch < o.global_batch_size; batch += o.rampup_increment)
    OMNI_REQUIRE(batch % per_step == 0, "--rampup-batch-size: the ramp's global batch ", batch,
                 " is not a multiple of --micro-batch-size (", o.micro_batch_size,
                 ") x data-parallel size (", o.data_parallel_size,
                 "); choose START and INCR multiples of ", per_step);
  b.rampup_start = o.rampup_start, b.rampup_increment = o.rampup_increment;
  b.rampup_samples = o.rampup_samples;
}

}  // namespace

void finalize_schedules(Options& o) {
  const bool by_samples = o.train_samples_total > 0;
  OMNI_REQUIRE(o.train_samples_total >= 0, "--train-samples must be positive");
  if (by_samples) {
    // Megatron's validate_args: "expected sample-based training" and its companions.
    OMNI_REQUIRE(!o.train_iters_given, "--train-samples and --train-iters: give one of them");
    OMNI_REQUIRE(o.lr_decay_iters == 0 && o.lr_warmup_iters == 0 && o.lr_wsd_decay_iters == 0,
                 "--train-samples counts the schedule in samples: use --lr-decay-samples, "
                 "--lr-warmup-samples and --lr-wsd-decay-samples, not the --lr-*-iters flags");
    OMNI_REQUIRE(o.lr_warmup_fraction < 0 || o.lr_warmup_samples == 0,
                 "give one of --lr-warmup-fraction and --lr-warmup-samples");
  } else {
    OMNI_REQUIRE(o.lr_decay_samples == 0 && o.lr_warmup_samples == 0 && o.lr_wsd_decay_samples == 0,
                 "--lr-decay-samples, --lr-warmup-samples and --lr-wsd-decay-samples need "
                 "sample-based training (--train-samples); with --train-iters use the "
                 "--lr-*-iters flags");
  }
  finalize_batch_schedule(o);
  const BatchSchedule& b = o.batch_schedule;
  if (by_samples) {
    o.train_iters = b.iterations_for(o.train_samples_total);
    OMNI_REQUIRE(o.train_iters > 0, "--train-samples (", o.train_samples_total,
                 ") holds no whole step of --global-batch-size (", o.global_batch_size, ")");
  }
  OMNI_REQUIRE(o.train_iters > 0, "--train-iters must be positive (got ", o.train_iters, ")");

  LRScheduleConfig& s = o.lr_schedule;
  s.lr = o.lr;
  s.min_lr = o.min_lr;
  s.style = parse_lr_decay_style(o.lr_decay_style);
  s.wsd_style = parse_wsd_decay_style(o.lr_wsd_decay_style);
  OMNI_REQUIRE(o.lr_warmup_fraction <= 1.0, "--lr-warmup-fraction must be at most 1");
  // Megatron's get_optimizer_param_scheduler: steps are samples.
  const int64_t gbs = o.global_batch_size;
  if (by_samples) {
    s.decay_steps = o.lr_decay_samples ? o.lr_decay_samples : o.train_samples_total;
    s.wsd_decay_steps = o.lr_wsd_decay_samples;
    s.warmup_steps = static_cast<double>(o.lr_warmup_samples);
  } else {
    s.decay_steps = (o.lr_decay_iters ? o.lr_decay_iters : o.train_iters) * gbs;
    s.wsd_decay_steps = o.lr_wsd_decay_iters * gbs;
    s.warmup_steps = static_cast<double>(o.lr_warmup_iters * gbs);
  }
  // --lr-warmup-iters wins over a fraction here (Megatron refuses the pair).
  if (o.lr_warmup_fraction > 0 && s.warmup_steps == 0)
    s.warmup_steps = o.lr_warmup_fraction * static_cast<double>(s.decay_steps);
  s.warmup_init = o.lr_warmup_init;
  OMNI_REQUIRE(o.lr_warmup_init >= 0 && o.lr_warmup_init <= o.lr, "--lr-warmup-init (",
               o.lr_warmup_init, ") must be between 0 and --lr (", o.lr, ")");
  if (s.style == LRDecayStyle::WSD)
    OMNI_REQUIRE(s.wsd_decay_steps > 0 && s.wsd_decay_steps <= s.decay_steps - s.warmup_steps,
                 by_samples ? "--lr-wsd-decay-samples" : "--lr-wsd-decay-iters",
                 " must be positive and fit after the warm-up");
}

}  // namespace omni::option_rows
