"""Adversarial probe: every attack of tests/server/api/test_adversarial.py against live tiny-model
servers, reported instead of asserted. Prints one JSON document (and writes it to --json-out).

Per attack: what the attacker got (status codes, timings), the worst /health latency while it
ran (polled every 100 ms), a normal chat's status and latency afterwards next to its baseline,
the server's RSS growth, the waiting/running/KV/in-flight gauges afterwards, and the broken
requirements ("problems"). A server an attack left unclean is replaced before the next attack.
The tiny model is random weights with SmolLM2's tokenizer (256-token context), built once here.
"""

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from kvpilot_server.models.builtin import builtin_path
from kvpilot_testing import attacks, results
from kvpilot_testing.adversary import Attack, Fleet, fail_closed_all
from kvpilot_testing.tiny import build_tiny_model

API_KEY = "adversarial-key"
# What the attacker should get (the test module asserts it), keyed by attack name prefix.
EXPECTED = {
    "seed_overflow": "400 each, then 200 (no 429)",
    "chunked_body": "413 or a close, before the whole body was sent",
    "content_length": "413 within 1 s",
    "cost_": "400 in OpenAI's error shape, message naming the limit",
    "few_stops": "200",
    "parallel_tokenize": "200 each",
    "huge_chat_message": "400 (context overflow)",
    "long_detokenize": "200",
    "timeout_ceiling": "408 (400 for Infinity) within the ceiling + 2 s",
    "burst": "200 each",
    "overload": "some 429s, Retry-After values not all equal",
    "malformed_": "400",
    "slow_clients": "408 or a close within the timeout + 2 s",
    "abandoned_streams": "200, then nothing left running",
    "oversized_headers": "400/413/431 or a close",
    "idle_connections": "/health 200 meanwhile, all closed by the server",
    "semantic_oddities": "unknown model 404 not_found_error; text/plain 200/400/415",
    "truncate_conversation": "200 with X-KVPilot-Dropped-Messages: 2000",
    "auth_without_keys": "exit non-zero quickly, saying no API key was found",
}


def expected(name: str) -> str:
    return next((v for k, v in EXPECTED.items() if name.startswith(k)), "")


def plan(key_file: Path) -> list[tuple[str, str, tuple, object]]:
    """(attack, server name, server flags, callable of the base URL)."""
    main = (*attacks.LIMITS, *attacks.CLIENT_TIMEOUT_FLAGS)
    guarded = (*attacks.LIMITS, "--context-overflow", "truncate-oldest")
    guarded += ("--api-key-file", str(key_file))
    h, b = attacks.HEADER_TIMEOUT, attacks.BODY_TIMEOUT
    steps = [
        ("seed_overflow", attacks.seed_overflow),
        ("chunked_body_64mib", attacks.chunked_body),
        ("content_length_10gib", attacks.content_length_lie),
        *[(f"cost_{c}", lambda u, c=c: attacks.cost_limit(u, c)) for c in attacks.COST_CASES],
        ("few_stops", attacks.few_stops),
        ("parallel_tokenize_3_5mb", attacks.parallel_tokenize),
        ("huge_chat_message_3_5mb", attacks.huge_chat_message),
        ("long_detokenize", attacks.long_detokenize),
        ("timeout_ceiling", attacks.timeout_ceiling),
        ("burst_8", attacks.burst),
        ("overload_40", attacks.overload),
        *[(f"malformed_{c}", lambda u, c=c: attacks.malformed(u, c)) for c in attacks.MALFORMED],
        ("slow_clients", lambda u: attacks.slow_clients(u, h, b)),
        ("abandoned_streams_n1", lambda u: attacks.disconnect_mid_stream(u, 1, 10)),
        ("abandoned_streams_n8", lambda u: attacks.disconnect_mid_stream(u, 8, 3)),
        ("oversized_headers", attacks.oversized_headers),
        ("idle_connections_200", lambda u: attacks.idle_connections(u, 200, h)),
        ("semantic_oddities", attacks.semantic_oddities),
    ]
    auth = {"Authorization": f"Bearer {API_KEY}"}
    truncate = ("truncate_conversation_3_5mb", lambda u: attacks.long_conversation(u, auth))
    return [(name, "main", main, fn) for name, fn in steps] + [
        (truncate[0], "guarded", guarded, truncate[1])
    ]


