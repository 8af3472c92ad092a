"""The client-library tests' fixtures: a recorder of requests, closed afterwards, and no
telemetry from the libraries (the machine reaches nothing but the server under test)."""

from collections.abc import Iterator

import pytest

from tests.server.api.clients.shapes import Recorder


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    taken = Recorder()
    yield taken
    taken.close()  # no socket left open for the warnings-as-errors check to find


@pytest.fixture(autouse=True, scope="module")
def _no_telemetry() -> Iterator[None]:
    # LangSmith traces only when told to; a developer's environment may tell it to.
    with pytest.MonkeyPatch.context() as env:
        for name in ("LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2", "LANGCHAIN_TRACING"):
            env.setenv(name, "false")
        yield
