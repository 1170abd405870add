"""The Hugging Face half of the training check, in fp64: transformers' own classes for each family shardwise's Llama is
configured as — LlamaForCausalLM as Llama 3.2 (llama3 rotary scaling, tied) and as Llama 3.1 (untied, 8 query heads
over 2 key-value heads), Qwen2ForCausalLM (biases on q, k and v, yarn, tied; and with a window of 3 on its second
layer), Qwen3ForCausalLM (q and k norms, heads of 16 on a width of 32, tied), MistralForCausalLM (a sliding window of
3 on rows of 8), LlamaForCausalLM as SmolLM2 (9 heads, 3 key-value heads, tied), LlamaForCausalLM with attention_bias
and mlp_bias — and GPT2LMHeadModel, built from the configs transformers_dump.cpp used and loaded with the weights it
wrote, give the same logits, loss and gradients of one batch, and torch.nn.utils.clip_grad_norm_ with
torch.optim.AdamW (two parameter groups) the same losses and global norms over 5 steps, as every shardwise run of the
backend named on the command line ("threads": unsharded, tp1, and tp2, tp2sp, tp4, tp4sp, or tp3, tp3sp for SmolLM2,
and for all but the two Llama 3 ones and GPT-2 fsdp2, fsdp2tp (beside tp 2, or 3), pp2 and cp2, whose 5 steps' losses
and norms are compared; "mpi2", "mpi4": one run, for the families whose heads that size serves). transformers runs in
float64 with its rotary tables and RMSNorms computed in float64 (hf_float64.py) and torch's
scaled_dot_product_attention, whose softmax stays in float64 (the eager one's is float32). Nothing is shared with the
C++ side. Relative errors: max |got - expected| / max |expected| per tensor, 1e-10; losses and norms per step, 1e-10.
On threads, also the Llama 3.2-like model trained under get_scheduler("cosine_with_min_lr") (warm-up 2, a tenth at
step 5) with the no-decay group at half the learning rate, unsharded and at tp 2 with sequence parallelism; and each
of seven schedules' learning rates over 100 steps, as LambdaLR sets them (absolute 1e-14, on rates of 1e-2); and
LoRA against peft (get_peft_model, r 8, alpha 16, q/k/v/o) trained by torch's AdamW over the adapters on
prompt-masked targets, unsharded, at tp 1 and tp 2 and 4 ± SP, dp 2 x tp 2 (ZeRO-1), FSDP dp 2 and pp 2 (those
three with the batch's rows on different ranks, 5 and 2 valid targets, the loss over the step's valid tokens), and on
MPI at tp 2 (with FSDP dp 2 and pp 2) and tp 4 (with dp 2 x tp 2): losses, clipped norms and adapters (1e-10); and
peft's files both ways (compare_peft): shardwise's saved adapter and merged export in PeftModel.from_pretrained and
from_pretrained, and an adapter peft saved ("prepare", before transformers_dump) loaded by shardwise at tp 4.

usage: transformers_reference.py DUMP_DIR prepare|threads|mpi2|mpi4
"""
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          get_scheduler)

from hf_float64 import in_float64

TOLERANCE = 1e-10
VOCAB, DIM, LAYERS, HEADS, SEQUENCE = 64, 32, 2, 4, 8
STEPS, MAX_NORM = 5, 0.05
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}


def ids_of(step, targets):  # the batches transformers_dump.cpp uses (inputs, not results)
    return torch.tensor([(step * 31 + i * 7 + (3 if targets else 0)) % 64 for i in range(16)]).view(2, SEQUENCE)


def common(**changes):  # the Llama-type fields every family shares, and the family's own
    fields = dict(vocab_size=VOCAB, hidden_size=DIM, intermediate_size=64, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=SEQUENCE,
                  rms_norm_eps=1e-5, tie_word_embeddings=True, attn_implementation="sdpa")
    fields.update(changes)
    return fields


# llama3's scaling reads original_max_position_embeddings, not max_position_embeddings (128 here, above it, as
# transformers expects; the rows are 8 tokens).
def llama():  # transformers_dump.cpp's LlamaSpec: Llama 3.2-like
    return LlamaForCausalLM(LlamaConfig(**common(rope_parameters=dict(LLAMA3_ROPE, rope_theta=10000.0),
                                                 max_position_embeddings=128, attention_bias=False, mlp_bias=False)))


def llama31():  # Llama31Spec: untied, 8 query heads over 2 key-value heads
    return LlamaForCausalLM(LlamaConfig(**common(num_attention_heads=8, tie_word_embeddings=False,
                                                 max_position_embeddings=128,
                                                 rope_parameters=dict(LLAMA3_ROPE, rope_theta=500000.0))))


