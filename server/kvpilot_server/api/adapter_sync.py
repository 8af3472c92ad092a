"""`--lora-config FILE`: keep the loaded adapters equal to a list in a file that changes under
the server (the operator's ConfigMap, which the kubelet refreshes in place).

The list is read at start, before the server listens, so a pod that turns Ready serves every
adapter it started with; then every few seconds. An adapter new to the list is loaded (an
hf:// one downloaded first, with the same `hf download` the model's init container uses); one
gone from it is unloaded; one whose entry changed is loaded again. One that fails is logged
with the reason and not retried until its entry changes, so a bad adapter costs one attempt,
not one a poll. The list's adapters are the operator's (api/adapters.py): a key with
adapters=all may unload one, which then stays unloaded until its entry changes. Adapters loaded
through the run-time routes are not this list's to unload, even under a name it once loaded;
but a name on the list is the operator's, loaded or not: no run-time load takes it, and a
tenant's adapter found under a name the list now declares is unloaded for the list's.
"""

import asyncio
import contextlib
import logging
import os
import subprocess
from pathlib import Path

from kvpilot_common import adapter_list
from kvpilot_common.errors import KvpilotError
from kvpilot_server.api.adapters import Adapters

POLL_S = 5.0
DOWNLOAD_TIMEOUT_S = 3600
log = logging.getLogger(__name__)


class AdapterSync:
    def __init__(self, adapters: Adapters, file: Path) -> None:
        self.adapters, self.file = adapters, file
        self.loaded: dict[str, adapter_list.Entry] = {}  # what this list loaded
        self.failed: dict[str, adapter_list.Entry] = {}  # entries that failed, as they were

    def wanted(self) -> list[adapter_list.Entry]:
        try:
            return adapter_list.decode(self.file.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:  # keep what is loaded until it reads again
            log.error("cannot read the adapter list %s: %s", self.file, exc)
            return list(self.loaded.values())

    async def once(self) -> None:
        wanted = {entry.name: entry for entry in self.wanted()}
        self.adapters.listed = frozenset(wanted)  # declared, loaded or not: no tenant takes one
        for name, entry in list(self.loaded.items()):
            if wanted.get(name) != entry:
                if await self.adapters.remove(name):
                    log.info("LoRA adapter %s unloaded (gone from the list or changed)", name)
                del self.loaded[name]
        for name, entry in wanted.items():
            if name in self.loaded or self.failed.get(name) == entry:
                continue
            try:
                await asyncio.to_thread(_fetch, entry)
                await self.adapters.claim(name, entry.path)
            except (KvpilotError, OSError, subprocess.SubprocessError) as exc:
                self.failed[name] = entry
                log.error("LoRA adapter %s from %s cannot be served: %s", name, entry.source, exc)
                continue
            self.failed.pop(name, None)
            self.loaded[name] = entry
            log.info("LoRA adapter %s loaded from %s", name, entry.source)

    async def follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await self.once()
            except Exception:  # the next poll tries again; serving goes on
                log.exception("adapter list sync failed")

    @contextlib.asynccontextmanager
    async def running(self):
        task = asyncio.create_task(self.follow())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def _fetch(entry: adapter_list.Entry) -> None:
    """Download an hf:// adapter into its path unless it is there (the pod's HF_HUB_OFFLINE is
    for the model, which is local by then; an adapter added at run time is not)."""
    if not entry.source.startswith("hf://") or (Path(entry.path) / "adapter_config.json").is_file():
        return
    repo = entry.source.removeprefix("hf://")
    command = ["hf", "download", repo, f"--revision={entry.revision}", f"--local-dir={entry.path}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "0"}
    subprocess.run(command, env=env, check=True, timeout=DOWNLOAD_TIMEOUT_S, capture_output=True)
