"""The PyTorch half of the outside check: PyTorch's own tensor parallelism (parallelize_module with
ColwiseParallel, RowwiseParallel, SequenceParallel, PrepareModuleInput, and loss_parallel) at TP 2 on gloo,
and PyTorch's own layers, fed the inputs and weights tp_dump wrote; every rank's local outputs and local
parameter gradients are compared with what shardwise computed. Nothing here is shared with the C++ side.

usage: tp_reference.py DUMP_DIR
"""
import math
import os
import socket
import sys

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, loss_parallel, parallelize_module)

TOLERANCE = 1e-10  # fp64 on both sides; only summation order differs
TOKENS, DIM, HIDDEN, HEADS, VOCAB = 8, 16, 32, 4, 24
# The integer inputs tp_dump.cpp uses (inputs, not results).
LOSS_PARALLEL_TARGETS = [3, 23, 0, 7, -100, 12, 12, 5]
EMBEDDING_IDS = [3, 23, 0, 7, 3, 12, 19, 5]
CROSS_ENTROPY_TARGETS = [1, 2, -100, 23, 0, 4, 4, 9]


def load(directory, name):
    return torch.from_numpy(np.load(os.path.join(directory, name + ".npy")))


def compare(results, name, got, expected):
    got = got.to_local() if isinstance(got, DTensor) else got
    got = got.detach().reshape(expected.shape)
    # Relative to the largest entry, floored at 1: some gradients are exactly zero in theory (a key bias does
    # not change a softmax) and both sides then hold rounding noise.
    scale = max(expected.abs().max().item(), 1.0)
    error = (got - expected).abs().max().item() / scale
    ok = error <= TOLERANCE
    results.append((name, ok, error))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Attention(nn.Module):
    """Causal multi-head attention; under TP each rank sees heads / tp of the heads (view(..., -1, head_dim))."""

    def __init__(self, dim, heads):
        super().__init__()
        self.head_dim = dim // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(dim, dim) for _ in range(4))

    def forward(self, x):
        tokens = x.shape[0]
        q, k, v = (p(x).view(tokens, -1, self.head_dim).transpose(0, 1) for p in (self.wq, self.wk, self.wv))
        scores = q @ k.transpose(1, 2) / math.sqrt(self.head_dim)
        mask = torch.triu(torch.ones(tokens, tokens, dtype=torch.bool), diagonal=1)
        probabilities = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.wo((probabilities @ v).transpose(0, 1).reshape(tokens, -1))


class NormFeedForward(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.feed_forward = MLP(dim, hidden)


def set_weights(linear, weight, bias=None):
    with torch.no_grad():
        linear.weight.copy_(weight)
        if bias is not None:
            linear.bias.copy_(bias)


def tensor_parallel(rank, port, directory, queue):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_default_dtype(torch.float64)
    mesh = init_device_mesh("cpu", (2,))
    results = []
    x, dy = load(directory, "x"), load(directory, "dy")

    mlp = MLP(DIM, HIDDEN)
    for name in ("w1", "w3", "w2"):
        set_weights(getattr(mlp, name), load(directory, f"mlp.{name}"))
    parallelize_module(mlp, mesh, {"w1": ColwiseParallel(), "w3": ColwiseParallel(), "w2": RowwiseParallel()})
    xi = x.clone().requires_grad_()
    y = mlp(xi)
    y.backward(dy)
    compare(results, f"mlp output, rank {rank}", y, load(directory, f"mlp.y.{rank}"))
    compare(results, f"mlp input gradient, rank {rank}", xi.grad, load(directory, f"mlp.dx.{rank}"))
    for name in ("w1", "w3", "w2"):
        compare(results, f"mlp {name} local gradient, rank {rank}", getattr(mlp, name).weight.grad,
                load(directory, f"mlp.{name}.grad.{rank}"))

    attention = Attention(DIM, HEADS)
    for name in ("wq", "wk", "wv", "wo"):
        set_weights(getattr(attention, name), load(directory, f"attention.{name}.weight"),
                    load(directory, f"attention.{name}.bias"))
    parallelize_module(attention, mesh, {"wq": ColwiseParallel(), "wk": ColwiseParallel(), "wv": ColwiseParallel(),
                                         "wo": RowwiseParallel()})
    xi = x.clone().requires_grad_()
    y = attention(xi)
    y.backward(dy)
    compare(results, f"attention output, rank {rank}", y, load(directory, f"attention.y.{rank}"))
    compare(results, f"attention input gradient, rank {rank}", xi.grad, load(directory, f"attention.dx.{rank}"))
    for name in ("wq", "wk", "wv", "wo"):
        layer = getattr(attention, name)
        compare(results, f"attention {name} local weight gradient, rank {rank}", layer.weight.grad,
                load(directory, f"attention.{name}.weight.grad.{rank}"))
        compare(results, f"attention {name} local bias gradient, rank {rank}", layer.bias.grad,
                load(directory, f"attention.{name}.bias.grad.{rank}"))

    block = NormFeedForward(DIM, HIDDEN)
    with torch.no_grad():
        block.norm.weight.copy_(load(directory, "sp.norm"))
    for name in ("w1", "w3", "w2"):
        set_weights(getattr(block.feed_forward, name), load(directory, f"sp.{name}"))
    parallelize_module(block, mesh, {
        "norm": SequenceParallel(sequence_dim=0),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(0)),
    })
    rows = TOKENS // 2
    xi = x[rank * rows:(rank + 1) * rows].clone().requires_grad_()
    y = block.feed_forward(block.norm(xi))
    y.backward(dy[rank * rows:(rank + 1) * rows])
    compare(results, f"sequence-parallel output, rank {rank}", y, load(directory, f"sp.y.{rank}"))
    compare(results, f"sequence-parallel input gradient, rank {rank}", xi.grad, load(directory, f"sp.dx.{rank}"))
    # PyTorch leaves the replicated norm weight's gradient Partial (each rank: the sum over its own tokens),
    # just as shardwise types it; compare the local partial sums, then the reduced gradient.
    grad = block.norm.weight.grad
    results.append((f"sequence-parallel norm gradient is Partial in PyTorch too, rank {rank}",
                    isinstance(grad, DTensor) and grad.placements[0].is_partial(), 0.0))
    compare(results, f"sequence-parallel norm local (partial) gradient, rank {rank}", grad,
            load(directory, f"sp.norm.partial_grad.{rank}"))
    compare(results, f"sequence-parallel norm reduced gradient, rank {rank}", grad.full_tensor(),
            load(directory, f"sp.norm.grad.{rank}"))
    compare(results, f"sequence-parallel w1 local gradient, rank {rank}", block.feed_forward.w1.weight.grad,
            load(directory, f"sp.w1.grad.{rank}"))
    compare(results, f"sequence-parallel w2 local gradient, rank {rank}", block.feed_forward.w2.weight.grad,
            load(directory, f"sp.w2.grad.{rank}"))

    logits = load(directory, "loss_parallel.logits")
    cols = VOCAB // 2
    local = logits[:, rank * cols:(rank + 1) * cols].clone().requires_grad_()
    sharded = DTensor.from_local(local, mesh, [Shard(1)])
    with loss_parallel():
        loss = F.cross_entropy(sharded, torch.tensor(LOSS_PARALLEL_TARGETS))
        loss.backward()
    compare(results, f"loss parallel loss, rank {rank}", loss.full_tensor().reshape(1),
            load(directory, f"loss_parallel.loss.{rank}"))
    compare(results, f"loss parallel local logit gradient, rank {rank}", local.grad,
            load(directory, f"loss_parallel.dlogits.{rank}"))

    queue.put(results)
    dist.barrier()  # both ranks past their last collective before gloo's teardown (see fsdp_reference.py)
    dist.destroy_process_group()


