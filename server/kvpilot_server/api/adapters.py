"""LoRA adapters as model names: listed by /v1/models with their base as `parent`, named by a
request's `model`, and loaded or unloaded at run time with vLLM's two routes,
POST /v1/load_lora_adapter {"lora_name", "lora_path"} and POST /v1/unload_lora_adapter
{"lora_name"}.

The two routes change what the server runs, so they are off unless the server was started
with --allow-runtime-lora-updating, and a path must lie inside --lora-dir once every symlink
is followed (a relative one is taken from there): an API key holder can make the server read
the adapter directories its operator put there, and nothing else on the machine. The files
are read and checked on a worker thread, never on the engine's loop.

With API keys, only a key with `adapters=own` or `adapters=all` (http/keys.py) may use the
routes, and an adapter has an owner: the tenant whose key loaded it, or the operator for those
of --lora-modules and the adapter list. A tenant unloads its own; another tenant's or the
operator's takes `adapters=all`, and no one loads over a name another owns (403: /v1/models
lists every adapter to every key, so hiding one behind a 404 would hide nothing). Adapters
loaded at run time are capped, all tenants together and per tenant, so that no key crowds out
the others. Without keys everyone is one tenant and the flag alone allows it all, as in vLLM.

/v1/models gives an adapter's name as its `root`, where vLLM gives its path: a listing every
key reads must not tell the machine's layout.
"""

import asyncio
import os
import re
from pathlib import Path

