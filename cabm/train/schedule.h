// Learning-rate schedules, as a pure function of the (1-based) optimizer step, so a resumed run
// needs nothing but the step to continue the schedule.
//
//   constant  lr(t) = lr
//   warmup    the seed's schedule (Vaswani et al. 2017, §5.3, "Noam"):
//             lr(t) = scale · E^-0.5 · min(t^-0.5, t · warmup^-1.5)
//             rising linearly for `warmup` steps, then decaying as t^-0.5; its peak, at
//             t = warmup, is scale · (E · warmup)^-0.5.
//   cosine    linear warm-up to `lr` over `warmup` steps, lr(t) = lr · t / warmup, then a
//             half cosine from lr down to min_lr_ratio · lr at t = total_steps (held after).
#pragma once

#include <cstdint>
#include <string>

namespace cabm {

enum class ScheduleKind { kConstant, kWarmup, kCosine };

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  double lr = 1e-3;           // constant/cosine: the peak rate
  double scale = 1.0;         // warmup (seed) schedule only
  int64_t d_model = 0;        // E, warmup (seed) schedule only
  int64_t warmup = 0;         // steps of linear warm-up (0: none; cosine/warmup)
  int64_t total_steps = 0;    // cosine: the step where the decay ends
  double min_lr_ratio = 0.1;  // cosine: final rate as a fraction of lr
};

// Parses "constant" | "warmup" (alias "noam") | "cosine"; throws cabm::Error otherwise.
ScheduleKind parse_schedule(const std::string& name);
std::string schedule_name(ScheduleKind kind);

// The seed schedule's scale that makes its peak (at t = warmup) equal to `peak_lr`:
// scale = peak_lr · √E · √warmup.
double warmup_scale_for_peak(double peak_lr, int64_t d_model, int64_t warmup);

// Learning rate for optimizer step t >= 1. Checks the configuration.
double learning_rate(const ScheduleConfig& config, int64_t step);

}  // namespace cabm
