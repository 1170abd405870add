"""The mixture-of-experts training run bench_moe measures, with transformers and torch: MixtralForCausalLM (its eager
experts: a loop over the experts, each on the tokens routed to it) or, with --dense, LlamaForCausalLM, from_pretrained
of the same folder in fp32; torch.optim.AdamW with clip_grad_norm_ on the cross-entropy plus router_aux_loss_coef x
the load-balancing loss; the same batch (bench_moe's formula), the whole batch in one process on --threads threads;
then save_pretrained and from_pretrained back. Prints one markdown row (median step -> tokens/s; load, save and reload
seconds; peak resident set above the start) and a RESULT line for run_moe.sh.

usage: torch_moe.py --folder DIR [--dense] [--threads N] [--steps N] [--sequences N] [--out DIR]
       torch_moe.py --write-folder DIR [--dense] [--vocabulary N] [--dim N] [--layers N] [--heads N]
                    [--kv-heads N] [--experts N] [--top-k N] [--expert-hidden N] [--sequence N]
"""
import argparse
import resource
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

MIB = 1024.0 * 1024.0


def write_folder(args):
    """A random Mixtral of the given sizes, or (--dense) the dense Llama of the same active parameters per token (its
    hidden width top_k x expert_hidden), as save_pretrained writes them."""
    torch.manual_seed(0)
    common = dict(vocab_size=args.vocabulary, hidden_size=args.dim, num_hidden_layers=args.layers,
                  num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                  max_position_embeddings=args.sequence, tie_word_embeddings=False, rms_norm_eps=1e-5,
                  rope_theta=10000.0)
    if args.dense:
        model = LlamaForCausalLM(LlamaConfig(**common, intermediate_size=args.top_k * args.expert_hidden))
    else:
        model = MixtralForCausalLM(MixtralConfig(**common, intermediate_size=args.expert_hidden,
                                                 num_local_experts=args.experts, num_experts_per_tok=args.top_k,
                                                 router_aux_loss_coef=0.02, output_router_logits=True,
                                                 router_jitter_noise=0.0))
    model.save_pretrained(args.write_folder)
    print(f"wrote {args.write_folder}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")


def batch(config, sequences):
    vocabulary, length = config.vocab_size, config.max_position_embeddings
    ids = [[(b * 131 + t * 17) % vocabulary for t in range(length)] for b in range(sequences)]
    targets = [[(b * 131 + (t + 1) * 17) % vocabulary for t in range(length)] for b in range(sequences)]
    return torch.tensor(ids), torch.tensor(targets)


def run(args):
    torch.set_num_threads(args.threads)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    Model = LlamaForCausalLM if args.dense else MixtralForCausalLM
    extra = {} if args.dense else {"experts_implementation": "eager"}
    began = time.perf_counter()
    try:
        model = Model.from_pretrained(args.folder, dtype=torch.float32, attn_implementation="sdpa", **extra)
    except TypeError:  # a transformers without experts_implementation: its experts are eager
        model = Model.from_pretrained(args.folder, dtype=torch.float32, attn_implementation="sdpa")
    load_seconds = time.perf_counter() - began
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    ids, targets = batch(model.config, args.sequences)
    coef = 0.0 if args.dense else model.config.router_aux_loss_coef
    times = []
    for step in range(args.steps + 1):  # step 0 is warm-up
        began = time.perf_counter()
        out = model(ids)
        loss = F.cross_entropy(out.logits.reshape(-1, out.logits.shape[-1]), targets.reshape(-1))
        if coef:
            loss = loss + coef * out.aux_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step:
            times.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    out_dir = tempfile.mkdtemp(prefix="torch-moe-", dir=args.out)
    began = time.perf_counter()
    model.save_pretrained(out_dir)
    torch.save(optimizer.state_dict(), out_dir + "/optimizer.pt")  # as shardwise saves its AdamW state beside
    save_seconds = time.perf_counter() - began
    began = time.perf_counter()
    again = Model.from_pretrained(out_dir, dtype=torch.float32)
    resumed = torch.optim.AdamW(again.parameters(), lr=1e-4, weight_decay=0.0)
    resumed.load_state_dict(torch.load(out_dir + "/optimizer.pt"))
    reload_seconds = time.perf_counter() - began
    shutil.rmtree(out_dir)
    tokens = args.sequences * model.config.max_position_embeddings
    rate = tokens / statistics.median(times)
    name = "dense" if args.dense else "moe"
    print(f"| transformers {'dense Llama' if args.dense else 'Mixtral (eager experts)'} + torch, {args.threads} "
          f"thread(s) | {rate:.0f} | {load_seconds:.2f} | {save_seconds:.2f} | {reload_seconds:.2f} | "
          f"{peak - rss_before:.0f} |")
    print(f"RESULT torch_{name}_{args.threads} {rate:.1f} {peak - rss_before:.1f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder")
    parser.add_argument("--dense", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--out", default=tempfile.gettempdir())
    parser.add_argument("--write-folder")
    for name, default in (("vocabulary", 8192), ("dim", 1024), ("layers", 2), ("heads", 16), ("kv-heads", 8),
                          ("experts", 8), ("top-k", 2), ("expert-hidden", 1408), ("sequence", 256)):
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    if args.write_folder:
        write_folder(args)
    elif args.folder:
        run(args)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
