"""benchmarks/gpu_check.py's checks of single operations, without a model: fp8 products against
bfloat16, paged attention against a dense float32 reference in every shape a step takes (decode
groups, a fresh prefill, a later chunk over cached context, a sliding window, each KV cache
dtype; the fused kernels are gpu_flash.py's). Each check returns a dict of figures and `ok`."""

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvpilot_common import precision
from kvpilot_server.engine.layers.attention import (
    AttentionMetadata,
    DecodeGroup,
    PrefillChunk,
    Workspace,
    paged_attention,
    visible_keys,
)
from kvpilot_server.engine.layers.kv_cache import LayerCache


def timed_ms(fn: Callable[[], object], device: torch.device, repeat: int = 5) -> float:
    """Median milliseconds of fn() after one warm-up, synchronized on CUDA."""
    fn()
    times = []
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) * 1000)
    return sorted(times)[len(times) // 2]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp(min=1e-30))


def fp8_linear(device: torch.device, size: int) -> dict:
    """Fp8Linear (per-row activation scales, per-channel weight scales, torch._scaled_mm) against
    the bfloat16 product, at 1, 3, 64 and 2048 rows, with bfloat16 and float16 outputs."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    if not precision.fp8_capable(capability):
        return {
            "ok": True,
            "skipped": f"fp8 needs compute capability {precision.FP8_MIN_COMPUTE_CAPABILITY_TEXT}",
        }
    from kvpilot_server.engine.layers.quant import Fp8Linear

    rows_out: dict = {}
    ok = True
    for dtype in (torch.bfloat16, torch.float16):
        linear = torch.nn.Linear(size, size, bias=False, device=device, dtype=dtype)
        layer = Fp8Linear(linear)
        for rows in (1, 3, 64, 2048):
            x = torch.randn(rows, size, device=device, dtype=dtype)
            key = f"{str(dtype).removeprefix('torch.')}_rows{rows}"
            try:
                got = layer(x)
                want = F.linear(x.float(), linear.weight.float())
                error = relative_error(got, want)
                rows_out[key] = {
                    "relative_error": round(error, 5),
                    "fp8_ms": round(timed_ms(lambda: layer(x), device), 4),  # noqa: B023
                    "bf16_ms": round(timed_ms(lambda: linear(x), device), 4),  # noqa: B023
                }
                ok &= error < 0.08  # e4m3 has 3 mantissa bits on both sides
            except Exception as exc:
                rows_out[key] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
                ok = False
    return {"ok": ok, **rows_out}


def dense_reference(q, keys, values, mask, scale: float) -> torch.Tensor:
    """The float32 reference: q [n, heads, d] against one sequence's keys and values [L,
    kv_heads, d], mask [n, L] True where visible."""
    group = q.shape[1] // keys.shape[1]
    k = keys.float().repeat_interleave(group, dim=1).transpose(0, 1)
    v = values.float().repeat_interleave(group, dim=1).transpose(0, 1)
    logits = torch.matmul(q.float().transpose(0, 1), k.transpose(1, 2)) * scale
    logits = logits.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(logits, dim=-1), v).transpose(0, 1)


class Case:
    """Sequences of random K/V written into a paged cache in random blocks, kept densely too."""

    def __init__(self, device, dtype, kv_dtype: str, lens: list[int], shape, block_size: int):
        self.heads, self.kv_heads, self.head_dim = shape
        self.device, self.dtype, self.block_size = device, dtype, block_size
        width = max(-(-n // block_size) for n in lens)
        num_blocks = len(lens) * width + 3
        order = torch.randperm(num_blocks)[: len(lens) * width].view(len(lens), width)
        self.tables = order.to(device)
        self.keys = [torch.randn(n, self.kv_heads, self.head_dim, device=device) for n in lens]
        self.values = [torch.randn(n, self.kv_heads, self.head_dim, device=device) for n in lens]
        cache_shape = (num_blocks, block_size, self.kv_heads, self.head_dim)
        storage = {"auto": dtype, "int8": torch.int8, "fp8": torch.float8_e4m3fn}[kv_dtype]
        zeros = lambda s, t: torch.zeros(s, dtype=t, device=device)  # noqa: E731
        self.cache = LayerCache(zeros(cache_shape, storage), zeros(cache_shape, storage))
        if kv_dtype != "auto":  # a float32 scale per token per kv head, as kv_cache.allocate's
            self.cache.k_scale = zeros(cache_shape[:-1], torch.float32)
            self.cache.v_scale = zeros(cache_shape[:-1], torch.float32)
        self.lens = lens

    def slots(self, seq: int, positions: range) -> torch.Tensor:
        table = self.tables[seq].tolist()
        return torch.tensor(
            [
                table[p // self.block_size] * self.block_size + p % self.block_size
                for p in positions
            ],
            dtype=torch.long,
            device=self.device,
        )

    def fill(self, seq: int, upto: int) -> None:
        """Write tokens [0, upto) of a sequence into the cache."""
        slots = self.slots(seq, range(upto))
        k, v = self.keys[seq][:upto].to(self.dtype), self.values[seq][:upto].to(self.dtype)
        self.cache.write(slots, k, v, None)


def paged_attention_cases(device: torch.device, dtype: torch.dtype, shape) -> dict:
    """The engine's paged attention against the float32 reference, for each KV cache dtype
    this device runs: decodes of mixed lengths (one group), a fresh prefill, a later chunk
    attending to cached context, and the same under a sliding window."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    kv_dtypes = ["auto", "int8"] + (["fp8"] if precision.fp8_capable(capability) else [])
    # Tolerances against float32: the cache dtype's rounding of K and V, and the model dtype's.
    bound = {"auto": 0.02 if dtype != torch.float32 else 1e-4, "int8": 0.03, "fp8": 0.1}
    results: dict = {}
    ok = True
    for kv in kv_dtypes:
        for window in (None, 24):
            for kind in ("decode", "fresh_prefill", "chunk_prefill"):
                key = f"{kind}_kv-{kv}_window-{window}"
                try:
                    error = _one_case(device, dtype, kv, window, kind, shape)
                    results[key] = round(error, 5)
                    ok &= error < bound[kv]
                except Exception as exc:
                    results[key] = f"{type(exc).__name__}: {exc}"[:400]
                    ok = False
    return {"ok": ok, "relative_error": results, "bounds": bound}


