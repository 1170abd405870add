#pragma once
// Shape-only tensors, for costs that come from the code that runs: a module built with the element type
// sw::meta<T> holds no parameters, and its own forward and backward, run on meta matrices (a shape and the trace
// they report to, no values), record what the module costs on one rank — each layer's transfers in the order the
// code calls it, the bytes its members keep from forward to backward, and the most its backward holds at once —
// in time that does not depend on the sizes. sw::derived_cost runs it (nn/meta.hpp).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "shardwise/core/module_hooks.hpp"
#include "shardwise/cost/cost.hpp"

namespace shardwise {

/// The element type of a shape-only module: T's sizes, no values (see sw::derived_cost).
template <class T>
struct meta {
  using element = T;  ///< The element type whose sizes it has.
  constexpr meta() = default;
  /// From a number (a norm's epsilon, say): nothing to keep.
  template <class Number>
    requires std::is_arithmetic_v<Number>
  constexpr meta(Number) {}  // NOLINT: converts, as the element types it stands for do
};

/// Whether T is a shape-only element type (sw::meta<U>).
template <class T>
inline constexpr bool is_meta_v = false;
template <class T>
inline constexpr bool is_meta_v<meta<T>> = true;

/// What a shape-only run records: the sizes it runs for, the bytes its meta matrices hold now and at most, and
/// the transfers its code makes, in order. A module called again on the same shapes (a model's next block) is
/// folded into a repeat group as its call ends (transfer_list::fold_repeat); until then two calls' entries are
/// held, so the run records into lists larger than a sw::cost's and hands the folded result over at the end.
class meta_trace {
 public:
  static constexpr std::size_t recorded_capacity = 256;  ///< Entries a pass may hold before its repeats fold.

  /// A run for `s`.
  constexpr explicit meta_trace(cost_inputs const& s) : inputs(s) {}

  cost_inputs inputs;    ///< The tokens and axes the run is for.
  cost total{};          ///< The bytes recorded so far; finish() adds the transfers.
  std::size_t live = 0;  ///< Bytes the live meta matrices hold.
  std::size_t peak = 0;  ///< The most they held at once since the last reset_peak().
  /// What sw::forward and sw::backward call around each module on shapes (FSDP's schedule, sw::fsdp_step_cost);
  /// null: nothing.
  detail::module_hooks* hooks = nullptr;

  /// Where a layer adds its transfers now (the list a style's mover writes): the entries since the last module
  /// call began or ended, which flush() moves to the pass's record.
  constexpr transfer_list<>& transfers() { return pending_; }
  /// Adds a whole list (a cost's) to the pass's record, after the pending entries: a list longer than a
  /// sw::cost's, as a ring attention's over many cp ranks, fits.
  template <std::size_t N>
  constexpr void add(transfer_list<N> const& list) {
    recorded().append(list);
  }
  /// The pass's record so far (the forward's until start_backward, then the backward's), pending entries moved in.
  constexpr transfer_list<recorded_capacity>& recorded() {
    flush();
    return backward_pass_ ? backward_ : forward_;
  }
  /// From now on what runs is the backward's (a forward run again by activation checkpointing too; a loss's
  /// backward within the forward step, as a pipeline's last stage runs it, is the forward's).
  constexpr void start_backward() {
    flush();
    backward_pass_ = true;
  }
  /// The cost recorded: the bytes, and each pass's transfers (throws if they do not fit a sw::cost's lists).
  constexpr cost finish() {
    flush();
    total.forward = transfer_list<>();
    total.backward = transfer_list<>();
    total.forward.append(forward_);
    total.backward.append(backward_);
    return total;
  }

  /// Appends what it recorded so far, the forward's then the backward's, to `out`, and records a new forward.
  template <std::size_t N>
  constexpr void take_record(transfer_list<N>& out) {
    flush();
    out.append(forward_).append(backward_);
    forward_.clear(), backward_.clear();
    backward_pass_ = false;
  }

  /// A module call begins (detail::repeated_call).
  constexpr void enter_call() { ++calls_open_; }
  /// It ends: whether what it recorded may fold into a repetition of the call before it. With hooks (FSDP's
  /// schedule) only the outermost calls fold: a unit's gathers open its call, so repeats inside a block (its
  /// attention's and feed-forward's equal moves) would hold a group of their own and keep the blocks apart.
  constexpr bool leave_call() {
    --calls_open_;
    return hooks == nullptr || calls_open_ == 0;
  }
  /// How many module calls are running (0: the code between them, as a pass's start and end).
  [[nodiscard]] constexpr std::size_t calls_open() const { return calls_open_; }

  /// Starts a new peak from what is held now.
  constexpr void reset_peak() { peak = live; }
  /// A meta matrix of `bytes` comes to life.
  constexpr void acquire(std::size_t bytes) {
    live += bytes;
    peak = std::max(peak, live);
  }
  /// One of `bytes` ends.
  constexpr void release(std::size_t bytes) { live -= bytes; }

