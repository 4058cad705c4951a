#include "cabm/train/schedule.h"

#include "cabm/core/error.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace cabm {

ScheduleKind parse_schedule(const std::string& name) {
  if (name == "constant") return ScheduleKind::kConstant;
  if (name == "warmup" || name == "noam") return ScheduleKind::kWarmup;
  if (name == "cosine") return ScheduleKind::kCosine;
  throw Error(fmt::format("unknown schedule '{}' (expected constant, warmup or cosine)", name));
}

std::string schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::kConstant:
      return "constant";
    case ScheduleKind::kWarmup:
      return "warmup";
    case ScheduleKind::kCosine:
      return "cosine";
  }
  return "?";
}

double warmup_scale_for_peak(double peak_lr, int64_t d_model, int64_t warmup) {
  CABM_CHECK(d_model > 0 && warmup > 0, "warmup schedule needs d_model > 0 and warmup > 0");
  return peak_lr * std::sqrt(static_cast<double>(d_model)) * std::sqrt(static_cast<double>(warmup));
}

double learning_rate(const ScheduleConfig& config, int64_t step) {
  CABM_CHECK(step >= 1, "learning-rate schedules start at step 1, got {}", step);
  CABM_CHECK(config.warmup >= 0, "warmup must be >= 0, got {}", config.warmup);
  const double t = static_cast<double>(step);
  switch (config.kind) {
    case ScheduleKind::kConstant:
      return config.lr;
    case ScheduleKind::kWarmup: {
      CABM_CHECK(config.d_model > 0 && config.warmup > 0, "the warmup schedule needs d_model > 0 and warmup > 0");
      const double w = static_cast<double>(config.warmup);
      return config.scale * std::pow(static_cast<double>(config.d_model), -0.5) *
             std::min(std::pow(t, -0.5), t * std::pow(w, -1.5));
    }
    case ScheduleKind::kCosine: {
      if (step <= config.warmup) return config.lr * t / static_cast<double>(config.warmup);
      const double min_lr = config.lr * config.min_lr_ratio;
      const int64_t decay_steps = config.total_steps - config.warmup;
      if (decay_steps <= 0) return config.lr;
      const double progress =
          std::min(1.0, (t - static_cast<double>(config.warmup)) / static_cast<double>(decay_steps));
      return min_lr + 0.5 * (config.lr - min_lr) * (1.0 + std::cos(std::numbers::pi * progress));
    }
  }
  return config.lr;
}

}  // namespace cabm
