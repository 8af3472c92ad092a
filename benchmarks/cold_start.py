"""A cold `kvpilot serve`: seconds from the process's start to /ready on the bundled model
(already converted), with the CPU kernels compiled on first use and with them prebuilt as the
server-cpu image carries them. Prints one JSON document.

Each start gets an empty torch extensions directory, as a new pod's empty /tmp does. "compiled"
has no prebuilt directory, so the server compiles the kernels for this CPU (-march=native)
before it turns ready; "prebuilt" points KVPILOT_CPU_KERNELS_DIR at the module built here
beforehand for the best level this CPU runs (the image builds every level the same way,
engine/kernels/cpu_kernels.py's prebuild), and its build time is reported beside them. The
e2e test of the image under a real kubelet prints the pod's own figure (apply_to_ready_s).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from kvpilot_server.engine.kernels import cpu_kernels
from kvpilot_testing import results

PORT = 8131


def ready_after(env: dict[str, str], timeout: float) -> float:
    """Seconds from starting `kvpilot serve` to its /ready answering 200."""
    argv = [str(Path(sys.executable).parent / "kvpilot"), "serve", "--port", str(PORT)]
    start = time.monotonic()
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while time.monotonic() - start < timeout:
            if server.poll() is not None:
                raise RuntimeError(server.stderr.read().decode()[-2000:])  # type: ignore[union-attr]
            try:
                if httpx.get(f"http://127.0.0.1:{PORT}/ready", timeout=1).status_code == 200:
                    return time.monotonic() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"not ready within {timeout} s")
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    record = results.Run.start("cold_start")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=900)
    results.add_argument(parser)
    args = parser.parse_args()

    level = cpu_kernels.choose(cpu_kernels.cpu_flags(), {lv.name for lv in cpu_kernels.LEVELS})
    assert level is not None, "this CPU runs none of the prebuilt levels"
    base = {k: v for k, v in os.environ.items() if k != cpu_kernels.PREBUILT_ENV}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        start = time.monotonic()
        cpu_kernels.build(cpu_kernels.NAME, level.march, str(root / "prebuilt" / level.name))
        prebuild_s = time.monotonic() - start
        # The bundled model converted before either start is timed.
        warm = {**base, "TORCH_EXTENSIONS_DIR": str(root / "warm")}
        warm[cpu_kernels.PREBUILT_ENV] = str(root / "prebuilt")
        ready_after(warm, args.timeout)
        compiled = ready_after({**base, "TORCH_EXTENSIONS_DIR": str(root / "a")}, args.timeout)
        prebuilt_env = {**warm, "TORCH_EXTENSIONS_DIR": str(root / "b")}
        prebuilt = ready_after(prebuilt_env, args.timeout)
    result = {
        "level": level.name,
        "compiled_ready_s": round(compiled, 1),
        "prebuilt_ready_s": round(prebuilt, 1),
        "prebuild_s": round(prebuild_s, 1),
    }
    print(json.dumps(result, indent=2))
    if args.record:
        figures = [
            results.figure(
                "start to /ready, empty /tmp",
                "s",
                result["prebuilt_ready_s"],
                result["compiled_ready_s"],
            )
        ]
        record.record(figures, "the kernels compiled on first use (no prebuilt directory)", result)


if __name__ == "__main__":
    main()
