"""The fine-tuning run bench_finetune measures, with peft and torch: LlamaForCausalLM.from_pretrained of the same
folder (fp32), peft's get_peft_model(LoraConfig(r=16, lora_alpha=32, q/k/v/o, no dropout)) or full fine-tuning,
torch.optim.AdamW over the trainable parameters with clip_grad_norm_, the same batch (bench_finetune's formula: a
quarter of each row a prompt, its targets -100), then save_pretrained and from_pretrained back. One thread (torch's
and the BLAS's) unless --threads. Prints one markdown row (median step -> tokens/s; load, save and reload seconds;
optimizer state MiB; peak resident set above the start) and a RESULT line for run_finetune.sh.

usage: torch_finetune.py --folder DIR --mode lora|full [--threads N] [--steps N] [--sequences N] [--out DIR]
       torch_finetune.py --write-folder DIR [--vocabulary N] [--dim N] [--layers N] [--heads N] [--kv-heads N]
                         [--hidden N] [--sequence N]
"""
import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM

MIB = 1024.0 * 1024.0


def write_folder(args):
    """A random Llama of the given sizes (untied, SiLU, no biases), as save_pretrained writes it."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocabulary, hidden_size=args.dim, intermediate_size=args.hidden,
                         num_hidden_layers=args.layers, num_attention_heads=args.heads,
                         num_key_value_heads=args.kv_heads, max_position_embeddings=args.sequence,
                         tie_word_embeddings=False, rms_norm_eps=1e-5)
    LlamaForCausalLM(config).save_pretrained(args.write_folder)
    print(f"wrote {args.write_folder}: {sum(p.numel() for p in LlamaForCausalLM(config).parameters()) / 1e6:.0f} M "
          "parameters")


def batch(config, sequences):
    vocabulary, length = config.vocab_size, config.max_position_embeddings
    ids = [[(b * 131 + t * 17) % vocabulary for t in range(length)] for b in range(sequences)]
    targets = [[-100 if t + 1 < length // 4 else (b * 131 + (t + 1) * 17) % vocabulary for t in range(length)]
               for b in range(sequences)]
    return torch.tensor(ids), torch.tensor(targets)


def run(args):
    torch.set_num_threads(args.threads)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    began = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(args.folder, dtype=torch.float32, attn_implementation="sdpa")
    if args.mode == "lora":
        from peft import LoraConfig, get_peft_model
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                 target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    load_seconds = time.perf_counter() - began
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-4, weight_decay=0.0)
    ids, targets = batch(model.config, args.sequences)
    times = []
    for step in range(args.steps + 1):  # step 0 is warm-up
        began = time.perf_counter()
        logits = model(ids).logits
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trainable, 1.0)
        optimizer.step()
        if step:
            times.append(time.perf_counter() - began)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    state = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                if torch.is_tensor(t) and t.dim() > 0)
    out = tempfile.mkdtemp(prefix="torch-finetune-", dir=args.out)
    began = time.perf_counter()
    model.save_pretrained(out)
    save_seconds = time.perf_counter() - began
    began = time.perf_counter()
    again = LlamaForCausalLM.from_pretrained(args.folder if args.mode == "lora" else out, dtype=torch.float32)
    if args.mode == "lora":
        from peft import PeftModel
        again = PeftModel.from_pretrained(again, out)
    reload_seconds = time.perf_counter() - began
    shutil.rmtree(out)
    tokens = args.sequences * model.config.max_position_embeddings
    rate = tokens / statistics.median(times)
    print(f"| {'peft' if args.mode == 'lora' else 'torch'} {args.mode}, {args.threads} thread(s) | {rate:.0f} | "
          f"{load_seconds:.2f} | {save_seconds:.2f} | {reload_seconds:.2f} | {state / MIB:.1f} | {peak - rss_before:.0f} | |")
    print(f"RESULT torch_{args.mode}_threads{args.threads} {rate:.1f} {peak - rss_before:.1f}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--folder")
    parser.add_argument("--mode", choices=("lora", "full"), default="lora")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--sequences", type=int, default=4)
    parser.add_argument("--out", default=tempfile.gettempdir())
    parser.add_argument("--write-folder")
    for name, default in (("vocabulary", 16384), ("dim", 1024), ("layers", 4), ("heads", 16), ("kv-heads", 4),
                          ("hidden", 2816), ("sequence", 256)):
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
