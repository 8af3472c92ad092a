"""Running a plan against one endpoint: an open-loop load generator.

Requests leave at their planned times whatever the server does (a closed loop that waits for
answers would hide overload, coordinated omission), each in its own task, at most
`max_in_flight` at once (beyond that the client's own pool queues them and the wait counts in
their latency). The run is bounded: the plan is finite, every request has a deadline, and the
wait for the last ones is bounded by that deadline. Setting `stop` (Ctrl-C) stops sending,
closes what is in flight (outcome `interrupted`) and returns what was measured.
"""

import asyncio
import contextlib
import datetime
import functools
import sys
import time
from dataclasses import dataclass, field, replace

import httpx
from tqdm import tqdm

from kvpilot_bench.client import Endpoint, Record, send
from kvpilot_bench.prompts import Job
from kvpilot_bench.server_metrics import Scraper
from kvpilot_bench.workload import Workload


@dataclass
class Options:
    max_in_flight: int = 512
    progress: bool = True
    scrape: bool = True  # read the server's /metrics during the run (kvpilot servers)
    scrape_interval: float = 1.0
    stop: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass
class RunResult:
    endpoint: Endpoint
    workload: Workload
    records: list[Record]
    planned: int
    started_at: str  # UTC, ISO 8601
    duration_s: float  # first send to the last answer (or the stop)
    interrupted: bool
    token_counter: str
    clamped: int  # requests shortened to fit the server's context
    server: dict | None = None  # Scraper.view()


def client(max_in_flight: int, timeout_s: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_in_flight, max_keepalive_connections=max_in_flight)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s, connect=10.0))


async def run(
    endpoint: Endpoint,
    workload: Workload,
    jobs: list[Job],
    options: Options,
    token_counter: str,
    label: str = "",
) -> RunResult:
    timeout = workload.timeout_s
    records = [
        Record(
            j.planned.index,
            j.planned.cls.name,
            j.planned.cls.stream,
            sent_at=0.0,
            planned_cancel=j.planned.cancel_after_s is not None
            or j.planned.cancel_after_tokens is not None,
            clamped=j.clamped,
        )
        for j in jobs
    ]
    started_at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    bar = tqdm(
        total=len(jobs),
        desc=label or endpoint.label or "bench",
        unit="req",
        file=sys.stderr,
        disable=not options.progress,
        dynamic_ncols=True,
    )
    stop = options.stop
    async with client(options.max_in_flight, timeout) as http:
        scraper = Scraper(http, endpoint.root, options.scrape_interval)
        scraping = options.scrape and await scraper.start()
        scrape_stop = asyncio.Event()
        scrape_task = asyncio.create_task(scraper.run(scrape_stop)) if scraping else None
        tasks: set[asyncio.Task] = set()
        counts = {"ok": 0, "other": 0}

        def finished(task: asyncio.Task, rec: Record) -> None:
            tasks.discard(task)
            counts["ok" if rec.outcome == "ok" else "other"] += 1
            bar.update(1)
            bar.set_postfix(in_flight=len(tasks), ok=counts["ok"], other=counts["other"])

        sent: list[Record] = []
        t0 = time.perf_counter()
        for job, rec in zip(jobs, records, strict=True):
            delay = t0 + job.planned.at - time.perf_counter()
            if delay > 0 and not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
            if stop.is_set():
                break
            rec.sent_at = time.perf_counter() - t0
            rec.lag = max(0.0, rec.sent_at - job.planned.at)
            rec.tokens_in = job.prompt_tokens  # our count, until the server's usage says
            sent.append(rec)
            task = asyncio.create_task(send(http, endpoint, job, rec, timeout))
            tasks.add(task)
            task.add_done_callback(functools.partial(finished, rec=rec))
        if tasks and not stop.is_set():
            # Every request ends by its own deadline; this bound is only a backstop.
            waiter = asyncio.ensure_future(asyncio.wait(set(tasks), timeout=timeout + 5.0))
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            if not waiter.done():
                waiter.cancel()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        duration = time.perf_counter() - t0
        if scrape_task is not None:
            scrape_stop.set()
            await scrape_task
            await scraper.finish()
    bar.close()
    for rec in sent:
        if rec.outcome is None:  # closed by the stop
            rec.outcome = "interrupted"
    return RunResult(
        endpoint=replace(endpoint, label=label) if label else endpoint,
        workload=workload,
        records=sent,
        planned=len(jobs),
        started_at=started_at,
        duration_s=duration,
        interrupted=stop.is_set(),
        token_counter=token_counter,
        clamped=sum(r.clamped for r in sent),
        server=scraper.view() if scraping else None,
    )
