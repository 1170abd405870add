"""The Hugging Face half of the save_pretrained loading check (hf_checkpoint_load.cpp is the shardwise half):
builds a small random transformers.LlamaForCausalLM, saves it with save_pretrained into DIR/single (one
model.safetensors) and into DIR/sharded (max_shard_size small enough for model.safetensors.index.json and
several files), and writes its logits for a fixed batch (2 sequences x 8 tokens, ids (i * 7 + 3) % 64) to
DIR/logits.npy. It also writes DIR/report.json: the missing and unexpected keys transformers'
load_state_dict(strict=False) reports when the 2-layer state dict goes into a 3-layer and a 1-layer model,
which shardwise's non-strict load must report alike. The same for a LlamaForCausalLM with
tie_word_embeddings=True (DIR/tied, DIR/tied_logits.npy) and a GPT2LMHeadModel (gelu_new, eager attention, no
dropout; DIR/gpt2 and, sharded, DIR/gpt2_sharded, DIR/gpt2_logits.npy): save_pretrained leaves the tied
lm_head.weight out of both, which is checked here. No download: the configs are built here.

usage: hf_checkpoints.py DIR
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors import safe_open
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, SEQUENCE = 64, 32, 64, 2, 4, 2, 8


def config(layers, tied=False):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=layers,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQUENCE,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied, attention_bias=False,
                       mlp_bias=False, attn_implementation="eager")


def gpt2_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=DIM, n_layer=LAYERS, n_head=HEADS,
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                      attn_implementation="eager")


def randomize(model):
    """transformers initializes with std 0.02 and norms at 1: logits that small would hide errors, and a norm of
    ones would hide one read wrong. Every parameter gets values of order 0.2 (norm weights around 1)."""
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied weight once
            norm_weight = ("norm" in name or ".ln_" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * torch.randn_like(p) if norm_weight else 0.2 * torch.randn_like(p))


def tensor_names(folder):
    names = set()
    for f in os.listdir(folder):
        if f.endswith(".safetensors"):
            with safe_open(os.path.join(folder, f), "np") as opened:
                names.update(opened.keys())
    return names


def save_logits(model, path):
    ids = torch.tensor([(i * 7 + 3) % VOCAB for i in range(2 * SEQUENCE)]).view(2, SEQUENCE)
    with torch.no_grad():
        logits = model(ids).logits.reshape(-1, VOCAB).double().numpy()
    np.save(path, logits)


def main():
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config(LAYERS)).float().eval()
    randomize(model)
    model.save_pretrained(os.path.join(directory, "single"))
    model.save_pretrained(os.path.join(directory, "sharded"), max_shard_size="20KB")
    shards = [f for f in os.listdir(os.path.join(directory, "sharded")) if f.endswith(".safetensors")]
    if not os.path.exists(os.path.join(directory, "sharded", "model.safetensors.index.json")) or len(shards) < 2:
        print(f"save_pretrained(max_shard_size='20KB') wrote no sharded folder: {sorted(shards)}")
        return 1

    save_logits(model, os.path.join(directory, "logits.npy"))

    state = model.state_dict()
    report = {}
    for layers in (3, 1):
        result = LlamaForCausalLM(config(layers)).load_state_dict(state, strict=False)
        report[str(layers)] = {"missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys)}
    with open(os.path.join(directory, "report.json"), "w") as f:
        json.dump(report, f, indent=1)

    # Tied: one table, saved once as model.embed_tokens.weight (GPT-2: transformer.wte.weight).
    tied = LlamaForCausalLM(config(LAYERS, tied=True)).float().eval()
    randomize(tied)
    if tied.lm_head.weight.data_ptr() != tied.model.embed_tokens.weight.data_ptr():
        print("LlamaForCausalLM(tie_word_embeddings=True) does not share lm_head.weight with embed_tokens")
        return 1
    tied.save_pretrained(os.path.join(directory, "tied"))
    save_logits(tied, os.path.join(directory, "tied_logits.npy"))
    gpt2 = GPT2LMHeadModel(gpt2_config()).float().eval()
    randomize(gpt2)
    gpt2.save_pretrained(os.path.join(directory, "gpt2"))
    gpt2.save_pretrained(os.path.join(directory, "gpt2_sharded"), max_shard_size="20KB")
    save_logits(gpt2, os.path.join(directory, "gpt2_logits.npy"))
    gpt2_shards = [f for f in os.listdir(os.path.join(directory, "gpt2_sharded")) if f.endswith(".safetensors")]
    if not os.path.exists(os.path.join(directory, "gpt2_sharded", "model.safetensors.index.json")) or \
            len(gpt2_shards) < 2:
        print(f"GPT-2 save_pretrained(max_shard_size='20KB') wrote no sharded folder: {sorted(gpt2_shards)}")
        return 1
    for folder in ("tied", "gpt2", "gpt2_sharded"):
        names = tensor_names(os.path.join(directory, folder))
        if "lm_head.weight" in names:
            print(f"{folder}: save_pretrained kept the tied lm_head.weight; the check expects it left out")
            return 1
    print(f"wrote {directory}/single, {directory}/sharded ({len(shards)} files), logits.npy, report.json, "
          f"{directory}/tied ({len(tensor_names(os.path.join(directory, 'tied')))} tensors), {directory}/gpt2 "
          f"({sorted(tensor_names(os.path.join(directory, 'gpt2')))}), {directory}/gpt2_sharded "
          f"({len(gpt2_shards)} files) and their logits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
