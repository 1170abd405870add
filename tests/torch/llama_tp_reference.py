"""PyTorch's own tensor parallelism on the Llama model, against shardwise: transformers' LlamaForCausalLM, built
from the config llama_dump.cpp used and loaded with the weights it wrote, is sharded at TP 2 on gloo with
torch.distributed.tensor.parallel.parallelize_module and torchtitan's Llama plan (sequence parallelism, loss
parallelism) spelled with the Hugging Face module names; 5 steps of torch.optim.AdamW must give the losses
shardwise wrote for its own TP 2 + SP run (and for its unsharded run), fp32, 1e-4 relative. The logits of the
first batch are compared too. Nothing here is shared with the C++ side: PyTorch computes one side, shardwise the
other.

usage: llama_tp_reference.py DUMP_DIR
"""
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)
from transformers import LlamaConfig, LlamaForCausalLM

TOLERANCE = 1e-4
TP = 2
STEPS = 5
VOCAB, DIM, LAYERS, HEADS, KV_HEADS, HIDDEN, SEQUENCE, BATCH = 64, 32, 2, 4, 2, 64, 8, 2


def ids_of(step, targets):  # the batches llama_dump.cpp uses (inputs, not results)
    return torch.tensor([(step * 31 + i * 7 + (3 if targets else 0)) % 64 for i in range(16)]).view(BATCH, SEQUENCE)


def llama_config():
    return LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
                       num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQUENCE,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                       mlp_bias=False, attn_implementation="eager", use_cache=False)


def torchtitan_plan(model):
    """torchtitan's Llama TP plan (sequence parallel, loss parallel), on the Hugging Face module names."""
    parallel_styles = {
        # Token ids replicated in, activations cut along the sequence out.
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        # Gathers the sequence, keeps the logits cut along the vocabulary for loss_parallel.
        "lm_head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
    }
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        parallel_styles.update({
            p + "input_layernorm": SequenceParallel(),
            # The decoder layer calls its attention with keyword arguments only (hidden_states=...,
            # position_embeddings=..., attention_mask=...); only hidden_states changes layout, the rest (rotary
            # cos/sin over the whole sequence, the 4-d mask) pass through as plain tensors.
            p + "self_attn": PrepareModuleInput(input_kwarg_layouts={"hidden_states": Shard(1)},
                                                desired_input_kwarg_layouts={"hidden_states": Replicate()}),
            p + "self_attn.q_proj": ColwiseParallel(),
            p + "self_attn.k_proj": ColwiseParallel(),
            p + "self_attn.v_proj": ColwiseParallel(),
            p + "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
            p + "post_attention_layernorm": SequenceParallel(),
            p + "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            p + "mlp.gate_proj": ColwiseParallel(),
            p + "mlp.up_proj": ColwiseParallel(),
            p + "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        })
    return parallel_styles


def whole_sequence_inputs():
    """Inputs the sharded model needs in full: LlamaModel derives positions and the causal mask from its embedding
    output, which under this plan holds only this rank's piece of the sequence; given the positions and a
    prepared 4-d additive causal mask it uses them as they are."""
    positions = torch.arange(SEQUENCE).unsqueeze(0)
    blocked = torch.triu(torch.ones(SEQUENCE, SEQUENCE, dtype=torch.bool), diagonal=1)
    mask = torch.zeros(SEQUENCE, SEQUENCE).masked_fill(blocked, torch.finfo(torch.float32).min)
    return positions, mask.expand(BATCH, 1, SEQUENCE, SEQUENCE)


def local(t):
    return t.full_tensor() if isinstance(t, DTensor) else t


def rank_main(rank, directory, port, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    try:
        mesh = init_device_mesh("cpu", (TP,), mesh_dim_names=("tp",))
        torch.manual_seed(0)
        model = LlamaForCausalLM(llama_config()).float()
        state = {name: torch.from_numpy(np.load(os.path.join(directory, name + ".npy"))).float()
                 for name in model.state_dict() if os.path.exists(os.path.join(directory, name + ".npy"))}
        missing = [name for name in model.state_dict() if name not in state and "rotary" not in name]
        if missing:
            raise RuntimeError(f"weights missing from the dump: {missing}")
        model.load_state_dict(state, strict=False)
        parallelize_module(model, mesh["tp"], torchtitan_plan(model))
        for name, parameter in model.named_parameters():
            if not isinstance(parameter, DTensor):
                raise RuntimeError(f"parameter {name} was not distributed by the plan")
        q = model.model.layers[0].self_attn.q_proj.weight
        if q.to_local().shape[0] * TP != q.shape[0]:
            raise RuntimeError("q_proj is not cut over the heads")
        positions, mask = whole_sequence_inputs()

        def forward(ids):
            return model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits

        with torch.no_grad():
            first_logits = forward(ids_of(0, False))
            if not (isinstance(first_logits, DTensor) and first_logits.placements == (Shard(2),)):
                raise RuntimeError(f"logits are not cut along the vocabulary: {first_logits}")
            first_logits = first_logits.full_tensor().reshape(-1, VOCAB).numpy()

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
        losses = []
        for step in range(STEPS):
            logits = forward(ids_of(step, False))
            with loss_parallel():
                loss = F.cross_entropy(logits.flatten(0, 1), ids_of(step, True).flatten())
                optimizer.zero_grad()
                loss.backward()
            optimizer.step()
            losses.append(float(local(loss).item()))
        if rank == 0:
            queue.put((first_logits, losses))
    finally:
        dist.barrier()
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    directory = sys.argv[1]
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(rank_main, args=(directory, free_port(), queue), nprocs=TP, join=True)
    logits, losses = queue.get()

    results = []

    def compare(name, got, expected):
        scale = max(float(np.abs(expected).max()), 1e-30)
        error = float(np.abs(got - expected).max()) / scale
        results.append((name, error <= TOLERANCE, error))

    for tag in ("tp2_sp", "unsharded"):
        compare(f"logits, PyTorch TP 2 + SP against shardwise {tag}",
                np.load(os.path.join(directory, f"logits.{tag}.npy")), logits)
    for tag in ("tp2_sp", "unsharded"):
        ours = np.load(os.path.join(directory, f"losses.{tag}.npy")).reshape(-1)
        for step in range(STEPS):
            compare(f"loss at step {step} ({losses[step]:.6f}), PyTorch TP 2 + SP against shardwise {tag}",
                    np.array([ours[step]]), np.array([losses[step]]))

    for name, ok, error in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative error {error:.1e}")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