def qwen2():  # Qwen2Spec: biases on q, k and v, tied, a yarn rotary scaling
    return Qwen2ForCausalLM(Qwen2Config(**common(rms_norm_eps=1e-6, use_sliding_window=False,
                                                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                                  "factor": 4.0, "truncate": False,
                                                                  "original_max_position_embeddings": 64})))


def qwen2_window():  # Qwen2WindowSpec: Qwen2Spec's, with a window of 3 on the second layer (max_window_layers 1)
    return Qwen2ForCausalLM(Qwen2Config(**common(rms_norm_eps=1e-6, use_sliding_window=True, sliding_window=3,
                                                 max_window_layers=1,
                                                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0,
                                                                  "factor": 4.0, "truncate": False,
                                                                  "original_max_position_embeddings": 64})))


def qwen3():  # Qwen3Spec: q and k norms, heads of 16 on a width of 32, tied
    return Qwen3ForCausalLM(Qwen3Config(**common(head_dim=16, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                                 attention_bias=False, use_sliding_window=False)))


def mistral():  # MistralSpec: a sliding window of 3, untied
    return MistralForCausalLM(MistralConfig(**common(sliding_window=3, rope_theta=10000.0,
                                                     tie_word_embeddings=False)))


def smollm():  # SmolSpec: 9 heads of 4, 3 key-value heads, tied
    return LlamaForCausalLM(LlamaConfig(**common(hidden_size=36, intermediate_size=48, num_attention_heads=9,
                                                 num_key_value_heads=3, rope_theta=10000.0)))


def llama_bias():  # LlamaBiasSpec: attention_bias (q, k, v and o) and mlp_bias, untied
    return LlamaForCausalLM(LlamaConfig(**common(attention_bias=True, mlp_bias=True, tie_word_embeddings=False,
                                                 rope_theta=10000.0)))


def gpt2():
    config = GPT2Config(vocab_size=VOCAB, n_positions=SEQUENCE, n_embd=DIM, n_layer=LAYERS, n_head=HEADS,
                        activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                        layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=0,
                        attn_implementation="eager")
    return GPT2LMHeadModel(config)


MODELS = (("llama", llama), ("llama31", llama31), ("qwen2", qwen2), ("qwen2_window", qwen2_window), ("qwen3", qwen3),
          ("mistral", mistral), ("smollm", smollm), ("llama_bias", llama_bias), ("gpt2", gpt2))
TIED = ("llama", "qwen2", "qwen2_window", "qwen3", "smollm", "gpt2")


# Also trained under FSDP dp 2, pp 2 and cp 2 on threads (losses and norms compared).
LAYOUTS = ("qwen2", "qwen3", "mistral", "smollm", "llama_bias")


def tags_of(model_name, backend):
    """The runs transformers_dump.cpp writes for a model on a backend."""
    sizes = [3] if model_name == "smollm" else [2, 4]
    if backend == "threads":
        return ["unsharded", "tp1"] + [f"tp{n}{sp}" for n in sizes for sp in ("", "sp")]
    return [backend] if int(backend[3:]) in sizes else []


def no_decay(name):  # shardwise's group: "*.bias", "*norm.weight", "*ln_*.weight"
    return name.endswith(".bias") or "norm" in name or ".ln_" in name


class Results:
    def __init__(self):
        self.rows = []

    def tensor(self, name, got, expected):
        got, expected = np.asarray(got, dtype=np.float64), np.asarray(expected, dtype=np.float64)
        if got.shape != expected.shape:
            self.rows.append((name, False, f"shape {got.shape} vs {expected.shape}"))
            return
        error = float(np.abs(got - expected).max()) / max(float(np.abs(expected).max()), 1e-30)
        self.rows.append((name, error <= TOLERANCE, f"relative error {error:.1e}"))

    def check(self, name, ok, detail):
        self.rows.append((name, bool(ok), detail))


