#pragma once
// A Linear's state and code under one style, for one element type: what every Linear of every path and plan
// with that style shares. Its members that do the work are defined after the class, out of it, so that a
// program built with SHARDWISE_SEPARATE_KERNELS takes them for the library's own styles from
// shardwise::separate_kernels instead of compiling them in every file (nn/layers/linear.hpp declares which).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/nn/layers/linear_precision.hpp"
#include "shardwise/nn/layers/linear_style.hpp"
#include "shardwise/nn/layers/lora.hpp"
#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/nn/redistribute.hpp"
#include "shardwise/nn/shapes.hpp"
#include "shardwise/nn/training/deferred_weight_gradients.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::detail {

/// A Linear's state and code under style Rule (a sw::linear_style): what the typed Linear derives from.
template <class T, class Rule>
class linear_core : public layer_plumbing<T> {
  using plumbing = layer_plumbing<T>;
  using plumbing::frozen_;
  using plumbing::group_;
  using plumbing::lazy_;
  using plumbing::path_;
  using layouts = linear_layouts<Rule>;
  using mover = typename Rule::mover;
  static_assert(activation_mover<mover, T>,
                "shardwise::Linear: the style's mover must have move<From, To, T>(group, x) and "
                "add_cost<From, To>(list, rows, cols, element, inputs), as sw::layout_engine has");
  static constexpr bool serial = std::is_same_v<Rule, unsharded_linear>;

 protected:
  static constexpr bool cut_rows = layouts::cut_rows, cut_cols = layouts::cut_cols;

 public:
  SHARDWISE_SAVED(saved_input_)
  using input_layout = typename layouts::in;    ///< The layout its input must have on the tp axis.
  using output_layout = typename layouts::out;  ///< The layout of its output.
  using matrix = nn::matrix<T>;                 ///< Row-major matrix of T.
  using vector = nn::vector<T>;                 ///< Column vector of T.

  /// Parameters drawn like torch.nn.Linear's (uniform, bound 1/sqrt(in)) from `seed`; `path`: the layer's plan
  /// path, kept for messages (a string of static storage).
  linear_core(std::string_view path, std::size_t in, std::size_t out, init seed, bool with_bias);

  /// @{ Copies, moves and destruction, compiled with the core's other code (once, in shardwise::separate_kernels)
  /// rather than in every file that builds a model: a model's blocks copy and move their layers through them.
  linear_core(linear_core const&);
  linear_core(linear_core&&) noexcept;
  linear_core& operator=(linear_core const&);
  linear_core& operator=(linear_core&&) noexcept;
  ~linear_core();
  /// @}

  /// @{ This rank's parameters (the whole of them before parallelize) and their gradients.
  matrix weight, weight_grad;
  vector bias, bias_grad;
  /// @}

  /// Input features (unsharded).
  [[nodiscard]] std::size_t in_features() const { return in_; }
  /// Output features (unsharded, padding included).
  [[nodiscard]] std::size_t out_features() const { return out_; }
  /// The output features before pad_outputs (a padded vocabulary's real size); checkpoints store only these.
  [[nodiscard]] std::size_t unpadded_out_features() const { return unpadded_out_ ? unpadded_out_ : out_; }
  /// Whether it adds a bias.
  [[nodiscard]] bool has_bias() const { return has_bias_; }

  /// Pads the output features with zero rows up to `out` (before parallelize): a padded vocabulary's logits,
  /// which the loss then leaves out.
  void pad_outputs(std::size_t out);

  /// Pads the output features at parallelize, with zero rows, up to a multiple of the tp size (a vocabulary
  /// the tp size does not divide, under ColwiseParallel): the logits of the padding are left out by the loss
  /// when it is given the real vocabulary as `classes`. Checkpoints store the real rows only.
  linear_core& pad_outputs_for_tp() {
    pad_for_tp_ = true;
    return *this;
  }

  /// Repeats every block of `block` output rows `copies` times in a row (before parallelize): key-value heads
  /// replicated so that each of more tp ranks than heads holds the head its query heads use (optimum-neuron's
  /// kv_size_multiplier). The copies' gradients are summed over the group by sw::finish_gradients.
  void replicate_output_blocks(std::size_t block, std::size_t copies);

  /// Sets the gradients to zero (a tied weight's are its owner's).
  void zero_grad();

  /// Keeps this rank's shard of the parameters and the group to talk to.
  template <class Mesh>
  void shardwise_parallelize(Mesh const& mesh) {
    group_ = nn::make_group<T>(mesh);
    keep_shard();
  }

