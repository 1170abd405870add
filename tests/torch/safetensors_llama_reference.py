"""Consolidation checked with Hugging Face's own packages: shardwise's Llama is saved sharded at TP 4
(safetensors_llama_checkpoint), `shardwise inspect` lists it, `shardwise consolidate --names transformers-llama`
writes one model.safetensors, which safetensors loads and transformers' LlamaForCausalLM takes with
strict=True, and from_pretrained reads the folder with the config.json consolidate wrote; their logits must equal
those of shardwise's unsharded model. The same for shardwise's GPT-2 with --names transformers-gpt2 (q, k and v
fused into c_attn, Conv1D weights transposed): GPT2LMHeadModel.from_pretrained reports no missing or unexpected
keys and gives the same logits. And a Qwen2 (biases on q, k and v, a sliding window on its second layer) and a
Mistral (a sliding window shorter than the batch's sequences) saved at TP 2 and consolidated with --names
transformers-qwen2 and -mistral, and a Qwen3 (q and k norms, heads of 16 on a width of 32) with
--names transformers-qwen3: AutoModelForCausalLM.from_pretrained builds Qwen2ForCausalLM, MistralForCausalLM and
Qwen3ForCausalLM with no missing or unexpected keys and the same logits; another family's name is refused.
Prints "N passed, M failed".

usage: safetensors_llama_reference.py CHECKPOINT_PROGRAM SHARDWISE_COMMAND DIR
"""
import os
import subprocess
import sys

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, DIM, HIDDEN, LAYERS, HEADS, KV_HEADS, SEQUENCE = 62, 32, 64, 2, 4, 2, 8
GPT2_VOCAB = 61  # shardwise pads it to 62 for TP 2; the consolidated file is unpadded
TOLERANCE = 1e-4  # fp32 on both sides


def run(results, name, command):
    done = subprocess.run(command, capture_output=True, text=True)
    results.append((name, done.returncode == 0, done.stderr[-2000:]))
    return done


def check_from_pretrained(results, model_class, folder, ids, expected, vocabulary):
    """The consolidated folder (model.safetensors and config.json) read by transformers' from_pretrained: no missing,
    unexpected or mismatched keys, and the logits of shardwise's unsharded model."""
    name = model_class.__name__
    try:
        model, info = model_class.from_pretrained(folder, output_loading_info=True, attn_implementation="eager")
        name = type(model).__name__
    except Exception as e:  # a missing config.json or file: a failed check, not a crash of the test
        results.append((f"{name}.from_pretrained", False, str(e)[:500]))
        return
    problems = {k: v for k, v in info.items() if v}
    results.append((f"{name}.from_pretrained: no missing or unexpected keys", not problems, str(problems)[:500]))
    with torch.no_grad():
        logits = model.float()(ids).logits.reshape(-1, vocabulary).numpy()
    error = float(np.abs(logits - expected).max()) / max(float(np.abs(expected).max()), 1e-30)
    results.append((f"{name}.from_pretrained: logits equal shardwise's", error <= TOLERANCE, f"error {error}"))


