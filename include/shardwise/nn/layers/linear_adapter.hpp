#pragma once
// The members of a Linear that add, cut, list and merge its LoRA adapter (nn/layers/lora.hpp; sw::add_lora), out of
// linear_core.hpp's class, so that SHARDWISE_SEPARATE_KERNELS compiles them with the rest of the library's styles.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string_view>

#include "shardwise/nn/layers/linear_core.hpp"

namespace shardwise::detail {

template <class T, class Rule>
void linear_core<T, Rule>::keep_adapter_shard() {
  if (lora_)
    fail("shardwise::add_lora: the Linear at \"", path_,
         "\" got its adapter before parallelize cut its weight; call sw::add_lora after sw::parallelize");
}

template <class T, class Rule>
char const* linear_core<T, Rule>::adapter_refusal() const {
  if (tied()) return "computes with another layer's weight (sw::tie_weights); adapt the owner";
  if (lazy_) return "has no parameters yet (sw::Lazy); load or materialize the model first";
  if (lora_) return "has an adapter already";
  return "is under sw::fully_shard, which sharded its parameters as they were; add adapters before fully_shard";
}

template <class T, class Rule>
void linear_core<T, Rule>::shardwise_add_lora(std::size_t rank, T scale, std::uint64_t seed) {
  std::size_t const limit = std::min(in_, unpadded_out_features());
  if (rank == 0 || rank > limit)
    fail("shardwise::add_lora: rank ", rank, " for the Linear at \"", path_, "\" (", in_, " -> ",
         unpadded_out_features(), "); give a rank from 1 to ", limit, ", the smaller of its features");
  if (tied() || lazy_ || lora_ || this->shardwise_module_hooks())
    fail("shardwise::add_lora: the Linear at \"", path_, "\" ", adapter_refusal());
  lora_adapter<T> adapter;
  matrix whole_a(static_cast<Eigen::Index>(rank), static_cast<Eigen::Index>(in_));
  fill_uniform(whole_a, T(1) / std::sqrt(static_cast<T>(in_)), seed);
  auto const cols = static_cast<Eigen::Index>(local_in_);
  adapter.a = cut_cols && group_ ? matrix(whole_a.middleCols(group_->rank() * cols, cols)) : std::move(whole_a);
  adapter.b = matrix::Zero(static_cast<Eigen::Index>(local_out_), static_cast<Eigen::Index>(rank));
  adapter.scale = scale, adapter.rank = rank;
  adapter.a_partial = is_partial_v<lora_a_placement>, adapter.b_partial = is_partial_v<lora_b_placement>;
  adapter.zero_grad();
  lora_ = std::move(adapter);
}

template <class T, class Rule>
void linear_core<T, Rule>::shardwise_merge_lora() {
  if (!lora_) return;
  if (this->shardwise_module_hooks())
    fail("shardwise::merge_lora: the Linear at \"", path_,
         "\" is under sw::fully_shard, which keeps its weight's and adapter's shards apart from the layer; save the "
         "adapters (sw::save_lora), load them into a model not under fully_shard (sw::load_lora) and merge there");
  lora_->merge_into(weight);
  lora_.reset();
}

template <class T, class Rule>
template <class G>
auto linear_core<T, Rule>::adapter_parameter(bool is_a) -> Parameter<matrix, G> {
  static constexpr std::string_view leaves[2] = {"lora_B.weight", "lora_A.weight"};
  if (!lora_) {
    Parameter<matrix, G> none{&weight, &weight_grad, group_.get(), path_};
    none.leaf = leaves[is_a], none.present = false;
    return none;
  }
  matrix& value = is_a ? lora_->a : lora_->b;
  matrix& grad = is_a ? lora_->a_grad : lora_->b_grad;
  Parameter<matrix, G> p{&value, &grad, group_.get(), path_, is_a ? 1 : copies_, is_a ? 0 : copy_block_};
  if constexpr (is_partial_v<G>) p.grad = is_a ? &lora_->a_pending : &lora_->b_pending, p.reduced_into = &grad;
  p.leaf = leaves[is_a];
  p.real_rows = is_a ? 0 : unpadded_out_;
  p.copies_summed = !is_a && copies_ > 1 ? &copies_summed_ : nullptr;
  p.placed_over = this->shardwise_placed_over();  // an expert's adapter sums the ep ranks' tokens as its weight does
  return p;
}

}  // namespace shardwise::detail
