"""The PyTorch half of the outside check of FSDP: transformers' LlamaForCausalLM, built from the config
fsdp_dump.cpp used and loaded with the initial weights it wrote, sharded by PyTorch's FSDP2 (fully_shard on each
decoder layer, then on the root model, as torchtitan does) over 2 gloo processes on the CPU, each rank fed its own
sequences of the same batches, clipped by torch.nn.utils.clip_grad_norm_ and stepped by torch.optim.AdamW, gives
the same per-rank losses and their dp mean, the same global gradient norms (every step clipped) and the same
parameters after the 5 steps as shardwise's sw::fully_shard<fsdp_policy<full_shard, wrap_paths<"layers.*">>>.
Nothing is shared with the C++ side.

The same again under mixed precision: shardwise's mixed_precision<Eigen::bfloat16, float> against FSDP2's
MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32), to the bounds of BF16_TOLERANCES
(why they are looser is said there). And the FSDP checkpoint fsdp_dump saved, consolidated by `shardwise
consolidate`, loads in transformers with shardwise's trained parameters.

Tolerances (fp32): losses and norms |got - expected| / |expected| <= 1e-5 (measured: <= 3e-7); parameters after
training |got - expected| / (|expected| + rms of the tensor) <= 2e-4 elementwise, the shardwise Llama tests' own
measure (llama_cases::check_same_run; measured: <= 3e-5, in lm_head): Adam's m / sqrt(v) turns rounding-sized
gradient differences of near-zero gradients into larger update differences, so parameters agree less tightly
than losses.

Losses: each rank's loss is the mean cross-entropy over its own tokens; FSDP2 reduce-scatters the gradients with
an average over dp, as shardwise does, so with equal token counts per rank the dp mean of the losses is the whole
batch's mean and the gradients are the unsharded model's.

usage: fsdp_reference.py DUMP_DIR
"""
import os
import socket
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from transformers import LlamaConfig, LlamaForCausalLM

try:  # FSDP2's public home since torch 2.6; the composable namespace before
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
except ImportError:
    from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

# bf16: torch computes the whole forward and backward in bfloat16 (activations too); shardwise rounds only the
# gathered weights and computes in fp32 (Eigen has no bfloat16 GEMM worth using here), so the runs differ by
# bfloat16 activation rounding. Measured: losses 3.4e-4, norms 1.2e-3 relative; each parameter's 5-step update
# within 5.5e-2 of torch's update (2-norm of the difference over 2-norm of torch's update; Adam moves an element
# whose gradient is near zero by up to lr a step either way, so elementwise differences reach the update itself).
# The bounds are 2-3x those.
BF16_TOLERANCES = (1e-3, 3e-3, 0.1)
# (loss and norm relative, parameter |got - expected| / (|expected| + rms) elementwise), per run
TOLERANCES = {"fp32": (1e-5, 1e-5, 2e-4), "bf16": BF16_TOLERANCES}
VOCAB, DIM, LAYERS, SEQUENCE = 64, 32, 2, 8
DP, STEPS = 2, 5
LR, MAX_NORM = 3e-3, 0.1  # shardwise's AdamWOptions defaults otherwise: betas (0.9, 0.999), eps 1e-8, decay 0.01


def llama():
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=64, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=SEQUENCE,
                         rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                         mlp_bias=False, attn_implementation="eager")
    return LlamaForCausalLM(config).float()


def load(directory):
    return {name[:-4]: torch.from_numpy(np.load(os.path.join(directory, name))).float()
            for name in os.listdir(directory) if name.endswith(".npy")}


def load_initial(directory, name):
    return np.load(os.path.join(directory, "weights", name + ".npy"))


