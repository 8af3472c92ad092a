"""A client inside the cluster's network (run by the tests in the node's network namespace,
where Service and pod addresses lead somewhere); prints one JSON line per event.

    in_the_cluster.py post URL BODY               the answer: {"status", "body"}
    in_the_cluster.py get URL {}                  the same for a GET
    in_the_cluster.py text URL {}                 a GET's text: {"status", "text"} (/metrics)
    in_the_cluster.py stream URL BODY READY_URL   streams; after the first chunk says
        {"event": "streaming"} and watches READY_URL (the serving pod's /ready) until it fails,
        saying {"event": "draining", "chunks": n}; at the end {"event": "end", ...}
"""

import json
import sys
import threading
import time

import httpx

WATCH_SECONDS = 120  # the longest a pod's drain is watched for


def post(url: str, body: dict) -> None:
    answer = httpx.post(url, json=body, timeout=300)
    print(json.dumps({"status": answer.status_code, "body": answer.json()}), flush=True)


def get(url: str) -> None:
    answer = httpx.get(url, timeout=60)
    print(json.dumps({"status": answer.status_code, "body": answer.json()}), flush=True)


def text(url: str) -> None:
    answer = httpx.get(url, timeout=60)
    print(json.dumps({"status": answer.status_code, "text": answer.text}), flush=True)


def stream(url: str, body: dict, ready_url: str) -> None:
    chunks: list[dict] = []
    watching = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        watching.wait()
        deadline = time.monotonic() + WATCH_SECONDS
        while time.monotonic() < deadline:
            try:
                status = httpx.get(ready_url, timeout=2).status_code
            except httpx.HTTPError:
                status = 0
            if status != 200:
                seconds = round(time.monotonic() - start, 1)
                draining = {"event": "draining", "chunks": len(chunks), "seconds": seconds}
                print(json.dumps(draining), flush=True)
                return
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    done = False
    with httpx.stream("POST", url, json=body, timeout=300) as answer:
        for line in answer.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks.append(json.loads(line.removeprefix("data: ")))
            if len(chunks) == 1:
                print(json.dumps({"event": "streaming"}), flush=True)
                watching.set()
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
    usage = next((c["usage"] for c in reversed(chunks) if c.get("usage")), None)
    text = "".join(c["choices"][0].get("text", "") for c in chunks if c.get("choices"))
    end = {"event": "end", "done": done, "chunks": len(chunks), "usage": usage, "text": text}
    end["seconds"] = round(time.monotonic() - start, 1)
    print(json.dumps(end | {"finish_reason": next((f for f in finish if f), None)}), flush=True)


if __name__ == "__main__":
    command, url, body = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if command == "post":
        post(url, body)
    elif command == "get":
        get(url)
    elif command == "text":
        text(url)
    else:
        stream(url, body, sys.argv[4])
