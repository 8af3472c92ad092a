"""LoRA adapters as model names: listed by /v1/models with their base as `parent`, named by a
request's `model`, and loaded or unloaded at run time with vLLM's two routes,
POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST /v1/unload_lora_adapter
{"lora_name"}.

The two routes change what the server runs, so they are off unless the server was started
with --allow-runtime-lora-updating, and a path must lie inside --lora-dir once every symlink
is followed (a relative one is taken from there): an API key holder can make the server read
the adapter directories its operator put there, and nothing else on the machine. The files
are read and checked on a worker thread, never on the engine's loop.
"""

import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvpilot_common.errors import AdapterError, ModelNotFoundError
from kvpilot_common.http.body import read_body
from kvpilot_common.http.errors import error_response
from kvpilot_server.engine.runtime.async_engine import AsyncEngine

# A model name: what a client, the gateway and the CRD can all spell.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_path: str


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="forbid")
    lora_name: str
    lora_int_id: int | None = None  # vLLM's; names are unique here, so it is not needed


def parse_modules(items: list[str]) -> dict[str, str]:
    """--lora-modules NAME=PATH ... as {name: path}; AdapterError naming a malformed one."""
    modules: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not path or NAME.fullmatch(name) is None:
            raise AdapterError(f"--lora-modules takes NAME=PATH, not {item!r}")
        if name in modules:
            raise AdapterError(f"--lora-modules names {name!r} twice")
        modules[name] = path
    return modules


class Adapters:
    def __init__(
        self,
        engine: AsyncEngine,
        base: str,
        body_timeout: float | None,
        runtime_dir: Path | None,
    ) -> None:
        self.engine, self.base, self.body_timeout = engine, base, body_timeout
        self.runtime_dir = runtime_dir.resolve() if runtime_dir is not None else None
        self.paths: dict[str, str] = {}  # name -> the path it was loaded from, for /v1/models

    def resolve(self, model: str | None) -> str | None:
        """The adapter a request's `model` names; None for the base model."""
        if model is None or model == self.base:
            return None
        if model in self.engine.stats.adapters:
            return model
        raise ModelNotFoundError(f"The model {model!r} does not exist")

    def cards(self, created: int) -> list[dict]:
        return [
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "kvpilot",
                "root": self.paths.get(name),
                "parent": self.base,
            }
            for name in self.engine.stats.adapters
        ]

    async def add(self, name: str, path: str) -> None:
        """Read, check and add an adapter (at start, and by the load route)."""
        if name == self.base or NAME.fullmatch(name) is None:
            raise AdapterError(
                f"{name!r} cannot name an adapter: it must differ from the base model's "
                f"name and match {NAME.pattern}"
            )
        await self.engine.load_adapter(name, path)
        self.paths[name] = path

    async def remove(self, name: str) -> None:
        await self.engine.unload_adapter(name)
        self.paths.pop(name, None)

    async def load(self, request: Request) -> Response:
        refused = self._refused()
        if refused is not None:
            return refused
        body = await read_body(request, self.body_timeout)
        parsed = await self.engine.process(LoadAdapter.model_validate_json, body)
        path = self._confined(parsed.lora_path)
        await self.add(parsed.lora_name, str(path))
        return JSONResponse({"status": "loaded", "id": parsed.lora_name, "parent": self.base})

    async def unload(self, request: Request) -> Response:
        refused = self._refused()
        if refused is not None:
            return refused
        body = await read_body(request, self.body_timeout)
        parsed = await self.engine.process(UnloadAdapter.model_validate_json, body)
        if parsed.lora_name not in self.engine.stats.adapters:
            raise ModelNotFoundError(f"No adapter named {parsed.lora_name!r} is loaded")
        await self.remove(parsed.lora_name)
        return JSONResponse({"status": "unloaded", "id": parsed.lora_name})

    def _refused(self) -> Response | None:
        if self.runtime_dir is None:
            return error_response(
                403,
                "Loading and unloading LoRA adapters at run time is off: start the server "
                "with --allow-runtime-lora-updating and --lora-dir",
            )
        return None

    def _confined(self, given: str) -> Path:
        assert self.runtime_dir is not None
        path = Path(os.path.realpath(self.runtime_dir / given))
        if not path.is_relative_to(self.runtime_dir):
            raise AdapterError(f"lora_path must lie inside {self.runtime_dir}", "lora_path")
        return path
