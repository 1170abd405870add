#pragma once
// A model's sequences cut over a context-parallel (cp) axis: sw::context_parallelize hands every module that
// attends across tokens a sw::context_parallel (the cut, and attention across the cp ranks by ring or
// all-to-all), and refuses at compile time a model with a module that has not said how it treats a cut sequence.
// Every other module works on this rank's rows as they are: a linear layer, a norm or an embedding treats each
// token alone. Parameters are whole on every cp rank, their gradients averaged over cp as over dp.
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "shardwise/context/attend_meta.hpp"
#include "shardwise/context/ring_attention.hpp"
#include "shardwise/context/split.hpp"
#include "shardwise/context/ulysses_attention.hpp"
#include "shardwise/core/fixed_string.hpp"
#include "shardwise/plan/hooks.hpp"
#include "shardwise/plan/module.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {

/// This rank's part of a context-parallel run: the cut (context_split), its place in it, and attention across
/// the cp mesh, for float and double. Built by sw::context_parallelize; modules read it through their
/// shardwise_on_context_parallel hook.
class context_parallel {
 public:
  /// Attention across `cp` (a 1-D mesh over split.ranks ranks) by `method`.
  template <class Mesh>
  context_parallel(Mesh const& cp, context_split split, context_method method)
      : split_(split), rank_(cp.rank()), positions_(split.positions(cp.rank())), method_(method) {
    split_.check();
    bind<float>(cp, float_);
    bind<double>(cp, double_);
    sum_ = [cp](nn::vector<double>& values) { detail::all_reduce_on(cp.comm(0), values, detail::op_kind::sum); };
  }

  [[nodiscard]] context_split const& split() const { return split_; }  ///< The cut.
  [[nodiscard]] int rank() const { return rank_; }                     ///< This rank's place on the cp axis.
  [[nodiscard]] context_method method() const { return method_; }      ///< Ring or all-to-all.
  /// The global positions of this rank's tokens within each sequence, increasing.
  [[nodiscard]] std::vector<std::int64_t> const& positions() const { return positions_; }
  /// This rank's tokens of each sequence.
  [[nodiscard]] std::size_t tokens() const { return positions_.size(); }
  /// `rows` as packed documents of the cut's sequences: empty when they are whole sequences (every(sequence)).
  [[nodiscard]] sequence_lengths documents(sequence_lengths const& rows) const {
    bool const whole = rows.empty() || (rows.uniform() && rows.longest() == split_.sequence);
    return whole ? sequence_lengths{} : rows;
  }
  /// Where the document of each of this rank's rows begins (context_split::document_starts), for `batch`
  /// sequences packed with the documents `rows`; empty for whole sequences.
  [[nodiscard]] std::vector<std::int64_t> document_starts(sequence_lengths const& rows, std::size_t batch) const {
    return split_.document_starts(documents(rows), batch, rank_);
  }
  /// This rank's tokens of `whole`, whole sequences back to back (the token ids and targets every cp rank has):
  /// what its forward and loss take. context_split::tokens_of at this rank.
  template <class T>
  [[nodiscard]] std::vector<T> my_tokens(std::vector<T> const& whole) const {
    return split_.tokens_of(whole, rank_);
  }
  /// The factor that turns this rank's mean over its own tokens into its share of the mean over every token, when
  /// the cp ranks' results are then averaged (as data-parallel losses and gradients are): tokens x ranks /
  /// sequence (1 when the cut is even).
  [[nodiscard]] double mean_weight() const {
    return static_cast<double>(tokens()) * split_.ranks / static_cast<double>(split_.sequence);
  }

  /// Sums `values` over the cp ranks, in place (what a loss pools over every token of the sequences: a mixture of
  /// experts' router totals).
  void sum(std::vector<double>& values) const {
    Eigen::Map<nn::vector<double>> all(values.data(), static_cast<Eigen::Index>(values.size()));
    nn::vector<double> summed = all;
    sum_(summed);
    all = summed;
  }