  /// A lazily constructed layer allocates this rank's shard (zeros, to be filled from a checkpoint).
  void shardwise_materialize();

  /// The input gradient's layout: the input's, but for a weight cut by output rows (ColwiseParallel) on a
  /// replicated input, where each rank's gradient is a partial sum over its output features: Partial<Sum>,
  /// reduced once where it meets a layout (the next layer back, a module boundary, sw::redistribute) — one
  /// reduction for wq, wk and wv together.
  using input_grad_layout = typename layouts::input_grad;

  /// Backward: accumulates the parameter gradients and returns the input gradient (input_grad_layout). The
  /// gradient given is in the output's layout or Partial<Sum> (reduced here first).
  template <class P>
  Activation<T, input_grad_layout> backward(Activation<T, P> const& dy_given) {
    require_group();
    return backward_from(gradient_in<output_layout>(group_.get(), dy_given, "Linear", path_));
  }

  /// The layer's cost (sw::cost) on one rank for an input of s.tokens rows: its shard of the weight (and bias)
  /// with their gradients, and the transfers of its forward and backward, as its style's mover states them for
  /// the moves the layer makes (the same moves as above). `in` and `out`: the unsharded features (out padded,
  /// where the vocabulary is).
  static constexpr cost shardwise_cost(std::size_t in, std::size_t out, cost_inputs const& s, bool with_bias = false) {
    cost c;
    c.parameter_bytes = c.gradient_bytes = parameter_bytes(in, out, s, with_bias);
    c.activation_bytes = s.tokens * shard_extent(in, cut_cols, serial ? 1 : s.tp) * sizeof(T);  // the product's input
    add_forward_cost(c.forward, in, out, s);
    add_backward_cost(c.backward, in, out, s);
    return c;
  }
  /// @{ The parts of shardwise_cost: the bytes of this rank's parameters, the transfers of a forward and of a
  /// backward (appended to `list`).
  static constexpr std::size_t parameter_bytes(std::size_t in, std::size_t out, cost_inputs const& s, bool with_bias) {
    std::size_t const n = serial ? 1 : s.tp;
    std::size_t const local_in = shard_extent(in, cut_cols, n), local_out = shard_extent(out, cut_rows, n);
    return (local_in * local_out + (with_bias ? local_out : 0)) * sizeof(T);
  }
  static constexpr void add_forward_cost(transfer_list<>& list, std::size_t in, std::size_t out, cost_inputs const& s) {
    mover::template add_cost<input_layout, typename layouts::product_in>(list, s.tokens, in, sizeof(T), s);
    mover::template add_cost<typename layouts::product_out, output_layout>(list, s.tokens, out, sizeof(T), s);
  }
  static constexpr void add_backward_cost(transfer_list<>& list, std::size_t in, std::size_t out,
                                          cost_inputs const& s) {
    mover::template add_cost<output_layout, typename layouts::product_out_grad>(list, s.tokens, out, sizeof(T), s);
    if constexpr (!layouts::input_grad_left_partial)
      mover::template add_cost<typename layouts::product_in_grad, input_layout>(list, s.tokens, in, sizeof(T), s);
  }
  /// @}

  /// This rank's parameters as the costs that walk a model's parameters see them (sw::parameter_cost), for a
  /// Linear of `shape` on s.tp ranks: the weight, then the bias if it has one (cut as shardwise_cost cuts them).
  template <class Fn>
  static constexpr void shardwise_parameter_costs(linear_shape const& shape, cost_inputs const& s, Fn&& fn) {
    std::size_t const n = serial ? 1 : s.tp, out = shape.out * shape.copies;
    std::size_t const rows = cut_rows ? (out + n - 1) / n : out, cols = cut_cols ? shape.in / n : shape.in;
    bool const repeated = shape.copies > 1;  // the copies' gradients are summed by an all-reduce of the whole
    fn(parameter_cost{rows * cols, sizeof(T), is_partial_v<typename layouts::weight>,
                      repeated ? shape.out * shape.in : 0, rows, is_shard_v<typename layouts::weight>});
    if (shape.bias)
      fn(parameter_cost{rows, sizeof(T), is_partial_v<typename layouts::bias>, repeated ? shape.out : 0, rows,
                        is_shard_v<typename layouts::bias>});
  }

