"""One `kvpilot eval` config, measured in this process (run as `python -m
kvpilot_server.eval_job` with the job as JSON on stdin, the figures as JSON on stdout)."""

import json
import math
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvpilot_common import precision

PROMPT_TOKENS = 64  # agreement and speed prompts
SPEED_BATCH = 32


@dataclass
class Job:
    model: str
    quantization: str
    kv_cache_dtype: str
    group_size: int
    device: str
    text: str
    tokens: int  # perplexity: the text's first `tokens` tokens
    window: int  # ... in windows of this many
    prompts: int  # agreement: prompts after the perplexity span
    new_tokens: int
    speed_tokens: int  # 0: no speed measurement
    continuations: list[list[int]] | None = None  # the baseline's; None: this is the baseline
    lm_head_quantization: str = precision.DEFAULT_LM_HEAD_QUANTIZATION
    dtype: str = precision.DEFAULT_DTYPE

    @property
    def name(self) -> str:
        kv = "" if self.kv_cache_dtype == "auto" else f"+kv-{self.kv_cache_dtype}"
        group = f"-g{self.group_size}" if self.quantization == "int4" else ""
        lm_head = self.lm_head_quantization
        head = "" if lm_head == precision.DEFAULT_LM_HEAD_QUANTIZATION else f"+lm_head-{lm_head}"
        dtype = "" if self.dtype == precision.DEFAULT_DTYPE else f"@{self.dtype}"
        return f"{self.quantization}{group}{head}{dtype}{kv}"


def run_job(job: Job) -> dict:
    """One config, in this process: build the engine, time it, then measure quality."""
    from kvpilot_common.memory_model import kv_bytes_per_token, shape_from_config
    from kvpilot_server import LLM
    from kvpilot_server.engine.models.model_setup import dtype_name, resolve_device, resolve_dtype

    config = json.loads((_model_path(job.model) / "config.json").read_text())
    # The KV cache's dtype for the engine below, to size its cache in advance.
    device = resolve_device(job.device)
    dtype = str(resolve_dtype(job.dtype, device)).removeprefix("torch.")
    max_len = max(job.window + 1, PROMPT_TOKENS + max(job.new_tokens, job.speed_tokens))
    per_token = kv_bytes_per_token(shape_from_config(config), dtype, job.kv_cache_dtype)
    llm = LLM(
        job.model,
        device=job.device,
        dtype=job.dtype,
        quantization=job.quantization,
        quantization_group_size=job.group_size,
        kv_cache_dtype=job.kv_cache_dtype,
        lm_head_quantization=job.lm_head_quantization,
        # Room for the speed batch at full length: the same token capacity in every config.
        kv_cache_bytes=max_len * SPEED_BATCH * per_token,
        max_model_len=max_len,
        enable_prefix_caching=False,
    )
    ids = llm.tokenizer(job.text).input_ids
    needed = job.tokens + max(job.prompts, SPEED_BATCH) * PROMPT_TOKENS
    if len(ids) < needed:
        raise SystemExit(f"the text has {len(ids)} tokens; this evaluation needs {needed}")
    prompts = [ids[job.tokens + i * PROMPT_TOKENS :][:PROMPT_TOKENS] for i in range(SPEED_BATCH)]
    model = llm.engine.model
    # Tied weights counted once; a packed bfloat16 weight (layers/half_matrices.py) has no
    # storage to point at, and is its own.
    tensors = {
        id(t) if t.is_mkldnn else t.data_ptr(): t.numel() * t.element_size()
        for t in [*model.parameters(), *model.buffers()]
    }
    result: dict = {
        "dtype": dtype_name(job.dtype, device),  # what auto meant here
        "weight_mib": round(sum(tensors.values()) / 2**20, 1),
        "kv_cache_mib": round(sum(layer.nbytes for layer in llm.engine.runner.kv_cache) / 2**20, 1),
    }
    if job.speed_tokens:
        result |= _speed(llm, prompts, job.speed_tokens)
        # Before the quality passes: their full-vocabulary logits are not serving memory. The
        # peak includes loading (weights are read in the model dtype, then quantized); the
        # resident figure is what serving holds.
        result["rss_mib"] = _resident_mib()  # first: the peak read after it includes it
        peak = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
        # The kernel keeps its RSS counts per CPU and folds them in batches (a huge page's
        # fault counts 512 pages at once): the two reads can differ by a MiB either way, and a
        # peak below what is resident would say nothing true.
        result["peak_rss_mib"] = max(peak, result["rss_mib"] or 0)
    # Quality passes prefill in small chunks, so every chunk after a window's first attends to
    # its context through the KV cache, as decoding does; one fresh chunk per window would
    # attend to its own unquantized keys and hide what a cache precision costs. Few enough
    # rows that every linear layer runs the kernel a decode step runs (int4's multiplies int8
    # activations; the expansion path for larger batches does not).
    from kvpilot_server.engine.layers.quant import KERNEL_MAX_ROWS

    llm.engine.scheduler.max_num_batched_tokens = KERNEL_MAX_ROWS
    result["perplexity"] = round(_perplexity(llm, ids[: job.tokens], job.window), 4)
    prompts = [ids[job.tokens + i * PROMPT_TOKENS :][:PROMPT_TOKENS] for i in range(job.prompts)]
    continuations = job.continuations or _greedy(llm, prompts, job.new_tokens)
    result["greedy_agreement"] = round(_agreement(llm, prompts, continuations), 4)
    if job.continuations is None:
        result["continuations"] = continuations
    return result


