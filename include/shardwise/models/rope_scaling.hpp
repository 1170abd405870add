#pragma once
// How a checkpoint's config scales the rotary embedding (transformers' "rope_scaling", or transformers 5's
// "rope_parameters"): the frequencies theta^(-2i / head_dim) of each pair of a head's columns, changed as
// transformers' rope init functions change them ("linear", "llama3", "yarn", "dynamic"), and the factor yarn multiplies
// cos and sin by. Computed in double, as shardwise computes the tables; transformers computes them in float32.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstddef>
#include <map>
#include <numbers>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/nn/layers/layer_common.hpp"  // config_number

namespace shardwise::models {

/// The scalings of the rotary frequencies shardwise computes: none ("default"), "linear" (every frequency divided
/// by the factor), "llama3" (Llama 3.1 and 3.2: low frequencies divided, high ones kept, a smooth blend between)
/// and "yarn" (Qwen2.5's long context: interpolated and extrapolated frequencies blended over a ramp, cos and sin
/// scaled) and "dynamic" (NTK: a sequence longer than the model's max_position_embeddings rotates with a base raised
/// for its length). `unsupported` is a type transformers has and shardwise does not compute ("longrope", ...): the
/// planner reads such configs; models::Llama refuses them.
enum class rope_type { plain, linear, llama3, yarn, dynamic, unsupported };

/// The name transformers gives a rope_type ("default" for plain).
constexpr char const* rope_type_name(rope_type t) {
  switch (t) {
    case rope_type::plain:
      return "default";
    case rope_type::linear:
      return "linear";
    case rope_type::llama3:
      return "llama3";
    case rope_type::yarn:
      return "yarn";
    case rope_type::dynamic:
      return "dynamic";
    default:
      return "unsupported";
  }
}

/// The rope_type transformers names `name` ("default", "linear", "llama3", "yarn", "dynamic"); unsupported for any
/// other.
inline rope_type rope_type_named(std::string_view name) {
  for (auto t : {rope_type::plain, rope_type::linear, rope_type::llama3, rope_type::yarn, rope_type::dynamic})
    if (name == rope_type_name(t)) return t;
  return rope_type::unsupported;
}

/// A rotary scaling and its parameters, with transformers' names and defaults.
struct RopeScaling {
  rope_type type = rope_type::plain;  ///< Which scaling.
  double factor = 1;                  ///< linear, llama3, yarn, dynamic: how many times longer the context is.
  /// llama3, yarn: the context length the model was pretrained at ("original_max_position_embeddings"); dynamic:
  /// max_position_embeddings, beyond which a sequence's base is raised.
  std::size_t original_max_positions = 0;
  double low_freq_factor = 1;   ///< llama3: wavelengths above original / low_freq_factor are divided by factor.
  double high_freq_factor = 4;  ///< llama3: wavelengths below original / high_freq_factor are kept.
  double beta_fast = 32;        ///< yarn: the ramp's start, in rotations over the original context.
  double beta_slow = 1;         ///< yarn: the ramp's end.
  double attention_factor = 0;  ///< yarn: what cos and sin are multiplied by; 0 derives it from factor and mscales.
  double mscale = 0;            ///< yarn: with mscale_all_dim, the derived attention factor's numerator's weight.
  double mscale_all_dim = 0;    ///< yarn: with mscale, its denominator's weight.
  bool truncate = true;         ///< yarn: the ramp's bounds rounded outward to whole columns.

  /// Whether the frequencies differ from the plain ones.
  [[nodiscard]] constexpr bool scaled() const { return type != rope_type::plain; }