def unsharded(directory):
    torch.set_default_dtype(torch.float64)
    results = []
    x, dy_hidden, dy = load(directory, "layers.x"), load(directory, "layers.dy_hidden"), load(directory, "layers.dy")

    xi = x.clone().requires_grad_()
    weight = load(directory, "linear.weight").requires_grad_()
    bias = load(directory, "linear.bias").requires_grad_()
    y = F.linear(xi, weight, bias)
    y.backward(dy_hidden)
    compare(results, "Linear output", y, load(directory, "linear.y"))
    compare(results, "Linear input gradient", xi.grad, load(directory, "linear.dx"))
    compare(results, "Linear weight gradient", weight.grad, load(directory, "linear.weight.grad"))
    compare(results, "Linear bias gradient", bias.grad, load(directory, "linear.bias.grad"))

    xi = x.clone().requires_grad_()
    weight = load(directory, "layer_norm.weight").requires_grad_()
    bias = load(directory, "layer_norm.bias").requires_grad_()
    y = F.layer_norm(xi, (DIM,), weight, bias, eps=1e-5)
    y.backward(dy)
    compare(results, "LayerNorm output", y, load(directory, "layer_norm.y"))
    compare(results, "LayerNorm input gradient", xi.grad, load(directory, "layer_norm.dx"))
    compare(results, "LayerNorm weight gradient", weight.grad, load(directory, "layer_norm.weight.grad"))
    compare(results, "LayerNorm bias gradient", bias.grad, load(directory, "layer_norm.bias.grad"))

    xi = x.clone().requires_grad_()
    norm = nn.RMSNorm(DIM, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(load(directory, "rms_norm.weight"))
    y = norm(xi)
    y.backward(dy)
    compare(results, "RMSNorm output", y, load(directory, "rms_norm.y"))
    compare(results, "RMSNorm input gradient", xi.grad, load(directory, "rms_norm.dx"))
    compare(results, "RMSNorm weight gradient", norm.weight.grad, load(directory, "rms_norm.weight.grad"))

    table = load(directory, "embedding.weight").requires_grad_()
    y = F.embedding(torch.tensor(EMBEDDING_IDS), table)
    y.backward(dy)
    compare(results, "Embedding output", y, load(directory, "embedding.y"))
    compare(results, "Embedding weight gradient", table.grad, load(directory, "embedding.weight.grad"))

    logits = load(directory, "cross_entropy.logits").requires_grad_()
    loss = F.cross_entropy(logits, torch.tensor(CROSS_ENTROPY_TARGETS))
    loss.backward()
    compare(results, "cross-entropy loss", loss.reshape(1), load(directory, "cross_entropy.loss"))
    compare(results, "cross-entropy logit gradient", logits.grad, load(directory, "cross_entropy.dlogits"))
    return results


def main():
    directory = sys.argv[1]
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = mp.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=tensor_parallel, args=(rank, port, directory, queue)) for rank in range(2)]
    for p in processes:
        p.start()
    results = [r for _ in processes for r in queue.get(timeout=600)]
    for p in processes:
        p.join()
    if any(p.exitcode != 0 for p in processes):
        print("a PyTorch rank failed")
        return 1
    results += unsharded(directory)
    for name, ok, error in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: relative error {error:.1e}")
    failed = sum(1 for _, ok, _ in results if not ok)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
