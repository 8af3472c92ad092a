"""The flags of `kvpilot serve` and `kvpilot generate`. Standard library only: the CLI builds
every parser before it knows which extras are installed."""

import argparse

from kvpilot_common.http.limits import add_http_limit_args
from kvpilot_common.naming import PORT
from kvpilot_server.engine_args import add_engine_args

# The names of api/tools/formats.FORMATS (kept equal by tests/server/api/tools): this module is
# read before the server's dependencies are known to be installed.
TOOL_CALL_PARSERS = ("hermes", "llama3_json", "mistral")
# Adapters loaded through the run-time routes, all tenants together and one tenant's: each holds
# memory and a model name, which one key could otherwise take by the hundred (api/adapters.py).
MAX_LOADED_ADAPTERS, MAX_ADAPTERS_PER_TENANT = 32, 8


def add_generate_args(generate: argparse.ArgumentParser) -> None:
    generate.add_argument("prompts", nargs="*", help="prompt strings")
    generate.add_argument("--input", "-i", help="JSONL file of requests ('-' for stdin)")
    generate.add_argument("--output", "-o", help="JSONL file for results (default stdout)")
    generate.add_argument("--chat", action="store_true", help="apply the chat template to prompts")
    generate.add_argument("--max-tokens", type=int, default=128)
    generate.add_argument("--temperature", type=float, default=0.0)
    generate.add_argument("--top-p", type=float, default=1.0)
    add_engine_args(generate)


def add_serve_args(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=PORT)
    serve.add_argument("--served-model-name", help="model name clients use (default: --model)")
    serve.add_argument(
        "--api-key-file",
        help="file of API keys, a line each, with optional name= rpm= tpm= weight= adapters= "
        "(docs/limits.md; also: KVPILOT_API_KEYS=key1,key2); reread when it changes; "
        "/health, /ready and /metrics stay open",
    )
    serve.add_argument(
        "--max-waiting",
        type=int,
        default=256,
        help="requests allowed to wait for the engine; more get 429 + Retry-After",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=None,
        help="seconds before a request is aborted with 408; a ceiling: a request's own "
        "timeout may shorten it, never extend it",
    )
    add_http_limit_args(serve)
    serve.add_argument(
        "--context-overflow",
        choices=["reject", "truncate-oldest"],
        default="reject",
        help="a chat longer than the context: reject with 400, or drop the oldest non-system "
        "turns until it fits (response header X-KVPilot-Dropped-Messages says how many)",
    )
    serve.add_argument(
        "--tool-call-parser",
        choices=["auto", *TOOL_CALL_PARSERS],
        default="auto",
        help="how the model writes tool calls: auto reads it from the chat template "
        "(hermes when the template has no tool support; docs/structured-outputs.md)",
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        action="extend",  # given twice, both lists: the last alone would drop adapters silently
        default=[],
        metavar="NAME=PATH",
        help="LoRA adapters (peft's files) to load at start, each served as model NAME; "
        "may be given more than once; implies --enable-lora",
    )
    serve.add_argument(
        "--lora-config",
        metavar="FILE",
        help="a JSON list of adapters [{name, source, path, revision}] to serve, followed as "
        "it changes (what the operator mounts for spec.adapters); implies --enable-lora",
    )
    serve.add_argument(
        "--allow-runtime-lora-updating",
        action="store_true",
        help="turn on POST /v1/load_lora_adapter and /v1/unload_lora_adapter (needs --lora-dir); "
        "implies --enable-lora",
    )
    serve.add_argument(
        "--lora-dir",
        help="the directory run-time adapter loads are confined to (a relative lora_path is "
        "taken from here)",
    )
    serve.add_argument(
        "--max-loaded-adapters",
        type=int,
        default=MAX_LOADED_ADAPTERS,
        help="adapters loaded at run time, all tenants together; more are refused with 400 "
        "until one is unloaded (--lora-modules and --lora-config ones do not count)",
    )
    serve.add_argument(
        "--max-adapters-per-tenant",
        type=int,
        default=MAX_ADAPTERS_PER_TENANT,
        help="adapters one tenant (an API key's name=) may have loaded at run time",
    )
    serve.add_argument(
        "--drain-timeout",
        type=float,
        default=30.0,
        help="seconds to let in-flight requests finish after SIGTERM",
    )
    add_engine_args(serve)