def main():
    program, command, directory = sys.argv[1:4]
    results = []
    ids = torch.tensor([(i * 7 + 3) % VOCAB for i in range(16)]).view(2, SEQUENCE)
    run(results, "safetensors_llama_checkpoint", [program, directory])
    checkpoint = os.path.join(directory, "ckpt")
    listing = run(results, "shardwise inspect (sharded)", [command, "inspect", checkpoint]).stdout
    # 2 key-value heads repeated for 4 ranks: each head is saved once, by the rank holding its first copy.
    results.append(("inspect lists the mesh and a sharded tensor",
                    "mesh tp 4 x pp 1" in listing and "layers.0.attention.wk.weight  F32 [16, 32]  tp Shard(dim=0)  2 pieces"
                    in listing and "layers.0.attention.wq.weight  F32 [32, 32]  tp Shard(dim=0)  4 pieces" in listing,
                    listing[:400]))
    # The tensor_parallel_shards folder itself is accepted, as optimum-cli does.
    out = os.path.join(directory, "consolidated")
    done = run(results, "shardwise consolidate", [command, "consolidate", os.path.join(checkpoint, "tensor_parallel_shards"),
                                                  out, "--names", "transformers-llama"])
    results.append(("progress on stderr", "[1/21] lm_head.weight" in done.stderr and "[21/21]" in done.stderr, done.stderr[:300]))
    listing = run(results, "shardwise inspect (file)", [command, "inspect", out]).stdout
    results.append(("inspect lists the file", "lm_head.weight  F32 [62, 32]" in listing, listing[:400]))

    path = os.path.join(out, "model.safetensors")
    if os.path.exists(path):
        with safe_open(path, framework="pt") as f:
            metadata = f.metadata()
        results.append(("metadata", metadata.get("model") == "llama-test" and metadata.get("shardwise.step") == "17"
                        and metadata.get("format") == "pt", str(metadata)))
        state = load_file(path)
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=HIDDEN, num_hidden_layers=LAYERS,
                             num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=SEQUENCE,
                             rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, attention_bias=False,
                             mlp_bias=False, attn_implementation="eager")
        model = LlamaForCausalLM(config).float()
        try:
            model.load_state_dict(state, strict=True)
            results.append(("load_state_dict(strict=True)", True, ""))
        except RuntimeError as e:
            results.append(("load_state_dict(strict=True)", False, str(e)[:500]))
        with torch.no_grad():
            logits = model(ids).logits.reshape(-1, VOCAB).numpy()
        expected = np.load(os.path.join(directory, "logits.npy"))
        error = float(np.abs(logits - expected).max()) / max(float(np.abs(expected).max()), 1e-30)
        results.append(("logits of transformers' Llama from model.safetensors", error <= TOLERANCE, f"error {error}"))
        check_from_pretrained(results, LlamaForCausalLM, out, ids, expected, VOCAB)
    else:
        results.append(("model.safetensors written", False, path))

    gpt2_out = os.path.join(directory, "gpt2_consolidated")
    run(results, "shardwise consolidate --names transformers-gpt2",
        [command, "consolidate", os.path.join(directory, "gpt2_ckpt"), gpt2_out, "--names", "transformers-gpt2"])
    gpt2_ids = torch.tensor([(i * 7 + 3) % GPT2_VOCAB for i in range(16)]).view(2, SEQUENCE)
    check_from_pretrained(results, GPT2LMHeadModel, gpt2_out, gpt2_ids,
                          np.load(os.path.join(directory, "gpt2_logits.npy")), GPT2_VOCAB)

    for family, architecture in (("qwen2", "Qwen2ForCausalLM"), ("mistral", "MistralForCausalLM"),
                                 ("qwen3", "Qwen3ForCausalLM")):
        family_out = os.path.join(directory, family + "_consolidated")
        run(results, f"shardwise consolidate --names transformers-{family}",
            [command, "consolidate", os.path.join(directory, family + "_ckpt"), family_out, "--names",
             "transformers-" + family])
        check_from_pretrained(results, AutoModelForCausalLM, family_out, ids,
                              np.load(os.path.join(directory, family + "_logits.npy")), VOCAB)
        other = "mistral" if family == "qwen2" else "qwen2"
        refused = subprocess.run([command, "consolidate", os.path.join(directory, family + "_ckpt"),
                                  os.path.join(directory, family + "_wrong"), "--names", "transformers-" + other],
                                 capture_output=True, text=True)
        results.append((f"--names transformers-{other} refuses the {family} checkpoint",
                        refused.returncode != 0 and f"consolidate it with --names transformers-{family}" in refused.stderr,
                        refused.stderr[-400:]))
        results.append((f"{family}: from_pretrained builds {architecture}",
                        any(name.startswith(architecture) for name, ok, _ in results if ok), ""))

    # --remove-checkpoint-dir: the same file again, then the sharded checkpoint is gone.
    again = os.path.join(directory, "again")
    run(results, "shardwise consolidate --remove-checkpoint-dir",
        [command, "consolidate", checkpoint, again, "--names", "transformers-llama", "--remove-checkpoint-dir"])
    same = (os.path.exists(path) and os.path.exists(os.path.join(again, "model.safetensors"))
            and open(path, "rb").read() == open(os.path.join(again, "model.safetensors"), "rb").read())
    results.append(("--remove-checkpoint-dir: same file, checkpoint removed", same and not os.path.exists(checkpoint), ""))

    passed = sum(1 for _, ok, _ in results if ok)
    for name, ok, detail in results:
        print(("ok   " if ok else "FAIL ") + name + ("" if ok else "  " + detail))
    print(f"{passed} passed, {len(results) - passed} failed")
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
