"""The Hugging Face half of the save_pretrained loading check (hf_checkpoint_load.cpp is the shardwise half):
builds a small random transformers.LlamaForCausalLM, saves it with save_pretrained into DIR/single (one
model.safetensors) and into DIR/sharded (max_shard_size small enough for model.safetensors.index.json and
several files), and writes its logits for a fixed batch (2 sequences x 8 tokens, ids (i * 7 + 3) % 64) to
DIR/logits.npy. It also writes DIR/report.json: the missing and unexpected keys transformers'
load_state_dict(strict=False) reports when the 2-layer state dict goes into a 3-layer and a 1-layer model,
which shardwise's non-strict load must report alike. No download: the config is built here.

usage: hf_checkpoints.py DIR
"""
import json
import os
import sys

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, SEQUENCE = 64, 32, 64, 2, 4, 2, 8


def config(layers):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=layers,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQUENCE,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                       mlp_bias=False, attn_implementation="eager")


def main():
    directory = sys.argv[1]
    os.makedirs(directory, exist_ok=True)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config(LAYERS)).float().eval()
    # transformers initializes with std 0.02 and norms at 1: logits that small would hide errors, and a norm of
    # ones would hide one read wrong. Every parameter gets values of order 0.2 (norms around 1).
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.1 * torch.randn_like(p) if "norm" in name else 0.2 * torch.randn_like(p))
    model.save_pretrained(os.path.join(directory, "single"))
    model.save_pretrained(os.path.join(directory, "sharded"), max_shard_size="20KB")
    shards = [f for f in os.listdir(os.path.join(directory, "sharded")) if f.endswith(".safetensors")]
    if not os.path.exists(os.path.join(directory, "sharded", "model.safetensors.index.json")) or len(shards) < 2:
        print(f"save_pretrained(max_shard_size='20KB') wrote no sharded folder: {sorted(shards)}")
        return 1

    ids = torch.tensor([(i * 7 + 3) % VOCAB for i in range(2 * SEQUENCE)]).view(2, SEQUENCE)
    with torch.no_grad():
        logits = model(ids).logits.reshape(-1, VOCAB).double().numpy()
    np.save(os.path.join(directory, "logits.npy"), logits)

    state = model.state_dict()
    report = {}
    for layers in (3, 1):
        result = LlamaForCausalLM(config(layers)).load_state_dict(state, strict=False)
        report[str(layers)] = {"missing": sorted(result.missing_keys), "unexpected": sorted(result.unexpected_keys)}
    with open(os.path.join(directory, "report.json"), "w") as f:
        json.dump(report, f, indent=1)
    print(f"wrote {directory}/single, {directory}/sharded ({len(shards)} files), logits.npy and report.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