from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from kvpilot_common.errors import AdapterError, ModelNotFoundError
from kvpilot_common.http.auth import Caller, caller
from kvpilot_common.http.body import read_body
from kvpilot_common.http.errors import error_response
from kvpilot_common.http.keys import ADAPTERS_ALL
from kvpilot_server.commands import MAX_ADAPTERS_PER_TENANT, MAX_LOADED_ADAPTERS
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
        # name -> the tenant that loaded it ("" without API keys); None: the operator's
        self.owners: dict[str, str | None] = {}
        # The names the operator declares, loaded or not (before the list's first load, while
        # an entry downloads, after it failed or an adapters=all key unloaded it): `kvpilot
        # serve` sets --lora-modules', the list sync its entries'. No run-time load takes one:
        # the gateway routes such a name to these pods for every tenant.
        self.modules: frozenset[str] = frozenset()
        self.listed: frozenset[str] = frozenset()
        # The caps on what the routes load (the operator's own do not count: it sized those);
        # `kvpilot serve` sets them from its flags.
        self.max_loaded, self.max_per_tenant = MAX_LOADED_ADAPTERS, MAX_ADAPTERS_PER_TENANT
        self._lock = asyncio.Lock()  # a load's checks and its add as one: no race past a cap

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
                "root": name,  # not its path: every key reads this (see the docstring)
                "parent": self.base,
            }
            for name in self.engine.stats.adapters
        ]

    async def add(self, name: str, path: str, owner: str | None = None) -> None:
        """Read, check and add an adapter (at start, from the list, and by the load route)."""
        if name == self.base or NAME.fullmatch(name) is None:
            raise AdapterError(
                f"{name!r} cannot name an adapter: it must differ from the base model's "
                f"name and match {NAME.pattern}"
            )
        await self.engine.load_adapter(name, path)
        self.owners[name] = owner

    async def claim(self, name: str, path: str) -> None:
        """Load one of the operator's adapters (the list's): a tenant's adapter that sits under
        the name (loaded before the name was declared) is unloaded first, the operator's
        declaration winning, and no run-time load slips in between."""
        async with self._lock:
            if self.owners.get(name) is not None:
                await self._unload(name)
            await self.add(name, path)

    async def remove(self, name: str) -> bool:
        """Unload an adapter of the operator's (the list's); False when `name` is none now: a
        key with adapters=all unloaded it, and a tenant may have loaded its own under the name
        since, which is not the list's to unload."""
        if self.owners.get(name, "") is not None:
            return False
        await self._unload(name)
        return True

    async def load(self, request: Request) -> Response:
        who = caller(request)
        refused = self._refused(who)
        if refused is not None:
            return refused
        body = await read_body(request, self.body_timeout)
        parsed = await self.engine.process(LoadAdapter.model_validate_json, body)
        path = self._confined(parsed.lora_path)
        async with self._lock:
            taken = self._taken(parsed.lora_name, who.tenant)
            if taken is not None:
                return taken
            try:
                await self.add(parsed.lora_name, str(path), who.tenant)
            except AdapterError as exc:  # it names the files it read: by --lora-dir, not the path
                said = str(exc).replace(str(self.runtime_dir), "--lora-dir")
                raise AdapterError(said, exc.param) from exc
        return JSONResponse({"status": "loaded", "id": parsed.lora_name, "parent": self.base})

    async def unload(self, request: Request) -> Response:
        who = caller(request)
        refused = self._refused(who)
        if refused is not None:
            return refused
        body = await read_body(request, self.body_timeout)
        parsed = await self.engine.process(UnloadAdapter.model_validate_json, body)
        name = parsed.lora_name
        async with self._lock:
            if name not in self.owners:
                raise ModelNotFoundError(f"No adapter named {name!r} is loaded")
            owner = self.owners[name]
            if owner != who.tenant and who.adapters != ADAPTERS_ALL:
                return error_response(
                    403,
                    f"The adapter {name!r} was loaded by {_whom(owner)}: only they, or a key "
                    "with adapters=all, may unload it",
                )
            await self._unload(name)
        return JSONResponse({"status": "unloaded", "id": name})

    async def _unload(self, name: str) -> None:
        await self.engine.unload_adapter(name)
        self.owners.pop(name, None)

    def _refused(self, who: Caller) -> Response | None:
        if self.runtime_dir is None:
            return error_response(
                403,
                "Loading and unloading LoRA adapters at run time is off: start the server "
                "with --allow-runtime-lora-updating and --lora-dir",
            )
        if who.adapters is None:
            return error_response(
                403,
                "This API key may not load or unload LoRA adapters: the key file gives that "
                "with adapters=own (its tenant's adapters) or adapters=all",
            )
        return None

    def _taken(self, name: str, tenant: str) -> Response | None:
        """A 403 when another owns `name`; AdapterError (400) past a cap. 400, not 429: waiting
        frees nothing until someone unloads, and clients retry a 429 on their own."""
        if name in self.modules or name in self.listed:
            return error_response(
                403,
                f"{name!r} names an adapter the operator declares (--lora-modules or the "
                "adapter list): choose another name",
            )
        if name in self.owners and self.owners[name] != tenant:
            return error_response(
                403,
                f"{name!r} names an adapter {_whom(self.owners[name])} loaded: choose another name",
            )
        run_time = [owner for owner in self.owners.values() if owner is not None]
        if name not in self.owners and len(run_time) >= self.max_loaded:
            raise AdapterError(
                f"This server holds at most {self.max_loaded} adapters loaded at run time, all "
                "tenants together (--max-loaded-adapters): unload one first"
            )
        if name not in self.owners and tenant and run_time.count(tenant) >= self.max_per_tenant:
            raise AdapterError(
                f"Adapters loaded at run time are at most {self.max_per_tenant} per tenant "
                "(--max-adapters-per-tenant): unload one of yours first"
            )
        return None

    def _confined(self, given: str) -> Path:
        assert self.runtime_dir is not None
        if "\x00" in given:  # os.path would raise ValueError: a 500 for a client's mistake
            raise AdapterError("lora_path holds a NUL byte, which no file path can", "lora_path")
        path = Path(os.path.realpath(self.runtime_dir / given))
        if not path.is_relative_to(self.runtime_dir):
            # Not the directory's own path: the machine's layout is none of a client's business.
            raise AdapterError("lora_path must lie inside --lora-dir", "lora_path")
        return path


def _whom(owner: str | None) -> str:
    return "the operator" if owner is None else "another tenant"
