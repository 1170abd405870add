"""PyTorch's own FSDP2 (fully_shard) training the same Llama model as bench_fsdp: transformers'
LlamaForCausalLM (vocabulary 8192, dim 1024, 4 layers, 16 heads, 8 key-value heads, hidden 2816, fp32; --small:
the tests' size), fully_shard on each decoder layer and then the root (torchtitan's wrapping), gloo, one process
per dp rank with one thread each; torch.optim.AdamW with global-norm clipping. 4 sequences of 128 tokens per step
over the dp ranks, the same token ids as bench_fsdp. Attention is transformers' "eager" one (matmul, softmax,
matmul, as shardwise computes it). Prints one markdown row and a RESULT line for run_fsdp.sh.

usage: torch_fsdp.py [--dp 2] [--steps 5] [--warmup 1] [--small] [--reshard-after-forward 0|1]
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
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

try:
    from torch.distributed.fsdp import fully_shard  # noqa: E402
except ImportError:  # torch < 2.6
    from torch.distributed._composable.fsdp import fully_shard  # noqa: E402

SEQUENCES = 4


def shape_of(args):
    if args.small:
        return dict(vocabulary=64, dim=32, layers=2, heads=4, kv_heads=4, hidden=64, sequence=8)
    return dict(vocabulary=8192, dim=1024, layers=4, heads=16, kv_heads=8, hidden=2816, sequence=128)


def run(rank, world, port, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    s = shape_of(args)
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=s["vocabulary"], hidden_size=s["dim"], intermediate_size=s["hidden"],
                         num_hidden_layers=s["layers"], num_attention_heads=s["heads"],
                         num_key_value_heads=s["kv_heads"], max_position_embeddings=s["sequence"], rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
                         attn_implementation="eager", use_cache=False)
    model = LlamaForCausalLM(config).float()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward))
    fully_shard(model, mesh=mesh, reshard_after_forward=bool(args.reshard_after_forward))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    sequence, vocabulary = s["sequence"], s["vocabulary"]
    per = SEQUENCES // world
    rows = range(rank * per, (rank + 1) * per)
    ids = torch.tensor([[(b * 131 + t * 17) % vocabulary for t in range(sequence)] for b in rows])
    targets = torch.tensor([[(b * 131 + t * 17 + 1) % vocabulary for t in range(sequence)] for b in rows])

    times = []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        dist.barrier()
        if step >= args.warmup:
            times.append(time.perf_counter() - start)
    gathered = [None] * world
    dist.all_gather_object(gathered, statistics.median(times))
    if rank == 0:
        queue.put(gathered)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dp", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--reshard-after-forward", type=int, default=1)
    args = parser.parse_args()
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(run, args=(args.dp, free_port(), args, queue), nprocs=args.dp, join=True)
    median = max(queue.get())
    s = shape_of(args)
    tokens_per_second = SEQUENCES * s["sequence"] / median
    kind = "full shard" if args.reshard_after_forward else "shard-grad-op (reshard_after_forward=False)"
    print(f"| PyTorch {torch.__version__.split('+')[0]} fully_shard, dp {args.dp}, {kind}, gloo | "
          f"{median * 1e3:.1f} | {tokens_per_second:.0f} | |")
    print(f"RESULT torch_fsdp {args.reshard_after_forward} {tokens_per_second:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