  /// How the weight (and its gradient) is cut over tp: Shard<0> (Colwise), Shard<1> (Rowwise) or Replicate.
  using weight_grad_placement = typename layouts::weight;
  /// How the bias is cut over tp.
  using bias_grad_placement = typename layouts::bias;

  /// The parameters with their gradients. A bias-free layer's bias and a tied weight (its owner's) are there
  /// but not present: walks over the model's parameters pass them by.
  auto parameters() {
    Parameter<matrix, weight_grad_placement> w{&weight, &weight_grad, group_.get(), path_, copies_, copy_block_};
    w.real_rows = unpadded_out_, w.present = !tied(), w.copies_summed = copies_ > 1 ? &copies_summed_ : nullptr;
    w.mirror_of = mirror_of_, w.frozen = &frozen_[0];
    Parameter<vector, bias_grad_placement> b{&bias, &bias_grad, group_.get(), path_, copies_, copy_block_};
    b.real_rows = unpadded_out_, b.leaf = "bias", b.present = has_bias_, b.frozen = &frozen_[1];
    b.copies_summed = w.copies_summed;
    w.placed_over = b.placed_over = this->shardwise_placed_over();
    return std::make_tuple(w, b, adapter_parameter<lora_a_placement>(true), adapter_parameter<lora_b_placement>(false));
  }

  /// How a LoRA adapter's A [rank, in] is cut over tp: as the weight's columns, so its gradient is Partial<Sum>
  /// where the weight is cut by rows (each rank's sum over its output rows) and Shard<1> where by columns.
  using lora_a_placement =
      std::conditional_t<cut_rows, Partial<Sum>, std::conditional_t<cut_cols, Shard<1>, Replicate>>;
  /// How B [out, rank] is cut: as the weight's rows; Partial<Sum> where the weight is cut by columns.
  using lora_b_placement =
      std::conditional_t<cut_cols, Partial<Sum>, std::conditional_t<cut_rows, Shard<0>, Replicate>>;

  /// Adds a LoRA adapter (sw::add_lora): A drawn as peft draws it (uniform, bound 1/sqrt(in)) from `seed` over the
  /// whole [rank, in] and cut as the weight's columns are; B zeros. Before or after parallelize.
  void shardwise_add_lora(std::size_t rank, T scale, std::uint64_t seed);
  /// Why the layer cannot take an adapter now (tied, lazy, adapted already, or under fully_shard).
  [[nodiscard]] char const* adapter_refusal() const;
  /// The adapter's rank and scale; {0, 0} without one.
  [[nodiscard]] std::pair<std::size_t, T> lora_shape() const {
    return lora_ ? std::pair{lora_->rank, lora_->scale} : std::pair{std::size_t{0}, T(0)};
  }
  /// Adds scale * B A into this rank's piece of the weight and removes the adapter (no communication).
  void shardwise_merge_lora();

  /// Makes the weight a pipeline stage's copy of the weight named `owner` on another stage (see
  /// Parameter::mirror_of); `owner` must outlive the layer (a string literal).
  void mirror_weight_of(std::string_view owner) { mirror_of_ = owner; }

  /// Whether the weight is another layer's (sw::tie_weights).
  [[nodiscard]] bool tied() const { return tie_.tied; }
  /// The plan path of the layer that owns a tied weight.
  [[nodiscard]] std::string_view tied_to() const { return tie_.owner_path; }

  /// The weight this layer computes with: its own, or the one it is tied to.
  [[nodiscard]] matrix const& current_weight() const { return tied() ? tie_.value(this) : weight; }
  /// The gradient it accumulates into: its own, or its owner's.
  [[nodiscard]] matrix& current_weight_grad() { return tied() ? tie_.grad(this) : weight_grad; }

  /// @{ Used by sw::bf16_weights and sw::bf16_autocast: forward multiplies with a bf16 copy of the weight, or forward
  /// and backward multiply in bf16, until the precision is reset to T's.
  void shardwise_hold_bf16_weight() {
    precision_.hold_bf16_weight(current_weight(), static_cast<Eigen::Index>(local_out_),
                                static_cast<Eigen::Index>(local_in_), path_);
  }
  void shardwise_autocast_bf16(bf16_scratch& scratch) {
    matrix const& w = current_weight();
    bool const resident =
        !lazy_ && w.rows() == static_cast<Eigen::Index>(local_out_) && w.cols() == static_cast<Eigen::Index>(local_in_);
    precision_.autocast(path_, resident, scratch);
  }
  void shardwise_reset_precision() { precision_.reset(); }
  /// @}
  /// The bytes of the bf16 copy (0 without one).
  [[nodiscard]] std::size_t bf16_weight_bytes() const { return precision_.bytes(); }

