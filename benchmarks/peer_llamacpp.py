"""Peer benchmark: kvpilot int4-g32 (int8 lm_head) and float32 vs llama.cpp on the Q4_1 GGUF.

Same run, same token ids, greedy; prints one JSON document. Measures batch-1 decode ms/token
(median of runs, prefill excluded, one prompt) and the engine_throughput.py mixed workload sent
one request at a time (output tokens/s, prefill included); kvpilot's continuous-batching
throughput on the same requests is added for reference.

llama.cpp comes from llama-cpp-python, which compiles llama.cpp from source (15-30 minutes on
2 cores), so it lives in its own venv (--venv), built on first use under `nice -n 19` with
CMAKE_BUILD_PARALLEL_LEVEL=--jobs (default 1) so the build does not starve other work. It is
measured in a subprocess of that venv's python: it is never imported into kvpilot's venv.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

PIN = "0.3.36"
# A native build (-march=native) segfaulted on an AMX host; this portable AVX2 build does not.
# LLAVA_BUILD=OFF skips the multimodal library (a third of the compile), which no run here needs.
CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF"
BUILD_RECORD = "kvpilot-llamacpp-build.json"  # written into the venv: what was built, how
DEFAULT_VENV = Path.home() / ".cache" / "kvpilot" / "llamacpp-venv"
N_CTX = 1024  # longest workload request: 512 prompt + 256 output tokens


def log(message: str) -> None:
    # Progress on stderr: a full run takes minutes, stdout carries only the JSON.
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def ensure_llamacpp(venv: Path, jobs: int) -> Path:
    """The venv's python, with llama_cpp importable; builds it there first if needed."""
    python = venv / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    print(
        f"building llama-cpp-python=={PIN} into {venv}: compiles llama.cpp, 15-30 minutes "
        f"on 2 cores (nice -n 19, {jobs} job(s), CMAKE_ARGS={CMAKE_ARGS!r})",
        file=sys.stderr,
    )
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    start = time.monotonic()
    pip = [str(python), "-m", "pip", "install", "--no-cache-dir", f"llama-cpp-python=={PIN}"]
    subprocess.run(["nice", "-n", "19", *pip], env=env, check=True)
    minutes = (time.monotonic() - start) / 60
    print(f"built llama-cpp-python in {minutes:.1f} min", file=sys.stderr)
    record = {"pin": PIN, "cmake_args": CMAKE_ARGS, "jobs": jobs, "build_minutes": minutes}
    (venv / BUILD_RECORD).write_text(json.dumps(record))
    return python


