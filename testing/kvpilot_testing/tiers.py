"""Tiers for the inner loop: a pytest plugin (pyproject's addopts loads it) that marks every test
from what it uses, so a developer can leave out what is slow to set up and CI still runs it all.

- `e2e`: runs on the real node (tests/e2e: containerd, the kubelet, images);
- `k8s`: runs against a real control plane (the session's `kube`, or a test's own `release`);
- `slow`: loads the bundled SmolLM2 (the `smollm2` fixture) or is marked so by hand.

The marks come from each test's fixture closure, never from a list of files kept by hand: a new
test that asks for `kube` is a k8s test without anyone remembering to say so.
`pytest --quick` (what `./scripts/test.sh --quick` runs) deselects all three.
"""

from pathlib import Path

import pytest

# A fixture in a test's closure that puts it in a tier.
TIER_OF_FIXTURE = {
    "real_node": "e2e",
    "kube": "k8s",
    "release": "k8s",  # tests/chart: a control plane of the module's own, with the chart in it
    "smollm2": "slow",
}
QUICK = "not e2e and not k8s and not slow"  # what --quick runs


def tiers(item: pytest.Item) -> set[str]:
    """The tiers one collected test belongs to."""
    used = getattr(item, "fixturenames", ())
    found = {tier for name, tier in TIER_OF_FIXTURE.items() if name in used}
    if "e2e" in Path(str(item.path)).parts:
        found.add("e2e")
    return found


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--quick", action="store_true", help=f"the inner loop: only tests that are {QUICK!r}"
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("quick"):
        given = config.option.markexpr
        config.option.markexpr = f"({given}) and {QUICK}" if given else QUICK
    for line in (
        "e2e: runs on the real node (containerd, the kubelet, built images)",
        "k8s: runs against a real Kubernetes control plane",
    ):
        config.addinivalue_line("markers", line)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        for tier in sorted(tiers(item)):
            item.add_marker(getattr(pytest.mark, tier))
