"""Prometheus and promtool for the monitoring tests, installed on first use."""

import pytest

from tests.monitoring.prometheus_server import install


@pytest.fixture(scope="session")
def prometheus_binaries() -> tuple[str, str]:
    """(prometheus, promtool)."""
    return install()
