"""The transformers half of the comparison of sw::generate with transformers' generate (generate_dump.cpp is the
C++ half; nothing is shared).

prepare DIR: builds three small random models with transformers — a LlamaForCausalLM with grouped-query attention
(4 heads, 2 key-value heads), saved as shards with model.safetensors.index.json (DIR/llama); a tied
LlamaForCausalLM with one key-value head, which tp 2 and 4 serve by kv_size_multiplier (DIR/llama_kv1); a
GPT2LMHeadModel (DIR/gpt2); one-block Llamas with a scaled rotary embedding, "llama3" (tied, as Llama 3.2),
"yarn", "linear" and "dynamic" (DIR/llama3_rope, yarn_rope, linear_rope, dynamic_rope: NTK beyond 6 positions); a tied Qwen2ForCausalLM (biases on q, k and
v: DIR/qwen2); a one-block Llama with attention_bias and mlp_bias (DIR/llama_bias); SmolLM2's shape, 9 heads
and 3 key-value heads, tied (DIR/smollm, which tp 3 serves and 2 and 4 do not); a MistralForCausalLM with a sliding
window of 4 (DIR/mistral), a Qwen2ForCausalLM whose second layer slides a window of 3 (DIR/qwen2_window) and a
tied Qwen3ForCausalLM, q and k norms and heads of 16 on a width of 32 (DIR/qwen3) — with save_pretrained, and the prompts (DIR/prompts.txt: 3 prompts of 5, 1 and 9 ids).

compare DIR [--example PATH] TAG...: for every model, in fp32 and in fp64 (model.double() on the same weights),
transformers' generate(do_sample=False, max_new_tokens=64) on each prompt gives the tokens and every step's
logits; each shardwise run named (tp1, tp2, tp4 on threads; mpi2, mpi4) must give the same tokens and logits
within 1e-5 (fp32) and 1e-12 (fp64) of them, as max |difference| / max |transformers'| per step. The logits of
step t are those of transformers' forward over the prompt and the tokens before t (by causality, what generate
computed at step t): generate itself returns them cast to float32. And for fp64 three parts of transformers' Llama
run in float64 here, as shardwise runs them: its rotary tables (transformers' own rope init function for each
scaling, evaluated in float64), its RMSNorm and its eager attention's softmax,
which transformers computes in float32 even for a float64 model (together they moved fp64 logits by 6e-7); the
fp64 Llama runs torch's scaled_dot_product_attention ("sdpa"), in float64 throughout. The sampled run's tokens must be the ones
transformers' TemperatureLogitsWarper(0.9), TopKLogitsWarper(12) and TopPLogitsWarper(0.85) and an inverse-CDF
draw pick from the same logits with the same draw. With --example, the example program `generate` runs on each
folder (2 threads, 16 new tokens) and must print transformers' greedy tokens.

usage: generate_reference.py prepare DIR | generate_reference.py compare DIR [--example PATH] TAG...
"""
import os
import subprocess
import sys

import numpy as np
import torch
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, Qwen2Config, Qwen3Config)
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from hf_float64 import RMS_NORMS, rms_norm_in_input_type, rope_in_float64

VOCAB, NEW_TOKENS = 61, 64
PROMPTS = [[5, 17, 3, 44, 9], [12], [7, 7, 30, 2, 58, 21, 40, 11, 3]]
TOLERANCE = {"fp32": 1e-5, "fp64": 1e-12}
MODELS = ("llama", "llama_kv1", "gpt2", "llama3_rope", "yarn_rope", "linear_rope", "dynamic_rope", "qwen2",
          "llama_bias", "smollm", "mistral", "qwen2_window", "qwen3")
# SmolLM2's shape (9 heads, 3 key-value heads, tied): tp 3 serves it, 2 and 4 do not. The others run at 1, 2, 4.
THREAD_RANKS = {"smollm": 3}  # the example's thread count for a model (default 2)


def runs_at(name, tag):
    """Whether generate_dump ran `name` under `tag`: smollm on one thread and on three, the others at every
    other tag (tp 3 does not divide their 4 heads)."""
    return tag in ("tp1", "tp3") if name == "smollm" else tag != "tp3"

