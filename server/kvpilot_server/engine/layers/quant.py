"""Weight quantization of the decoder's linear layers, applied after loading; embeddings and
lm_head stay in the model dtype.

int8 and int4: int8 is symmetric per output channel; int4 is asymmetric per group of inputs (a
scale and a minimum every 32, 64 or 128 weights). On CPU in float32, decode-sized batches run
our AVX2 kernels (kernels/csrc/weight_only.cpp): int8 against float activations, int4 against
activations quantized to int8 per block of 32 as llama.cpp's Q4_1 x Q8_1 does
(kernels/csrc/int8_activations.cpp: one integer instruction per 32 weights, where widening them to
float made the kernel compute-bound; the cost is in `kvpilot eval`'s quality figures). Larger
batches, and every batch elsewhere (CUDA), expand the weight into one buffer shared by the
model's layers and run an ordinary matmul against float activations.
Not torch's packed int4 CPU matmul: measured 8.7x slower than float32 at one row here. Not
fbgemm's dynamic int8: it quantizes activations per tensor, and SmolLM2's activation outliers
(absmax 6.1 vs median 0.017) wreck it (1.6% greedy agreement with float32, measured).

fp8 (CUDA, precision.FP8_MIN_COMPUTE_CAPABILITY or newer): e4m3 weights with a scale per output
channel, activations quantized per row at run time, one `torch._scaled_mm`.
"""

import logging

import torch
from torch import nn

from kvpilot_common import precision
from kvpilot_common.errors import ConfigError
from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_server.engine.kernels.operands import DecodeOperands, ProductKind
from kvpilot_server.engine.layers.direct import Direct
from kvpilot_server.engine.layers.linear import linear

log = logging.getLogger(__name__)
SUPPORTED = tuple(precision.QUANTIZATIONS)
GROUP_SIZES = precision.INT4_GROUP_SIZES
KERNEL_MAX_ROWS = 16  # measured on SmolLM2's matrices: the kernels win up to here
FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_DIM_MULTIPLE = 16  # torch._scaled_mm wants both dimensions of the weight in multiples of 16
FLOAT16_TINY = torch.finfo(torch.float16).tiny  # an int4 group's smallest scale


class DenseBuffer:
    """One grow-only buffer per model, in the model dtype: batches the kernels do not serve
    expand a layer's weight into it. A fresh tensor per call would be mmapped and page-faulted
    every time (measured 5 ms for a 1536x576 weight, against 0.2 ms into a reused buffer)."""

    def __init__(self, like: torch.Tensor) -> None:
        self.data = torch.empty(0, dtype=like.dtype, device=like.device)

    def view(self, rows: int, cols: int) -> torch.Tensor:
        if self.data.numel() < rows * cols:
            self.data = torch.empty(rows * cols, dtype=self.data.dtype, device=self.data.device)
        return self.data[: rows * cols].view(rows, cols)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight, float32 scale per output row) with weight ~= q * scale[:, None]."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp(min=1e-12)
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