def reference(build, directory, scheduled=False):
    """transformers' numbers for one model: logits, loss and gradients of batch 0; losses and norms of 5 steps.
    scheduled: the no-decay group at half the learning rate, and cosine_with_min_lr (warm-up 2, 5 steps, a tenth)."""
    torch.manual_seed(0)
    model = build()
    model = model.double() if isinstance(model, GPT2LMHeadModel) else in_float64(model)
    weights = os.path.join(directory, "weights")
    state = {name[:-4]: torch.from_numpy(np.load(os.path.join(weights, name))) for name in os.listdir(weights)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    out = {"missing": list(missing), "unexpected": list(unexpected), "tied": tied, "grads": {}}
    named = dict(model.named_parameters())  # the tied tensor once, under the embedding's name
    out["names"] = sorted(named)
    decay = [p for n, p in named.items() if not no_decay(n)]
    plain = [p for n, p in named.items() if no_decay(n)]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                   {"params": plain, "weight_decay": 0.0, "lr": 5e-3 if scheduled else 1e-2}],
                                  lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    scheduler = get_scheduler("cosine_with_min_lr", optimizer, num_warmup_steps=2, num_training_steps=STEPS,
                              scheduler_specific_kwargs={"min_lr_rate": 0.1}) if scheduled else None
    out["losses"], out["norms"] = [], []
    for step in range(STEPS):
        logits = model(ids_of(step, False)).logits.reshape(-1, VOCAB)
        loss = F.cross_entropy(logits, ids_of(step, True).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach().numpy()
            out["loss"] = loss.item()
            out["grads"] = {n: p.grad.detach().numpy().copy() for n, p in named.items()}
        out["norms"].append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)))
        optimizer.step()
        if scheduler:
            scheduler.step()
        out["losses"].append(loss.item())
    return out


def compare_steps(results, model_name, expected, run, tag):
    """A layout that cuts the batch or the model (FSDP, pp, cp): its 5 steps' losses and clipped norms."""
    label = f"{model_name} {tag}"
    if not os.path.exists(os.path.join(run, "losses.npy")):
        results.check(f"{label}: written", False, run)
        return
    losses, norms = np.load(os.path.join(run, "losses.npy")), np.load(os.path.join(run, "norms.npy"))
    for step in range(STEPS):
        results.tensor(f"{label}: loss at step {step}", [losses[step]], [expected["losses"][step]])
        results.tensor(f"{label}: global norm at step {step}", [norms[step]], [expected["norms"][step]])


def compare(results, model_name, expected, run, tag):
    label = f"{model_name} {tag}"
    results.tensor(f"{label}: logits", np.load(os.path.join(run, "logits.npy")), expected["logits"])
    results.tensor(f"{label}: loss", np.load(os.path.join(run, "loss.npy")), [expected["loss"]])
    grads = os.path.join(run, "grad")
    written = sorted(name[:-4] for name in os.listdir(grads))
    results.check(f"{label}: a gradient for every parameter, none more", written == expected["names"],
                  f"{len(written)} written, {len(expected['names'])} in the model")
    for name in expected["names"]:
        if name in written:
            results.tensor(f"{label}: gradient {name}", np.load(os.path.join(grads, name + ".npy")),
                           expected["grads"][name])
    losses, norms = np.load(os.path.join(run, "losses.npy")), np.load(os.path.join(run, "norms.npy"))
    for step in range(STEPS):
        results.tensor(f"{label}: loss at step {step}", [losses[step]], [expected["losses"][step]])
        results.tensor(f"{label}: global norm at step {step}", [norms[step]], [expected["norms"][step]])
    results.check(f"{label}: every step clipped (norms over {MAX_NORM})", min(expected["norms"]) > MAX_NORM,
                  f"smallest norm {min(expected['norms']):.3g}")


def masked(targets):  # transformers_dump.cpp's run_lora: the prompts' targets ignored (3 and 6 tokens)
    targets = targets.clone()
    targets[0, :3] = -100
    targets[1, :6] = -100
    return targets


