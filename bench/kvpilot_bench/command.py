"""`kvpilot bench`: a capacity test of any OpenAI-compatible server (kvpilot, vLLM, TGI,
llama.cpp's server). One run, a comparison of two servers, or a sweep that finds the rate one
replica sustains within an SLO. Ctrl-C (or SIGTERM) stops sending, closes what is in flight and
still reports what was measured (exit code 130)."""

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from kvpilot_bench import plan, prompts, report, runner, tenants, tokens
from kvpilot_bench.client import Endpoint
from kvpilot_bench.compare import side_by_side
from kvpilot_bench.stats import Slo
from kvpilot_bench.sweep import SweepOptions, autoscaling_yaml, sweep
from kvpilot_bench.workload import Workload, WorkloadError, load

INTERRUPTED = 130


class BenchError(Exception):
    """Something the user can fix, said in one line."""


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_main(args))
    except (BenchError, WorkloadError, ValueError, httpx.HTTPError) as exc:
        print(f"kvpilot bench: {exc}", file=sys.stderr)
        return 2


def root_of(url: str) -> str:
    root = url.rstrip("/")
    return root.removesuffix("/v1")


def _check(args: argparse.Namespace) -> None:
    if args.sweep and args.slo_ttft_ms is None and args.slo_e2e_ms is None:
        raise BenchError("--sweep needs an SLO: --slo-ttft-ms and/or --slo-e2e-ms")
    if args.sweep and args.compare:
        raise BenchError("--sweep and --compare do not go together: sweep each server alone")
    if not 0 < args.goodput_target <= 1:
        raise BenchError("--goodput-target is a share in (0, 1]")
    for name in ("rate", "duration", "sweep_start", "sweep_step_duration"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise BenchError(f"--{name.replace('_', '-')} must be positive")
    if args.sweep_factor <= 1:
        raise BenchError("--sweep-factor must be above 1")
    if args.tenant and (args.sweep or args.compare):
        raise BenchError(
            "--tenant runs the tenants at once against --url: not with --sweep or --compare"
        )
    if (args.requests is not None and args.requests < 1) or args.max_in_flight < 1:
        raise BenchError("--requests and --max-in-flight must be at least 1")


def _workload(args: argparse.Namespace) -> Workload:
    workload = load(args.workload)
    if args.rate is not None:
        workload = workload.with_rate(args.rate)
    return workload.with_limits(args.duration, args.requests, args.seed)


async def _endpoint(
    http: httpx.AsyncClient, url: str, key: str | None, model: str | None, label: str | None
) -> Endpoint:
    root = root_of(url)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if model is None:
        try:
            r = await http.get(f"{root}/v1/models", headers=headers)
        except httpx.HTTPError as exc:
            raise BenchError(f"cannot reach {root}: {exc}") from None
        if r.status_code != 200:
            raise BenchError(f"{root}/v1/models answered {r.status_code}: {r.text[:200]}")
        try:
            model = r.json()["data"][0]["id"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BenchError(f"{root}/v1/models lists no model; pass --model") from None
    return Endpoint(root, model, key, label or "")


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def stopping(sig: signal.Signals) -> None:
        print(
            f"\n{sig.name}: stopping; reporting what was measured (again to quit now)",
            file=sys.stderr,
        )
        stop.set()
        for s in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(s)  # a second signal acts at once

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping, sig)


async def _main(args: argparse.Namespace) -> int:
    _check(args)
    workload = _workload(args)
    slo = Slo(args.slo_ttft_ms, args.slo_e2e_ms)
    stop = asyncio.Event()
    _stop_on_signals(stop)
    options = runner.Options(
        max_in_flight=args.max_in_flight,
        progress=not args.no_progress,
        scrape=not args.no_server_metrics,
        stop=stop,
    )
    key = args.api_key or os.environ.get("OPENAI_API_KEY")
    if key is None and args.tenant:  # the model list and tokenizer probe: any tenant may ask
        key = args.tenant[0].key
    async with httpx.AsyncClient(timeout=30.0) as http:
        first = await _endpoint(http, args.url, key, args.model, args.label)
        endpoints = [first]
        if args.compare:
            endpoints.append(
                await _endpoint(
                    http, args.compare, args.compare_api_key, args.compare_model, args.compare_label
                )
            )
            if not first.label and not endpoints[1].label:
                endpoints = [
                    Endpoint(e.root, e.model, e.api_key, n)
                    for e, n in zip(endpoints, ("A", "B"), strict=True)
                ]
        counter = await tokens.probe(http, first.root, first.model, args.tokenizer)
        path = args.prompts or (
            workload.prompts_path if workload.prompts_source == "jsonl" else None
        )
        source = prompts.read_jsonl(path) if path else await prompts.Corpus.load(counter)
        extra = await prompts.variant_tokens(workload, counter)  # structured instructions

    async def run_at(
        endpoint: Endpoint, wl: Workload, label: str = ""
    ) -> tuple[runner.RunResult, dict]:
        jobs = prompts.jobs(plan.build(wl), source, counter, extra)
        result = await runner.run(endpoint, wl, jobs, options, counter.name, label)
        return result, report.run_report(result, slo)

    if args.sweep:
        options_s = SweepOptions(
            start=args.sweep_start,
            factor=args.sweep_factor,
            max_rate=args.sweep_max_rate,
            max_steps=args.sweep_steps,
            refine=args.sweep_refine,
            step_duration_s=args.sweep_step_duration,
            goodput_target=args.goodput_target,
        )

        async def step(rate: float) -> tuple[runner.RunResult, dict]:
            wl = workload.with_rate(rate).with_limits(duration_s=options_s.step_duration_s)
            result, rep = await run_at(first, wl, f"{rate:g} req/s")
            print(f"rate {rate:g} req/s: {report.one_line(rep)}", file=sys.stderr)
            return result, rep

        steps, section = await sweep(step, options_s, slo)
        results, reports = [s.result for s in steps], [s.report for s in steps]
        doc = report.document("sweep", reports, section)
        print(_sweep_text(section))
        if args.plot_out:
            from kvpilot_bench.plot import plot_sweep

            plot_sweep(section, reports, args.plot_out)
    elif args.tenant:
        results, reports = await _tenants(args.tenant, first, workload, run_at)
        doc = report.document("tenants", reports)
        if args.plot_out and results:
            from kvpilot_bench.plot import plot_runs

            plot_runs(results, reports, args.plot_out)
    else:
        results, reports = [], []
        for endpoint in endpoints:
            if stop.is_set():
                break
            result, rep = await run_at(endpoint, workload)
            results.append(result)
            reports.append(rep)
            print(report.table(rep) + "\n")
        if len(reports) == 2:
            print(side_by_side(reports))
        doc = report.document("compare" if args.compare else "run", reports)
        if args.plot_out and results:
            from kvpilot_bench.plot import plot_runs

            plot_runs(results, reports, args.plot_out)
    report.validate(doc)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(doc, indent=1) + "\n")
    for what, where in (("report", args.json_out), ("plots", args.plot_out)):
        if where:
            print(f"{what}: {where}", file=sys.stderr)
    return INTERRUPTED if stop.is_set() else 0


