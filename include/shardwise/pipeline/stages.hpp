#pragma once
// Which blocks of a model's repeated stack each pipeline stage holds: contiguous ranges, an even split by
// default or explicit cuts; and a batch cut into equal microbatches. The first stage also holds what comes before the
// stack (the embedding), the last what comes after (final norm, output, loss); the model decides that, this only counts
// blocks.
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"

namespace shardwise {

/// Which pass of a microbatch a pipeline hook runs around (hooks::pipeline_carry).
enum class pipeline_pass {
  forward,   ///< after the chunk's forward
  backward,  ///< before the chunk's backward
};

/// The blocks [first, first + count) of the stack that one stage holds.
struct stage_range {
  std::size_t first = 0;  ///< The model's index of the stage's first block.
  std::size_t count = 0;  ///< How many blocks the stage holds.
};

/// How a stack of `layers` blocks is cut into pipeline stages.
class stage_split {
 public:
  /// An even split of `layers` blocks over `stages` stages; throws, naming the counts and the fix, when the
  /// blocks do not divide over the stages or there are more stages than blocks.
  stage_split(std::size_t layers, int stages) : layers_(layers) {
    if (stages < 1) detail::fail("shardwise::stage_split: ", stages, " stages; give at least one");
    auto const n = static_cast<std::size_t>(stages);
    if (n > layers)
      detail::fail("shardwise::stage_split: ", stages, " stages for ", layers,
                   " layers: every stage needs a layer; use at most ", layers, " stages");
    if (layers % n != 0)
      detail::fail("shardwise::stage_split: ", layers, " layers do not divide over ", stages,
                   " stages; choose a stage count that divides them, or give explicit cuts");
    for (std::size_t s = 1; s < n; ++s) cuts_.push_back(s * layers / n);
  }

  /// Explicit cuts: stage s holds blocks [cuts[s - 1], cuts[s]), stage 0 from block 0, the last to `layers`;
  /// so `cuts` has one entry fewer than the stages. Throws unless the cuts rise strictly inside (0, layers).
  stage_split(std::size_t layers, std::vector<std::size_t> cuts) : layers_(layers), cuts_(std::move(cuts)) {
    std::size_t previous = 0;
    for (std::size_t i = 0; i < cuts_.size(); ++i) {
      if (cuts_[i] <= previous || cuts_[i] >= layers)
        detail::fail("shardwise::stage_split: cut ", i, " at layer ", cuts_[i], " leaves a stage without layers (",
                     layers, " layers); give cuts that rise strictly between 0 and the layer count");
      previous = cuts_[i];
    }
  }

  /// The number of stages.
  [[nodiscard]] int stages() const { return static_cast<int>(cuts_.size()) + 1; }
  /// The number of blocks of the whole stack.
  [[nodiscard]] std::size_t layers() const { return layers_; }
  /// The blocks stage `stage` holds; throws for a stage outside [0, stages()).
  [[nodiscard]] stage_range of(int stage) const {
    if (stage < 0 || stage >= stages())
      detail::fail("shardwise::stage_split: stage ", stage, " of ", stages(), " stages does not exist");
    auto const s = static_cast<std::size_t>(stage);
    std::size_t const first = s == 0 ? 0 : cuts_[s - 1];
    std::size_t const end = s == cuts_.size() ? layers_ : cuts_[s];
    return {first, end - first};
  }

 private:
  std::size_t layers_;
  std::vector<std::size_t> cuts_;
};

namespace detail {
template <std::size_t Layers, std::size_t Stages>
struct layers_do_not_divide_over_stages;  // incomplete on purpose: the compile error spells the counts
}

/// The even split of a stack whose layer and stage counts are known at compile time: counts that do not
/// divide are a compile error naming them.
template <std::size_t Layers, std::size_t Stages>
stage_split even_stage_split() {
  if constexpr (Stages < 1 || Stages > Layers || Layers % Stages != 0) {
    using shown [[maybe_unused]] =
        decltype(detail::show_incomplete<detail::layers_do_not_divide_over_stages<Layers, Stages>>());
  }
  static_assert(Stages >= 1 && Stages <= Layers,
                "shardwise::even_stage_split: more stages than layers (see the counts in the template arguments); "
                "use at most as many stages as layers");
  static_assert(Layers % Stages == 0,
                "shardwise::even_stage_split: the layers do not divide over the stages (see the counts in the "
                "template arguments); choose a stage count that divides them, or give stage_split explicit cuts");
  return {Layers, static_cast<int>(Stages)};
}

/// A batch of `rows` rows of `row_length` elements each (sequences of tokens) cut into `microbatches` equal
/// microbatches: microbatch m is rows [m * rows / microbatches, (m + 1) * rows / microbatches). Throws, naming the
/// counts, when the batch is not whole rows or the rows do not divide: uneven microbatches would weigh their
/// tokens unequally in a step's mean loss.
template <class T>
std::vector<std::span<T const>> split_microbatches(std::span<T const> batch, std::size_t row_length, int microbatches) {
  if (microbatches < 1 || row_length == 0)
    detail::fail("shardwise::split_microbatches: ", microbatches, " microbatches of rows of ", row_length,
                 " elements; give at least one microbatch of non-empty rows");
  auto const n = static_cast<std::size_t>(microbatches);
  if (batch.size() % row_length != 0 || (batch.size() / row_length) % n != 0)
    detail::fail("shardwise::split_microbatches: a batch of ", batch.size(), " elements (", batch.size() / row_length,
                 " rows of ", row_length, ") does not divide into ", microbatches,
                 " microbatches of whole rows; give a batch whose rows the microbatch count divides");
  std::size_t const each = batch.size() / n;
  std::vector<std::span<T const>> parts;
  for (std::size_t m = 0; m < n; ++m) parts.push_back(batch.subspan(m * each, each));
  return parts;
}

namespace detail {
template <std::size_t Rows, std::size_t Microbatches>
struct rows_do_not_divide_into_microbatches;  // incomplete on purpose: the compile error spells the counts
}

/// The rows of each microbatch of a batch of Rows rows in Microbatches microbatches, when both are known at
/// compile time: counts that do not divide are a compile error naming them.
template <std::size_t Rows, std::size_t Microbatches>
constexpr std::size_t microbatch_rows() {
  if constexpr (Microbatches == 0 || Rows % Microbatches != 0) {
    using shown [[maybe_unused]] =
        decltype(detail::show_incomplete<detail::rows_do_not_divide_into_microbatches<Rows, Microbatches>>());
  }
  static_assert(Microbatches != 0 && Rows % Microbatches == 0,
                "shardwise::microbatch_rows: the batch's rows do not divide into the microbatches (see the counts in "
                "the template arguments); choose a microbatch count that divides the batch");
  return Microbatches == 0 ? 0 : Rows / Microbatches;
}

}  // namespace shardwise
