"""Paged KV cache storage: per layer, K and V blocks [num_blocks, block_size, kv_heads, head_dim].

kv_cache_dtype auto stores the model dtype. int8 and fp8 store one byte per element plus a
float32 scale per token per kv head (symmetric: scale = absmax / qmax), so a token is quantized
once as it is written and needs no calibration. Per-token scales keep one outlier token from
costing its whole block precision; they add 4 bytes per head_dim bytes (6% at head_dim 64).
"""

from dataclasses import dataclass
from types import ModuleType

import torch

from kvpilot_common import precision
from kvpilot_common.errors import ConfigError
from kvpilot_server.engine import huge_pages
from kvpilot_server.engine.models.model_config import ModelConfig

_MIN_SCALE = 1e-8  # an all-zero head still gets a finite scale


@dataclass
class LayerCache:
    k: torch.Tensor  # [num_blocks, block_size, kv_heads, head_dim]
    v: torch.Tensor
    # [num_blocks, block_size, kv_heads] float32 when k and v are quantized, else None
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None

    @property
    def nbytes(self) -> int:
        tensors = (self.k, self.v, self.k_scale, self.v_scale)
        return sum(t.nbytes for t in tensors if t is not None)

    def write(
        self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kernel: ModuleType | None
    ) -> None:
        """Store new keys and values [N, kv_heads, head_dim] in their slots [N]. With the
        compiled CPU kernel, int8 is quantized in one call, bit for bit the same: ~10 PyTorch
        ops per layer cost 2.5 ms of a 37 ms SmolLM2 decode step on 2 cores."""
        if self.k_scale is None or self.v_scale is None:
            if kernel is not None and self.k.dtype == k.dtype == torch.float32:
                kernel.write_kv(k, v, self.k, self.v, slots)
                return
            _put(self.k, slots, k)
            _put(self.v, slots, v)
            return
        for cache, scales, new in ((self.k, self.k_scale, k), (self.v, self.v_scale, v)):
            if kernel is not None and cache.dtype == torch.int8:
                kernel.write_int8(new, cache, scales, slots)
                continue
            quantized, scale = quantize(new, cache.dtype)
            _put(cache, slots, quantized)
            _put(scales, slots, scale)


KVCache = list[LayerCache]


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric quantization of each row of the last dimension: x ~= q * scale[..., None]."""
    qmax = _qmax(dtype)
    x = x.float()
    scale = x.abs().amax(-1).div_(qmax).clamp_(min=_MIN_SCALE)
    # The clamp only catches rounding a hair past qmax: not every device's float8 cast saturates.
    scaled = (x / scale.unsqueeze(-1)).clamp_(-qmax, qmax)
    if not dtype.is_floating_point:
        scaled.round_()  # a cast to int truncates; a cast to float8 rounds by itself
    return scaled.to(dtype), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """q * scale[..., None] written into `out` (a workspace buffer: no fresh allocation)."""
    # copy_ then mul_: PyTorch does not promote float8 in a mixed-type multiply.
    return out.copy_(q).mul_(scale.unsqueeze(-1))


def raw_bytes(t: torch.Tensor) -> torch.Tensor:
    """One-byte storage as uint8, for index_copy_/index_select, which have no float8 kernels."""
    return t.view(torch.uint8) if t.element_size() == 1 else t


def _put(cache: torch.Tensor, slots: torch.Tensor, new: torch.Tensor) -> None:
    raw_bytes(cache).flatten(0, 1).index_copy_(0, slots, raw_bytes(new))


def _qmax(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max if dtype.is_floating_point else torch.iinfo(dtype).max)


def _storage(kv_cache_dtype: str, device: torch.device) -> torch.dtype | None:
    """The quantized element type, or None for the model dtype; fp8 only where GPUs support it."""
    rule = precision.KV_CACHE_DTYPES[kv_cache_dtype]
    if rule.fp8:
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        if not precision.fp8_capable(capability):
            found = "a CPU" if capability is None else "a GPU of {}.{}".format(*capability)
            raise ConfigError(
                f"kv_cache_dtype {kv_cache_dtype} needs a CUDA GPU with compute capability >= "
                f"{precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT} (found {found}); use int8 or auto"
            )
    return None if rule.storage is None else getattr(torch, rule.storage)


def allocate(
    cfg: ModelConfig,
    dtype: torch.dtype,  # the model's: what an unquantized cache stores
    device: torch.device,
    num_blocks: int,
    block_size: int,
    kv_cache_dtype: str = "auto",
) -> KVCache:
    storage = _storage(kv_cache_dtype, device)
    shape = (num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim)

    # Zeros, not empty: padded decode rows read unused slots, and 0 * NaN would poison them.
    # On the host, on huge pages (engine/huge_pages.py): asked for before the zeros touch them.
    def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=dtype, device=device)
        huge_pages.advise(tensor)
        return tensor.zero_()

    def layer() -> LayerCache:
        if storage is None:
            return LayerCache(zeros(shape, dtype=dtype), zeros(shape, dtype=dtype))
        k, v = (zeros(shape, dtype=storage) for _ in range(2))
        scales = (zeros(shape[:-1], dtype=torch.float32) for _ in range(2))
        return LayerCache(k, v, *scales)

    return [layer() for _ in range(cfg.num_layers)]


def bytes_per_block(
    cfg: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    block_size: int,
    kv_cache_dtype: str = "auto",
) -> int:
    _storage(kv_cache_dtype, device)  # refuses fp8 where it cannot run
    per_head = precision.kv_bytes_per_head(cfg.head_dim, kv_cache_dtype, dtype.itemsize)
    return 2 * cfg.num_layers * block_size * cfg.num_kv_heads * per_head
