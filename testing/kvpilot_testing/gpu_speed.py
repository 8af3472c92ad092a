"""benchmarks/gpu_check.py's figures of speed: each weight and KV cache precision (finite,
agreeing, milliseconds per step), batch-1 decode against the memory-bandwidth bound with the
device's busy time beside the wall clock, and throughput against Hugging Face `generate`."""

import time
from pathlib import Path

import torch

from kvpilot_common import precision
from kvpilot_server import SamplingParams
from kvpilot_server.engine.models.model_setup import workspace
from kvpilot_testing.gpu_models import attention_path, engine, random_weights_on_device, release

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _prompts(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(100, vocab, (length,), generator=g).tolist() for _ in range(count)]


def _decode_ms(outputs) -> float:
    """Milliseconds per output token after the first, the median over the requests."""
    per = sorted(
        (o.metrics.finished_time - o.metrics.first_token_time)
        / max(len(o.outputs[0].token_ids) - 1, 1)
        for o in outputs
    )
    return per[len(per) // 2] * 1000


def quantizations(device: torch.device, path: Path, dtype: str) -> dict:
    """Each weight quantization and KV cache dtype this device runs, against the unquantized
    engine: greedy agreement, any NaN logprob, decode milliseconds per token."""
    capability = torch.cuda.get_device_capability(device) if device.type == "cuda" else None
    fp8 = precision.fp8_capable(capability)
    configs = {
        "none": {},
        "int8": {"quantization": "int8"},
        "int4": {"quantization": "int4"},
        "kv-int8": {"kv_cache_dtype": "int8"},
    }
    if fp8:
        configs |= {"fp8": {"quantization": "fp8"}, "kv-fp8": {"kv_cache_dtype": "fp8"}}
    params = SamplingParams(max_tokens=32, logprobs=0, **GREEDY)
    report: dict = {}
    reference = None
    ok = True
    for name, settings in configs.items():
        try:
            llm = engine(path, device, dtype=dtype, **settings)
            prompts = _prompts(8, 40, min(len(llm.tokenizer), 49152))
            outs = llm.generate(prompts, params)
            release(llm)
        except Exception as exc:
            report[name] = {"error": f"{type(exc).__name__}: {exc}"[:400]}
            ok = False
            continue
        tokens = [o.outputs[0].token_ids for o in outs]
        reference = reference or tokens
        pairs = [
            (a, b)
            for x, y in zip(tokens, reference, strict=True)
            for a, b in zip(x, y, strict=True)
        ]
        same = sum(a == b for a, b in pairs)
        finite = all(
            s.logprob == s.logprob and abs(s.logprob) != float("inf")
            for o in outs
            for s in o.outputs[0].logprobs or []
        )
        report[name] = {
            "agreement_with_none": round(same / sum(map(len, reference)), 4),
            "finite_logprobs": finite,
            "decode_ms_per_token": round(_decode_ms(outs), 3),
        }
        ok &= finite
    return {"ok": ok, **report}


def copy_bandwidth(device: torch.device) -> float:
    """Bytes per second a device-to-device copy moves, read and written counted."""
    data = torch.empty(
        1 << 28 if device.type == "cuda" else 1 << 25, dtype=torch.uint8, device=device
    )
    dest = torch.empty_like(data)
    dest.copy_(data)
    _sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dest.copy_(data)
    _sync(device)
    return 2 * data.numel() * 10 / (time.perf_counter() - start)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def batch1_decode(device: torch.device, path: Path, contexts: tuple[int, ...]) -> dict:
    """A random model of the checkpoint's shapes built on the device (no weights read): batch-1
    decode milliseconds per token at each context length, against the time the weights and
    KV bytes take to read at the measured copy bandwidth; on CUDA, the device's busy time per
    token (profiler kernel time) beside the wall clock shows how launch-bound a step is."""
    bandwidth = copy_bandwidth(device)
    dtype = "bfloat16" if device.type == "cuda" else "float32"
    with random_weights_on_device():
        llm = engine(path, device, dtype=dtype, enable_prefix_caching=False)
    model = llm.engine.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    cfg = model.cfg
    kv_per_token = (
        2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * (2 if dtype == "bfloat16" else 4)
    )
    vocab = min(len(llm.tokenizer), 49152)
    report: dict = {
        "attention": attention_path(llm),
        "weight_gib": round(weight_bytes / 2**30, 3),
        "copy_gb_per_s": round(bandwidth / 1e9, 1),
    }
    new = 48
    for context in contexts:
        prompt = _prompts(1, context, vocab, seed=context)[0]
        llm.generate(prompt, SamplingParams(max_tokens=4, **GREEDY))  # warm-up at this shape
        out = llm.generate(prompt, SamplingParams(max_tokens=new, **GREEDY))[0]
        wall = _decode_ms([out])
        bound = (weight_bytes + kv_per_token * (context + new // 2)) / bandwidth * 1000
        row = {
            "ms_per_token": round(wall, 3),
            "bound_ms": round(bound, 3),
            "over_bound": round(wall / bound, 2),
        }
        if device.type == "cuda":
            row["device_busy_ms_per_token"] = round(_busy_ms(llm, prompt, 16), 3)
        report[f"context_{context}"] = row
    release(llm)
    return {"ok": True, **report}


def _busy_ms(llm, prompt: list[int], tokens: int) -> float:
    """Kernel time per decode token, by the profiler: the device's own time, without the
    launch gaps the wall clock includes (prefill subtracted by a one-token run)."""
    from torch.profiler import ProfilerActivity, profile

    def kernel_ms(max_tokens: int) -> float:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            llm.generate(prompt, SamplingParams(max_tokens=max_tokens, **GREEDY))
        return sum(e.self_device_time_total for e in prof.key_averages()) / 1000

    return (kernel_ms(tokens + 1) - kernel_ms(1)) / tokens


def throughput(device: torch.device, path: Path, counts: tuple[int, ...], new: int) -> dict:
    """Output tokens per second, kvpilot against Hugging Face `generate` (one static batch,
    left-padded), same prompts, same dtype, same device."""
    from transformers import AutoModelForCausalLM

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    report: dict = {}
    ok = True
    for count in counts:
        llm = engine(path, device, dtype=dtype)  # the device's own batch limits
        vocab = min(len(llm.tokenizer), 49152)
        prompts = _prompts(count, 64, vocab, seed=count)
        params = SamplingParams(max_tokens=new, **GREEDY)
        llm.generate(prompts[:2], SamplingParams(max_tokens=2, **GREEDY))
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            held = torch.cuda.memory_allocated(device)  # weights and KV cache
        start = time.perf_counter()
        llm.generate(prompts, params)
        ours = count * new / (time.perf_counter() - start)
        memory = {}
        if device.type == "cuda":
            # What the steps took beyond weights and cache, beside the rule the cache was sized
            # around (model_setup.workspace): the rule must not be the smaller.
            peak = torch.cuda.max_memory_allocated(device) - held
            rule = workspace(llm.engine.config, llm.engine.model.cfg, llm.engine.dtype)
            memory = {"step_peak_mib": peak >> 20, "workspace_rule_mib": rule >> 20}
            ok &= peak <= rule
        config = llm.engine.config
        # What the engine chose for this device (kvpilot_common.batch_limits), and whether the
        # step inputs went in one copy (runtime/staging.py passed its start-up check).
        memory["limits"] = [config.max_num_seqs, config.max_num_batched_tokens, config.block_size]
        memory["packed_inputs"] = llm.engine.runner.staging.packed
        release(llm)
        hf = (
            AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
            .to(device)
            .eval()
        )
        ids = torch.tensor(prompts, device=device)
        with torch.inference_mode():
            hf.generate(
                ids[:2], attention_mask=torch.ones_like(ids[:2]), max_new_tokens=2, do_sample=False
            )
            _sync(device)
            start = time.perf_counter()
            hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
            )
            _sync(device)
        theirs = count * new / (time.perf_counter() - start)
        release(hf)
        report[f"prompts_{count}"] = memory | {
            "kvpilot_tok_s": round(ours, 1),
            "hf_tok_s": round(theirs, 1),
            "speedup": round(ours / theirs, 2),
        }
    return {"ok": ok, **report}
