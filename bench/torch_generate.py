"""transformers' generate beside bench_generate (bench/run_generate.sh runs both): the same LlamaForCausalLM
folder, the same prompts, greedy, fp32 (or --dtype bfloat16: weights and compute in bf16), on `--threads` threads (torch's intra-op threads). Time to first token:
generate(max_new_tokens=1); decode tokens/s: the tokens after the first over the time generate(max_new_tokens=N)
took beyond that. Peak resident set from getrusage.

  torch_generate.py prepare DIR [--small]       # writes a random model of bench_generate's default sizes
                                                # (--small: dim 256, 4 layers, vocabulary 512, 3.1 M parameters)
  torch_generate.py run DIR [--threads N] [--batch B] [--prompt-tokens P] [--new N] [--dtype float32|bfloat16]
"""
import argparse
import os
import resource
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def prepare(directory, small):
    if os.path.exists(os.path.join(directory, "config.json")):
        print(f"# {directory}: present")
        return 0
    torch.manual_seed(0)
    sizes = dict(vocab_size=512, hidden_size=256, intermediate_size=704, num_hidden_layers=4, num_attention_heads=8,
                 num_key_value_heads=2) if small else \
        dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=12, num_attention_heads=16,
             num_key_value_heads=4)
    config = LlamaConfig(**sizes, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=10000.0,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).float()
    model.save_pretrained(directory)
    print(f"# {directory}: written, {sum(p.numel() for p in model.parameters()) / 1e6:.0f} M parameters")
    return 0


def prompts(batch, tokens, vocabulary):  # bench_generate's
    return torch.tensor([[(b * 7919 + t * 104729 + 17) % vocabulary for t in range(tokens)] for b in range(batch)])


def timed_generate(model, ids, new_tokens):
    began = time.perf_counter()
    with torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, pad_token_id=0)
    return time.perf_counter() - began


def run(args):
    torch.set_num_threads(args.threads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = LlamaForCausalLM.from_pretrained(args.directory, torch_dtype=dtype).eval()
    ids = prompts(args.batch, args.prompt_tokens, model.config.vocab_size)
    timed_generate(model, ids, 2)  # warm
    first = timed_generate(model, ids, 1)
    whole = timed_generate(model, ids, args.new)
    rate = args.batch * (args.new - 1) / max(whole - first, 1e-9)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"transformers threads {args.threads} batch {args.batch} {args.dtype}: first token {first:.3f} s, decode {rate:.2f} "
          f"tokens/s; peak resident {peak:.0f} MiB")
    print(f"RESULT torch_threads{args.threads}_batch{args.batch}_{args.dtype} {first:.4f} {rate:.3f} {peak:.0f}")
    return 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "prepare":
        return prepare(sys.argv[2], "--small" in sys.argv[3:])
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["run"])
    parser.add_argument("directory")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="the model's weights and compute (bfloat16: transformers' torch_dtype=torch.bfloat16)")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