  /// Throws, naming the parameter and the fix, for values transformers' formulas cannot use.
  constexpr void check() const {
    if (type == rope_type::plain || type == rope_type::unsupported) return;
    if (!(factor > 0))
      shardwise::raise("shardwise::models::RopeScaling: ", rope_type_name(type), " scaling with factor ", factor,
                       "; give the config's positive \"factor\"");
    if ((type == rope_type::llama3 || type == rope_type::yarn || type == rope_type::dynamic) &&
        original_max_positions == 0)
      shardwise::raise("shardwise::models::RopeScaling: ", rope_type_name(type),
                       " scaling without original_max_position_embeddings; give the pretraining context length");
    if (type == rope_type::llama3 && !(high_freq_factor > low_freq_factor && low_freq_factor > 0))
      shardwise::raise("shardwise::models::RopeScaling: llama3 scaling with low_freq_factor ", low_freq_factor,
                       " and high_freq_factor ", high_freq_factor, "; they must be positive, high above low");
    if (type == rope_type::yarn && (!(beta_fast > 0) || !(beta_slow > 0) || attention_factor < 0))
      shardwise::raise("shardwise::models::RopeScaling: yarn scaling with beta_fast ", beta_fast, ", beta_slow ",
                       beta_slow, " and attention_factor ", attention_factor,
                       "; the betas must be positive and the attention factor not negative");
  }

  /// The scaling's type and the parameters that change its frequencies, as text (saved beside the weights and
  /// compared on load: a checkpoint is not loaded into a model scaled otherwise).
  [[nodiscard]] std::map<std::string, std::string> fields() const;

  /// The scaling whose fields() are among `fields` (a checkpoint's recorded configuration): plain when they
  /// name none. Throws, naming the field, for a type or a number it cannot read.
  static RopeScaling from_fields(std::map<std::string, std::string> const& fields) {
    RopeScaling r;
    auto const type = fields.find("rope_type");
    if (type == fields.end()) return r;
    r.type = rope_type_named(type->second);
    if (r.type == rope_type::unsupported)
      shardwise::raise("shardwise::models::RopeScaling: the recorded rope_type \"", type->second,
                       "\" is not one shardwise computes (linear, llama3, yarn, dynamic)");
    if (!r.scaled()) return r;
    auto const number = [&](char const* field, double fallback) {
      auto const found = fields.find(field);
      if (found == fields.end()) return fallback;
      std::string const& text = found->second;  // config_number's digits: read without the C locale's say
      double value = 0;
      auto const [end, failed] = std::from_chars(text.data(), text.data() + text.size(), value);
      if (text.empty() || failed != std::errc() || end != text.data() + text.size() || !std::isfinite(value))
        shardwise::raise("shardwise::models::RopeScaling: the recorded ", field, " \"", text, "\" is not a number");
      return value;
    };
    r.factor = number("rope_factor", r.factor);
    double const original = number("rope_original_max_positions", 0);
    if (original < 0 || original > 1e15)
      shardwise::raise("shardwise::models::RopeScaling: the recorded rope_original_max_positions ", original,
                       " is not a context length");
    r.original_max_positions = static_cast<std::size_t>(original);
    r.low_freq_factor = number("rope_low_freq_factor", r.low_freq_factor);
    r.high_freq_factor = number("rope_high_freq_factor", r.high_freq_factor);
    r.beta_fast = number("rope_beta_fast", r.beta_fast), r.beta_slow = number("rope_beta_slow", r.beta_slow);
    r.attention_factor = number("rope_attention_factor", 0);
    if (auto t = fields.find("rope_truncate"); t != fields.end()) r.truncate = t->second == "true";
    r.check();
    return r;
  }

  /// What cos and sin are multiplied by: yarn's attention factor (given, or 0.1 ln(factor) + 1, or the ratio of
  /// the two mscales' values), 1 for the other scalings.
  [[nodiscard]] double rope_attention_factor() const {
    if (type != rope_type::yarn) return 1;
    if (attention_factor > 0) return attention_factor;
    auto const yarn_mscale = [&](double weight) { return factor <= 1 ? 1.0 : 0.1 * weight * std::log(factor) + 1; };
    if (mscale != 0 && mscale_all_dim != 0) return yarn_mscale(mscale) / yarn_mscale(mscale_all_dim);
    return yarn_mscale(1);
  }

  /// The inverse frequency of each of a head's head_dim / 2 column pairs: theta^(-2i / head_dim), changed by the
  /// scaling as transformers' rope init functions change it.
  [[nodiscard]] std::vector<double> inverse_frequencies(std::size_t head_dim, double theta) const {
    std::size_t const pairs = head_dim / 2;
    std::vector<double> inverse(pairs);
    for (std::size_t i = 0; i < pairs; ++i) inverse[i] = 1.0 / std::pow(theta, double(2 * i) / double(head_dim));
    if (type == rope_type::linear)
      for (double& f : inverse) f /= factor;
    if (type == rope_type::llama3) llama3(inverse);
    if (type == rope_type::yarn) yarn(inverse, head_dim, theta);
    return inverse;
  }