def lora_reference(build, directory):
    """peft's LoRA (r 8, alpha 16, q/k/v/o, no dropout) from the adapters the C++ side wrote, trained 5 steps by
    torch's AdamW over the adapters alone on prompt-masked targets: losses, clipped norms, the adapters after."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(0)
    model = in_float64(build())
    weights = os.path.join(directory, "weights")
    state = {name[:-4]: torch.from_numpy(np.load(os.path.join(weights, name))) for name in os.listdir(weights)}
    model.load_state_dict(state, strict=False)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                             lora_dropout=0.0))
    initial = os.path.join(directory, "lora_weights")
    trainable = {n.replace(".default", ""): p for n, p in model.named_parameters() if p.requires_grad}
    out = {"names": sorted(trainable), "written": sorted(name[:-4] for name in os.listdir(initial))}
    with torch.no_grad():
        for name, p in trainable.items():
            p.data = torch.from_numpy(np.load(os.path.join(initial, name + ".npy"))).clone()
    base = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    params = list(trainable.values())
    optimizer = torch.optim.AdamW(params, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    out["losses"], out["norms"] = [], []
    for step in range(STEPS):
        logits = model(ids_of(step, False)).logits.reshape(-1, VOCAB)
        loss = F.cross_entropy(logits, masked(ids_of(step, True)).reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        out["norms"].append(float(torch.nn.utils.clip_grad_norm_(params, MAX_NORM)))
        optimizer.step()
        out["losses"].append(loss.item())
    out["adapters"] = {n: p.detach().numpy().copy() for n, p in trainable.items()}
    out["base_unchanged"] = all(torch.equal(p, base[n]) for n, p in model.named_parameters() if not p.requires_grad)
    return out


def compare_lora(results, expected, directory, tag):
    run = os.path.join(directory, "llama", tag)
    label = f"llama {tag}"
    compare_steps(results, "llama", expected, run, tag)
    written = sorted(name[:-4] for name in os.listdir(os.path.join(run, "adapters")))
    results.check(f"{label}: an adapter for every one of peft's, none more", written == expected["names"],
                  f"{len(written)} written, {len(expected['names'])} in peft's model")
    for name in expected["names"]:
        if name in written:
            results.tensor(f"{label}: adapter {name}", np.load(os.path.join(run, "adapters", name + ".npy")),
                           expected["adapters"][name])


def base_with_weights(build, directory):
    """The model transformers_dump.cpp wrote the initial weights of, in float64."""
    model = in_float64(build())
    weights = os.path.join(directory, "weights")
    model.load_state_dict({name[:-4]: torch.from_numpy(np.load(os.path.join(weights, name)))
                           for name in os.listdir(weights)}, strict=False)
    return model


def prepare(directory):
    """Before transformers_dump runs: an adapter as peft saves it (r 8, alpha 16, q/k/v/o; A and B drawn here, B
    not zero) in DIR/peft_saved, which transformers_dump loads at tp 4."""
    from peft import LoraConfig, get_peft_model
    torch.manual_seed(1)
    model = get_peft_model(in_float64(llama()), LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0,
                                                         target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn_like(p) * 0.05)
    model.save_pretrained(os.path.join(directory, "peft_saved"))


def logits_of(model):
    with torch.no_grad():
        return model(ids_of(0, False)).logits.reshape(-1, VOCAB).numpy()


def compare_peft(results, build, directory):
    """peft's files both ways: the adapter transformers_dump saved at tp 2 loads in PeftModel.from_pretrained with
    no missing or unexpected key and gives its logits; the merged export loads in from_pretrained with them; the
    adapter peft saved (prepare) gives shardwise's logits at tp 4."""
    from peft import PeftModel
    from peft.utils import load_peft_weights, set_peft_model_state_dict
    run = os.path.join(directory, "llama", "lora_tp2")
    folder = os.path.join(run, "peft")
    if not os.path.exists(os.path.join(folder, "adapter_config.json")):
        results.check("llama peft: shardwise's adapter written", False, folder)
        return
    model = PeftModel.from_pretrained(base_with_weights(build, os.path.join(directory, "llama")), folder)
    loaded = set_peft_model_state_dict(model, load_peft_weights(folder))
    missing = [k for k in loaded.missing_keys if "lora_" in k]
    results.check("llama peft: shardwise's adapter (saved at tp 2) loads with no missing or unexpected key",
                  not missing and not loaded.unexpected_keys, f"missing {missing}, unexpected {loaded.unexpected_keys}")
    expected = np.load(os.path.join(run, "peft_logits.npy"))
    results.tensor("llama peft: logits of PeftModel.from_pretrained(shardwise's adapter, saved at tp 2)", expected,
                   logits_of(model))
    merged = in_float64(LlamaForCausalLM.from_pretrained(os.path.join(run, "merged"), dtype=torch.float64))
    results.tensor("llama peft: logits of from_pretrained(shardwise's merged export)", expected, logits_of(merged))
    peft_saved = PeftModel.from_pretrained(base_with_weights(build, os.path.join(directory, "llama")),
                                           os.path.join(directory, "peft_saved"))
    results.tensor("llama peft: logits of peft's saved adapter loaded by shardwise at tp 4 with SP",
                   np.load(os.path.join(directory, "llama", "peft_saved_tp4.npy")), logits_of(peft_saved))