 private:
  constexpr void flush() {
    if (pending_.empty()) return;
    (backward_pass_ ? backward_ : forward_).append(pending_);
    pending_.clear();
  }

  bool backward_pass_ = false;
  std::size_t calls_open_ = 0;
  transfer_list<> pending_;
  transfer_list<recorded_capacity> forward_, backward_;
};

namespace detail {
/// A call of a module on shapes, while it lives: at its end what the call recorded is folded into one more
/// repetition of the call before it when the two are equal (transfer_list::fold_repeat), so that a model's
/// repeated blocks are stored once.
class repeated_call {
 public:
  /// Null: not a call on shapes, nothing to fold.
  constexpr explicit repeated_call(meta_trace* trace) : trace_(trace), from_(trace ? trace->recorded().stored() : 0) {
    if (trace_) trace_->enter_call();
  }
  constexpr ~repeated_call() {
    if (trace_ && trace_->leave_call()) trace_->recorded().fold_repeat(from_);
  }
  repeated_call(repeated_call const&) = delete;
  repeated_call& operator=(repeated_call const&) = delete;

 private:
  meta_trace* trace_;
  std::size_t from_;
};
}  // namespace detail

/// A [rows, cols] matrix of T with no values: what a meta activation holds. It reports its bytes to its trace
/// while it lives; moved from, it is empty (as an Eigen matrix whose storage was taken).
template <class T>
class meta_matrix {
 public:
  using Scalar = meta<T>;  ///< As an Eigen matrix's: the element type.

  /// Empty, reporting to no trace.
  constexpr meta_matrix() = default;
  /// A matrix of rows x cols that reports to `trace`.
  constexpr meta_matrix(std::ptrdiff_t rows, std::ptrdiff_t cols, meta_trace* trace)
      : rows_(rows), cols_(cols), trace_(trace) {
    if (trace_) trace_->acquire(bytes());
  }
  /// A copy: as many bytes again.
  constexpr meta_matrix(meta_matrix const& other) : meta_matrix(other.rows_, other.cols_, other.trace_) {}
  /// Takes the other's storage, which is left empty.
  constexpr meta_matrix(meta_matrix&& other) noexcept
      : rows_(std::exchange(other.rows_, 0)), cols_(std::exchange(other.cols_, 0)), trace_(other.trace_) {}
  /// Copy or move assignment (the old storage ends).
  constexpr meta_matrix& operator=(meta_matrix other) noexcept {
    swap(other);
    return *this;
  }
  constexpr ~meta_matrix() {
    if (trace_) trace_->release(bytes());
  }
  /// Exchanges the two matrices.
  constexpr void swap(meta_matrix& other) noexcept {
    std::swap(rows_, other.rows_), std::swap(cols_, other.cols_), std::swap(trace_, other.trace_);
  }
  /// Exchanges the two matrices.
  friend constexpr void swap(meta_matrix& a, meta_matrix& b) noexcept { a.swap(b); }

  [[nodiscard]] constexpr std::ptrdiff_t rows() const { return rows_; }          ///< Rows.
  [[nodiscard]] constexpr std::ptrdiff_t cols() const { return cols_; }          ///< Columns.
  [[nodiscard]] constexpr std::ptrdiff_t size() const { return rows_ * cols_; }  ///< Elements.
  /// The bytes its values would take.
  [[nodiscard]] constexpr std::size_t bytes() const { return static_cast<std::size_t>(rows_ * cols_) * sizeof(T); }
  /// The trace it reports to (null: none).
  [[nodiscard]] constexpr meta_trace* trace() const { return trace_; }
  /// Gives it rows x cols (as Eigen's resize: the bytes are those of the new shape).
  constexpr void resize(std::ptrdiff_t rows, std::ptrdiff_t cols) { *this = like(rows, cols); }
  /// A new matrix of this one's trace.
  [[nodiscard]] constexpr meta_matrix like(std::ptrdiff_t rows, std::ptrdiff_t cols) const {
    return {rows, cols, trace_};
  }

  /// @{ What the element-wise arithmetic on activations uses: each result a new matrix of the same shape, or
  /// this one.
  [[nodiscard]] constexpr meta_matrix cwiseProduct(meta_matrix const&) const { return like(rows_, cols_); }
  constexpr meta_matrix& array() { return *this; }
  constexpr meta_matrix const& array() const { return *this; }
  constexpr meta_matrix& operator*=(meta_matrix const&) { return *this; }
  constexpr meta_matrix& operator*=(Scalar) { return *this; }
  constexpr meta_matrix& operator+=(meta_matrix const&) { return *this; }
  friend constexpr meta_matrix operator+(meta_matrix const& a, meta_matrix const&) { return a.like(a.rows_, a.cols_); }
  /// @}

 private:
  std::ptrdiff_t rows_ = 0, cols_ = 0;
  meta_trace* trace_ = nullptr;
};

}  // namespace shardwise
