"""Hugging Face models as references: the checkpoint in float32 (conftest's oracle), the same
with the weights int8 stores, a base with a LoRA adapter merged; greedy generation from any such
model, and its answers kept on disk between runs (hf_cache)."""

import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvpilot_testing.hf_cache import cached, directory_digest

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


@dataclass(frozen=True)
class HFReference:
    """A Hugging Face model named by how it is built from which directories. Its greedy answers
    come from disk when a run before computed them with the same versions, files and arguments;
    otherwise the model is loaded (once per process) and generate() runs, as it always did."""

    recipe: str  # "float32", "int8-weights" or "peft-merged" (base, then adapter)
    paths: tuple[Path, ...]

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        key = self.greedy_key(prompt, max_new_tokens)
        return cached(key, lambda: hf_greedy_of(self.model(), list(prompt), max_new_tokens))

    def greedy_key(self, prompt: list[int], max_new_tokens: int) -> dict[str, Any]:
        """Everything greedy()'s answer depends on beside hf_cache's environment."""
        key: dict[str, Any] = {
            "call": "greedy",
            "recipe": self.recipe,
            "code": _code_digest(self.recipe),
            "models": [directory_digest(p) for p in self.paths],
            "prompt": list(prompt),
            "max_new_tokens": max_new_tokens,
        }
        if self.recipe == "peft-merged":
            import peft

            key["peft"] = peft.__version__  # the merge is peft's arithmetic
        return key

    def model(self) -> Any:  # a transformers PreTrainedModel
        return _load(self)


def float32_reference(path: Path) -> HFReference:
    return HFReference("float32", (Path(path),))


def int8_reference(path: Path) -> HFReference:
    return HFReference("int8-weights", (Path(path),))


def merged_reference(base: Path, adapter: Path) -> HFReference:
    return HFReference("peft-merged", (Path(base), Path(adapter)))


@functools.cache
def _code_digest(recipe: str) -> str:
    """A hash of our code that builds the reference and calls generate(): an edit to it (the
    int8 rounding the engine shares, say) must not be answered from entries made before."""
    import inspect

    functions: list[Any] = [hf_greedy_of, _load]
    if recipe == "int8-weights":
        from kvpilot_server.engine.layers.quant import quantize_int8

        functions += [hf_with_int8_weights, quantize_int8]
    if recipe == "peft-merged":
        from kvpilot_testing.lora import merged_model

        functions.append(merged_model)
    sources = [inspect.getsource(f) for f in functions] + [repr(QUANTIZED)]
    return hashlib.sha256("\0".join(sources).encode()).hexdigest()


# Held for the session, as conftest's oracle always was: on a cold cache each test's prompts, and
# the tests parametrized over the same models, reuse one load.
@functools.cache
def _load(reference: HFReference) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    if reference.recipe == "float32":
        return AutoModelForCausalLM.from_pretrained(reference.paths[0], dtype=torch.float32).eval()
    if reference.recipe == "int8-weights":
        return hf_with_int8_weights(reference.paths[0])
    if reference.recipe == "peft-merged":
        from kvpilot_testing.lora import merged_model

        return merged_model(*reference.paths)
    raise ValueError(f"no such reference recipe: {reference.recipe!r}")