def quantize_int4(
    weight: torch.Tensor, group: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(packed uint8 [out, in/2], float16 scale and minimum [out, in/group]) with
    weight ~= q * scale + minimum per group, q in [0, 15]. Within each 16-weight chunk byte k
    holds weight k (low nibble) and weight k + 8 (high nibble): the layout the kernel unpacks."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().view(out_features, in_features // group, group)
    # float16 scale and minimum (GGUF's Q4_1 stores them so): q is chosen against the rounded
    # values, the ones the kernels will read.
    low = groups.amin(dim=2).half()
    scale = ((groups.amax(dim=2) - low.float()) / 15).clamp(min=FLOAT16_TINY).half()
    steps = (groups - low.float()[..., None]) / scale.float()[..., None]
    q = torch.round(steps).clamp(0, 15).to(torch.uint8)
    chunks = q.view(out_features, in_features // 16, 2, 8)
    packed = chunks[:, :, 0] | (chunks[:, :, 1] << 4)
    return packed.reshape(out_features, in_features // 2).contiguous(), scale, low


def dequantize_int4(
    packed: torch.Tensor, scale: torch.Tensor, minimum: torch.Tensor, group: int
) -> torch.Tensor:
    """The float32 weight an int4 one stands for (the reference the kernel is tested against)."""
    out_features = packed.shape[0]
    chunks = packed.view(out_features, -1, 1, 8)
    q = torch.cat((chunks & 0x0F, chunks >> 4), dim=2).view(out_features, -1, group)
    return (q.float() * scale.float()[..., None] + minimum.float()[..., None]).view(
        out_features, -1
    )


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the decode kernels multiply it (the reference they are tested against): per block
    of 32 inputs, d = max |x| / 127 and x ~= d * round(x / d), ties to even."""
    blocks = x.float().view(*x.shape[:-1], -1, 32)
    d = blocks.abs().amax(dim=-1, keepdim=True) / 127
    inverse = torch.where(d > 0, 1 / d, torch.zeros_like(d))
    return (torch.round(blocks * inverse) * d).view(x.shape)


class WeightOnlyLinear(Direct):
    """Shared forward of int8 and int4: the CPU kernel for few rows (float32 on CPU), else expand
    the weight into the model's buffer and run an ordinary matmul. The second path is all
    there is on CUDA in this version: it saves the memory, not the time."""

    def __init__(self, linear: nn.Linear, buffer: DenseBuffer) -> None:
        super().__init__()
        weight = linear.weight
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach())
        self.buffer = buffer
        on_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32
        self.kernel = cpu_kernels.load() if on_cpu else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x if x.dim() == 2 else x.reshape(-1, self.in_features)  # the model's are 2-D
        if self.kernel is not None and rows.shape[0] <= KERNEL_MAX_ROWS:
            out = self.matmul(rows)
        else:
            dense = self.buffer.view(self.out_features, self.in_features)
            self.expand(dense)
            out = linear(rows, dense, self.bias)
        return out if x.dim() == 2 else out.reshape(*x.shape[:-1], self.out_features)

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def expand(self, dense: torch.Tensor) -> None:
        raise NotImplementedError

    def decode_operands(self) -> DecodeOperands | None:
        """The compiled product this layer runs few rows through, and its tensors; None where
        no kernel serves it (off CPU float32, or the kernels did not build)."""
        raise NotImplementedError


class Int8Linear(WeightOnlyLinear):
    def __init__(self, linear: nn.Linear, buffer: DenseBuffer) -> None:
        super().__init__(linear, buffer)
        weight, scale = quantize_int8(linear.weight)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        b = self._buffers  # as Int4Linear.matmul
        return self.kernel.int8_linear(rows, b["weight"], b["scale"], b["bias"])

    def expand(self, dense: torch.Tensor) -> None:
        if self.kernel is not None:
            self.kernel.int8_dequantize(self.weight, self.scale, dense)
        else:  # in place: an out= multiply refuses to round float32 into bfloat16
            dense.copy_(self.weight).mul_(self.scale[:, None])

    def decode_operands(self) -> DecodeOperands | None:
        if self.kernel is None:
            return None
        return DecodeOperands(
            ProductKind.INT8, self.weight, self.scale, None, 0, self.bias, KERNEL_MAX_ROWS
        )


class Int4Linear(WeightOnlyLinear):
    def __init__(self, linear: nn.Linear, buffer: DenseBuffer, group: int) -> None:
        super().__init__(linear, buffer)
        self.group = group
        weight, scale, minimum = quantize_int4(linear.weight, group)
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)
        if self.kernel is not None:  # int8 activations need whole spans of inputs
            whole = self.in_features % self.kernel.INT8_ACTIVATION_SPAN == 0
            self.kind = ProductKind.INT4_INT8 if whole else ProductKind.INT4
            self.product = self.kernel.int4_int8_linear if whole else self.kernel.int4_linear

    def matmul(self, rows: torch.Tensor) -> torch.Tensor:
        # Straight from the buffer table: nn.Module's attribute lookup costs ~0.5 us a name.
        b = self._buffers
        return self.product(rows, b["weight"], b["scale"], b["minimum"], self.group, b["bias"])

    def expand(self, dense: torch.Tensor) -> None:
        if self.kernel is not None:
            self.kernel.int4_dequantize(self.weight, self.scale, self.minimum, self.group, dense)
        else:
            dense.copy_(dequantize_int4(self.weight, self.scale, self.minimum, self.group))

    def decode_operands(self) -> DecodeOperands | None:
        if self.kernel is None:
            return None
        return DecodeOperands(
            self.kind,
            self.weight,
            self.scale,
            self.minimum,
            self.group,
            self.bias,
            KERNEL_MAX_ROWS,
        )


class Fp8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()
        scale = (weight.abs().amax(dim=1) / FP8_MAX).clamp(min=1e-12)
        self.register_buffer("weight", (weight / scale[:, None]).to(torch.float8_e4m3fn))
        self.register_buffer("scale", scale[None, :].contiguous())  # [1, out], as _scaled_mm wants
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, x.shape[-1])
        # Per-row activation scales: one outlier token does not flatten every other row.
        row_scale = (rows.abs().amax(dim=1, keepdim=True).float() / FP8_MAX).clamp(min=1e-12)
        q = (rows.float() / row_scale).to(torch.float8_e4m3fn)
        out = torch._scaled_mm(
            q, self.weight.t(), scale_a=row_scale, scale_b=self.scale, out_dtype=x.dtype
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.weight.shape[0])


def check(method: str, group: int, device: torch.device, dtype: torch.dtype) -> None:
    """Refuse at start what cannot run here, in words."""
    if method not in SUPPORTED:
        raise ConfigError(f"quantization {method!r} is not supported (one of {SUPPORTED})")
    if method in ("int8", "int4") and (device.type != "cpu" or dtype != torch.float32):
        log.warning(
            "%s weights on %s in %s expand each layer per call: the memory is saved, decoding "
            "is slower than unquantized in this version (the fast kernels are CPU float32)",
            method,
            device,
            dtype,
        )
    if precision.QUANTIZATIONS[method].fp8:
        capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
        if not precision.fp8_capable(capability):
            floor = precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT
            raise ConfigError(
                f"fp8 weights need a CUDA GPU of compute capability {floor} or newer "
                f"(Ada, Hopper); this device is {device}: use int8 or int4 on CPU, or none"
            )
    if method == "int4" and group not in GROUP_SIZES:
        raise ConfigError(f"int4 group size must be one of {GROUP_SIZES}, not {group}")


def quantize(
    model: nn.Module,
    method: str,
    device: torch.device,
    group: int = precision.INT4_DEFAULT_GROUP_SIZE,
) -> None:
    """Replace the decoder layers' linear modules in place."""
    check(method, group, device, model.embed_tokens.weight.dtype)
    if method == "none":
        return
    layers = decoder_linears(model)
    for owner, name in layers:  # every check before any change: never a half-quantized model
        inputs, outputs = getattr(owner, name).in_features, getattr(owner, name).out_features
        if method == "fp8" and (inputs % FP8_DIM_MULTIPLE or outputs % FP8_DIM_MULTIPLE):
            # torch._scaled_mm's rule; under tensor parallelism these are this rank's shares.
            raise ConfigError(
                f"fp8 weights need every layer's inputs and outputs in multiples of "
                f"{FP8_DIM_MULTIPLE}; {name} has {inputs} inputs and {outputs} outputs here "
                "(with tensor parallelism, per GPU): use int8, or another tensor parallel size"
            )
        if method == "int4" and inputs % group:
            fits = [g for g in GROUP_SIZES if inputs % g == 0]
            raise ConfigError(
                f"int4 group size {group} does not divide {name}'s {inputs} inputs; "
                f"choose one of {fits}"
            )
    buffer = DenseBuffer(model.embed_tokens.weight)
    for owner, name in layers:
        setattr(owner, name, _quantized(getattr(owner, name), method, buffer, group))


def decoder_linears(model: nn.Module) -> list[tuple[nn.Module, str]]:
    """(owner, attribute) of every decoder linear layer: what quantization replaces."""
    pairs = []
    for layer in model.layers:
        pairs += [(layer.self_attn, "qkv_proj"), (layer.self_attn, "o_proj")]
        pairs += layer.mlp.linears()  # a dense MLP's two, or every expert's (layers/moe.py)
    return pairs


def _quantized(dense: nn.Linear, method: str, buffer: DenseBuffer, group: int) -> nn.Module:
    if method == "int8":
        return Int8Linear(dense, buffer)
    if method == "int4":
        return Int4Linear(dense, buffer, group)
    return Fp8Linear(dense)
