"""The Hugging Face half of the mixture-of-experts model check, in fp64 (hf_checkpoint_load.cpp's --moe mode is the
shardwise half). "prepare": builds small random MixtralForCausalLM, Qwen3MoeForCausalLM and Qwen2MoeForCausalLM (8
experts, top-2, 2 layers; Qwen2-MoE with its gated shared expert and q, k, v biases; output_router_logits on, so
that the training loss holds router_aux_loss_coef x the load-balancing loss), saves each with save_pretrained in
fp64 into DIR/<family> (one tensor per expert), and Mixtral's state_dict, whose experts transformers 5 holds fused
(mlp.experts.gate_up_proj, down_proj), into DIR/mixtral_fused; then writes, for a fixed batch, the logits, the
aux_loss transformers returns, greedy generate's tokens after two prompts, and the losses of 5 torch.optim.AdamW steps on cross-entropy + coef x aux; and of 5
steps as two data-parallel ranks take them (a row each, its own aux loss, the gradients averaged: DDP), which
shardwise runs with the experts over 2 ep ranks (and as 4 ranks take them, a row each of a batch of 4, for ep 4).
"check": loads the folders shardwise exported after its 5 steps (DIR/<family>_export, and DIR/mixtral_fused_export
with its experts fused) with from_pretrained, nothing missing or unexpected, and compares their logits with those
shardwise wrote beside them; the fused export must hold the names and shapes of transformers 5's state_dict.

transformers computes in fp64 here as shardwise does: its rotary tables and RMSNorms (hf_float64.py), its routers'
softmax (moe_reference.py's router_in_fp64) and its load_balancing_loss_func, whose float32 sums are made float64
below; the experts and the rest are transformers' own code.

usage: moe_checkpoints.py DIR prepare|check
"""
import json
import os
import shutil
import sys
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import (MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3MoeConfig,
                          Qwen3MoeForCausalLM)
from transformers.models.mixtral import modeling_mixtral
from transformers.models.qwen2_moe import modeling_qwen2_moe
from transformers.models.qwen3_moe import modeling_qwen3_moe

from hf_float64 import Float64Torch, in_float64
from moe_reference import router_in_fp64

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, SEQUENCE, EXPERTS, TOP_K, EXPERT_HIDDEN = 64, 32, 2, 4, 2, 8, 8, 2, 24
AUX_COEF, STEPS = 0.02, 5
TOLERANCE = 1e-12


def common():
    return dict(vocab_size=VOCAB, hidden_size=DIM, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                num_key_value_heads=KV_HEADS, max_position_embeddings=SEQUENCE, num_experts_per_tok=TOP_K,
                router_aux_loss_coef=AUX_COEF, output_router_logits=True, tie_word_embeddings=False,
                attn_implementation="sdpa", experts_implementation="eager")


FAMILIES = {
    "mixtral": (MixtralForCausalLM, lambda: MixtralConfig(**common(), intermediate_size=EXPERT_HIDDEN,
                                                          num_local_experts=EXPERTS, router_jitter_noise=0.0,
                                                          rms_norm_eps=1e-5)),
    "qwen3_moe": (Qwen3MoeForCausalLM, lambda: Qwen3MoeConfig(**common(), intermediate_size=48, num_experts=EXPERTS,
                                                              moe_intermediate_size=EXPERT_HIDDEN, head_dim=8,
                                                              norm_topk_prob=False)),
    "qwen2_moe": (Qwen2MoeForCausalLM, lambda: Qwen2MoeConfig(**common(), intermediate_size=48, num_experts=EXPERTS,
                                                              moe_intermediate_size=EXPERT_HIDDEN,
                                                              shared_expert_intermediate_size=40,
                                                              norm_topk_prob=False)),
}
MODULES = (modeling_mixtral, modeling_qwen2_moe, modeling_qwen3_moe)


def ids_of(step, targets, rows=2):  # the batches hf_checkpoint_load.cpp uses (inputs, not results)
    return torch.tensor([(step * 31 + i * 7 + (3 if targets else 0)) % VOCAB for i in range(rows * SEQUENCE)]).view(
        rows, SEQUENCE)


@contextmanager
def aux_loss_in_float64():
    """load_balancing_loss_func as transformers writes it, its float32 tensors and casts made float64."""
    saved_float = torch.Tensor.float
    saved = [m.torch for m in MODULES]
    torch.Tensor.float = lambda self, *args, **kwargs: self.double()
    for m in MODULES:
        m.torch = Float64Torch()
    try:
        yield
    finally:
        torch.Tensor.float = saved_float
        for m, t in zip(MODULES, saved):
            m.torch = t


GREEDY_PROMPTS, GREEDY_NEW = [[3, 17, 42], [9, 1, 60]], 5  # hf_checkpoint_load.cpp generates after the same


def greedy(model):
    """transformers' greedy generate (its cache, no stop token) after each prompt alone: [prompt][new token]."""
    model.generation_config.eos_token_id = None
    rows = []
    with torch.no_grad():
        for prompt in GREEDY_PROMPTS:
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 max_new_tokens=GREEDY_NEW, do_sample=False, pad_token_id=0)
            rows.append(out[0, len(prompt):].tolist())
    return np.array(rows, dtype=np.float64)