  /// ring_attention / ulysses_attention over this rank's rows, with a sliding `window` of keys if not 0, within
  /// packed `documents` if given (their lengths over the whole sequences: context_split::document_starts).
  template <std::floating_point T>
  void attend(nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k, nn::const_matrix_ref<T> v, std::size_t head_dim,
              nn::matrix_ref<T> out, nn::attention_saved<T>& saved, std::size_t window = 0,
              sequence_lengths const& documents = {}) const {
    kernels<T>().forward(q, k, v, head_dim, out, saved, window, documents);
  }
  /// The backward of attend.
  template <std::floating_point T>
  void attend_backward(nn::const_matrix_ref<T> dout, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                       nn::const_matrix_ref<T> v, nn::const_matrix_ref<T> out, nn::attention_saved<T> const& saved,
                       nn::matrix_ref<T> dq, nn::matrix_ref<T> dk, nn::matrix_ref<T> dv) const {
    kernels<T>().backward(dout, q, k, v, out, saved, dq, dk, dv);
  }

 private:
  template <class T>
  struct typed {
    using M = nn::const_matrix_ref<T>;
    using W = nn::matrix_ref<T>;
    std::function<void(M, M, M, std::size_t, W, nn::attention_saved<T>&, std::size_t, sequence_lengths const&)> forward;
    std::function<void(M, M, M, M, M, nn::attention_saved<T> const&, W, W, W)> backward;
  };
  template <class T, class Mesh>
  void bind(Mesh const& cp, typed<T>& k) {
    using M = nn::const_matrix_ref<T>;
    using W = nn::matrix_ref<T>;
    context_split const s = split_;
    if (method_ == context_method::ring) {
      k.forward = [cp, s](M q, M kk, M v, std::size_t d, W out, nn::attention_saved<T>& saved, std::size_t window,
                          sequence_lengths const& documents) {
        ring_attention<Mesh, T>(cp, s, q, kk, v, d, out, saved, nn::attention_block_rows, window, documents);
      };
      k.backward = [cp, s](M dout, M q, M kk, M v, M out, nn::attention_saved<T> const& saved, W dq, W dk, W dv) {
        ring_attention_backward<Mesh, T>(cp, s, dout, q, kk, v, out, saved, dq, dk, dv);
      };
    } else {
      k.forward = [cp, s](M q, M kk, M v, std::size_t d, W out, nn::attention_saved<T>& saved, std::size_t window,
                          sequence_lengths const& documents) {
        ulysses_attention<Mesh, T>(cp, s, q, kk, v, d, out, saved, nn::attention_block_rows, window, documents);
      };
      k.backward = [cp, s](M dout, M q, M kk, M v, M out, nn::attention_saved<T> const& saved, W dq, W dk, W dv) {
        ulysses_attention_backward<Mesh, T>(cp, s, dout, q, kk, v, out, saved, dq, dk, dv);
      };
    }
  }
  template <class T>
  [[nodiscard]] typed<T> const& kernels() const {
    if constexpr (std::is_same_v<T, float>)
      return float_;
    else
      return double_;
  }

  context_split split_;
  int rank_ = 0;
  std::vector<std::int64_t> positions_;
  context_method method_ = context_method::ring;
  typed<float> float_;
  typed<double> double_;
  std::function<void(nn::vector<double>&)> sum_;
};

/// A model attention's causal attention on its rows: within each of the sequences `rows` (nn::causal_attention,
/// with a sliding `window` if not 0) when `context` is null, else of this rank's tokens across the cp ranks (the
/// context's cut; the same window; `rows` there are the documents packed into the whole sequences, or whole
/// sequences of the cut's length). Under the ring, `saved` also keeps the output, which the ring's backward needs (its
/// softmax term spans every block).
template <std::floating_point T>
void attend_causal(context_parallel const* context, nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                   nn::const_matrix_ref<T> v, sequence_lengths const& rows, std::size_t head_dim, nn::matrix<T>& out,
                   nn::attention_saved<T>& saved, std::size_t window = 0) {
  if (!context) return nn::causal_attention<T>(q, k, v, rows, head_dim, out, saved, nn::attention_block_rows, window);
  context->attend<T>(q, k, v, head_dim, out, saved, window, context->documents(rows));
  if (context->method() == context_method::ring) saved.output = out;
}

/// The backward of attend_causal (`saved`: what it kept).
template <std::floating_point T>
void attend_causal_backward(context_parallel const* context, nn::const_matrix_ref<T> dout, nn::const_matrix_ref<T> q,
                            nn::const_matrix_ref<T> k, nn::const_matrix_ref<T> v, nn::attention_saved<T> const& saved,
                            nn::matrix_ref<T> dq, nn::matrix_ref<T> dk, nn::matrix_ref<T> dv) {
  if (context)
    context->attend_backward<T>(dout, q, k, v, saved.output, saved, dq, dk, dv);
  else
    nn::causal_attention_backward<T>(dout, q, k, v, saved, dq, dk, dv);
}

