"""Fixtures of the operator's live tests on the real control plane."""

import pytest


@pytest.fixture
def cluster(kube_namespace, tmp_path):
    """A fresh namespace with the real operator running (under the chart's ServiceAccount);
    its ModelDeployments are deleted while it still runs, so none is left to a later test."""
    log = tmp_path / "operator.log"
    kube_namespace.start_operator(log)
    try:
        kube_namespace.wait_for_operator()
        yield kube_namespace
        kube_namespace.delete_model_deployments()
    finally:
        kube_namespace.stop_operator()
        print(log.read_text()[-3000:])  # shown by pytest when the test fails
