#!/usr/bin/env python3
"""Judge checkov's JSON reports against the committed skip file (.checkov-skips.yaml).

    .venv/bin/python scripts/checkov_gate.py --skips .checkov-skips.yaml SCAN=REPORT.json ...

SCAN names the scan a report comes from (defaults, watch-all, all-on, dockerfile): a skip may be
limited to some scans. Every failed check is printed, with the reason it is accepted or as
UNEXPLAINED. The exit status is 1 when a failed check has no skip, when a skip matches no failed
check any more (stale: remove it), when the skip file is malformed, or when checkov could not
parse a file or scanned nothing; 0 otherwise.

A skip:  {check: CKV_..., resources: [fnmatch patterns on checkov's resource id], why: one line,
          scans: [optional: the scans it applies to; default every one]}
"""

import argparse
import fnmatch
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SCANS = ("defaults", "watch-all", "all-on", "dockerfile")


@dataclass
class Skip:
    check: str
    resources: list[str]
    why: str
    scans: list[str]
    used: int = field(default=0, compare=False)

    def covers(self, scan: str, failure: dict) -> bool:
        return (
            failure["check_id"] == self.check
            and scan in self.scans
            and any(fnmatch.fnmatchcase(failure["resource"], p) for p in self.resources)
        )


def load_skips(path: Path) -> list[Skip]:
    """The skip file, checked: each entry names a check, resources and a one-line why."""
    data = yaml.safe_load(path.read_text()) or {}
    entries = data.get("skips") or []
    skips, problems = [], []
    for number, entry in enumerate(entries, 1):
        where = f"{path}: skip {number}"
        if not isinstance(entry, dict):
            problems.append(f"{where}: not a mapping")
            continue
        unknown = set(entry) - {"check", "resources", "why", "scans"}
        check, why = entry.get("check"), entry.get("why")
        resources, scans = entry.get("resources"), entry.get("scans", list(SCANS))
        if unknown:
            problems.append(f"{where}: unknown keys {sorted(unknown)}")
        if not isinstance(check, str) or not check.startswith("CKV"):
            problems.append(f"{where}: check must be a checkov check id")
        if not isinstance(why, str) or not why.strip() or "\n" in why.strip():
            problems.append(f"{where} ({check}): why must be one non-empty line")
        if not resources or not all(isinstance(r, str) and r for r in resources):
            problems.append(f"{where} ({check}): resources must be a non-empty list of patterns")
        if not scans or not set(scans) <= set(SCANS):
            problems.append(f"{where} ({check}): scans must be among {', '.join(SCANS)}")
        if not problems:
            skips.append(Skip(check, list(resources), why.strip(), list(scans)))
    if problems:
        raise ValueError("\n".join(problems))
    return skips


def reports(text: str) -> list[dict]:
    """checkov -o json prints one object for one framework, a list for several."""
    data = json.loads(text)
    return data if isinstance(data, list) else [data]


def judge(scans: dict[str, list[dict]], skips: list[Skip]) -> tuple[list[str], int]:
    """(lines to print, number of problems) for the reports of each scan."""
    lines: list[str] = []
    problems = 0
    totals: Counter[str] = Counter()
    for scan, found in scans.items():
        for report in found:
            summary = report.get("summary", {})
            if summary.get("parsing_errors"):
                failed_files = report.get("results", {}).get("parsing_errors", [])
                lines.append(f"[{scan}] checkov could not parse: {failed_files}")
                problems += 1
            if not summary.get("resource_count"):
                lines.append(f"[{scan}] checkov scanned nothing")
                problems += 1
            totals["passed"] += summary.get("passed", 0)
            for failure in report.get("results", {}).get("failed_checks", []):
                start, end = failure.get("file_line_range") or (0, 0)
                where = f"{failure['file_path']}:{start}-{end}"
                severity = failure.get("severity") or "n/a"
                head = f"[{scan}] {failure['check_id']} ({severity}) {failure['resource']} {where}"
                skip = next((s for s in skips if s.covers(scan, failure)), None)
                totals[f"severity {severity}"] += 1
                if skip:
                    skip.used += 1
                    totals["explained"] += 1
                    lines.append(f"{head}\n    skipped: {skip.why}")
                else:
                    totals["unexplained"] += 1
                    problems += 1
                    lines.append(f"{head}\n    UNEXPLAINED: {failure['check_name']}")
    for skip in skips:
        if not skip.used:
            problems += 1
            lines.append(f"STALE skip {skip.check} {skip.resources}: matches no failed check")
    failed = totals["explained"] + totals["unexplained"]
    by_severity = ", ".join(
        f"{k.removeprefix('severity ')}: {v}" for k, v in sorted(totals.items()) if "severity" in k
    )
    lines.append(
        f"checkov: {totals['passed']} passed, {failed} failed ({totals['explained']} explained,"
        f" {totals['unexplained']} unexplained; by severity: {by_severity or 'none'})"
    )
    return lines, problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--skips", type=Path, required=True)
    parser.add_argument("reports", nargs="+", metavar="SCAN=REPORT.json")
    args = parser.parse_args()
    try:
        skips = load_skips(args.skips)
    except ValueError as exc:
        sys.exit(str(exc))
    scans: dict[str, list[dict]] = {}
    for item in args.reports:
        scan, _, path = item.partition("=")
        if scan not in SCANS or not path:
            parser.error(f"{item}: expected SCAN=REPORT.json, SCAN among {', '.join(SCANS)}")
        scans.setdefault(scan, []).extend(reports(Path(path).read_text()))
    lines, problems = judge(scans, skips)
    print("\n".join(lines))
    if problems:
        sys.exit(f"security scan: {problems} problem(s): fix them or explain them in {args.skips}")


if __name__ == "__main__":
    main()