SCHEDULES = {  # transformers_dump.cpp's run_schedules: get_scheduler's name and arguments, 100 steps each
    "constant": ("constant", {}),
    "constant_with_warmup": ("constant_with_warmup", {"num_warmup_steps": 10}),
    "linear": ("linear", {"num_warmup_steps": 10, "num_training_steps": 100}),
    "linear_past_the_end": ("linear", {"num_warmup_steps": 0, "num_training_steps": 60}),
    "cosine": ("cosine", {"num_warmup_steps": 10, "num_training_steps": 100}),
    "cosine_cycles": ("cosine", {"num_warmup_steps": 5, "num_training_steps": 60,
                                 "scheduler_specific_kwargs": {"num_cycles": 1.5}}),
    "cosine_with_min_lr": ("cosine_with_min_lr", {"num_warmup_steps": 10, "num_training_steps": 100,
                                                  "scheduler_specific_kwargs": {"min_lr_rate": 0.1}}),
}


def compare_schedules(results, directory):
    """Each schedule's learning rate at each of 100 optimizer steps, as LambdaLR sets it, within 1e-12."""
    for label, (name, arguments) in SCHEDULES.items():
        path = os.path.join(directory, "schedules", label + ".npy")
        if not os.path.exists(path):
            results.check(f"schedule {label}: written", False, path)
            continue
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))], lr=1e-2)
        scheduler = get_scheduler(name, optimizer, **arguments)
        rates = []
        for _ in range(100):
            rates.append(optimizer.param_groups[0]["lr"])  # what this step runs with
            optimizer.step()
            scheduler.step()
        got = np.load(path)
        error = float(np.abs(got - np.array(rates)).max()) if got.shape == (100,) else float("inf")
        results.check(f"schedule {label}: 100 learning rates", error <= 1e-14, f"absolute error {error:.1e}")


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ("prepare", "threads", "mpi2", "mpi4"):
        print(__doc__)
        return 2
    directory, backend = sys.argv[1], sys.argv[2]
    if backend == "prepare":
        prepare(directory)
        return 0
    results = Results()
    for model_name, build in MODELS:
        tags = tags_of(model_name, backend)
        if not tags:
            continue
        expected = reference(build, os.path.join(directory, model_name))
        tied = model_name in TIED
        results.check(f"{model_name}: lm_head.weight is the embedding's tensor after loading exactly when tied",
                      expected["tied"] == tied, "")
        results.check(f"{model_name}: loaded every weight (but the tied lm_head)",
                      expected["missing"] == (["lm_head.weight"] if tied else []) and not expected["unexpected"],
                      f"missing {expected['missing']}, unexpected {expected['unexpected']}")
        for tag in tags:
            compare(results, model_name, expected, os.path.join(directory, model_name, tag), tag)
        if backend == "threads" and model_name == "llama":
            scheduled = reference(build, os.path.join(directory, model_name), scheduled=True)
            for tag in ("schedule_unsharded", "schedule_tp2sp"):
                compare(results, model_name, scheduled, os.path.join(directory, model_name, tag), tag)
            adapted = lora_reference(build, os.path.join(directory, model_name))
            results.check("llama lora: the initial adapters written are peft's", adapted["written"] == adapted["names"],
                          f"{len(adapted['written'])} written, {len(adapted['names'])} in peft's model")
            results.check("llama lora: peft leaves the base weights as they were", adapted["base_unchanged"], "")
            for tag in ("lora_unsharded", "lora_tp1", "lora_tp2", "lora_tp2sp", "lora_tp4", "lora_tp4sp", "lora_dp2tp2",
                        "lora_fsdp2", "lora_pp2"):
                compare_lora(results, adapted, directory, tag)
            compare_peft(results, build, directory)
        if backend != "threads" and model_name == "llama":
            adapted = lora_reference(build, os.path.join(directory, model_name))
            for tag in [f"lora_{backend}"] + (["lora_fsdp2", "lora_pp2"] if backend == "mpi2" else ["lora_dp2tp2"]):
                compare_lora(results, adapted, directory, tag)
        if backend == "threads" and model_name in LAYOUTS:
            for tag in ("fsdp2", "fsdp2tp", "pp2", "cp2"):
                compare_steps(results, model_name, expected, os.path.join(directory, model_name, tag), tag)
    if backend == "threads":
        compare_schedules(results, directory)
    worst = {}
    for name, ok, detail in results.rows:
        print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}")
        if detail.startswith("relative error"):
            kind = {"global": "norm"}.get(name.split(": ")[1].split(" ")[0], name.split(": ")[1].split(" ")[0])
            key = (name.split(":")[0].split(" ")[0], kind)
            worst[key] = max(worst.get(key, 0.0), float(detail.split()[-1]))
    for (model_name, kind), error in sorted(worst.items()):
        print(f"worst {model_name} {kind}: {error:.1e}")
    failed = sum(1 for _, ok, _ in results.rows if not ok)
    print(f"{len(results.rows) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
