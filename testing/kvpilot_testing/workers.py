"""Tests side by side: a pytest plugin (pyproject's addopts loads it) for runs split over
pytest-xdist workers (scripts/test.sh runs the suite in two). Each worker, and every server and
subprocess it starts, gets its share of the machine's cores for torch's threads: workers that
each take every core spin against each other (OpenMP's threads wait busily), and the step gains
little from the second worker. A thread count set by hand is left alone.
"""

import os

import pytest

WORKERS_ENV = "PYTEST_XDIST_WORKER_COUNT"  # set by xdist in each worker, before any conftest


def threads_per_worker() -> int | None:
    """The cores of this machine over the run's workers; None outside an xdist worker."""
    workers = os.environ.get(WORKERS_ENV)
    if not workers:
        return None
    return max(1, (os.cpu_count() or 1) // int(workers))


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests() -> None:
    # Before the conftests import torch, which reads the variable once, at its first import.
    threads = threads_per_worker()
    if threads is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
