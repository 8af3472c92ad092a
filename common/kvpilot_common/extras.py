"""Which optional dependencies (pyproject extras) each `kvpilot` command needs, and one line that
says what to install when they are missing. Standard library only: this runs before anything
heavy is imported, in an install that may have neither extra.

The module lists are the third-party packages each side imports, itself or through the
kvpilot_common modules it uses (tests/test_packaging.py keeps them equal to the imports)."""

import importlib.util

# What server/kvpilot_server imports beyond the standard library (engine, serve, generate, eval),
# with the kvpilot_common modules it uses.
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
    "llguidance",
)
# What operator/kvpilot_operator imports beyond the standard library, with the kvpilot_common
# modules it uses.
OPERATOR_MODULES = ("kopf", "lightkube", "yaml", "prometheus_client", "httpx")
# What gateway/kvpilot_gateway imports, with the kvpilot_common modules it uses (the HTTP front
# door, the CRD's names).
GATEWAY_MODULES = ("starlette", "uvicorn", "aiohttp", "lightkube", "prometheus_client")
# What bench/kvpilot_bench (`kvpilot bench`, the load tester: no torch) imports; it also
# reads servers' /metrics through kvpilot_common.observe, which needs only prometheus_client.
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

MODULES = {
    "server": SERVER_MODULES,
    "operator": OPERATOR_MODULES,
    "gateway": GATEWAY_MODULES,
    "bench": BENCH_MODULES,
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module left in sys.modules as None
        return False


def missing_extra(command: str, extra: str | None) -> str | None:
    """None when `command` (which needs `extra`) can run, else one line naming the missing
    module and the extra."""
    if extra is None:
        return None
    absent = [m for m in MODULES[extra] if not _installed(m)]
    if not absent:
        return None
    return (
        f"kvpilot {command}: {', '.join(absent)} not installed; "
        f"install the {extra} extra: pip install 'kvpilot[{extra}]'"
    )