def train(rank, directory, out, run):
    """5 steps on this rank's sequences; rank 0 saves the losses of both ranks, the norms and the trained
    parameters (gathered whole) to `out`. run "bf16": MixedPrecisionPolicy(param_dtype=bfloat16,
    reduce_dtype=float32), torchtitan's default; the loss is taken on the logits widened to fp32."""
    mesh = init_device_mesh("cpu", (DP,), mesh_dim_names=("dp",))
    model = llama()
    model.load_state_dict(load(os.path.join(directory, "weights")), strict=True)  # untied: lm_head too
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if run == "bf16" \
        else MixedPrecisionPolicy()
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    # Sharded for real: every parameter a DTensor cut by rows over dp (the embedding's 64 rows: 32 here).
    sharded = all(isinstance(p, DTensor) and p.placements == (Shard(0),) for p in model.parameters())
    local_rows = model.model.embed_tokens.weight.to_local().shape[0]
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    ids = torch.from_numpy(np.load(os.path.join(directory, "ids.npy"))).long()  # [step, rank, sequence, token]
    targets = torch.from_numpy(np.load(os.path.join(directory, "targets.npy"))).long()
    losses, norms = [], []
    for step in range(STEPS):
        logits = model(input_ids=ids[step, rank]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets[step, rank].reshape(-1))  # mean over its tokens
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        # The global norm over every rank's shards; a plain tensor on torch 2.15, a DTensor on versions that
        # leave the shards' norms Partial (torchtitan's full_tensor()).
        norm = norm.full_tensor() if isinstance(norm, DTensor) else norm
        optimizer.step()
        optimizer.zero_grad()
        every_rank = [torch.zeros(()) for _ in range(DP)]
        dist.all_gather(every_rank, loss.detach())
        losses.append([float(l) for l in every_rank])
        norms.append(float(norm))
    final = {name: p.full_tensor().detach().numpy() for name, p in model.named_parameters()}  # collective
    if rank == 0:
        np.savez(out, losses=np.array(losses), norms=np.array(norms), sharded=sharded, local_rows=local_rows,
                 **{"final/" + name: value for name, value in final.items()})


def worker(rank, port, directory, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=DP)
    try:
        for run in TOLERANCES:
            train(rank, directory, out + "." + run + ".npz", run)
        # Both ranks past their last collective before gloo is torn down: without it one process in about ten
        # aborted in the teardown ("terminate called without an active exception", SIGABRT).
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def compare(run, torch_results, directory, rows, worst):
    """Appends (check, ok, detail) rows comparing shardwise's run (DIR/<run>/) with torch's."""
    loss_tolerance, norm_tolerance, parameter_tolerance = TOLERANCES[run]
    want_losses, want_norms = torch_results["losses"], torch_results["norms"]
    got_losses = np.load(os.path.join(directory, run, "losses.npy"))  # [step, rank]
    got_norms = np.load(os.path.join(directory, run, "norms.npy"))
    rows.append((f"{run}: torch's model is sharded (every parameter a DTensor Shard(0) over dp)",
                 bool(torch_results["sharded"]) and int(torch_results["local_rows"]) == VOCAB // DP,
                 f"embedding rows on rank 0: {int(torch_results['local_rows'])} of {VOCAB}"))
    for kind in ("loss", "norm", "parameter"):
        worst[run + " " + kind] = 0.0

    def relative(kind, name, got, want, tolerance):
        error = abs(got - want) / abs(want)
        worst[run + " " + kind] = max(worst[run + " " + kind], error)
        rows.append((f"{run}: {name}", error <= tolerance,
                     f"shardwise {got:.7f}, torch {want:.7f}, relative error {error:.1e}"))

    for step in range(STEPS):
        for rank in range(DP):
            relative("loss", f"loss of rank {rank} at step {step}", got_losses[step, rank], want_losses[step, rank],
                     loss_tolerance)
        relative("loss", f"loss (dp mean) at step {step}", got_losses[step].mean(), want_losses[step].mean(),
                 loss_tolerance)
        relative("norm", f"global norm at step {step}", got_norms[step], want_norms[step], norm_tolerance)
    rows.append((f"{run}: every step clipped (torch's norms over {MAX_NORM})", want_norms.min() > MAX_NORM,
                 f"smallest norm {want_norms.min():.3g}"))
    final = load(os.path.join(directory, run, "final"))
    names = sorted(name[len("final/"):] for name in torch_results if name.startswith("final/"))
    rows.append((f"{run}: the same parameters on both sides", sorted(final) == names,
                 f"{len(final)} from shardwise, {len(names)} from torch"))
    for name in names:
        want = torch_results["final/" + name]
        got = final[name].numpy() if name in final else None
        ok = got is not None and got.shape == want.shape
        initial = load_initial(directory, name)
        moved = float(np.abs(want - initial).max())
        if run == "fp32":
            rms = float(np.sqrt(np.mean(want.astype(np.float64) ** 2)))
            error = float((np.abs(got - want) / (np.abs(want) + rms)).max()) if ok else float("inf")
            measure = "max |difference| / (|torch| + rms)"
        else:  # the training's updates, as a whole: Adam moves near-zero gradients by up to lr a step either way
            update = (want - initial).astype(np.float64)
            error = float(np.linalg.norm(got - want) / np.linalg.norm(update)) if ok else float("inf")
            measure = "|difference| / |torch's update| (2-norms)"
        worst[run + " parameter"] = max(worst[run + " parameter"], error)
        rows.append((f"{run}: {name} after {STEPS} steps", ok and error <= parameter_tolerance,
                     f"{measure} {error:.1e} (training moved it by up to {moved:.1e})"))


