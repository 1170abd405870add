#pragma once
// Learning-rate schedules as transformers' get_scheduler defines them: constant, linear and cosine (with a floor),
// each with a linear warm-up. A schedule is a multiplier of every parameter group's own learning rate, a function of
// the optimizer steps taken before (torch's LambdaLR: the first step runs at factor(0)), so a run resumed from a
// checkpoint that keeps the step count continues the curve exactly.
#include <charconv>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <string>
#include <string_view>
#include <system_error>

#include "shardwise/core/error.hpp"

namespace shardwise {

/// The shape of a learning-rate schedule after its warm-up.
enum class schedule_kind {
  constant,  ///< 1 (transformers' "constant", or "constant_with_warmup" with warm-up steps).
  linear,    ///< Down to 0 at total_steps ("linear").
  cosine,    ///< Half a cosine down to min_lr_rate at total_steps ("cosine", or "cosine_with_min_lr").
};

/// A learning-rate schedule (AdamWOptions::schedule): the factor each step's learning rate is multiplied by.
/// `{.kind = sw::schedule_kind::cosine, .warmup_steps = 100, .total_steps = 2000, .min_lr_rate = 0.1}` is
/// get_scheduler("cosine_with_min_lr", num_warmup_steps=100, num_training_steps=2000, min_lr_rate=0.1).
struct LearningRateSchedule {
  schedule_kind kind = schedule_kind::constant;  ///< What follows the warm-up.
  std::size_t warmup_steps = 0;                  ///< Steps over which the factor rises linearly from 0 to 1.
  std::size_t total_steps = 0;                   ///< The run's optimizer steps (linear and cosine need them).
  double num_cycles = 0.5;                       ///< Cosine: cycles over the decay (transformers' default, half).
  double min_lr_rate = 0;                        ///< Cosine: its floor, as a fraction of the learning rate.

  bool operator==(LearningRateSchedule const&) const = default;  ///< Field by field.
};

/// The schedule's name, as get_scheduler spells it.
[[nodiscard]] constexpr std::string_view schedule_name(schedule_kind kind) {
  switch (kind) {
    case schedule_kind::linear:
      return "linear";
    case schedule_kind::cosine:
      return "cosine";
    default:
      return "constant";
  }
}

/// Refuses a schedule that cannot describe a run, naming the field and the fix.
inline void check_schedule(LearningRateSchedule const& s) {
  bool const decays = s.kind != schedule_kind::constant;
  if (decays && s.total_steps == 0)
    detail::fail("shardwise::LearningRateSchedule: a ", schedule_name(s.kind),
                 " schedule needs total_steps, the run's optimizer steps; set .total_steps");
  if (decays && s.warmup_steps > s.total_steps)
    detail::fail("shardwise::LearningRateSchedule: warmup_steps (", s.warmup_steps, ") is longer than the run (",
                 "total_steps ", s.total_steps, "); shorten the warm-up or lengthen the run");
  if (!(s.num_cycles > 0) || !std::isfinite(s.num_cycles))
    detail::fail("shardwise::LearningRateSchedule: num_cycles is ", s.num_cycles,
                 "; give a positive number (0.5: half "
                 "a cosine)");
  if (!(s.min_lr_rate >= 0 && s.min_lr_rate <= 1))
    detail::fail("shardwise::LearningRateSchedule: min_lr_rate is ", s.min_lr_rate,
                 "; give a fraction of the learning rate in [0, 1]");
}

/// The factor of the step taken after `step` others (LambdaLR's lambda at `step`), in transformers' arithmetic.
/// Past total_steps, linear stays at 0 and cosine follows its cycle, as transformers' do.
[[nodiscard]] inline double learning_rate_factor(LearningRateSchedule const& s, std::size_t step) {
  auto const current = static_cast<double>(step);
  if (step < s.warmup_steps) return current / static_cast<double>(s.warmup_steps);
  auto const decay_steps = static_cast<double>(s.total_steps > s.warmup_steps ? s.total_steps - s.warmup_steps : 1);
  switch (s.kind) {
    case schedule_kind::linear: {
      double const left = static_cast<double>(s.total_steps) - current;
      return left > 0 ? left / decay_steps : 0.0;
    }
    case schedule_kind::cosine: {
      double const progress = (current - static_cast<double>(s.warmup_steps)) / decay_steps;
      double const factor = 0.5 * (1.0 + std::cos(std::numbers::pi * s.num_cycles * 2.0 * progress));
      double const floored = factor * (1 - s.min_lr_rate) + s.min_lr_rate;
      return floored > 0 ? floored : 0.0;
    }
    default:
      return 1.0;
  }
}

namespace detail {
/// The schedule as checkpoint metadata: "<kind> <warmup> <total> <cycles> <min_lr_rate>", doubles written shortest
/// (they read back bit for bit).
inline std::string schedule_text(LearningRateSchedule const& s) {
  auto number = [](double x) {
    char buffer[32];
    auto const end = std::to_chars(buffer, buffer + sizeof buffer, x).ptr;
    return std::string(buffer, end);
  };
  return std::string(schedule_name(s.kind)) + " " + std::to_string(s.warmup_steps) + " " +
         std::to_string(s.total_steps) + " " + number(s.num_cycles) + " " + number(s.min_lr_rate);
}

/// Reads schedule_text back; false if the text is not one (the caller names the file).
inline bool read_schedule_text(std::string_view text, LearningRateSchedule& s) {
  auto const space = text.find(' ');
  if (space == std::string_view::npos) return false;
  std::string_view const kind = text.substr(0, space);
  if (kind == "constant")
    s.kind = schedule_kind::constant;
  else if (kind == "linear")
    s.kind = schedule_kind::linear;
  else if (kind == "cosine")
    s.kind = schedule_kind::cosine;
  else
    return false;
  char const* at = text.data() + space + 1;
  char const* const end = text.data() + text.size();
  auto field = [&](auto& value) {
    auto const [next, failed] = std::from_chars(at, end, value);
    if (failed != std::errc{}) return false;
    at = next == end ? next : next + (*next == ' ' ? 1 : 0);
    return next == end || *next == ' ';
  };
  return field(s.warmup_steps) && field(s.total_steps) && field(s.num_cycles) && field(s.min_lr_rate) && at == end;
}
}  // namespace detail

}  // namespace shardwise
