"""The benchmarks' records and the page made from them: every script in benchmarks/ takes
--record, a record carries what says where its figures come from, and docs/benchmarks.md lays
each record out as a table and lists the benchmarks with none (its staleness against the
committed records is tests/test_generate.py's)."""

import json
from pathlib import Path

from kvpilot_testing import results
from scripts.generators import benchmarks

ROOT = Path(__file__).parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))


def test_every_benchmark_script_can_record():
    assert len(SCRIPTS) >= 9
    # peer_llamacpp.py declares the flag itself: its worker parses it in a venv without
    # kvpilot_testing.
    marks = ("results.add_argument(parser)", '"--record"')
    assert [p.name for p in SCRIPTS if not any(m in p.read_text() for m in marks)] == []
    assert [p.name for p in SCRIPTS if ".record(" not in p.read_text()] == []


def test_a_record_says_where_when_and_what(tmp_path):
    run = results.Run.start("example")
    figures = [results.figure("speed", "tok/s", 2.5, 1.0), results.figure("only ours", "ms", 3)]
    path = run.record(figures, "the old way", {"raw": 1}, folder=tmp_path)
    record = json.loads(path.read_text())
    assert path == tmp_path / "example.json"
    assert {"date", "host", "commit", "dirty", "command", "baseline", "figures", "result"} <= set(
        record
    )
    host = record["host"]
    assert host["cores"] >= 1 and len(host["loadavg_at_start"]) == 3
    assert set(host["flags"]) <= set(results.SPEED_FLAGS)
    assert len(record["commit"]) == 40  # this checkout is a git repository
    assert record["result"] == {"raw": 1}


def test_the_page_has_a_table_per_record_and_lists_the_rest(tmp_path):
    run = results.Run.start("shared_prefill")
    run.record([results.figure("prefill | tokens", "tokens", 176, 512)], "n prefills", {}, tmp_path)
    page = benchmarks.generate(tmp_path)
    table = page.split("## shared_prefill")[1].split("\n## ")[0]
    assert "| prefill \\| tokens | 176 | 512 | tokens |" in table
    assert run.commit["commit"][:12] in table and run.host["cpu"] in table
    not_recorded = page.split("## Not recorded yet")[1].split("\n## ")[0]
    named = {p.stem for p in SCRIPTS} - {"shared_prefill"}
    assert {n for n in named if f"benchmarks/{n}.py --record" in not_recorded} == named
    assert "## Earlier runs (transcribed, not regenerated)" in page