# The rotary scalings, each on a one-block Llama: Llama 3.2's "llama3" (tied; its 4 column pairs fall in all three
# of its bands), Qwen2.5's "yarn" (heads of 16, its ramp's bounds rounded outward as by default, cos and sin
# scaled; transformers_reference.py trains one with fractional bounds) and "linear".
ROPE_MODELS = {
    "llama3_rope": dict(hidden_size=32, tie=True, theta=10000.0, positions=128,
                        rope={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 16}),
    "yarn_rope": dict(hidden_size=64, tie=False, theta=10000.0, positions=128,  # truncate: the default, True
                      rope={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32}),
    "linear_rope": dict(hidden_size=32, tie=False, theta=500.0, positions=128,
                        rope={"rope_type": "linear", "factor": 2.0}),
    # dynamic (NTK) beyond 6 positions: the 5-token prompt rotates as is, the 9-token one and every generation
    # with the frequencies of its own length so far (checked call by call: incremental_reference).
    "dynamic_rope": dict(hidden_size=32, tie=False, theta=10000.0, positions=6,
                         rope={"rope_type": "dynamic", "factor": 2.0}),
}


def llama_config(kv_heads, tied):
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=128,
                       rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=tied, attention_bias=False,
                       mlp_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def rope_config(spec):
    rope = dict(spec["rope"], rope_theta=spec["theta"])
    return LlamaConfig(vocab_size=VOCAB, hidden_size=spec["hidden_size"], intermediate_size=48, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=spec["positions"],
                       rms_norm_eps=1e-5, rope_parameters=rope, tie_word_embeddings=spec["tie"],
                       attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def qwen2_config():  # Qwen2.5-0.5B's shape, scaled down: biases on q, k and v, tied embeddings
    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6,
                       rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
                       bos_token_id=None, eos_token_id=None, pad_token_id=None)


def mistral_config():  # Mistral's sliding window, 4 tokens: shorter than two prompts and than every generation
    return MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5,
                         rope_theta=10000.0, sliding_window=4, tie_word_embeddings=False, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)


def qwen2_window_config():  # Qwen2's window on the layers from max_window_layers on: layer 1 of 2, 3 tokens
    config = qwen2_config()
    config = Qwen2Config(**dict(config.to_dict(), use_sliding_window=True, sliding_window=3, max_window_layers=1,
                                layer_types=None))
    return config


def qwen3_config():  # Qwen3-0.6B's shape, scaled down: q and k norms, 4 heads of 16 on a width of 32, tied
    return Qwen3Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
                       use_sliding_window=False, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def llama_bias_config():  # Llama's attention_bias (q, k, v and o) and mlp_bias
    config = llama_config(2, False)
    config.num_hidden_layers, config.attention_bias, config.mlp_bias = 1, True, True
    return config


def gpt2_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=80, n_embd=32, n_layer=2, n_head=4,
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      layer_norm_epsilon=1e-5, bos_token_id=None, eos_token_id=None, pad_token_id=None)


