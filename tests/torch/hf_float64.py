"""transformers' Llama-type models in float64 as shardwise computes them: transformers evaluates its rotary tables
and its RMSNorm in float32 even for a float64 model (together they move fp64 logits by 6e-7); these replace the two
on a loaded model. Used by the reference scripts beside this file; nothing here is shardwise's.
"""
import types

import torch
from transformers import modeling_rope_utils as rope_utils

# The RMSNorm classes of the Llama-type families, each cast to float32 inside transformers.
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm", "MixtralRMSNorm", "Qwen2MoeRMSNorm",
             "Qwen3MoeRMSNorm")


class Float64Torch:
    """torch, but for its float32 type, which is float64 here."""

    def __getattr__(self, name):
        return torch.float64 if name in ("float", "float32") else getattr(torch, name)


def inverse_in_float64(config):
    """The inverse frequencies and the cos/sin factor of transformers' own rope init function for the config's
    scaling, evaluated in float64 (transformers evaluates it in float32)."""
    parameters = config.rope_parameters or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type == "default":
        dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return 1.0 / (parameters.get("rope_theta", 10000.0) ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)), 1.0
    saved, rope_utils.torch = rope_utils.torch, Float64Torch()
    try:
        inverse, factor = rope_utils.ROPE_INIT_FUNCTIONS[rope_type](config, None)
    finally:
        rope_utils.torch = saved
    assert inverse.dtype == torch.float64
    return inverse, factor


def rope_in_float64(rotary, config):
    """transformers' rotary tables, computed in float64 (shardwise's): its frequencies at each position. A dynamic
    scaling's frequencies are those of the call's longest position (transformers' rule for a fresh model: its
    module also keeps the longest length seen across calls, which a fresh one has not)."""
    inverse, factor = inverse_in_float64(config)
    dynamic = (config.rope_parameters or {}).get("rope_type") == "dynamic"

    def forward(self, x, position_ids):
        frequencies = inverse
        if dynamic:
            saved, rope_utils.torch = rope_utils.torch, Float64Torch()
            try:
                frequencies, _ = rope_utils.ROPE_INIT_FUNCTIONS["dynamic"](config, None,
                                                                           seq_len=int(position_ids.max()) + 1)
            finally:
                rope_utils.torch = saved
        angles = position_ids[..., None].double() * frequencies
        both = torch.cat((angles, angles), dim=-1)
        return (both.cos() * factor).to(x.dtype), (both.sin() * factor).to(x.dtype)

    rotary.forward = types.MethodType(forward, rotary)


def rms_norm_in_input_type(norm):
    """LlamaRMSNorm in its input's type (transformers casts to float32 first)."""

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))

    norm.forward = types.MethodType(forward, norm)


def in_float64(model):
    """A loaded Llama-type model, in float64, with its rotary tables and RMSNorms computed in float64."""
    model = model.double()
    rope_in_float64(model.model.rotary_emb, model.config)
    for module in model.modules():
        if type(module).__name__ in RMS_NORMS:
            rms_norm_in_input_type(module)
    return model
