"""transformers' sparse MoE blocks against shardwise's models::MoeFeedForward: MixtralSparseMoeBlock (top-2 of 8,
renormalised), Qwen3MoeSparseMoeBlock (norm_topk_prob off), Qwen2MoeSparseMoeBlock (with its gated shared
expert) and DeepseekV3MoE (sigmoid scores, a correction bias in the choice, 2 of 4 groups, routed_scaling_factor,
an ungated shared expert), fp64, fed the weights and inputs tp_dump wrote
("tp_dump DIR moe"). Compared: the output, transformers' load_balancing_loss_func on the block's router logits, and
every gradient of sum(y * dy) + router_aux_loss_coef * aux.

The routers' softmax runs in fp64 here: transformers upcasts it to fp32 (router_logits.float(), softmax(...,
dtype=torch.float)), which would cap the agreement of an fp64 model at about 1e-7; the replacement below is that
forward with the upcast left out, and the experts are transformers' own code. load_balancing_loss_func sums in
fp32, so the loss and the router's share of the gradients agree to fp32's precision only.

usage: moe_reference.py DUMP_DIR
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DeepseekV3Config, MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock, load_balancing_loss_func
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

TIGHT = 1e-12  # fp64 on both sides: summation order only
LOOSE = 1e-6   # what passes through load_balancing_loss_func's fp32 sums
DIM, HIDDEN, EXPERTS, TOP_K, SHARED_HIDDEN = 16, 12, 8, 2, 20


def router_in_fp64(self, hidden_states):
    """transformers' top-k router forward with its fp32 upcast left out."""
    hidden_states = hidden_states.reshape(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    router_probs = torch.softmax(router_logits, dim=-1)
    top_value, top_index = torch.topk(router_probs, self.top_k, dim=-1)
    if getattr(self, "norm_topk_prob", True):  # Mixtral's router always renormalises
        top_value = top_value / top_value.sum(dim=-1, keepdim=True)
    return router_logits, top_value, top_index


def deepseek_router_in_fp64(self, hidden_states):
    """transformers' DeepSeek-V3 router forward with its fp32 casts left out."""
    hidden_states = hidden_states.view(-1, self.hidden_dim)
    router_logits = F.linear(hidden_states, self.weight)
    scores = router_logits.sigmoid()
    scores_for_choice = scores + self.e_score_correction_bias
    group_scores = (scores_for_choice.view(-1, self.num_group, self.num_experts // self.num_group)
                    .topk(2, dim=-1)[0].sum(dim=-1))
    group_idx = torch.topk(group_scores, k=self.topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = (group_mask.unsqueeze(-1).expand(-1, self.num_group, self.num_experts // self.num_group)
                  .reshape(-1, self.num_experts))
    scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
    topk_indices = torch.topk(scores_for_choice, k=self.top_k, dim=-1, sorted=False)[1]
    topk_weights = scores.gather(1, topk_indices)
    if self.norm_topk_prob:
        topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
    return router_logits, topk_weights * self.routed_scaling_factor, topk_indices


def load(directory, name):
    return torch.from_numpy(np.load(os.path.join(directory, name + ".npy")))


def check(results, label, name, got, expected, tolerance):
    scale = max(expected.abs().max().item(), 1.0)
    error = (got.detach().reshape(expected.shape) - expected).abs().max().item() / scale
    results.append((f"{label}: {name}", error <= tolerance, error))


def shared_layers(block):
    """The shared expert's projections (Qwen2-MoE's shared_expert, DeepSeek-V3's shared_experts), each with the name
    tp_dump gives its file; none without a shared expert."""
    shared = getattr(block, "shared_expert", None) or getattr(block, "shared_experts", None)
    if shared is None:
        return []
    return [("shared_" + name, getattr(shared, name)) for name in ("gate_proj", "up_proj", "down_proj")]


def prepared(block, directory):
    """The block in fp64 with its router in fp64, holding the weights tp_dump wrote into `directory`."""
    deepseek = isinstance(block, DeepseekV3MoE)
    type(block.gate).forward = deepseek_router_in_fp64 if deepseek else router_in_fp64
    block = block.to(torch.float64)
    with torch.no_grad():
        block.gate.weight.copy_(load(directory, "gate"))
        block.experts.gate_up_proj.copy_(load(directory, "gate_up").reshape(EXPERTS, 2 * HIDDEN, DIM))
        block.experts.down_proj.copy_(load(directory, "down").reshape(EXPERTS, DIM, HIDDEN))
        if deepseek:
            block.gate.e_score_correction_bias.copy_(load(directory, "bias"))
        for file, layer in shared_layers(block):
            layer.weight.copy_(load(directory, file))
        if hasattr(block, "shared_expert_gate"):
            block.shared_expert_gate.weight.copy_(load(directory, "shared_expert_gate"))
    return block


def check_gradients(results, label, block, directory, router_tolerance, expert_tolerance):
    check(results, label, "router gradient", block.gate.weight.grad, load(directory, "gate_grad"), router_tolerance)
    check(results, label, "gate_up_proj gradient", block.experts.gate_up_proj.grad, load(directory, "gate_up_grad"),
          expert_tolerance)
    check(results, label, "down_proj gradient", block.experts.down_proj.grad, load(directory, "down_grad"),
          expert_tolerance)
    for file, layer in shared_layers(block):
        check(results, label, file + " gradient", layer.weight.grad, load(directory, file + "_grad"), expert_tolerance)
    if hasattr(block, "shared_expert_gate"):
        check(results, label, "shared_expert_gate gradient", block.shared_expert_gate.weight.grad,
              load(directory, "shared_expert_gate_grad"), expert_tolerance)


def run(blocks, directory, aux_coef):
    """x through the blocks in turn; the loss sum(y * dy) + aux_coef * load_balancing_loss_func over all of them."""
    x = load(directory, "x").reshape(1, -1, DIM).requires_grad_(True)
    dy = load(directory, "dy").reshape(1, -1, DIM)
    logits = []
    hooks = [b.gate.register_forward_hook(lambda module, args, out: logits.append(out[0])) for b in blocks]
    y = x
    for block in blocks:
        y = block(y)
    for hook in hooks:
        hook.remove()
    aux = load_balancing_loss_func(tuple(logits), EXPERTS, blocks[0].gate.top_k)
    ((y * dy).sum() + aux_coef * aux).backward()
    return x, y, aux


def compare(results, directory, label, block, aux_coef):
    block = prepared(block, directory)
    x, y, aux = run([block], directory, aux_coef)
    tight_router = TIGHT if aux_coef == 0 else LOOSE
    check(results, label, "output", y, load(directory, "y"), TIGHT)
    if not isinstance(block, DeepseekV3MoE):  # the sigmoid router has no load-balancing loss
        check(results, label, "aux loss", aux.double().reshape(1), load(directory, "aux"), LOOSE)
    check(results, label, "input gradient", x.grad, load(directory, "dx"), tight_router)
    check_gradients(results, label, block, directory, tight_router, TIGHT)


def compare_pooled(results, directory):
    """Two Mixtral blocks in a row, the loss pooled over both as MixtralForCausalLM pools its layers'."""
    config = MixtralConfig(hidden_size=DIM, intermediate_size=HIDDEN, num_local_experts=EXPERTS,
                           num_experts_per_tok=TOP_K, router_jitter_noise=0.0, router_aux_loss_coef=0.02,
                           experts_implementation="eager")
    blocks = [prepared(MixtralSparseMoeBlock(config), os.path.join(directory, part)) for part in ("first", "second")]
    x, y, aux = run(blocks, directory, 0.02)
    check(results, "Mixtral, 2 blocks pooled", "output", y, load(directory, "y"), TIGHT)
    check(results, "Mixtral, 2 blocks pooled", "aux loss", aux.double().reshape(1), load(directory, "aux"), LOOSE)
    check(results, "Mixtral, 2 blocks pooled", "input gradient", x.grad, load(directory, "dx"), LOOSE)
    for block, part in zip(blocks, ("first", "second")):
        check_gradients(results, "Mixtral, 2 blocks pooled, " + part, block, os.path.join(directory, part), LOOSE,
                        LOOSE)


def main():
    torch.manual_seed(0)
    directory = sys.argv[1]
    results = []
    for aux_coef, suffix in ((0.0, ""), (0.02, "_aux")):
        mixtral = MixtralConfig(hidden_size=DIM, intermediate_size=HIDDEN, num_local_experts=EXPERTS,
                                num_experts_per_tok=TOP_K, router_jitter_noise=0.0, router_aux_loss_coef=aux_coef,
                                experts_implementation="eager")
        compare(results, os.path.join(directory, "mixtral" + suffix), "Mixtral" + suffix,
                MixtralSparseMoeBlock(mixtral), aux_coef)
    for aux_coef, suffix in ((0.0, ""), (0.001, "_aux")):
        qwen = Qwen3MoeConfig(hidden_size=DIM, moe_intermediate_size=HIDDEN, num_experts=EXPERTS,
                              num_experts_per_tok=TOP_K, norm_topk_prob=False, router_aux_loss_coef=aux_coef,
                              experts_implementation="eager")
        compare(results, os.path.join(directory, "qwen3_moe" + suffix), "Qwen3-MoE" + suffix,
                Qwen3MoeSparseMoeBlock(qwen), aux_coef)
    qwen2 = Qwen2MoeConfig(hidden_size=DIM, moe_intermediate_size=HIDDEN,
                           shared_expert_intermediate_size=SHARED_HIDDEN, num_experts=EXPERTS,
                           num_experts_per_tok=TOP_K, norm_topk_prob=False, experts_implementation="eager")
    compare(results, os.path.join(directory, "qwen2_moe"), "Qwen2-MoE", Qwen2MoeSparseMoeBlock(qwen2), 0.0)
    deepseek = DeepseekV3Config(hidden_size=DIM, moe_intermediate_size=HIDDEN, n_shared_experts=2,
                                n_routed_experts=EXPERTS, num_experts_per_tok=3, n_group=4, topk_group=2,
                                routed_scaling_factor=2.5, norm_topk_prob=True, experts_implementation="eager")
    compare(results, os.path.join(directory, "deepseek_v3"), "DeepSeek-V3", DeepseekV3MoE(deepseek), 0.0)
    compare_pooled(results, os.path.join(directory, "mixtral_pooled"))
    for name, ok, error in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {error:.2e}")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
