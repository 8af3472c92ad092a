"""Write an MXFP4 copy of a float gpt-oss checkpoint, as OpenAI's releases store their experts,
so that tests can load one without the model hub: transformers' own MXFP4 writer needs Triton
kernels on a GPU. The format (blocks of 32 E2M1 values sharing an E8M0 power-of-two scale)
follows the OCP Microscaling specification; the tests hold the engine to transformers'
dequantizing load of the same files, not to this writer.
"""

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

BLOCK = 32
MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])  # E2M1's, codes 0-7
EXPERT_WEIGHTS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")


def quantize(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(blocks uint8 [..., out, in/32, 16], scales uint8 [..., out, in/32]) for a float
    [..., out, in]: each block's scale the smallest power of two that brings its largest
    magnitude within 6, each value rounded to the nearest E2M1 (its sign in bit 3)."""
    *lead, out_features, in_features = weight.shape
    groups = weight.float().reshape(*lead, out_features, in_features // BLOCK, BLOCK)
    amax = groups.abs().amax(dim=-1, keepdim=True)
    exponent = torch.ceil(torch.log2(amax / 6.0)).clamp(-127, 127)
    exponent = torch.where(amax > 0, exponent, torch.full_like(exponent, -127))
    scaled = groups / torch.exp2(exponent)
    code = (scaled.abs().unsqueeze(-1) - MAGNITUDES).abs().argmin(dim=-1)
    code = (code + 8 * (scaled < 0)).to(torch.uint8)  # -0.0 is code 8: harmless
    blocks = code[..., 0::2] | (code[..., 1::2] << 4)  # low nibble first
    scales = (exponent.squeeze(-1) + 127).to(torch.uint8)
    return blocks.contiguous(), scales.contiguous()


def save_mxfp4_copy(source: Path, target: Path) -> Path:
    """Copy source (a float gpt-oss checkpoint) to target with every layer's expert weights
    replaced by `_blocks` and `_scales`, and the quantization_config transformers writes."""
    if (target / "config.json").is_file():
        return target
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    for file in sorted(tmp.glob("*.safetensors")):
        tensors = {}
        for name, tensor in load_file(file).items():
            if name.endswith(EXPERT_WEIGHTS):
                # transformers keeps them [experts, in, out]; MXFP4 blocks run along in.
                blocks, scales = quantize(tensor.transpose(-1, -2))
                tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks, scales
            else:
                tensors[name] = tensor
        save_file(tensors, file, metadata={"format": "pt"})
    config = json.loads((tmp / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": [
            "model.layers.*.self_attn",
            "model.layers.*.mlp.router",
            "model.embed_tokens",
            "lm_head",
        ],
    }
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    tmp.replace(target)
    return target
