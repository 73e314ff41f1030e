#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace omni {

LRDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LRDecayStyle::Constant;
  if (s == "linear") return LRDecayStyle::Linear;
  if (s == "cosine") return LRDecayStyle::Cosine;
  if (s == "inverse-square-root") return LRDecayStyle::InverseSquareRoot;
  if (s == "WSD") return LRDecayStyle::WSD;
  throw UsageError("--lr-decay-style: '" + s +
                   "' is not one of constant, linear, cosine, inverse-square-root, WSD");
}

WSDDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "linear") return WSDDecayStyle::Linear;
  if (s == "cosine") return WSDDecayStyle::Cosine;
  if (s == "exponential") return WSDDecayStyle::Exponential;
  if (s == "minus_sqrt") return WSDDecayStyle::MinusSqrt;
  throw UsageError("--lr-wsd-decay-style: '" + s +
                   "' is not one of linear, cosine, exponential, minus_sqrt");
}

double learning_rate(const LRScheduleConfig& c, int64_t steps) {
  const double n = static_cast<double>(steps);
  if (c.warmup_steps > 0 && n <= c.warmup_steps)
    return c.warmup_init + (c.lr - c.warmup_init) * n / c.warmup_steps;
  if (c.style == LRDecayStyle::Constant) return c.lr;
  if (steps > c.decay_steps) return c.min_lr;
  if (c.style == LRDecayStyle::InverseSquareRoot) {
    const double w = std::max(c.warmup_steps, 1.0);
    return std::max(c.min_lr, c.lr * std::sqrt(w) / std::sqrt(std::max(n, 1.0)));
  }
  const double delta = c.lr - c.min_lr;
  if (c.style == LRDecayStyle::WSD) {
    const int64_t anneal_start = c.decay_steps - c.wsd_decay_steps;
    if (steps <= anneal_start) return c.lr;
    const double r =
        static_cast<double>(steps - anneal_start) / static_cast<double>(c.wsd_decay_steps);
    double coeff = 0;
    switch (c.wsd_style) {
      case WSDDecayStyle::Linear:
        coeff = 1.0 - r;
        break;
      case WSDDecayStyle::Cosine:
        coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
        break;
      case WSDDecayStyle::Exponential:
        coeff = 2.0 * std::pow(0.5, r) - 1.0;
        break;
      case WSDDecayStyle::MinusSqrt:
        coeff = 1.0 - std::sqrt(r);
        break;
    }
    return c.min_lr + coeff * delta;
  }
  const double span = static_cast<double>(c.decay_steps) - c.warmup_steps;
  const double r = span > 0 ? (n - c.warmup_steps) / span : 1.0;
  const double coeff =
      c.style == LRDecayStyle::Linear ? 1.0 - r : 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
  return c.min_lr + coeff * delta;
}

}  // namespace omni
