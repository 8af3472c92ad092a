"""Which optional dependencies (pyproject extras) each `kvpilot` command needs, and one line that
says what to install when they are missing. Standard library only: this runs before anything
heavy is imported, in an install that may have neither extra.

The module lists are the third-party packages each side imports (tests/test_packaging.py keeps
them equal to the imports in server/ and operator/)."""

import importlib.util

# What server/kvpilot_server imports beyond the standard library (engine, serve, generate, eval;
# bench/ aside).
SERVER_MODULES = (
    "torch",
    "transformers",
    "huggingface_hub",
    "safetensors",
    "jinja2",
    "tqdm",
    "starlette",
    "uvicorn",
    "pydantic",
    "pydantic_core",
    "prometheus_client",
)
# What operator/kvpilot_operator imports beyond the standard library and kvpilot_server's pure
# modules.
OPERATOR_MODULES = ("kopf", "lightkube", "yaml", "prometheus_client", "httpx")
# What gateway/kvpilot_gateway imports beyond the standard library and the torch-free modules of
# kvpilot_server (the API's error shape and key check) and kvpilot_operator (the CRD's names).
GATEWAY_MODULES = ("starlette", "uvicorn", "aiohttp", "lightkube", "yaml", "prometheus_client")
# What server/kvpilot_server/bench (`kvpilot bench`, the load tester: no torch) imports; it also
# reads servers' /metrics through kvpilot_operator.observe, which needs only prometheus_client.
BENCH_MODULES = (
    "httpx",
    "yaml",
    "jsonschema",
    "numpy",
    "matplotlib",
    "tqdm",
    "prometheus_client",
    "tokenizers",
)

NEEDS = {
    "serve": ("server", SERVER_MODULES),
    "generate": ("server", SERVER_MODULES),
    "eval": ("server", SERVER_MODULES),
    "operator": ("operator", OPERATOR_MODULES),
    "gateway": ("gateway", GATEWAY_MODULES),
    "bench": ("bench", BENCH_MODULES),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module left in sys.modules as None
        return False


def missing_extra(command: str) -> str | None:
    """None when `command` can run, else one line naming the missing module and the extra."""
    if command not in NEEDS:
        return None
    extra, modules = NEEDS[command]
    absent = [m for m in modules if not _installed(m)]
    if not absent:
        return None
    return (
        f"kvpilot {command}: {', '.join(absent)} not installed; "
        f"install the {extra} extra: pip install 'kvpilot[{extra}]'"
    )
