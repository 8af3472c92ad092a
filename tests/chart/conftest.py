"""The chart tests' own control plane, one for the session (tests/chart/live.py): each module
that needs the chart on a real API server installs its release there, one at a time."""

from collections.abc import Iterator

import pytest

from tests.chart.live import ChartPlane


@pytest.fixture(scope="session")
def chart_plane(tmp_path_factory) -> Iterator[ChartPlane]:
    plane = ChartPlane(tmp_path_factory.mktemp("chart-plane"))
    try:
        yield plane
    finally:
        plane.stop()
