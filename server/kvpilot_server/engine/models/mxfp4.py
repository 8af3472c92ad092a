"""MXFP4 checkpoints (gpt-oss's releases): expert weights stored as 4-bit floats in blocks of 32
that share a power-of-two scale, read back into the engine's float dtype as they load.

Each quantized tensor `X` is stored as two: `X_blocks`, uint8 [..., out, in / 32, 16], two E2M1
values a byte (low nibble first), and `X_scales`, uint8 [..., out, in / 32], each block's E8M0
exponent biased by 127. Every E2M1 value times a power of two is exact in float32 and bfloat16,
so dequantizing loses nothing: the weights served are the ones the checkpoint stores, as
transformers' own dequantizing load reads them (the oracle the tests hold this to).

Why dequantize rather than keep 4 bits: kvpilot's int4 kernels take 16 evenly spaced levels per
group, and E2M1's eight magnitudes (0, 0.5, 1, 1.5, 2, 3, 4, 6) are not evenly spaced, so no
int4 group holds them exactly; `--quantization int4` (or int8) quantizes the dequantized
experts again, at the cost docs/commands.md gives, for the memory of a 4-bit model.
"""

from collections.abc import Iterator

import torch

from kvpilot_common.errors import ModelLoadError

BLOCK = 32  # weights that share one scale
_BLOCK_BYTES = BLOCK // 2
_SCALE_BIAS = 127  # E8M0: the scale is 2 ** (stored - 127)
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_PARTS = ("_blocks", "_scales")


def dequantized(
    tensors: Iterator[tuple[str, torch.Tensor]], dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with each `X_blocks`/`X_scales` pair replaced by `X` in dtype,
    laid out as transformers keeps a float checkpoint's experts ([..., in, out]); the rest as
    they are. A pair's halves may come from different files: the first waits for the second."""
    waiting: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in tensors:
        base, part = name[:-7], name[-7:]
        if part not in _PARTS:
            yield name, tensor
            continue
        pair = waiting.setdefault(base, {})
        pair[part] = tensor
        if len(pair) == 2:
            del waiting[base]
            weight = dequantize(pair["_blocks"], pair["_scales"], dtype, base)
            yield base, weight.transpose(-1, -2)
    if waiting:
        base, pair = next(iter(waiting.items()))
        missing = next(p for p in _PARTS if p not in pair)
        raise ModelLoadError(f"Checkpoint has {base}{next(iter(pair))} but no {base}{missing}")


def dequantize(
    blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype, name: str = "weight"
) -> torch.Tensor:
    """[..., out, in] in dtype from MXFP4 blocks and scales. One leading slice at a time, so
    that the lookup's indices (8 bytes each) stay a slice's size, not a whole layer's."""
    if (
        blocks.dtype != torch.uint8
        or scales.dtype != torch.uint8
        or blocks.shape[-1] != _BLOCK_BYTES
        or blocks.shape[:-1] != scales.shape
        or blocks.dim() < 3
    ):
        raise ModelLoadError(
            f"{name}: MXFP4 blocks {tuple(blocks.shape)} {blocks.dtype} and scales "
            f"{tuple(scales.shape)} {scales.dtype} do not pair (uint8 [..., out, in/32, 16] "
            "and uint8 [..., out, in/32])"
        )
    *lead, out_features, groups, _ = blocks.shape
    weight = torch.empty(*lead, out_features, groups * BLOCK, dtype=dtype)
    # One lookup a byte: its two weights, low nibble first (byte k holds weights 2k and 2k + 1).
    pairs = torch.tensor([(E2M1[b & 0x0F], E2M1[b >> 4]) for b in range(256)], dtype=dtype)
    # Every E8M0 scale as a float32 power of two: multiplying by one is exact, as ldexp is.
    powers = torch.ldexp(torch.ones(256), torch.arange(256) - _SCALE_BIAS)
    flat_blocks = blocks.reshape(-1, out_features, groups, _BLOCK_BYTES)
    flat_scales = scales.reshape(-1, out_features, groups)
    values = torch.empty(out_features * groups * _BLOCK_BYTES, 2, dtype=dtype)  # reused
    for index, target in enumerate(weight.view(-1, out_features, groups, BLOCK)):
        torch.index_select(pairs, 0, flat_blocks[index].reshape(-1).long(), out=values)
        scale = powers[flat_scales[index].long()].unsqueeze(-1)
        torch.mul(values.view(out_features, groups, BLOCK), scale, out=target)
    return weight
