"""Hugging Face models as references beyond conftest's float32 oracle: the same checkpoint with
the weights int8 stores, and greedy generation from any such model."""

from pathlib import Path

# transformers' names for the linear weights kvpilot quantizes: attention and MLP projections
# (Phi-3's fused qkv_proj and gate_up_proj among them), and the experts' fused 3-D tensors; not
# the router (mlp.gate) or the shared expert's gate.
QUANTIZED = ("_proj.weight", "experts.gate_up_proj", "experts.down_proj")


def hf_with_int8_weights(path: Path):
    """Hugging Face's model with each quantized weight replaced by what int8 stores: a scale per
    output row times an integer (a fused projection's rows are its parts' rows; transformers
    holds most families' experts as [experts, out, in] tensors, so rows are rows there too, and
    gpt-oss's as [experts, in, out] (its experts module says `is_transposed`), whose output rows
    are their columns; gate and up interleaved there is no matter: a row's scale is its own)."""
    import torch
    from transformers import AutoModelForCausalLM

    from kvpilot_server.engine.layers.quant import quantize_int8

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(QUANTIZED):
                owner = model.get_submodule(name.rpartition(".")[0])
                transposed = getattr(owner, "is_transposed", False)
                weight = param.transpose(-1, -2) if transposed else param
                q, scale = quantize_int8(weight.reshape(-1, weight.shape[-1]))
                weight.copy_((q.float() * scale[:, None]).view(weight.shape))
    return model


def hf_greedy_of(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """model.generate(do_sample=False) for one prompt: its new tokens."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt], device=model.device),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=model.device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=model.config.eos_token_id,
        )
    return out[0, len(prompt) :].tolist()