RunAt = Callable[[Endpoint, Workload, str], Awaitable[tuple[runner.RunResult, dict]]]


async def _tenants(
    specs: list[tenants.TenantSpec], first: Endpoint, workload: Workload, run_at: RunAt
) -> tuple[list[runner.RunResult], list[dict]]:
    """Every tenant's run at once, each with its key, arrivals and prompts."""
    runs = [
        run_at(
            Endpoint(first.root, first.model, spec.key, spec.name),
            tenants.workload_for(workload, spec, i),
            spec.name,
        )
        for i, spec in enumerate(specs)
    ]
    done = await asyncio.gather(*runs)
    results, reports = [r for r, _ in done], [rep for _, rep in done]
    for rep in reports:
        print(report.table(rep) + "\n")
    print(tenants.summary(reports))
    return results, reports


def _sweep_text(section: dict) -> str:
    lines = ["sweep:"]
    for s in section["steps"]:
        lines.append(f"  {s['rate']:>8g} req/s  {'pass' if s['passed'] else 'FAIL'}  {s['why']}")
    rate, rec = section["sustainable_rate"], section["recommendation"]
    if rate is None:
        lines.append("no rate tried held the SLO: start lower (--sweep-start)")
        return "\n".join(lines)
    lines.append(f"sustainable: {rate:g} requests/s per replica")
    lines += ["recommended for the ModelDeployment's spec:", autoscaling_yaml(rec)]
    lines += [f"note: {n}" for n in rec["notes"]]
    return "\n".join(lines)
