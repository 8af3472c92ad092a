"""The container's termination message: why `kvpilot serve` could not start (or, with tensor
parallelism, why it stopped), as "Reason: text".

Kubernetes shows the file's text as the container's termination message; the operator reads
the reason from it (kvpilot_operator.status) to set a condition that names the real cause.
Pure: the operator imports it without torch.
"""

import contextlib
import os
import re
from pathlib import Path

MODEL_LOAD_FAILED = "ModelLoadFailed"  # the model or the engine configuration
INVALID_CONFIGURATION = "InvalidConfiguration"  # the server's own settings (API keys, flags)
STARTUP_FAILED = "StartupFailed"  # anything else, e.g. the port is taken
WORKER_FAILED = "WorkerFailed"  # a tensor-parallel rank died while serving (it is named)
REASONS = (MODEL_LOAD_FAILED, INVALID_CONFIGURATION, STARTUP_FAILED, WORKER_FAILED)
_LIMIT = 4000  # Kubernetes keeps at most 4096 bytes
_FORMAT = re.compile(rf"^({'|'.join(REASONS)}):\s*(.*)$", re.DOTALL)


def write(reason: str, message: str) -> None:
    """Write the message where Kubernetes reads it; outside a pod the file does not exist."""
    path = Path(os.environ.get("KVPILOT_TERMINATION_LOG", "/dev/termination-log"))
    if path.exists():
        with contextlib.suppress(OSError):
            path.write_text(f"{reason}: {message}"[:_LIMIT])


def parse(text: str) -> tuple[str, str] | None:
    """(reason, message) from a termination message written by write(), else None."""
    found = _FORMAT.match(text.strip())
    return (found.group(1), found.group(2).strip()) if found else None