  /// Used by sw::tie_weights: the weight is the matrices `value` and `grad` of a layer in the same model.
  void shardwise_tie(matrix& value, matrix& grad, std::string_view owner_path);

 protected:
  /// Forward on the input's local values (the typed Linear has checked its type and layout).
  Activation<T, output_layout> forward_given(matrix const& given);
  /// Forward on an input the caller gives up: kept without a copy where the layer keeps its input as given.
  Activation<T, output_layout> forward_taken(matrix& given);

 private:
  // Where forward keeps its input as given (not gathered over the sequence, not cut to this rank's columns).
  static constexpr bool keeps_input_as_given = same_layout_v<input_layout, typename layouts::product_in>;

  /// `x` moved from layout From to layout To by the style's mover.
  template <class From, class To, class M>
  matrix moved(M&& x) const {
    return mover::template move<From, To, T>(*group_, std::forward<M>(x));
  }

  void keep_shard();  // parallelize, once the group is known
  Activation<T, input_grad_layout> backward_from(matrix const& dy_whole);
  void weight_gradient(matrix const& x, matrix const& dy, bool dy_rounded = false);
  void check_width(Eigen::Index given_width) const;
  void keep_input(matrix const& given);
  Activation<T, output_layout> forward_kept_input();
  void require_group() const { this->require_ready(!serial); }
  void unsum_copies();
  void keep_adapter_shard();
  /// A's (is_a) or B's parameter: not present without an adapter.
  template <class G>
  Parameter<matrix, G> adapter_parameter(bool is_a);

  std::size_t in_, out_;
  bool has_bias_;
  bool copies_summed_ = false;  // see unsum_copies
  bool pad_for_tp_ = false;     // see pad_outputs_for_tp
  weight_tie<matrix> tie_;
  std::string_view mirror_of_;               // a copy of another stage's weight (mirror_weight_of)
  std::size_t copies_ = 1, copy_block_ = 0;  // see replicate_output_blocks
  std::size_t unpadded_out_ = 0;             // out_ before pad_outputs (0: never padded)
  std::size_t local_in_, local_out_;         // this rank's shard of the weight
  matrix saved_input_;
  std::optional<lora_adapter<T>> lora_;  // sw::add_lora
  linear_precision<T> precision_;        // sw::bf16_weights, sw::bf16_autocast
};

// Defaulted here, not in the class: an explicit instantiation declaration (SHARDWISE_SEPARATE_KERNELS) then
// keeps them out of the files that use the core.
template <class T, class Rule>
linear_core<T, Rule>::linear_core(linear_core const&) = default;
template <class T, class Rule>
linear_core<T, Rule>::linear_core(linear_core&&) noexcept = default;
template <class T, class Rule>
linear_core<T, Rule>& linear_core<T, Rule>::operator=(linear_core const&) = default;
template <class T, class Rule>
linear_core<T, Rule>& linear_core<T, Rule>::operator=(linear_core&&) noexcept = default;
template <class T, class Rule>
linear_core<T, Rule>::~linear_core() = default;

template <class T, class Rule>
linear_core<T, Rule>::linear_core(std::string_view path, std::size_t in, std::size_t out, init seed, bool with_bias)
    : plumbing("Linear", path, seed.declares_only()),
      in_(in),
      out_(out),
      has_bias_(with_bias),
      local_in_(in),
      local_out_(out) {
  if (lazy_) return;  // sizes only: sw::materialize allocates this rank's shard
  T const bound = T(1) / std::sqrt(static_cast<T>(in));
  weight.resize(static_cast<Eigen::Index>(out), static_cast<Eigen::Index>(in));
  fill_uniform(weight, bound, seed.seed());
  if (has_bias_) {
    bias.resize(static_cast<Eigen::Index>(out));
    fill_uniform(bias, bound, seed.seed() ^ 0x9e3779b97f4a7c15ull);
  }
  zero_grad();
}

template <class T, class Rule>
void linear_core<T, Rule>::zero_grad() {
  // A tied layer's own weight is empty (its owner's is zeroed); a frozen one keeps no gradient.
  weight_grad.setZero(frozen_[0] ? 0 : weight.rows(), frozen_[0] ? 0 : weight.cols());
  bias_grad.setZero(bias.size());
  if (lora_) lora_->zero_grad();
  copies_summed_ = false;
}

