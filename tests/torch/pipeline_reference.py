"""The PyTorch half of the outside check of pipeline training: transformers' LlamaForCausalLM, built from the
config pipeline_dump.cpp used and loaded with the initial weights it wrote, split into stage 0 = embed_tokens +
layers[0:2] and stage 1 = layers[2:4] + norm + lm_head, run by torch.distributed.pipelining (PipelineStage,
ScheduleGPipe and Schedule1F1B) on 2 gloo processes with the same microbatches in the same order, global-norm
clipping over both stages (the squared norms all-reduced, as torchtitan does) and torch.optim.AdamW, gives the
same 5 step losses and global norms as shardwise's pipeline training with GPipe and 1F1B. Nothing is shared with
the C++ side. Relative error per step: |got - expected| / |expected| <= 1e-4 (fp32).

Loss scaling: the schedules call loss_fn on each microbatch (mean cross-entropy over its tokens), run backward
on that unscaled loss and divide the accumulated gradients by n_microbatches after the last backward
(scale_grads=True); the losses they hand back are the unscaled ones, so a step's loss is their mean. shardwise
scales each microbatch's loss gradient by 1/microbatches before its backward instead: the same sums up to rounding.

usage: pipeline_reference.py DUMP_DIR
"""
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.masking_utils import create_causal_mask

TOLERANCE = 1e-4
VOCAB, DIM, LAYERS, SEQUENCE = 64, 32, 4, 8
STAGES, MICROBATCHES, STEPS = 2, 4, 5
LR, MAX_NORM = 3e-3, 0.5  # shardwise's AdamWOptions defaults otherwise: betas (0.9, 0.999), eps 1e-8, decay 0.01
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def llama():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQUENCE,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                         mlp_bias=False, attn_implementation="eager")
    return LlamaForCausalLM(config).float()


class Stage(nn.Module):
    """Blocks [first, last) of a LlamaForCausalLM; the embedding on the first stage, norm and lm_head on the last.
    Positions, causal mask and rotary embeddings are computed here as LlamaModel.forward computes them."""

    def __init__(self, model, first, last):
        super().__init__()
        self.config = model.config
        self.embed_tokens = model.model.embed_tokens if first == 0 else None
        self.layers = nn.ModuleList(model.model.layers[first:last])
        self.rotary_emb = model.model.rotary_emb
        self.norm = model.model.norm if last == LAYERS else None
        self.lm_head = model.lm_head if last == LAYERS else None

    def forward(self, x):
        h = self.embed_tokens(x) if self.embed_tokens is not None else x
        positions = torch.arange(h.shape[1]).unsqueeze(0)
        mask = create_causal_mask(config=self.config, inputs_embeds=h, attention_mask=None, cache=None,
                                  position_ids=positions)
        rotary = self.rotary_emb(h, position_ids=positions)
        for layer in self.layers:
            h = layer(h, attention_mask=mask, position_embeddings=rotary, position_ids=positions)
        return self.lm_head(self.norm(h)) if self.lm_head is not None else h


def loss_fn(logits, targets):  # one microbatch's mean cross-entropy over its tokens
    return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def train(rank, directory, schedule_name):
    """One schedule's 5 steps on this rank's stage; the losses (last stage) and the global norms."""
    model = llama()
    weights = os.path.join(directory, "weights")
    state = {name[:-4]: torch.from_numpy(np.load(os.path.join(weights, name))).float() for name in os.listdir(weights)}
    model.load_state_dict(state, strict=True)  # untied: every tensor, lm_head too
    half = LAYERS // STAGES
    module = Stage(model, rank * half, (rank + 1) * half)
    stage = PipelineStage(module, rank, STAGES, torch.device("cpu"))
    schedule = SCHEDULES[schedule_name](stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    parameters = list(module.parameters())
    optimizer = torch.optim.AdamW(parameters, lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    run = os.path.join(directory, schedule_name)
    ids = torch.from_numpy(np.load(os.path.join(run, "ids.npy"))).long()  # [step, microbatch, sequence, token]
    targets = torch.from_numpy(np.load(os.path.join(run, "targets.npy"))).long()
    losses, norms = [], []
    for step in range(STEPS):
        optimizer.zero_grad()
        microbatch_losses = []
        if stage.is_first:
            schedule.step(arg_mbs=[(ids[step, m],) for m in range(MICROBATCHES)])
        else:
            schedule.step(target_mbs=[targets[step, m] for m in range(MICROBATCHES)], losses=microbatch_losses)
        # Clipping over both stages: each stage's squared norm, summed over the ranks.
        squares = torch.nn.utils.get_total_norm([p.grad for p in parameters]).double() ** 2
        dist.all_reduce(squares)
        norm = squares.sqrt()
        torch.nn.utils.clip_grads_with_norm_(parameters, MAX_NORM, norm.float())
        optimizer.step()
        norms.append(float(norm))
        if stage.is_last:
            losses.append(sum(float(l.detach()) for l in microbatch_losses) / MICROBATCHES)
    return losses, norms


def worker(rank, port, directory, results):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=STAGES)
    try:
        for name in SCHEDULES:
            losses, norms = train(rank, directory, name)
            if rank == STAGES - 1:
                results.put((name, losses, norms))
            dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    directory = sys.argv[1]
    results = mp.get_context("spawn").SimpleQueue()
    mp.spawn(worker, args=(free_port(), directory, results), nprocs=STAGES, join=True)
    expected = {}
    while not results.empty():
        name, losses, norms = results.get()
        expected[name] = (losses, norms)
    rows, worst = [], 0.0
    for name in SCHEDULES:
        got_losses = np.load(os.path.join(directory, name, "losses.npy"))
        got_norms = np.load(os.path.join(directory, name, "norms.npy"))
        losses, norms = expected[name]
        for step in range(STEPS):
            for kind, got, want in (("loss", got_losses[step], losses[step]), ("global norm", got_norms[step],
                                                                              norms[step])):
                error = abs(got - want) / abs(want)
                worst = max(worst, error)
                rows.append((f"{name}: {kind} at step {step}", error <= TOLERANCE,
                             f"shardwise {got:.7f}, torch {want:.7f}, relative error {error:.1e}"))
        rows.append((f"{name}: every step clipped (torch's norms over {MAX_NORM})", min(norms) > MAX_NORM,
                     f"smallest norm {min(norms):.3g}"))
    for name, ok, detail in rows:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    print(f"worst relative error: {worst:.1e}")
    failed = sum(1 for _, ok, _ in rows if not ok)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