def randomize(model):
    """Values of order 0.2 (norm weights around 1), as hf_checkpoints.py: transformers' own initialization is too
    small for a wrong weight to show."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm_weight = "norm" in name and name.endswith("weight")
            p.copy_(1 + 0.1 * torch.randn_like(p) if norm_weight else 0.2 * torch.randn_like(p))


def in_fp64(model):
    model = in_float64(model)
    for module in model.modules():
        if type(module).__name__.endswith("TopKRouter"):
            type(module).forward = router_in_fp64
    return model


def loss_of(model, step, row=None, rows=2):
    """The training loss of batch `step` of `rows` rows (of its row `row` alone, as a data-parallel rank holding it
    computes it), its logits and its aux loss."""
    pick = slice(None) if row is None else slice(row, row + 1)
    with aux_loss_in_float64():
        out = model(ids_of(step, False, rows)[pick])
    logits = out.logits.reshape(-1, VOCAB)
    targets = ids_of(step, True, rows)[pick].reshape(-1)
    return F.cross_entropy(logits, targets) + AUX_COEF * out.aux_loss, logits, out.aux_loss


def train_data_parallel(model, directory, family, ranks=2):
    """5 steps as `ranks` data-parallel ranks take them, each one row of a batch of that many rows: each row's loss
    (its cross-entropy and its own aux loss) alone, the gradients averaged (torch's DistributedDataParallel), one
    AdamW step; writes each step's loss per row (<family>_dp_losses.npy for 2 ranks, _dp4_losses.npy for 4)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    losses = []
    for step in range(STEPS):
        rows = [loss_of(model, step, row, ranks)[0] for row in range(ranks)]
        (sum(rows) / ranks).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append([r.item() for r in rows])
    suffix = "_dp_losses.npy" if ranks == 2 else f"_dp{ranks}_losses.npy"
    np.save(os.path.join(directory, family + suffix), np.array(losses))


def prepare(directory):
    for family, (Model, config) in FAMILIES.items():
        torch.manual_seed(sorted(FAMILIES).index(family))
        model = Model(config()).double()
        randomize(model)
        model.save_pretrained(os.path.join(directory, family))
        if family == "mixtral":  # the experts fused, as transformers 5 holds them
            fused = os.path.join(directory, "mixtral_fused")
            os.makedirs(fused, exist_ok=True)
            save_file({k: v.contiguous() for k, v in model.state_dict().items()},
                      os.path.join(fused, "model.safetensors"), metadata={"format": "pt"})
            shutil.copy(os.path.join(directory, family, "config.json"), fused)
        model = in_fp64(model)
        np.save(os.path.join(directory, family + "_greedy.npy"), greedy(model))
        loss, logits, aux = loss_of(model, 0)
        np.save(os.path.join(directory, family + "_logits.npy"), logits.detach().numpy())
        np.save(os.path.join(directory, family + "_aux.npy"), aux.detach().reshape(1).numpy())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        losses = []
        for step in range(STEPS):
            loss, _, _ = loss_of(model, step)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            losses.append(loss.item())
        np.save(os.path.join(directory, family + "_losses.npy"), np.array(losses))
        for ranks in (2, 4):
            fresh = Model.from_pretrained(os.path.join(directory, family), attn_implementation="sdpa",
                                          experts_implementation="eager", dtype=torch.float64)
            train_data_parallel(in_fp64(fresh), directory, family, ranks)
    print(f"wrote {', '.join(FAMILIES)} and mixtral_fused into {directory}, with their logits, aux losses and losses")
    return 0


def same_layout(exported, reference):
    """Whether two safetensors files hold the same tensor names with the same shapes."""
    def layout(path):
        with safe_open(path, framework="pt") as f:
            return {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    return layout(exported) == layout(reference)


def check(directory):
    results = []
    fused_export = os.path.join(directory, "mixtral_fused_export", "model.safetensors")
    results.append(("mixtral_fused: shardwise's export of fused experts has the names and shapes of transformers 5's "
                    "state_dict", same_layout(fused_export, os.path.join(directory, "mixtral_fused",
                                                                         "model.safetensors")), 0.0))
    for family, exported in [(f, f) for f in FAMILIES] + [("mixtral", "mixtral_fused")]:
        Model = FAMILIES[family][0]
        folder = os.path.join(directory, exported + "_export")
        try:
            model, info = Model.from_pretrained(folder, attn_implementation="sdpa", experts_implementation="eager",
                                                dtype=torch.float64, output_loading_info=True)
            left = {k: v for k, v in info.items() if v}
            results.append((f"{exported}: shardwise's export loads with nothing missing or unexpected {left}", not left,
                            0.0))
            _, logits, _ = loss_of(in_fp64(model), 0)
            expected = torch.from_numpy(np.load(os.path.join(folder, "logits.npy")))
            error = (logits.detach() - expected).abs().max().item() / expected.abs().max().item()
            results.append((f"{exported}: shardwise's export (after 5 steps) in from_pretrained gives shardwise's "
                            "logits", error <= TOLERANCE, error))
        except Exception as e:  # a folder transformers cannot load is a failure, with its reason
            results.append((f"{exported}: shardwise's export in from_pretrained ({e})", False, float("nan")))
    for name, ok, error in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name} (relative error {error:.2g})")
    failed = sum(not ok for _, ok, _ in results)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(prepare(sys.argv[1]) if sys.argv[2] == "prepare" else check(sys.argv[1]))