  /// Whether a sequence of `length` tokens rotates with frequencies of its own (dynamic, beyond
  /// original_max_positions).
  [[nodiscard]] constexpr bool rescales(std::size_t length) const {
    return type == rope_type::dynamic && length > original_max_positions;
  }
  /// The inverse frequencies a sequence of `length` tokens rotates with: inverse_frequencies, or for dynamic
  /// (NTK) beyond original_max_positions, theta raised to theta * (factor * length / original - (factor - 1))^(d /
  /// (d - 2)), as transformers' _compute_dynamic_ntk_parameters raises it for the length of the call.
  [[nodiscard]] std::vector<double> inverse_frequencies(std::size_t head_dim, double theta, std::size_t length) const {
    if (!rescales(length) || head_dim <= 2) return inverse_frequencies(head_dim, theta);
    double const d = double(head_dim), ratio = factor * double(length) / double(original_max_positions);
    return RopeScaling{}.inverse_frequencies(head_dim, theta * std::pow(ratio - (factor - 1), d / (d - 2)));
  }

 private:
  /// Llama 3.1's rule: long wavelengths (low frequencies) divided by factor, short ones kept, a linear blend of
  /// the two in between, by how many times the wavelength fits in the original context.
  void llama3(std::vector<double>& inverse) const {
    double const original = double(original_max_positions);
    double const longest_kept = original / high_freq_factor, shortest_divided = original / low_freq_factor;
    for (double& f : inverse) {
      double const wavelength = 2 * std::numbers::pi / f;
      if (wavelength > shortest_divided) {
        f /= factor;
      } else if (!(wavelength < longest_kept)) {
        double const smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  }

  /// YaRN: pairs that turn fewer than beta_slow times over the original context interpolated (divided by
  /// factor), those that turn more than beta_fast times kept, a linear ramp over the pairs between.
  void yarn(std::vector<double>& inverse, std::size_t head_dim, double theta) const {
    double const dim = double(head_dim), original = double(original_max_positions);
    auto const pair_turning = [&](double rotations) {
      return dim * std::log(original / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
    };
    double low = pair_turning(beta_fast), high = pair_turning(beta_slow);
    if (truncate) low = std::floor(low), high = std::ceil(high);
    low = std::max(low, 0.0), high = std::min(high, dim - 1);
    if (low == high) high += 0.001;  // as transformers does: no division by zero
    for (std::size_t i = 0; i < inverse.size(); ++i) {
      double const ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      double const kept = 1 - ramp;  // the extrapolated (unchanged) frequency's weight
      inverse[i] = inverse[i] / factor * (1 - kept) + inverse[i] * kept;
    }
  }
};

// Compiled once with checkpoint IO where shardwise::separate_checkpoint is linked (checkpoint/compiled_once.hpp).
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::map<std::string, std::string> RopeScaling::fields() const {
  if (!scaled()) return {{"rope_type", rope_type_name(type)}};
  std::map<std::string, std::string> f{{"rope_type", rope_type_name(type)}, {"rope_factor", config_number(factor)}};
  if (type == rope_type::llama3 || type == rope_type::yarn || type == rope_type::dynamic)
    f["rope_original_max_positions"] = std::to_string(original_max_positions);
  if (type == rope_type::llama3) {
    f["rope_low_freq_factor"] = config_number(low_freq_factor);
    f["rope_high_freq_factor"] = config_number(high_freq_factor);
  }
  if (type == rope_type::yarn) {
    f["rope_beta_fast"] = config_number(beta_fast), f["rope_beta_slow"] = config_number(beta_slow);
    f["rope_attention_factor"] = config_number(rope_attention_factor());
    f["rope_truncate"] = truncate ? "true" : "false";
  }
  return f;
}
#endif

}  // namespace shardwise::models
