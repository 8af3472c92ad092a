"""n choices of one prompt: n prefills (before) vs one shared prefill (now), in one run on the
bundled model. Prints one JSON document.

Each run submits one prompt n times at once (as the API does for a request with `n` choices),
greedy, EOS ignored, and reports the prompt tokens the engine computed, the time until every
choice has its first token and the time until all have finished; median over runs, a fresh
prompt for every run so no run is served by an earlier one's cache. "Before" turns off the
scheduler's holding back of identical prompts, which restores the old behaviour exactly.
"""

import argparse
import json
import statistics
import time
from unittest import mock

from kvpilot_server import LLM, SamplingParams
from kvpilot_server.engine.runtime.scheduler import Scheduler
from kvpilot_testing import results
from kvpilot_testing.corpus import CORPUS

MODEL = "builtin://smollm2-135m-instruct"


def measure(llm: LLM, prompt: list[int], n: int, max_tokens: int) -> dict[str, float]:
    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    before = engine.stats().num_prefill_tokens
    start = time.perf_counter()
    outputs = llm.generate([prompt] * n, params)
    elapsed = time.perf_counter() - start
    first = max(o.metrics.first_token_time - o.metrics.arrival_time for o in outputs)
    assert len({tuple(o.outputs[0].token_ids) for o in outputs}) == 1
    return {
        "prefill_tokens": engine.stats().num_prefill_tokens - before,
        "all_first_tokens_s": first,
        "elapsed_s": elapsed,
    }


def median(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


def main() -> None:
    run = results.Run.start("shared_prefill")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3)
    results.add_argument(parser)
    args = parser.parse_args()

    llm = LLM(MODEL, max_model_len=1024, kv_cache_bytes=1 << 30)
    ids = llm.tokenizer(CORPUS).input_ids
    ids = ids * (8192 // len(ids) + 1)
    length = args.prompt_tokens
    prompts = iter(ids[i : i + length] for i in range(0, len(ids) - length, length + 1))
    measure(llm, next(prompts)[:32], args.n, 4)  # warm-up
    modes: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(args.runs):  # interleaved, so drift on a shared machine hits both alike
        with mock.patch.object(Scheduler, "_awaits_prefill", return_value=False):
            modes["before"].append(measure(llm, next(prompts), args.n, args.max_tokens))
        modes["after"].append(measure(llm, next(prompts), args.n, args.max_tokens))
    result = {
        "n": args.n,
        "prompt_tokens": length,
        "max_tokens": args.max_tokens,
        "block_size": llm.engine.config.block_size,
        **{mode: median(runs) for mode, runs in modes.items()},
    }
    print(json.dumps(result, indent=2))
    if args.record:
        rows = [
            (f"prompt tokens computed for n={args.n}", "tokens", "prefill_tokens"),
            ("until every choice has its first token", "s", "all_first_tokens_s"),
            ("until all choices have finished", "s", "elapsed_s"),
        ]
        figures = [
            results.figure(name, unit, result["after"][key], result["before"][key])
            for name, unit, key in rows
        ]
        run.record(figures, "n prefills (the scheduler's hold-back turned off)", result)


if __name__ == "__main__":
    main()