def consolidated_rows(directory, final):
    """The FSDP checkpoint, consolidated by `shardwise consolidate --names transformers-llama
    --remove-checkpoint-dir` into hf/model.safetensors, loads in transformers (from_pretrained, no missing or
    unexpected tensor) and holds shardwise's trained parameters exactly."""
    hf = os.path.join(directory, "hf")
    rows = [("--remove-checkpoint-dir removed the sharded checkpoint",
             not os.path.exists(os.path.join(directory, "checkpoint")), os.path.join(directory, "checkpoint"))]
    if not os.path.exists(os.path.join(hf, "model.safetensors")):
        return rows + [("shardwise consolidate wrote hf/model.safetensors", False,
                        "missing: is the shardwise command built (libcli11-dev)?")]
    llama().config.save_pretrained(hf)  # the config; the weights are shardwise's alone
    model, info = LlamaForCausalLM.from_pretrained(hf, output_loading_info=True)
    rows.append(("transformers' from_pretrained loads the consolidated FSDP checkpoint",
                 not info["missing_keys"] and not info["unexpected_keys"],
                 f"missing {sorted(info['missing_keys'])}, unexpected {sorted(info['unexpected_keys'])}"))
    loaded = {name: p.detach().float().numpy() for name, p in model.named_parameters()}
    equal = [name for name in final if name in loaded and np.array_equal(loaded[name], final[name].numpy())]
    rows.append(("the loaded parameters are shardwise's trained ones, to the bit", len(equal) == len(final),
                 f"{len(equal)} of {len(final)} equal"))
    return rows


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    directory = sys.argv[1]
    rows, worst = [], {}
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "torch")
        mp.spawn(worker, args=(free_port(), directory, out), nprocs=DP, join=True)
        for run in TOLERANCES:
            with np.load(out + "." + run + ".npz") as saved:
                compare(run, {name: saved[name] for name in saved.files}, directory, rows, worst)
    final = load(os.path.join(directory, "fp32", "final"))
    rows += consolidated_rows(directory, final)
    for name, ok, detail in rows:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    for run in TOLERANCES:
        print(f"{run}: worst loss relative error {worst[run + ' loss']:.1e}, worst norm relative error "
              f"{worst[run + ' norm']:.1e}, worst parameter error {worst[run + ' parameter']:.1e}")
    failed = sum(1 for _, ok, _ in rows if not ok)
    print(f"{len(rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
