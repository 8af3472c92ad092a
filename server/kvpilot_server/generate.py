"""`kvpilot generate`: offline batch generation from arguments or JSONL, results as JSONL."""

import argparse
import json
import sys
from typing import Any, TextIO

from kvpilot_common.errors import KvpilotError
from kvpilot_server.engine_args import engine_config
from kvpilot_server.sampling_params import SamplingParams

_PER_LINE = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop", "min_tokens")


def run_generate(args: argparse.Namespace) -> int:
    try:
        requests = _read_requests(args)
    except (OSError, ValueError) as exc:
        print(f"kvpilot generate: {exc}", file=sys.stderr)
        return 2
    if not requests:
        print("kvpilot generate: no prompts (give strings or --input FILE)", file=sys.stderr)
        return 2
    from kvpilot_server.llm import LLM

    try:
        llm = LLM(**vars(engine_config(args)))
        prompts = [
            llm.engine.apply_chat_template(r["messages"]) if "messages" in r else r["prompt"]
            for r in requests
        ]
        params = [_params(args, r) for r in requests]
        outputs = llm.generate(prompts, params, use_tqdm=True)
    except KvpilotError as exc:
        print(f"kvpilot generate: {exc}", file=sys.stderr)
        return 1
    out = open(args.output, "w") if args.output else sys.stdout  # noqa: SIM115
    try:
        _write(out, requests, outputs)
    finally:
        if args.output:
            out.close()
    return 0


def _read_requests(args: argparse.Namespace) -> list[dict[str, Any]]:
    key = "messages" if args.chat else "prompt"
    requests = [
        {key: [{"role": "user", "content": p}]} if args.chat else {key: p} for p in args.prompts
    ]
    if args.input:
        stream = sys.stdin if args.input == "-" else open(args.input)  # noqa: SIM115
        with stream:
            for number, line in enumerate(stream, 1):
                if line.strip():
                    requests.append(_parse_line(line, number))
    return requests


def _parse_line(line: str, number: int) -> dict[str, Any]:
    try:
        request = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {number}: not JSON ({exc.msg})") from exc
    if not isinstance(request, dict) or not ({"prompt", "messages"} & request.keys()):
        raise ValueError(f"line {number}: expected an object with 'prompt' or 'messages'")
    return request


def _params(args: argparse.Namespace, request: dict[str, Any]) -> SamplingParams:
    base = {"max_tokens": args.max_tokens, "temperature": args.temperature, "top_p": args.top_p}
    return SamplingParams(**{**base, **{k: request[k] for k in _PER_LINE if k in request}})


def _write(out: TextIO, requests: list[dict[str, Any]], outputs: list) -> None:
    for request, output in zip(requests, outputs, strict=True):
        completion, usage = output.outputs[0], output.usage
        result = {
            "id": request.get("id", output.request_id),
            "text": completion.text,
            "token_ids": completion.token_ids,
            "finish_reason": completion.finish_reason,
            "usage": {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            },
        }
        out.write(json.dumps(result) + "\n")