def randomize(model):
    """Values of order 0.2 (norm weights around 1), so that logits are not all near zero."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            norm_weight = ("norm" in name or ".ln_" in name) and name.endswith("weight")
            p.copy_(1 + 0.1 * torch.randn_like(p) if norm_weight else 0.2 * torch.randn_like(p))


def prepare(directory):
    torch.manual_seed(0)
    for name, model, shard in (("llama", LlamaForCausalLM(llama_config(2, False)), "20KB"),
                               ("llama_kv1", LlamaForCausalLM(llama_config(1, True)), None),
                               ("gpt2", GPT2LMHeadModel(gpt2_config()), None)):
        randomize(model)
        kwargs = {"max_shard_size": shard} if shard else {}
        model.save_pretrained(os.path.join(directory, name), **kwargs)
    smollm = LlamaConfig(vocab_size=VOCAB, hidden_size=36, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=128, rms_norm_eps=1e-5,
                         rope_theta=10000.0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    for name, config in (("qwen2", qwen2_config()), ("llama_bias", llama_bias_config()), ("smollm", smollm),
                         ("mistral", mistral_config()), ("qwen2_window", qwen2_window_config()),
                         ("qwen3", qwen3_config())):
        model = AutoModelForCausalLM.from_config(config)
        randomize(model)  # the biases too: 0.2 * N(0, 1)
        model.save_pretrained(os.path.join(directory, name))
    for name, spec in ROPE_MODELS.items():
        model = LlamaForCausalLM(rope_config(spec))
        randomize(model)
        model.save_pretrained(os.path.join(directory, name))
    with open(os.path.join(directory, "prompts.txt"), "w") as f:
        for p in PROMPTS:
            f.write(" ".join(map(str, p)) + "\n")
    print("prepared")
    return 0


def load(directory, name, dtype):
    attention = "sdpa" if name != "gpt2" and dtype == "fp64" else "eager"  # eager Llama: softmax in float32
    model = AutoModelForCausalLM.from_pretrained(os.path.join(directory, name), attn_implementation=attention)
    model = model.double() if dtype == "fp64" else model.float()
    if name != "gpt2":
        rope_in_float64(model.model.rotary_emb, model.config)
        if dtype == "fp64":
            for module in model.modules():
                if type(module).__name__ in RMS_NORMS:
                    rms_norm_in_input_type(module)
    return model.eval()


def reference(model):
    """transformers' greedy tokens for each prompt, and every step's logits from its forward over the sequence."""
    runs = []
    with torch.no_grad():
        for p in PROMPTS:
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                 return_dict_in_generate=True, pad_token_id=0)
            tokens = out.sequences[0, len(p):].tolist()
            logits = model(out.sequences[:, :-1]).logits[0].double().numpy()
            runs.append((tokens, [logits[len(p) - 1 + t] for t in range(len(tokens))]))
    return runs


def incremental_reference(model):
    """Greedy decoding one call per token with the key-value cache, each step's logits from its own call: what
    generate computes, in the model's precision. For a dynamic scaling, whose frequencies follow each call's
    longest position, a forward over the whole sequence would rotate the early tokens otherwise."""
    runs = []
    with torch.no_grad():
        for p in PROMPTS:
            out = model(torch.tensor([p]), use_cache=True)
            tokens, logits = [], []
            for t in range(NEW_TOKENS):
                step = out.logits[0, -1].double().numpy()
                logits.append(step)
                tokens.append(int(step.argmax()))
                out = model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True,
                            position_ids=torch.tensor([[len(p) + t]]))
            runs.append((tokens, logits))
    return runs


def packed_reference(model):
    """transformers' logits of each prompt run alone, one after another: what a packed row of them must give."""
    with torch.no_grad():
        return np.concatenate([model(torch.tensor([p])).logits[0].double().numpy() for p in PROMPTS])


def compare_packed(results, label, path, want, tolerance):
    """The packed row's logits against each prompt's alone: the worst max |difference| / max |transformers'| of a
    prompt's rows."""
    got = np.loadtxt(path, ndmin=2) if os.path.exists(path) else np.zeros((0, 0))
    if got.shape != want.shape:
        results.check(f"{label}: packed row's logits", False, f"shape {got.shape} vs {want.shape}")
        return float("inf")
    worst, first = 0.0, 0
    for p in PROMPTS:
        rows = slice(first, first + len(p))
        worst = max(worst, float(np.abs(got[rows] - want[rows]).max() / np.abs(want[rows]).max()))
        first += len(p)
    results.check(f"{label}: every step's logits of the packed row within {tolerance:g}", worst <= tolerance,
                  f"worst {worst:.2e}")
    return worst


def read_dump(path):
    """greedy and sampled runs of a dump file: {"tokens": {i: [...]}, "logits": {(i, t): row}, "draws": {...}}."""
    runs, current = [], None
    with open(path) as f:
        for line in f:
            kind, *rest = line.split()
            if current is None or (kind != "tokens" and current["done"]):
                current = {"tokens": {}, "logits": {}, "draws": {}, "done": False}
                runs.append(current)
            if kind == "tokens":
                current["tokens"][int(rest[0])] = [int(v) for v in rest[1:]]
                current["done"] = True
            elif kind == "logits":
                current["logits"][(int(rest[0]), int(rest[1]))] = np.array([float(v) for v in rest[2:]])
            elif kind == "draw":
                current["draws"][(int(rest[0]), int(rest[1]))] = float(rest[2])
    return runs


def hf_sample(row, draw):
    scores = torch.tensor(row, dtype=torch.float32)[None]
    for warper in (TemperatureLogitsWarper(0.9), TopKLogitsWarper(12), TopPLogitsWarper(0.85)):
        scores = warper(None, scores)
    weights = torch.softmax(scores.double(), dim=-1)[0].numpy()
    cumulative = np.cumsum(weights)
    return int(np.searchsorted(cumulative, draw * cumulative[-1], side="right"))