/// Where an attention keeps the sw::context_parallel that sw::context_parallelize hands its
/// shardwise_on_context_parallel hook (null before). Built with the shape-only element type sw::meta<T> it holds
/// nothing: a shape-only run (sw::derived_cost) reads the cp axis from its cost inputs.
template <class T>
class context_slot {
 public:
  /// Keeps the context handed over.
  context_slot& operator=(std::shared_ptr<context_parallel const> context) {
    context_ = std::move(context);
    return *this;
  }
  /// The context (null: none given; attention within whole sequences).
  [[nodiscard]] context_parallel const* get() const { return context_.get(); }

 private:
  std::shared_ptr<context_parallel const> context_;
};

/// A shape-only attention's slot: never given a context.
template <class T>
class context_slot<meta<T>> {
 public:
  /// None.
  [[nodiscard]] constexpr context_parallel const* get() const { return nullptr; }
};

}  // namespace shardwise

namespace shardwise::detail {

template <class Module>
struct module_does_not_say_how_it_treats_a_sequence_cut_over_cp;  // incomplete on purpose: names the module
template <fixed_string Path, class Spelled = spelled_t<Path>>
struct at_plan_path;  // incomplete on purpose: spells the module's plan path, where its layers were given one

/// The plan path of module N (where its layers were built with one), as text a template argument can spell.
template <class N>
struct context_module_path {
  static constexpr found_path own = module_path<N>();
  static constexpr std::string_view text = own.path;
};

/// Whether module N may run on a sequence cut over cp: it attends across the ranks itself (the hook), or its own
/// code treats every token alone (token_wise); layers always do.
template <class N>
constexpr bool context_parallel_ready() {
  if constexpr (layer<N> || !module<N>) {
    return true;
  } else {
    constexpr bool ready = requires(N& m, std::shared_ptr<context_parallel const> const& c) {
      m.shardwise_on_context_parallel(c);
    } || requires { requires N::shardwise_token_wise; };
    if constexpr (!ready) {
      using shown [[maybe_unused]] =
          decltype(show_incomplete<module_does_not_say_how_it_treats_a_sequence_cut_over_cp<N>>());
      if constexpr (context_module_path<N>::own.found) {
        using path_shown [[maybe_unused]] =
            decltype(show_incomplete<at_plan_path<spelled<context_module_path<N>::text>()>>());
      }
    }
    return ready;
  }
}

}  // namespace shardwise::detail

namespace shardwise {

/// Cuts the model's sequences over the cp mesh (a 1-D mesh; split.ranks its size): every module with a
/// shardwise_on_context_parallel hook gets this rank's sw::context_parallel. From then on the model takes this
/// rank's tokens of every sequence (split.rows_of, or ids picked by positions()), and its parameters' gradients
/// are to be averaged over cp as over dp (the loss weighted by mean_weight()). Refused at compile time if a
/// module under Model neither attends across cp itself nor declares itself token-wise.
template <module Model, class Mesh>
std::shared_ptr<context_parallel const> context_parallelize(Model& model, Mesh const& cp, context_split split,
                                                            context_method method = context_method::ring) {
  constexpr bool ready = detail::every_node<Model>([]<class N>() { return detail::context_parallel_ready<N>(); });
  static_assert(ready,
                "shardwise::context_parallelize: a module of this model (named below) does not say how it treats a "
                "sequence cut over cp ranks; if its own code treats every token alone, declare "
                "`static constexpr bool shardwise_token_wise = true;` and list token_wise in its SHARDWISE_HOOKS, "
                "else give it shardwise_on_context_parallel and attend across the ranks with the context_parallel "
                "it receives");
  auto context = std::make_shared<context_parallel const>(cp, split, method);
  if constexpr (ready) {
    auto on_module = [&](auto& m, auto const&) {
      if constexpr (requires { m.shardwise_on_context_parallel(context); }) m.shardwise_on_context_parallel(context);
    };
    auto on_layer = [](auto&, auto const&) {};
    detail::walk_tree(model, std::string(), on_module, on_layer);
  }
  return context;
}

}  // namespace shardwise