def main() -> int:
    run = results.Run.start("adversarial")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json-out", type=Path, help="also write the JSON here")
    parser.add_argument("--only", nargs="*", help="run only attacks whose name contains one of")
    results.add_argument(parser)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kvpilot-adversarial-"))
    model = build_tiny_model("llama", work / "llama", builtin_path("smollm2-135m-instruct"))
    key_file = work / "keys"
    key_file.write_text(f"{API_KEY}\n")
    fleet = Fleet(model)
    report: dict = {
        "cpus": os.cpu_count(),
        "server_flags": [*attacks.LIMITS, *attacks.CLIENT_TIMEOUT_FLAGS],
        "attacks": {},
    }
    started = time.monotonic()
    try:
        for name, server, flags, fn in plan(key_file):
            if args.only and not any(part in name for part in args.only):
                continue
            headers = {"Authorization": f"Bearer {API_KEY}"} if server == "guarded" else None
            target = fleet.get(server, *flags, headers=headers)
            with Attack(target) as attack:
                seen = fn(target.base)
            problems = attack.problems()
            report["attacks"][name] = {
                "expected": expected(name),
                "seen": seen,
                **attack.figures,
                "problems": problems,
            }
            print(f"{name}: {seen} {problems}", file=sys.stderr, flush=True)
        if not args.only or any("auth" in part for part in args.only):
            (work / "empty").write_text("")
            (work / "comments").write_text("# keys go here\n")
            cases = {"empty_file": ("empty", None), "comments_only": ("comments", None)}
            cases["empty_env_and_file"] = ("empty", "")
            report["attacks"]["auth_without_keys"] = {"seen": fail_closed_all(model, work, cases)}
    finally:
        fleet.close()
    report["server_restarts"] = fleet.restarts
    report["seconds"] = round(time.monotonic() - started, 1)
    report["summary"] = summary(report["attacks"])
    text = json.dumps(report, indent=2, default=str)
    print(text)
    if args.json_out:
        args.json_out.write_text(text + "\n")
    if args.record:
        baseline = "the same server before the attack (a normal chat's latency)"
        run.record(_figures(report), baseline, report)
    return 0


def _figures(report: dict) -> list[results.Figure]:
    summary, attacked = report["summary"], report["attacks"]
    measured = [v for v in attacked.values() if "chat_s" in v]
    slowest = max(measured, key=lambda v: v["chat_s"], default={})
    return [
        results.figure("attacks run", "", summary["attacks"]),
        results.figure("attacks that harmed other requests", "", len(summary["harm"])),
        results.figure("worst /health latency during an attack", "s", summary["worst_health_s"][1]),
        results.figure("largest RSS growth", "MiB", summary["largest_rss_growth_mib"][1]),
        results.figure(
            "slowest normal chat after an attack",
            "s",
            slowest.get("chat_s"),
            slowest.get("chat_baseline_s"),
        ),
    ]


def summary(results: dict) -> dict:
    """The headline: which attacks harmed others (beyond gauges the server does not export yet),
    the worst /health latency and RSS growth, and whether a server started without any key."""
    measured = {k: v for k, v in results.items() if "health_worst_s" in v}
    harm = {}
    for name, result in measured.items():
        found = [p for p in result["problems"] if not p.startswith("gauges not exported")]
        if found:
            harm[name] = found
    worst = max(measured.items(), key=lambda kv: kv[1]["health_worst_s"], default=(None, {}))
    grew = max(measured.items(), key=lambda kv: kv[1]["rss_growth_mib"], default=(None, {}))
    auth = results.get("auth_without_keys", {}).get("seen", {})
    return {
        "attacks": len(results),
        "gauges_missing": sorted(
            {k for v in measured.values() for k in ("in_flight",) if v.get(k) is None}
        ),
        "harm": harm,
        "worst_health_s": [worst[0], worst[1].get("health_worst_s")],
        "largest_rss_growth_mib": [grew[0], grew[1].get("rss_growth_mib")],
        "chat_failed_after": sorted(k for k, v in measured.items() if v["chat_status"] != 200),
        "served_without_api_key": sorted(k for k, v in auth.items() if v["served"]),
    }


if __name__ == "__main__":
    sys.exit(main())
