"""Fixtures of the operator's live tests on the real control plane: a fresh namespace that the
session's shared operator watches, or one with a private operator for a test that restarts or
reconfigures it."""

from collections.abc import Iterator

import pytest

from kvpilot_testing.kube.cluster import Cluster
from kvpilot_testing.kube.operator import namespace


@pytest.fixture
def cluster(kube, request) -> Iterator[Cluster]:
    """A fresh namespace the session's operator watches (under the chart's ServiceAccount);
    its ModelDeployments are deleted while it still runs, so none is left to a later test."""
    with namespace(kube, request.node.name, watched=True) as watched:
        yield watched


@pytest.fixture
def own_operator(kube, request, tmp_path) -> Iterator[Cluster]:
    """A fresh namespace with a private operator watching it alone: for a test that stops,
    restarts or reads the log of its operator."""
    log = tmp_path / "operator.log"
    with namespace(kube, request.node.name, watched=False) as private:
        private.start_operator(log)
        try:
            private.wait_for_operator()
            yield private
            private.delete_model_deployments()  # while it runs: its finalizer is handled
        finally:
            private.stop_operator()
            print(log.read_text()[-3000:])  # shown by pytest when the test fails