def _model_path(model: str):
    from kvpilot_server.models.resolve import resolve_model

    return resolve_model(model)


def _resident_mib() -> int | None:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:  # not Linux
        return None
    line = next(x for x in status.splitlines() if x.startswith("VmRSS:"))
    return round(int(line.split()[1]) / 1024)


def _speed(llm, prompts: list[list[int]], new_tokens: int) -> dict:
    from kvpilot_server import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    llm.generate(prompts[:2], SamplingParams(max_tokens=4))  # warm-up: kernels, allocator
    decode = []  # seconds per token after the first (prefill excluded), median of 3 runs
    for _ in range(3):
        single = llm.generate(prompts[0], params)[0].metrics
        decode.append((single.finished_time - single.first_token_time) / (new_tokens - 1))
    start = time.perf_counter()
    llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    return {
        "batch1_decode_tokens_per_s": round(1 / statistics.median(decode), 1),
        "batch32_output_tokens_per_s": round(len(prompts) * new_tokens / elapsed, 1),
    }


def _perplexity(llm, ids: list[int], window: int) -> float:
    from kvpilot_server import SamplingParams

    windows = [ids[i : i + window] for i in range(0, len(ids) - 1, window)]
    windows = [w for w in windows if len(w) > 1]
    params = SamplingParams(max_tokens=1, prompt_logprobs=0)
    outputs = llm.generate(windows, params)
    logprobs = [s.logprob for o in outputs for s in o.prompt_logprobs[1:]]
    return math.exp(-sum(logprobs) / len(logprobs))


def _greedy(llm, prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from kvpilot_server import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(prompts, params)]


def _agreement(llm, prompts: list[list[int]], continuations: list[list[int]]) -> float:
    from kvpilot_server import SamplingParams

    params = SamplingParams(max_tokens=1, prompt_logprobs=1)
    outputs = llm.generate([p + c for p, c in zip(prompts, continuations, strict=True)], params)
    same = total = 0
    for prompt, continuation, output in zip(prompts, continuations, outputs, strict=True):
        ranked = output.prompt_logprobs[len(prompt) :]
        same += sum(s.top_logprobs[0][0] == t for s, t in zip(ranked, continuation, strict=True))
        total += len(continuation)
    return same / total


if __name__ == "__main__":
    from kvpilot_common.errors import ConfigError

    try:
        print(json.dumps(run_job(Job(**json.load(sys.stdin)))))
    except ConfigError as exc:  # the combination cannot run here: say why in one line
        sys.exit(f"{exc}")
