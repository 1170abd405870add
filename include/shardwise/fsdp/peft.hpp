#pragma once
// LoRA adapters of a model under sw::fully_shard saved in peft's files (checkpoint/peft.hpp): each dp (and tp) rank
// writes its rows of the adapters, which the leader consolidates into adapter_model.safetensors.
//
//   sw::save_lora(sharded, tp, "adapter", lora, sw::transformers_llama_name);   // every rank of dp x tp
#include <filesystem>
#include <string>
#include <type_traits>

#include "shardwise/checkpoint/peft.hpp"
#include "shardwise/fsdp/checkpoint.hpp"

namespace shardwise {

namespace detail {
template <class Sharded, class... TpMesh>
void save_fsdp_lora(Sharded& sharded, std::filesystem::path const& folder, LoraConfig const& config,
                    parameter_names const& names, std::string const& base_model, TpMesh const&... tp) {
  check_fsdp_save(sharded, tp...);
  auto const linears =
      adapted_linears(sharded.model(), config, names, "save_lora", "give the LoraConfig the adapters were added with");
  auto const targets = peft_target_modules(linears);
  if (targets.empty())
    fail(
        "shardwise::save_lora: the model has no LoRA adapter to save; add them with sw::add_lora or sw::load_lora "
        "before sw::fully_shard");
  write_peft_folder(adapter_tensors_only(tensors_of(sharded)), fsdp_save_group(sharded, tp...), folder,
                    peft_config_text(config, targets, base_model), names);
}
}  // namespace detail

/// save_lora of a model under sw::fully_shard (full_shard, shard_grad_op or no_shard; not hybrid sharding),
/// collectively over its dp mesh and `tp`, the mesh it was parallelized over: the same files as save_lora of the model
/// itself, which load at any tp size with sw::load_lora. Every rank of dp x tp calls it.
template <class Model, class Policy, class ShardMesh, class TpMesh>
void save_lora(fully_sharded<Model, Policy, ShardMesh>& sharded, TpMesh const& tp, std::filesystem::path const& folder,
               LoraConfig const& config, parameter_names const& names = {}, std::string const& base_model = {}) {
  detail::save_fsdp_lora(sharded, folder, config, names, base_model, tp);
}

/// A model under hybrid sharding: not offered yet, refused at compile time.
template <class Model, class Policy, class ShardMesh, class ReplicateMesh, class... Arguments>
  requires(!std::is_same_v<ReplicateMesh, no_replication>)
void save_lora(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>&, Arguments const&...) {
  static_assert(std::is_same_v<ReplicateMesh, no_replication>,
                "shardwise::save_lora: a model under hybrid sharding (fully_shard(model, dp, replicate)) is not "
                "offered yet; save the adapters of a model sharded over one dp mesh");
}

/// As above, for a model not parallelized over tp: every dp rank calls it.
template <class Model, class Policy, class ShardMesh>
void save_lora(fully_sharded<Model, Policy, ShardMesh>& sharded, std::filesystem::path const& folder,
               LoraConfig const& config, parameter_names const& names = {}, std::string const& base_model = {}) {
  detail::save_fsdp_lora(sharded, folder, config, names, base_model);
}

}  // namespace shardwise