template <class T, class Rule>
void linear_core<T, Rule>::keep_shard() {
  if constexpr (!cut_rows && !cut_cols) return;
  int const n = group_->size(), r = group_->rank();
  if constexpr (cut_rows) {
    if (pad_for_tp_) pad_outputs(padded_to_multiple(out_, static_cast<std::size_t>(n)));
    require_divisible(style_name<Rule>, path_, "output features", out_, n, group_->axis(),
                      ", or pad them with pad_outputs_for_tp()");
    auto const rows = static_cast<Eigen::Index>(shard_extent(out_, true, static_cast<std::size_t>(n)));
    local_out_ = static_cast<std::size_t>(rows);
    keep_adapter_shard();
    if (lazy_) return;
    if (!tied()) weight = matrix(weight.middleRows(r * rows, rows));  // a tied weight is cut by its owner
    if (has_bias_) bias = vector(bias.segment(r * rows, rows));
  } else {
    require_divisible(style_name<Rule>, path_, "input features", in_, n, group_->axis());
    auto const cols = static_cast<Eigen::Index>(shard_extent(in_, true, static_cast<std::size_t>(n)));
    local_in_ = static_cast<std::size_t>(cols);
    keep_adapter_shard();
    if (lazy_) return;
    if (!tied()) weight = matrix(weight.middleCols(r * cols, cols));
  }
  zero_grad();
}

template <class T, class Rule>
void linear_core<T, Rule>::shardwise_materialize() {
  if (!lazy_) return;
  if (!tied()) weight.setZero(static_cast<Eigen::Index>(local_out_), static_cast<Eigen::Index>(local_in_));
  if (has_bias_) bias.setZero(static_cast<Eigen::Index>(local_out_));
  lazy_ = false;  // gradients come on first use (backward, zero_grad, an optimizer): a load holds no more
}

template <class T, class Rule>
auto linear_core<T, Rule>::backward_from(matrix const& dy_whole) -> Activation<T, input_grad_layout> {
  precision_.refuse_backward(path_);
  matrix const& w = current_weight();
  matrix const* dy = &dy_whole;
  matrix dy_part;
  if constexpr (!same_layout_v<output_layout, typename layouts::product_out_grad>) {
    dy_part = moved<output_layout, typename layouts::product_out_grad>(*dy);  // the output move's conjugate
    dy = &dy_part;
  }
  if (dy->rows() != saved_input_.rows() || dy->cols() != w.rows())
    fail("shardwise::Linear at \"", path_, "\": backward got a gradient of ", dy->rows(), "x", dy->cols(),
         " on this rank after a forward of ", saved_input_.rows(), "x", w.rows(),
         "; pass the gradient of this layer's last output");
  matrix dx(dy->rows(), w.cols());
  if (!precision_.backward_input(w, *dy, dx)) nn::linear_backward_input<T>(w, *dy, dx);
  if (lora_) {
    if (copies_summed_) unsum_copies();  // B's gradient too accumulates onto summed copies
    lora_->backward(saved_input_, *dy, dx);
  }
  if (frozen_[0] && (!has_bias_ || frozen_[1])) {  // frozen (sw::freeze): no weight-gradient work at all
    saved_input_ = matrix();
  } else if (auto* later = this->shardwise_weight_work()) {  // a pipeline's B: W runs this later, on what it keeps
    matrix kept_dy = dy == &dy_part ? std::move(dy_part) : matrix(dy_whole);  // the caller's dy: a copy
    later->defer([this, x = std::move(saved_input_), kept_dy = std::move(kept_dy)] { weight_gradient(x, kept_dy); });
    saved_input_ = matrix();
  } else {
    weight_gradient(saved_input_, *dy, true);
  }
  if constexpr (!layouts::input_grad_left_partial && !same_layout_v<typename layouts::product_in_grad, input_layout>)
    dx = moved<typename layouts::product_in_grad, input_layout>(dx);  // the input move's conjugate
  return {std::move(dx)};
}

