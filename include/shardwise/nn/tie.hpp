#pragma once
// Tied parameters: one tensor used by two layers — the output projection that reuses the token embedding's
// table (GPT-2, Llama 3.2 1B/3B, Gemma: transformers' tie_word_embeddings). The tensor has one gradient (the
// sum of both layers' contributions), one optimizer state, one entry in the global norm and in checkpoints,
// all under the owner's name. Both layers' plans must cut it the same way, which is checked at compile time.
#include <cstddef>
#include <string_view>
#include <type_traits>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fixed_string.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/nn/layers/layer_common.hpp"

namespace shardwise {

namespace detail {
/// Incomplete on purpose: the diagnostic shows both layers' paths and how each plan cuts the weight.
template <fixed_string UserPath, class UserPlacement, fixed_string OwnerPath, class OwnerPlacement,
          class SpelledUser = spelled_t<UserPath>, class SpelledOwner = spelled_t<OwnerPath>>
struct tied_weight_cut_differently;

/// Named in decltype before tie_weights' static_assert (see mesh.hpp's show_if_named_twice).
template <class User, class Owner>
constexpr auto show_tie_mismatch() {
  using U = typename User::weight_grad_placement;
  using O = typename Owner::weight_grad_placement;
  if constexpr (!std::is_same_v<U, O>) {
    using offending_tie [[maybe_unused]] =
        decltype(detail::show_incomplete<
                 tied_weight_cut_differently<User::shardwise_location::path, U, Owner::shardwise_location::path, O>>());
  }
  return true;
}

/// The owner's weight shape before any cut: [vocabulary, dim] for an Embedding, [out, in] for a Linear.
template <class Owner>
constexpr std::pair<std::size_t, std::size_t> unsharded_weight_shape(Owner const& owner) {
  if constexpr (requires { owner.vocabulary(); })
    return {owner.vocabulary(), owner.dim()};
  else
    return {owner.out_features(), owner.in_features()};
}
}  // namespace detail

/// Makes `user` (a Linear) compute with `owner`'s weight (an Embedding's table, or another Linear's weight of
/// the same shape): the output projection of a model with tied word embeddings. Call it in the model's
/// constructor, before sw::parallelize; both layers must be parts of the same model object. Both plans must
/// cut the weight the same way: an output Linear under ColwiseParallel (rows: the vocabulary) with an Embedding
/// under RowwiseParallel, RowwiseParallel with ColwiseParallel, or neither in the plan.
template <class User, class Owner>
constexpr void tie_weights(User& user, Owner& owner) {
  static_assert(
      requires { user.shardwise_tie(owner.weight, owner.weight_grad, std::string_view()); },
      "shardwise::tie_weights: the first layer must be a shardwise::Linear (the one that reuses the "
      "weight), the second an Embedding or Linear that owns it");
  using U = typename User::weight_grad_placement;
  using O = typename Owner::weight_grad_placement;
  using cuts_shown [[maybe_unused]] = decltype(detail::show_tie_mismatch<User, Owner>());
  static_assert(std::is_same_v<U, O>,
                "shardwise::tie_weights: the two layers' plans cut the shared weight differently; give the Linear "
                "ColwiseParallel when the Embedding is RowwiseParallel (both cut the vocabulary), RowwiseParallel "
                "when it is ColwiseParallel, or leave both out of the plan");
  auto const [rows, cols] = detail::unsharded_weight_shape(owner);
  if (user.out_features() != rows || user.in_features() != cols)
    detail::fail("shardwise::tie_weights: the Linear at \"", User::shardwise_location::path.view(), "\" has a [",
                 user.out_features(), ", ", user.in_features(), "] weight but the layer at \"",
                 Owner::shardwise_location::path.view(), "\" owns a [", rows, ", ", cols,
                 "] one; tie layers of the same shape ([vocabulary, dim] for an output projection)");
  user.shardwise_tie(owner.weight, owner.weight_grad, Owner::shardwise_location::path.view());
}

}  // namespace shardwise