def llamacpp_worker() -> None:
    """Runs inside the llama.cpp venv: stdlib and llama_cpp only. A job on stdin, JSON out."""
    import llama_cpp

    job = json.load(sys.stdin)
    log("llama.cpp: loading the GGUF")
    threads = os.cpu_count()
    llm = llama_cpp.Llama(
        job["gguf"], n_threads=threads, n_threads_batch=threads, n_ctx=N_CTX, verbose=False
    )

    def greedy(prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        llm.reset()  # no prefix reuse between requests: every prompt is prefilled in full
        out, stamps = [], []
        for token in llm.generate(prompt, temp=0.0, top_k=1, reset=True):
            out.append(token)
            stamps.append(time.perf_counter())
            if len(out) == n:  # EOS ignored: generate() never stops on its own
                break
        return out, stamps

    log("llama.cpp: batch-1 decode")
    greedy(job["prompt"], 4)  # warm-up: the first eval repacks weights (seconds)
    tokens, samples = job["decode_tokens"], []
    for _ in range(job["runs"]):
        # The first token carries the prefill; the next `tokens` stamps are pure decode steps.
        out, stamps = greedy(job["prompt"], tokens + 1)
        samples.append((stamps[-1] - stamps[0]) * 1000 / tokens)
    log("llama.cpp: sequential workload")
    start = time.perf_counter()
    produced = sum(len(greedy(prompt, m)[0]) for prompt, m in job["requests"])
    elapsed = time.perf_counter() - start
    text_ids = llm.tokenize(job["text"].encode(), add_bos=False, special=False)
    build = Path(sys.prefix) / BUILD_RECORD
    print(
        json.dumps(
            {
                "version": llama_cpp.__version__,
                "build": json.loads(build.read_text()) if build.exists() else None,
                "system_info": llama_cpp.llama_print_system_info().decode().strip(),
                "threads": threads,
                "tokenizer_ids_match": text_ids == job["text_ids"],
                "greedy_tokens": out,
                "batch1_ms_per_token": sorted(samples)[len(samples) // 2],
                "sequential": {"elapsed_s": elapsed, "output_tokens": produced},
            }
        )
    )


def machine() -> dict:
    flags = set()
    with open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512_vnni", "amx_tile", "amx_int8", "amx_bf16")
    return {
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
        "cpu_flags": [f for f in wanted if f in flags],
        "load_avg_1m_before": _load(),
    }


def measure_kvpilot(
    quantization: str, dtype: str, prompt, requests, args, lm_head: str = "none"
) -> dict:
    # Imported here so --help and the llama.cpp worker need neither torch nor kvpilot.
    import torch
    from engine_throughput import MODEL, decode_ms_per_token, run_kvpilot

    from kvpilot_server import LLM, SamplingParams

    llm = LLM(
        MODEL,
        dtype=dtype,
        quantization=quantization,
        quantization_group_size=32,  # Q4_1's block size: the same weights as the GGUF's
        lm_head_quantization=lm_head,
        max_model_len=N_CTX,
        kv_cache_bytes=2 << 30,
        # Off: the same prompts run several times here, and llama.cpp prefills each in full.
        enable_prefix_caching=False,
    )
    log(f"kvpilot {quantization} {dtype}: batch-1 decode")
    # Warm-up: the first steps build kernels and allocate; no timed run should pay for that.
    llm.generate(prompt, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    ms = decode_ms_per_token(llm, prompt, args.decode_tokens, args.runs)
    greedy = SamplingParams(max_tokens=args.decode_tokens + 1, temperature=0.0, ignore_eos=True)
    tokens = llm.generate(prompt, greedy)[0].outputs[0].token_ids
    log(f"kvpilot {quantization} {dtype}: sequential, then continuous batching")
    start, produced = time.perf_counter(), 0
    for ids, m in requests:
        params = SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)
        produced += len(llm.generate(ids, params)[0].outputs[0].token_ids)
    elapsed = time.perf_counter() - start
    figures = {
        "dtype": str(llm.engine.dtype).removeprefix("torch."),
        "quantization": quantization if quantization == "none" else f"{quantization}-g32",
        "lm_head_quantization": lm_head,
        "torch_threads": torch.get_num_threads(),
        "batch1_ms_per_token": round(ms, 2),
        "sequential": _rate(elapsed, produced),
        "continuous_batching": run_kvpilot(llm, requests),
        "load_avg_1m_after": _load(),
    }
    return figures | {"greedy_tokens": list(tokens)}


def _load() -> float:
    # Others share this machine: rerun when the load before a run is over 1.5. The run's own
    # threads count too, so the figures taken after it sit near the core count.
    return round(os.getloadavg()[0], 2)


def _rate(elapsed: float, produced: int) -> dict:
    return {
        "elapsed_s": round(elapsed, 2),
        "output_tokens": produced,
        "output_tokens_per_s": round(produced / elapsed, 2),
    }


def _agreement(a: list[int], b: list[int]) -> int:
    """Leading greedy tokens two engines agree on (kernels differ, so they may part ways)."""
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog=f"llama-cpp-python=={PIN} is built on first use with CMAKE_ARGS={CMAKE_ARGS!r}, "
        "under nice -n 19 and CMAKE_BUILD_PARALLEL_LEVEL=--jobs, so it does not starve other "
        "work; it takes 15-30 minutes on 2 cores.",
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="llama.cpp's own venv")
    parser.add_argument("--jobs", type=int, default=1, help="parallel compile jobs for the build")
    parser.add_argument(
        "--requests", type=int, default=16, help="engine_throughput.py workload size"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3, help="batch-1 runs; the median is kept")
    parser.add_argument("--skip-llamacpp", action="store_true", help="measure kvpilot only")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    # Inline, not kvpilot_testing.results.add_argument: the worker parses these arguments too,
    # in llama.cpp's venv, which has no kvpilot_testing.
    parser.add_argument(
        "--record", action="store_true", help="also write benchmarks/results/peer_llamacpp.json"
    )
    args = parser.parse_args()
    if args.worker:
        return llamacpp_worker()
    from kvpilot_testing import results

    run = results.Run.start("peer_llamacpp")

    from engine_throughput import workload
    from transformers import AutoTokenizer

    from kvpilot_server.models.builtin import BUILTIN_MODELS, _gguf_file, builtin_path
    from kvpilot_testing.corpus import CORPUS

    name = "smollm2-135m-instruct"
    gguf = _gguf_file(*BUILTIN_MODELS[name])
    tokenizer = AutoTokenizer.from_pretrained(builtin_path(name))
    requests = workload(tokenizer, args.requests, args.seed)
    prompt = requests[0][0][:32]  # engine_throughput.py's batch-1 prompt
    result: dict = {"machine": machine(), "model": f"builtin://{name}", "gguf": gguf.name}
    result["workload"] = {
        "requests": len(requests),
        "prompt_tokens": sum(len(p) for p, _ in requests),
        "requested_output_tokens": sum(m for _, m in requests),
        "seed": args.seed,
        "batch1_prompt_tokens": len(prompt),
        "batch1_decode_tokens": args.decode_tokens,
    }
    engines = {
        # The GGUF's tied lm_head is 8-bit (Q8_0): kvpilot's int4 run takes its int8 one too.
        "kvpilot_int4": measure_kvpilot("int4", "float32", prompt, requests, args, "int8"),
        "kvpilot_float32": measure_kvpilot("none", "float32", prompt, requests, args),
    }
    if not args.skip_llamacpp:
        python = ensure_llamacpp(args.venv.expanduser(), args.jobs)
        text = CORPUS[:2000]
        job = {
            "gguf": str(gguf),
            "prompt": prompt,
            "decode_tokens": args.decode_tokens,
            "runs": args.runs,
            "requests": requests,
            "text": text,
            "text_ids": tokenizer(text).input_ids,
        }
        command = [str(python), __file__, "--worker"]
        # stderr passes through: the worker's progress and any llama.cpp error show as they come.
        done = subprocess.run(command, input=json.dumps(job), stdout=subprocess.PIPE, text=True)
        if done.returncode != 0:
            sys.exit(f"llama.cpp worker failed with exit code {done.returncode}")
        peer = json.loads(done.stdout)
        seq = peer.pop("sequential")
        peer["sequential"] = _rate(seq["elapsed_s"], seq["output_tokens"])
        peer["batch1_ms_per_token"] = round(peer["batch1_ms_per_token"], 2)
        peer["weights"] = "Q4_1 linears, Q8_0 token_embd/lm_head (tied)"
        # llama.cpp's OpenMP threads collapse when another process takes a core: keep the load.
        peer["load_avg_1m_after"] = _load()
        engines["llamacpp"] = peer
        base = peer["batch1_ms_per_token"]
        result["ratios"] = {
            "kvpilot_int4_over_llamacpp_batch1_ms": round(
                engines["kvpilot_int4"]["batch1_ms_per_token"] / base, 2
            ),
            "kvpilot_float32_over_llamacpp_batch1_ms": round(
                engines["kvpilot_float32"]["batch1_ms_per_token"] / base, 2
            ),
            "kvpilot_int4_over_llamacpp_sequential_tokens_per_s": round(
                engines["kvpilot_int4"]["sequential"]["output_tokens_per_s"]
                / peer["sequential"]["output_tokens_per_s"],
                2,
            ),
            "goal": "kvpilot_int4_over_llamacpp_batch1_ms < 1.0",
        }
    reference = engines["kvpilot_int4"]["greedy_tokens"]
    for key, figures in engines.items():
        tokens = figures.pop("greedy_tokens")
        if key != "kvpilot_int4":
            figures["greedy_prefix_agreeing_with_kvpilot_int4"] = _agreement(reference, tokens)
    result["engines"] = engines
    result["machine"]["load_avg_1m_after"] = _load()
    print(json.dumps(result, indent=2))
    if args.record:
        baseline = "llama.cpp (llama-cpp-python) on the same GGUF, same run"
        run.record(_figures(result), baseline, result)


def _figures(result: dict) -> list:
    from kvpilot_testing import results

    engines, count = result["engines"], result["workload"]["requests"]
    peer = engines.get("llamacpp", {})  # absent with --skip-llamacpp
    peer_ms = peer.get("batch1_ms_per_token")
    peer_rate = peer.get("sequential", {}).get("output_tokens_per_s")
    figures = []
    for key, label in (("kvpilot_int4", "int4-g32 + int8 lm_head"), ("kvpilot_float32", "float32")):
        mine = engines[key]
        rate = mine["sequential"]["output_tokens_per_s"]
        ms = mine["batch1_ms_per_token"]
        figures.append(results.figure(f"batch-1 decode, kvpilot {label}", "ms/token", ms, peer_ms))
        sequential = f"{count} requests one at a time, kvpilot {label}"
        figures.append(results.figure(sequential, "tok/s", rate, peer_rate))
    return figures


if __name__ == "__main__":
    main()
