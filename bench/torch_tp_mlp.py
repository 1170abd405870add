"""PyTorch's own tensor parallelism on the same MLP as bench_tp_mlp: parallelize_module with w1, w3
ColwiseParallel and w2 RowwiseParallel, gloo, TP 2, one thread per rank (torch's and the BLAS library's).
Prints the median step time and tokens/s.

usage: torch_tp_mlp.py [--tokens 2048] [--dim 1024] [--hidden 4096] [--repeats 5]
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def run(rank, world, port, args, queue):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    mlp = MLP(args.dim, args.hidden)
    parallelize_module(mlp, mesh, {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()})
    x = torch.randn(args.tokens, args.dim, requires_grad=True)
    dy = torch.randn(args.tokens, args.dim)
    times = []
    for i in range(args.repeats + 1):
        dist.barrier()
        start = time.perf_counter()
        mlp(x).backward(dy)
        dist.barrier()
        if i:  # the first is warm-up
            times.append(time.perf_counter() - start)
    if rank == 0:
        queue.put(statistics.median(times))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=run, args=(r, 2, port, args, queue)) for r in range(2)]
    for p in procs:
        p.start()
    t = queue.get(timeout=1800)
    for p in procs:
        p.join()
    print(f"torch {torch.__version__}: TP 2, {t * 1e3:.1f} ms/step, {args.tokens / t:.0f} tokens/s")
    print(f"RESULT torch_tp2_tokens_per_s {args.tokens / t:.1f}")


if __name__ == "__main__":
    main()
