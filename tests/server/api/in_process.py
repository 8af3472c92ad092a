"""The real app and engine on real HTTP, in the test process, so tests can inject faults into
any step of request handling (monkeypatch) and read admission and engine state directly."""

import socket
import threading
import time
from dataclasses import dataclass

import httpx
import uvicorn
from starlette.applications import Starlette

from kvpilot_server.api.admission import Admission
from kvpilot_server.api.app import ServerSettings, build_app
from kvpilot_server.config import EngineConfig
from kvpilot_server.engine.runtime.async_engine import AsyncEngine


@dataclass
class Served:
    base: str
    app: Starlette
    engine: AsyncEngine
    server: uvicorn.Server
    thread: threading.Thread

    @property
    def admission(self) -> Admission:
        return self.app.state.admission

    def idle(self, timeout: float = 5.0) -> bool:
        """True once nothing is admitted, queued, running or holding KV blocks (an abort
        lands at the engine's next step, so this polls)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            stats = self.engine.stats
            busy = sum(stats.running.values()) + sum(stats.waiting.values())
            if self.admission.in_flight == 0 and busy == 0 and stats.kv_cache_usage == 0:
                return True
            time.sleep(0.02)
        return False

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.engine.shutdown()


def serve_in_process(model_dir, **settings) -> Served:
    config = EngineConfig(
        model=str(model_dir), kv_cache_bytes=16 << 20, max_model_len=256, dtype="float32"
    )
    engine = AsyncEngine.from_config(config).start()
    app = build_app(engine, ServerSettings(served_model_name="tiny", **settings))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    httpx.get(f"{base}/health", timeout=5).raise_for_status()
    return Served(base, app, engine, server, thread)
