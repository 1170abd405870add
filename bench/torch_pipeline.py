"""PyTorch's torch.distributed.pipelining training the same Llama model as bench_pipeline at pp 2: transformers'
LlamaForCausalLM (vocabulary 256, dim 1024, 4 layers, 16 heads, 8 key-value heads, hidden 2816, fp32) split into
two stages (the embedding and layers 0-1; layers 2-3, the final norm and lm_head), PipelineStage and
Schedule1F1B (or, with --schedule zbh1, ScheduleInterleavedZeroBubble at one stage per rank: ZB-H1, its backward
split into input and weight gradients; with --schedule zbv, ScheduleZBVZeroBubble on four stages of one layer,
rank r holding stages r and 3 - r) with 8 microbatches of one 128-token sequence, gloo, one process per stage with one thread each;
torch.optim.AdamW with global-norm clipping over both stages. Prints the median step time after warm-up and a
RESULT line (tokens/s) for run_pipeline.sh. Attention is transformers' "eager" one, as in torch_train_llama.py.

usage: torch_pipeline.py [--steps 3] [--warmup 1] [--small] [--schedule 1f1b|zbh1|zbv|dualpipev]
"""
import argparse
import os

for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import socket  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.pipelining import (  # noqa: E402
    PipelineStage,
    Schedule1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleDualPipeV,
    ScheduleZBVZeroBubble,
)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

MICROBATCHES = 8


def shape_of(small):
    if small:  # bench_pipeline --small: the tests' size
        return dict(vocabulary=64, dim=32, layers=4, heads=4, kv_heads=4, hidden=64, sequence=8, sequences=8)
    return dict(vocabulary=256, dim=1024, layers=4, heads=16, kv_heads=8, hidden=2816, sequence=128, sequences=8)


class Stage(torch.nn.Module):
    """Layers [first, last) of the model, with the embedding on the first stage and the head on the last."""

    def __init__(self, model, first, last, sequence):
        super().__init__()
        inner = model.model
        self.embed = inner.embed_tokens if first == 0 else None
        self.layers = torch.nn.ModuleList(inner.layers[first:last])
        self.rotary = inner.rotary_emb
        self.norm = inner.norm if last == len(inner.layers) else None
        self.head = model.lm_head if last == len(inner.layers) else None
        causal = torch.tril(torch.ones(sequence, sequence, dtype=torch.bool))
        self.register_buffer("mask", torch.zeros(1, 1, sequence, sequence).masked_fill(~causal, torch.finfo(torch.float32).min),
                             persistent=False)
        self.register_buffer("positions", torch.arange(sequence).unsqueeze(0), persistent=False)

    def forward(self, x):
        h = self.embed(x) if self.embed is not None else x
        rope = self.rotary(h, self.positions)
        for layer in self.layers:
            h = layer(h, attention_mask=self.mask, position_ids=self.positions, position_embeddings=rope)
        return self.head(self.norm(h)) if self.head is not None else h


def run(rank, world, port, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = shape_of(args.small)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=s["vocabulary"], hidden_size=s["dim"], intermediate_size=s["hidden"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=s["sequence"], rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         attn_implementation="eager", use_cache=False)
    model = LlamaForCausalLM(config).float()
    if args.schedule in ("zbv", "dualpipev"):  # two stages per rank in the V: rank r holds stages r and 2 world - 1 - r
        indices = (rank, 2 * world - 1 - rank)
        per_stage = s["layers"] // (2 * world)
        modules = [Stage(model, i * per_stage, (i + 1) * per_stage, s["sequence"]) for i in indices]
        stages = [PipelineStage(m, i, 2 * world, torch.device("cpu")) for m, i in zip(modules, indices)]
    else:
        per_stage = s["layers"] // world
        modules = [Stage(model, rank * per_stage, (rank + 1) * per_stage, s["sequence"])]
        stages = [PipelineStage(modules[0], rank, world, torch.device("cpu"))]
    del model
    stage_module = torch.nn.ModuleList(modules)
    holds_first = any(stage.stage_index == 0 for stage in stages)
    holds_last = any(stage.stage_index == stage.num_stages - 1 for stage in stages)

    def loss_fn(logits, targets):
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    if args.schedule == "zbv":
        schedule = ScheduleZBVZeroBubble(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    elif args.schedule == "dualpipev":
        schedule = ScheduleDualPipeV(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    elif args.schedule == "zbh1":
        schedule = ScheduleInterleavedZeroBubble(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    else:
        schedule = Schedule1F1B(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(stage_module.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    sequence, sequences, vocabulary = s["sequence"], s["sequences"], s["vocabulary"]
    ids = torch.tensor([[(b * 131 + t * 17) % vocabulary for t in range(sequence)] for b in range(sequences)])
    targets = torch.tensor([[(b * 131 + t * 17 + 1) % vocabulary for t in range(sequence)] for b in range(sequences)])
    times, losses = [], []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        step_losses = []
        inputs = (ids,) if holds_first else ()  # under ZBV and DualPipeV rank 0 holds the first stage and the last
        schedule.step(*inputs, **(dict(target=targets, losses=step_losses) if holds_last else {}))
        # Global-norm clipping over both stages (torchtitan's way): the squares summed across the pipeline.
        grads = [p.grad for p in stage_module.parameters() if p.grad is not None]
        squares = torch.stack([g.pow(2).sum() for g in grads]).sum()
        dist.all_reduce(squares)
        scale = min(1.0, 1.0 / (float(squares.sqrt()) + 1e-6))
        for g in grads:
            g.mul_(scale)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        if holds_last:
            losses.append(float(torch.stack(step_losses).detach().mean()))
    report = dict(rank=rank, median=statistics.median(times), losses=losses)
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        queue.put(gathered)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--schedule", choices=("1f1b", "zbh1", "zbv", "dualpipev"), default="1f1b")
    args = parser.parse_args()
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(2, free_port(), args, queue), nprocs=2, join=True)
    reports = queue.get()
    s = shape_of(args.small)
    median = max(r["median"] for r in reports)
    tokens_per_second = s["sequences"] * s["sequence"] / median
    losses = next(r["losses"] for r in reports if r["losses"])
    name = {"1f1b": "Schedule1F1B", "zbh1": "ScheduleInterleavedZeroBubble", "zbv": "ScheduleZBVZeroBubble",
            "dualpipev": "ScheduleDualPipeV"}[args.schedule]
    print(f"# PyTorch {torch.__version__.split('+')[0]} pipelining: {name}, pp 2, {MICROBATCHES} microbatches, "
          f"gloo, 2 processes x 1 thread; median of {args.steps} steps after {args.warmup} warm-up: "
          f"{median * 1e3:.0f} ms, {tokens_per_second:.0f} tokens/s; loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    print(f"RESULT torch_pp2_{args.schedule}_m8 {tokens_per_second:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