def _one_case(device, dtype, kv: str, window: int | None, kind: str, shape) -> float:
    torch.manual_seed(0)
    heads, _, head_dim = shape
    scale = head_dim**-0.5
    if kind == "decode":
        lens = [1, 17, 64, 100, 3]
        case = Case(device, dtype, kv, lens, shape, 16)
        for i, n in enumerate(lens):
            case.fill(i, n - 1)  # the last token's K/V arrive with the step
        rows, width = len(lens), case.tables.shape[1]
        context = torch.tensor(lens, device=device)
        mask = visible_keys(torch.tensor(lens) - 1, width * 16, window)[None, :, None].to(device)
        group = DecodeGroup(0, rows, case.tables.flatten(), width, mask, context)
        slots = torch.cat([case.slots(i, range(n - 1, n)) for i, n in enumerate(lens)])
        meta = AttentionMetadata(slots, window, None, decodes=[group])
        q = torch.randn(rows, heads, head_dim, device=device)
        new_k = torch.stack([case.keys[i][n - 1] for i, n in enumerate(lens)])
        new_v = torch.stack([case.values[i][n - 1] for i, n in enumerate(lens)])
        got = paged_attention(
            q.to(dtype), new_k.to(dtype), new_v.to(dtype), case.cache, meta, Workspace()
        )
        want = torch.cat(
            [
                dense_reference(
                    q[i : i + 1],
                    case.keys[i],
                    case.values[i],
                    visible_keys(torch.tensor([n - 1]), n, window).to(device),
                    scale,
                )
                for i, n in enumerate(lens)
            ]
        )
        return relative_error(got, want)
    total, start = (80, 0) if kind == "fresh_prefill" else (90, 57)
    case = Case(device, dtype, kv, [total], shape, 16)
    case.fill(0, start)
    n = total - start
    positions = torch.arange(start, total)
    # A fresh prefill attends to its own (unquantized) K/V: mask None, causal.
    # As the model runner decides: a fresh prefill within its window attends to its own
    # (unquantized) K/V, causal, with no mask; otherwise the mask and the cache.
    fresh = kind == "fresh_prefill" and window is None
    mask = None if fresh else visible_keys(positions, total, window).to(device)
    blocks = case.tables[0, : -(-total // 16)]
    chunk = PrefillChunk(0, n, blocks, total, mask)
    meta = AttentionMetadata(case.slots(0, range(start, total)), window, None, prefills=[chunk])
    q = torch.randn(n, heads, head_dim, device=device)
    k, v = case.keys[0][start:], case.values[0][start:]
    got = paged_attention(q.to(dtype), k.to(dtype), v.to(dtype), case.cache, meta, Workspace())
    reference_mask = visible_keys(positions, total, window).to(device)
    return relative_error(
        got, dense_reference(q, case.keys[0], case.values[0], reference_mask, scale)
    )