class Results:
    def __init__(self):
        self.rows = []

    def check(self, name, ok, detail=""):
        self.rows.append((name, bool(ok), detail))


def compare_greedy(results, label, run, expected, tolerance):
    worst = 0.0
    for i, (tokens, logits) in enumerate(expected):
        results.check(f"{label}: prompt {i} tokens", run["tokens"].get(i) == tokens,
                      f"{run['tokens'].get(i)} vs {tokens}" if run["tokens"].get(i) != tokens else "")
        for t, want in enumerate(logits):
            got = run["logits"].get((i, t))
            if got is None or got.shape != want.shape:
                results.check(f"{label}: prompt {i} step {t} logits", False, "missing or of another width")
                continue
            worst = max(worst, float(np.abs(got - want).max() / np.abs(want).max()))
    results.check(f"{label}: every step's logits within {tolerance:g}", worst <= tolerance, f"worst {worst:.2e}")
    return worst


def compare_sampled(results, label, run):
    picked = 0
    for (i, t), draw in run["draws"].items():
        ours = run["tokens"][i][t]
        theirs = hf_sample(run["logits"][(i, t)], draw)
        results.check(f"{label}: sampled prompt {i} step {t}", ours == theirs, f"{ours} vs transformers' {theirs}")
        picked += 1
    results.check(f"{label}: sampled steps compared", picked == len(PROMPTS) * NEW_TOKENS, f"{picked}")


def compare_example(results, directory, example, expected_by_model):
    for name in MODELS:
        args = [example, os.path.join(directory, name), "--new", "16"]
        for p in PROMPTS:
            args += ["--prompt", ",".join(map(str, p))]
        env = dict(os.environ, SHARDWISE_THREADS=str(THREAD_RANKS.get(name, 2)), OPENBLAS_NUM_THREADS="1")
        out = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        printed = {}
        for line in out.stdout.splitlines():
            if line.startswith("prompt ") and "->" in line:
                printed[int(line.split()[1])] = [int(v) for v in line.split("->")[1].split()]
        for i, (tokens, _) in enumerate(expected_by_model[name]):
            results.check(f"example generate on {name}: prompt {i}", out.returncode == 0 and printed.get(i) == tokens[:16],
                          f"exit {out.returncode}, printed {printed.get(i)}, transformers {tokens[:16]} {out.stderr[-300:]}")


def compare(directory, tags, example):
    results, worst = Results(), {}
    greedy_fp32 = {}
    for name in MODELS:
        for dtype in ("fp32", "fp64"):
            model = load(directory, name, dtype)
            expected = incremental_reference(model) if name == "dynamic_rope" else reference(model)
            packed = packed_reference(model) if name != "gpt2" else None
            if dtype == "fp32":
                greedy_fp32[name] = expected
            for tag in (t for t in tags if runs_at(name, t)):
                runs = read_dump(os.path.join(directory, name, f"{tag}_{dtype}.txt"))
                label = f"{name} {tag} {dtype}"
                results.check(f"{label}: runs written", len(runs) == (2 if dtype == "fp32" else 1), f"{len(runs)}")
                if not runs:
                    continue
                error = compare_greedy(results, label, runs[0], expected, TOLERANCE[dtype])
                worst[(name, dtype)] = max(worst.get((name, dtype), 0.0), error)
                if packed is not None:
                    error = compare_packed(results, label, os.path.join(directory, name, f"{tag}_{dtype}_packed.txt"),
                                           packed, TOLERANCE[dtype])
                    worst[(name + " packed", dtype)] = max(worst.get((name + " packed", dtype), 0.0), error)
                if dtype == "fp32" and len(runs) > 1:
                    compare_sampled(results, label, runs[1])
    if example:
        compare_example(results, directory, example, greedy_fp32)
    for name, ok, detail in results.rows:
        if not ok or "every step" in name or "example" in name:
            print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
    for (name, dtype), error in sorted(worst.items()):
        print(f"worst {name} {dtype}: {error:.2e}")
    failed = sum(1 for _, ok, _ in results.rows if not ok)
    print(f"{len(results.rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "prepare":
        return prepare(sys.argv[2])
    if len(sys.argv) >= 4 and sys.argv[1] == "compare":
        args, example = sys.argv[3:], None
        if args[:1] == ["--example"]:
            example, args = args[1], args[2:]
        return compare(sys.argv[2], args, example)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main())
