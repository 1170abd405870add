"""PyTorch's own tensor parallelism training the same Llama model as bench_train_llama: transformers'
LlamaForCausalLM (vocabulary 2048, dim 256, 4 layers, 8 heads, 4 key-value heads, hidden 704, fp32), sharded
with parallelize_module and torchtitan's Llama plan (sequence parallel, loss parallel) on gloo, one process per
rank with one thread each (torch's and the BLAS library's); torch.optim.AdamW with global-norm clipping.
8 sequences of 128 tokens per step, the same token ids as bench_train_llama. Prints one markdown row (median step
time after warm-up -> tokens/s, and per-rank memory) and a RESULT line for run_train_llama.sh. Attention is
transformers' "eager" one (matmul, softmax, matmul, as shardwise computes it), which ran faster here at this size
than "sdpa" given the same explicit causal mask.

usage: torch_train_llama.py [--tp 2] [--steps 10] [--warmup 2] [--attention eager|sdpa] [--smoke] [--no-header]
       [--vocabulary N] [--dim N] [--layers N] [--heads N] [--kv-heads N] [--hidden N] [--sequence N] [--sequences N]
"""
import argparse
import os

for variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(variable, "1")

import resource  # noqa: E402
import socket  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.tensor import DTensor, Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,  # noqa: E402
                                               SequenceParallel, loss_parallel, parallelize_module)
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

MIB = 1024.0 * 1024.0


SHAPE_FLAGS = ("vocabulary", "dim", "layers", "heads", "kv_heads", "hidden", "sequence", "sequences")


def shape_of(args):
    if args.smoke:
        return dict(vocabulary=64, dim=32, layers=1, heads=8, kv_heads=4, hidden=64, sequence=8, sequences=4)
    shape = dict(vocabulary=2048, dim=256, layers=4, heads=8, kv_heads=4, hidden=704, sequence=128, sequences=8)
    shape.update({name: getattr(args, name) for name in SHAPE_FLAGS if getattr(args, name) is not None})
    return shape


def plan(model):
    """torchtitan's Llama plan on the Hugging Face module names."""
    styles = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "model.norm": SequenceParallel(),
        "lm_head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False),
    }
    for i in range(len(model.model.layers)):
        p = f"model.layers.{i}."
        styles.update({
            p + "input_layernorm": SequenceParallel(),
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
    return styles


def rss_mib(field):  # VmRSS (now) or VmHWM (peak) of this process
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def local_numel(tensors):
    return sum((t.to_local() if isinstance(t, DTensor) else t).numel() for t in tensors)


def run(rank, world, port, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = shape_of(args)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=s["vocabulary"], hidden_size=s["dim"], intermediate_size=s["hidden"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=s["sequence"], rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         attn_implementation=args.attention, use_cache=False)
    baseline = rss_mib("VmRSS")
    model = LlamaForCausalLM(config).float()
    if world > 1:
        parallelize_module(model, mesh["tp"], plan(model))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    sequence, sequences, vocabulary = s["sequence"], s["sequences"], s["vocabulary"]
    ids = torch.tensor([[(b * 131 + t * 17) % vocabulary for t in range(sequence)] for b in range(sequences)])
    targets = torch.tensor([[(b * 131 + t * 17 + 1) % vocabulary for t in range(sequence)] for b in range(sequences)])
    # The whole sequence's positions and causal mask, given explicitly: under sequence parallelism the embedding
    # output LlamaModel would derive them from holds only this rank's piece of the sequence.
    positions = torch.arange(sequence).unsqueeze(0)
    causal = torch.tril(torch.ones(sequence, sequence, dtype=torch.bool))
    if args.attention == "eager":
        mask = torch.zeros(sequence, sequence).masked_fill(~causal, torch.finfo(torch.float32).min)
    else:
        mask = causal  # scaled_dot_product_attention: True attends
    mask = mask.expand(sequences, 1, sequence, sequence)

    times, losses = [], []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.autocast):
            logits = model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=False).logits
        with loss_parallel():
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0, foreach=True)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)  # keep the gradients allocated, as shardwise does, for the memory
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
        losses.append(float((loss.full_tensor() if isinstance(loss, DTensor) else loss).item()))

    parameters = local_numel(model.parameters())
    gradients = local_numel(p.grad for p in model.parameters() if p.grad is not None)
    state = local_numel(v for st in optimizer.state.values() for v in st.values()
                        if torch.is_tensor(v) and v.dim() > 0)
    report = dict(rank=rank, median=statistics.median(times), fastest=min(times), slowest=max(times), parameters=parameters, gradients=gradients,
                  state=state, baseline=baseline, peak=rss_mib("VmHWM"), first_loss=losses[0], last_loss=losses[-1])
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
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--attention", choices=("eager", "sdpa"), default="eager")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--autocast", action="store_true",
                        help="the forward under torch.autocast('cpu', torch.bfloat16): bf16 products, fp32 parameters")
    for name in SHAPE_FLAGS:  # the model and batch, as bench_train_llama takes them
        parser.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    parser.add_argument("--no-header", action="store_true", help="the row without the table's header")
    args = parser.parse_args()
    if args.smoke:
        args.steps, args.warmup = 1, 1
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(args.tp, free_port(), args, queue), nprocs=args.tp, join=True)
    reports = queue.get()
    s = shape_of(args)
    median = max(r["median"] for r in reports)  # ranks wait for each other at the barriers: these are equal
    tokens_per_second = s["sequences"] * s["sequence"] / median
    r0 = reports[0]
    held = (r0["parameters"] + r0["gradients"] + r0["state"]) * 4 / MIB
    how = (f"parallelize_module with torchtitan's plan (sequence + loss parallel), gloo, {args.tp} processes x 1 "
           f"thread" if args.tp > 1 else "not parallelized, 1 process x 1 thread")
    print(f"# PyTorch {torch.__version__.split('+')[0]} TP {args.tp}: transformers LlamaForCausalLM, {how}, "
          f"attention {args.attention}{', bf16 autocast' if args.autocast else ''}, AdamW + clipping, median of {args.steps} steps after "
          f"{args.warmup} warm-up (fastest {r0['fastest'] * 1e3:.0f} ms, slowest {r0['slowest'] * 1e3:.0f} ms); "
          f"loss {r0['first_loss']:.4f} -> {r0['last_loss']:.4f}")
    if not args.no_header:
        print("| run | tokens/s | step ms | parameters / rank | gradients / rank | optimizer state / rank | "
          "held MiB / rank | peak RSS MiB / rank (before the model) |")
        print("|---|---|---|---|---|---|---|---|")
    peaks = ", ".join(f"{r['peak']:.0f} ({r['baseline']:.0f})" for r in reports)
    name = f"PyTorch TP {args.tp} (sequence parallel, gloo)" if args.tp > 1 else "PyTorch TP 1 (not parallelized)"
    print(f"| {name} | {tokens_per_second:.0f} | {median * 1e3:.1f} | "
          f"{r0['parameters']} | {r0['gradients']} | {r0['state']} | {held:.1f} | {peaks} |")
    print(f"RESULT torch_tp{args.tp} {tokens_per_second:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
