"""One JSON line per finished request on the `kvpilot.access` logger.

Carries ids, status, token counts and timings; never prompt or completion text, never a key.
"""

import json
import logging
import time

from kvpilot_server.outputs import RequestOutput

log = logging.getLogger("kvpilot.access")


def log_request(request_id: str, status: int, output: RequestOutput | None, outcome: str) -> None:
    record: dict = {"event": "request", "id": request_id, "status": status, "outcome": outcome}
    if output is not None:
        m, usage = output.metrics, output.usage
        end = m.finished_time or time.monotonic()
        record |= {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "cached_tokens": usage.cached_tokens,
            "ttft_s": None
            if m.first_token_time is None
            else round(m.first_token_time - m.arrival_time, 4),
            "latency_s": round(end - m.arrival_time, 4),
        }
    log.info(json.dumps(record))
