"""benchmarks/gpu_check.py's checks of the fused attention kernels a fast CUDA path would use:
which SDPA backends take the reference path's calls, and torch's varlen flash attention over a
block table laid out as kvpilot's paged cache is."""

import torch
import torch.nn.functional as F

from kvpilot_server.engine.layers.attention import visible_keys
from kvpilot_testing.gpu_ops import Case, dense_reference, relative_error, timed_ms


def sdpa_backends(device: torch.device, dtype: torch.dtype, shape) -> dict:
    """Which of SDPA's backends take the two calls the reference path makes: a decode group
    (sequences as SDPA's batch of kv heads, a boolean mask) and a later prefill chunk (a
    boolean mask with enable_gqa). Milliseconds where a backend runs, its refusal where not."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads, kv_heads, head_dim = shape
    rows, length, n = 32, 1024, 256
    group = heads // kv_heads
    calls = {
        "decode_group": lambda: F.scaled_dot_product_attention(
            torch.randn(kv_heads, rows, group, head_dim, device=device, dtype=dtype),
            torch.randn(kv_heads, rows, length, head_dim, device=device, dtype=dtype),
            torch.randn(kv_heads, rows, length, head_dim, device=device, dtype=dtype),
            attn_mask=torch.ones(1, rows, 1, length, dtype=torch.bool, device=device),
        ),
        "masked_prefill_gqa": lambda: F.scaled_dot_product_attention(
            torch.randn(1, heads, n, head_dim, device=device, dtype=dtype),
            torch.randn(1, kv_heads, length, head_dim, device=device, dtype=dtype),
            torch.randn(1, kv_heads, length, head_dim, device=device, dtype=dtype),
            attn_mask=visible_keys(torch.arange(length - n, length), length, None).to(device),
            enable_gqa=True,
        ),
    }
    found: dict = {}
    for name, call in calls.items():
        found[name] = {}
        for backend in (
            SDPBackend.FLASH_ATTENTION,
            SDPBackend.EFFICIENT_ATTENTION,
            SDPBackend.CUDNN_ATTENTION,
            SDPBackend.MATH,
        ):
            try:
                with sdpa_kernel([backend]):
                    found[name][backend.name] = round(timed_ms(call, device, 3), 4)
            except Exception as exc:
                found[name][backend.name] = f"refused: {str(exc).splitlines()[0][:160]}"
    return {"ok": True, **found}


def varlen_paged(device: torch.device, dtype: torch.dtype, shape) -> dict:
    """torch.nn.attention.varlen.varlen_attn over a paged cache laid out as kvpilot's
    ([pages, page_size, kv_heads, head_dim], an int32 block table, seqused_k), one call for
    decodes and a later prefill chunk together, at page sizes 16 and 256, with and without a
    sliding window (kvpilot's window w is flash's left window w - 1), against the float32
    reference. The fast CUDA path needs exactly this."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError as exc:
        return {"ok": device.type != "cuda", "unavailable": str(exc)}
    import inspect

    if "block_table" not in inspect.signature(varlen_attn).parameters:
        return {"ok": device.type != "cuda", "unavailable": "varlen_attn has no block_table"}
    results: dict = {}
    ok = True
    for page in (16, 256):
        for window in (None, 24):
            key = f"page{page}_window-{window}"
            try:
                error, ms = _varlen_case(varlen_attn, device, dtype, shape, page, window)
                results[key] = {"relative_error": round(error, 5), "ms": round(ms, 4)}
                ok &= error < (1e-4 if dtype == torch.float32 else 0.02)
            except Exception as exc:
                results[key] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                ok &= device.type != "cuda"  # flash kernels are CUDA's; a CPU refusal is expected
    return {"ok": ok, **results}


def _varlen_case(varlen_attn, device, dtype, shape, page: int, window: int | None):
    torch.manual_seed(page)
    heads, _, head_dim = shape
    lens = [1, 17, 300, 40]  # three decodes' contexts and a chunk's (its queries: the last 25)
    queries = [1, 1, 1, 25]
    case = Case(device, dtype, "auto", lens, shape, page)
    for i, n in enumerate(lens):
        case.fill(i, n)
    q = torch.randn(sum(queries), heads, head_dim, device=device)
    cu_q = torch.tensor([0, *torch.tensor(queries).cumsum(0).tolist()], dtype=torch.int32)
    seqused = torch.tensor(lens, dtype=torch.int32, device=device)
    # Both cumulative tensors or neither, the kernel's entry check says, with a block table too.
    cu_k = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    left = -1 if window is None else window - 1

    def call():
        return varlen_attn(
            q.to(dtype),
            case.cache.k,
            case.cache.v,
            cu_q.to(device),
            cu_k.to(device),
            max(queries),
            max(lens),
            window_size=(left, 0),
            enable_gqa=True,
            seqused_k=seqused,
            block_table=case.tables.to(torch.int32),
        )

    got = call()
    wants = []
    for i, (n, m) in enumerate(zip(lens, queries, strict=True)):
        rows = slice(int(cu_q[i]), int(cu_q[i + 1]))
        mask = visible_keys(torch.arange(n - m, n), n, window).to(device)
        wants.append(dense_reference(q[rows], case.keys[i], case.values[i], mask, head_dim**-0.5))
    return relative_error(got, torch.cat(wants)), timed_ms(call, device)