template <class T, class Rule>
void linear_core<T, Rule>::weight_gradient(matrix const& x, matrix const& dy, bool dy_rounded) {
  matrix const& w = current_weight();
  matrix& wg = current_weight_grad();
  bool const bias_trained = has_bias_ && !frozen_[1];
  if (bias_grad.size() != bias.size()) bias_grad.setZero(bias.size());
  if (frozen_[0]) {  // sw::freeze: the bias alone (the product with the input is skipped)
    if (bias_trained) bias_grad.noalias() += dy.colwise().sum().transpose();
    return;
  }
  if (wg.size() != w.size()) wg.setZero(w.rows(), w.cols());  // a materialized layer's first backward
  if (copies_summed_) unsum_copies();  // accumulating onto summed copies: back to one sum, not `copies` of it
  if (!precision_.backward_weight(x, dy, wg, dy_rounded))
    return nn::linear_backward_weight<T>(x, dy, wg,
                                         bias_trained ? std::optional<nn::vector_ref<T>>(bias_grad) : std::nullopt);
  if (bias_trained) bias_grad.noalias() += dy.colwise().sum().transpose();
}

template <class T, class Rule>
void linear_core<T, Rule>::shardwise_tie(matrix& value, matrix& grad, std::string_view owner_path) {
  if (group_ || copies_ > 1 || unpadded_out_ != 0)
    fail("shardwise::tie_weights: the Linear at \"", path_,
         "\" is already parallelized, padded or repeated; tie weights in the model's constructor");
  tie_.bind(this, value, grad, owner_path);
  weight = matrix();  // one tensor: this layer's own is gone
  weight_grad = matrix();
}

template <class T, class Rule>
auto linear_core<T, Rule>::forward_given(matrix const& given) -> Activation<T, output_layout> {
  check_width(given.cols());
  keep_input(given);
  return forward_kept_input();
}

template <class T, class Rule>
auto linear_core<T, Rule>::forward_taken(matrix& given) -> Activation<T, output_layout> {
  check_width(given.cols());
  if constexpr (keeps_input_as_given) {
    saved_input_ = std::move(given);
    given.resize(0, 0);  // Eigen's move swaps: what it got back is the last step's input, not the caller's
  } else {
    keep_input(given);
  }
  return forward_kept_input();
}

// The input's width, checked in Release builds too: a wrong one would read past the input in the sliced cases,
// or give wrong numbers.
template <class T, class Rule>
void linear_core<T, Rule>::check_width(Eigen::Index given_width) const {
  require_group();
  constexpr bool local_input = std::is_same_v<input_layout, Shard<1>>;
  std::size_t const ranks = group_ ? static_cast<std::size_t>(group_->size()) : 1;  // no group: unsharded
  std::size_t const rank = group_ ? static_cast<std::size_t>(group_->rank()) : 0;
  auto const width = static_cast<Eigen::Index>(shard_extent(in_, local_input, ranks, rank));
  if (given_width != width)
    fail("shardwise::Linear at \"", path_, "\": the input has ", given_width,
         " features on this rank but the layer takes ", width, local_input ? " (its shard of " : " (of ", in_,
         "); give it [tokens, features] inputs of that width");
}

// Keeps what the product reads, which backward needs too: the input as given, or moved (the whole sequence
// gathered, this rank's columns taken).
template <class T, class Rule>
void linear_core<T, Rule>::keep_input(matrix const& given) {
  if constexpr (keeps_input_as_given)
    saved_input_ = given;
  else
    saved_input_ = moved<input_layout, typename layouts::product_in>(given);
}

// The product with the kept input, then the style's communication.
template <class T, class Rule>
auto linear_core<T, Rule>::forward_kept_input() -> Activation<T, output_layout> {
  matrix const& w = current_weight();
  matrix y(saved_input_.rows(), w.rows());
  // The bias goes in with the product, except where the product is a partial sum: there after it, once.
  bool const bias_now = has_bias_ && !layouts::bias_after_output;
  auto const bias_in = bias_now ? std::optional<nn::const_vector_ref<T>>(bias) : std::nullopt;
  if (!precision_.forward(saved_input_, w, bias_in, y)) nn::linear_forward<T>(saved_input_, w, bias_in, y);
  if (lora_) lora_->add_to(saved_input_, y);  // a part of the product: moved with it
  if constexpr (!same_layout_v<typename layouts::product_out, output_layout>)
    y = moved<typename layouts::product_out, output_layout>(std::move(y));
  if (has_bias_ && layouts::bias_after_output) y.rowwise() += bias.transpose();
  return {std::move(y)};
}

}  // namespace shardwise::detail

#include "shardwise/nn/layers/linear_adapter.hpp"  // a Linear's LoRA adapter members
#include "shardwise/nn/layers/linear_meta.hpp"     // the shape-only Linear (element type sw::meta<T>)
#include "shardwise/nn/layers/linear_rows.hpp"     // a Linear's output rows padded and repeated
