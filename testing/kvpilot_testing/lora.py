"""Random LoRA adapters written by peft itself, and their oracle: peft's merge_and_unload.

peft initializes B to zero (an adapter that changes nothing) unless told not to; with
init_lora_weights=False both A and B are random, and B is scaled up here so that each adapter
moves the tiny models' greedy output away from the base's (the tests check that it does, or
they could not tell an adapter applied from one ignored).
"""

from dataclasses import dataclass, field
from pathlib import Path

ALL_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# A checkpoint that stores these fused (Phi-3) has its adapters target the fused module.
_FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj"}
_FUSED |= {"gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}


@dataclass(frozen=True)
class AdapterSpec:
    rank: int
    targets: tuple[str, ...]
    alpha: int = 16
    rslora: bool = False
    seed: int = 1
    # peft's own per-module overrides, e.g. {"o_proj": 4}
    alpha_pattern: dict[str, int] = field(default_factory=dict)


def build_adapter(base: Path, target: Path, spec: AdapterSpec, gain: float = 30.0) -> Path:
    """Write a peft LoRA adapter for the checkpoint `base` to `target` (once)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    if (target / "adapter_config.json").is_file():
        return target
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    names = {name.rpartition(".")[2] for name, _ in model.named_modules()}
    targets = {t if t in names else _FUSED[t] for t in spec.targets}
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=sorted(targets),
        use_rslora=spec.rslora,
        alpha_pattern=dict(spec.alpha_pattern),
        init_lora_weights=False,
        lora_dropout=0.0,
    )
    torch.manual_seed(spec.seed)
    peft_model = get_peft_model(model, config)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.mul_(gain)
    peft_model.save_pretrained(target, safe_serialization=True)
    return target


def merged_model(base: Path, adapter: Path):
    """The oracle: Hugging Face's base model with the adapter merged into its weights."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter).merge_and_unload().eval()
