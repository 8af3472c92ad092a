"""One JSON line per finished HTTP request on the `kvpilot.access` logger.

Carries ids, status, token counts and timings; never prompt or completion text, never a key.
A request with n choices is one line: tokens add up, TTFT is the first choice's, latency the last.
"""

import json
import logging
import time

from kvpilot_server.outputs import RequestOutput

log = logging.getLogger("kvpilot.access")


def log_request(
    request_id: str,
    status: int,
    outputs: list[RequestOutput | None],
    outcome: str,
    tenant: str = "",  # the API key's name (never the key)
) -> None:
    record: dict = {"event": "request", "id": request_id, "status": status, "outcome": outcome}
    if tenant:
        record["tenant"] = tenant
    done = [o for o in outputs if o is not None]
    if done:
        arrival = done[0].metrics.arrival_time
        first_tokens = [o.metrics.first_token_time for o in done if o.metrics.first_token_time]
        end = max(o.metrics.finished_time or time.monotonic() for o in done)
        record |= {
            "choices": len(outputs),
            "prompt_tokens": done[0].usage.prompt_tokens,
            "completion_tokens": sum(o.usage.completion_tokens for o in done),
            "cached_tokens": done[0].usage.cached_tokens,
            "ttft_s": round(min(first_tokens) - arrival, 4) if first_tokens else None,
            "latency_s": round(end - arrival, 4),
        }
    log.info(json.dumps(record))
